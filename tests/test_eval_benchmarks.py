"""Out-of-distribution benchmarks (`eval --benchmark`): readers, graders in the sandbox, the CLI, Table 6.

The benchmark files are third-party data: read from ../shared/data beside the repository or
/work/shared/data, never copied into the project; the tests skip with the reason when absent.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

from jaxrl import cli, prompts
from jaxrl.eval import benchmarks as B
from jaxrl.eval.ood import score_predictions_file
from jaxrl.eval.report import benchmark_table
from models.tokenizer import load_tokenizer
from reward.fleet import Fleet
from reward.schema import Prediction

FENCE = "```"
_PLACES = (Path(__file__).resolve().parents[2] / "shared" / "data", Path("/work/shared/data"))
SHARED = next((p for p in _PLACES if p.is_dir()), _PLACES[0])
HUMANEVAL = SHARED / "humanevalplus.jsonl.gz"
MBPP = SHARED / "mbppplus.jsonl.gz"
CRUXEVAL = SHARED / "cruxeval.jsonl"
BIGCODEBENCH = SHARED / "bigcodebench_pdb200.jsonl"


def needs(path: Path):
    return pytest.mark.skipif(not path.exists(), reason=f"shared benchmark data absent: {path}")


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


def subset_file(src: Path, dst: Path, ids: list[str], key: str = "task_id") -> Path:
    """The records of `ids` from a benchmark file, written to `dst` (a test's own temporary copy)."""
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt", encoding="utf-8") as f:
        records = {r[key]: r for r in map(json.loads, f)}
    dst.write_text("".join(json.dumps(records[i]) + "\n" for i in ids), encoding="utf-8")
    return dst


def pass_rate(name: str, tasks: list[B.BenchTask], predictions: list[Prediction], fleet, tmp_path: Path) -> float:
    summary = score_predictions_file(name, tasks, predictions, fleet, model={"name": "t"}, data="d",
                                     out_dir=tmp_path / name)
    assert summary["tasks"] == len(tasks) and summary["missing"] == 0
    return summary["pass@1"]["value"]


def canonical(tasks: list[B.BenchTask]) -> list[Prediction]:
    return [Prediction(t.task_id, code=t.reference) for t in tasks]


def wrong(tasks: list[B.BenchTask]) -> list[Prediction]:
    """Programs whose entry point answers an object of its own: never equal to plain data."""
    return [Prediction(t.task_id, code=f"class Wrong:\n    pass\n\ndef {t.entry_point}(*args, **kwargs):\n"
                                       "    return Wrong()\n") for t in tasks]


# HumanEval/32 (find_zero) is graded by the reference's poly vanishing at the answer.
HUMANEVAL_SUBSET = ["HumanEval/0", "HumanEval/2", "HumanEval/12", "HumanEval/32", "HumanEval/38"]
MBPP_SUBSET = ["Mbpp/3", "Mbpp/4", "Mbpp/6", "Mbpp/7", "Mbpp/8"]


@needs(HUMANEVAL)
def test_humanevalplus_canonical_passes_and_wrong_programs_fail_on_a_subset(fleet, tmp_path):
    tasks = [t for t in B.load_benchmark("humaneval+", HUMANEVAL) if t.task_id in HUMANEVAL_SUBSET]
    assert len(tasks) == len(HUMANEVAL_SUBSET)
    assert pass_rate("humaneval+", tasks, canonical(tasks), fleet, tmp_path) == 1.0
    assert pass_rate("humaneval+", tasks, wrong(tasks), fleet, tmp_path) == 0.0


@needs(MBPP)
def test_mbppplus_canonical_passes_and_wrong_programs_fail_on_a_subset(fleet, tmp_path):
    tasks = [t for t in B.load_benchmark("mbpp+", MBPP) if t.task_id in MBPP_SUBSET]
    assert len(tasks) == len(MBPP_SUBSET)
    assert pass_rate("mbpp+", tasks, canonical(tasks), fleet, tmp_path) == 1.0
    assert pass_rate("mbpp+", tasks, wrong(tasks), fleet, tmp_path) == 0.0


@needs(HUMANEVAL)
def test_an_answer_right_on_base_inputs_only_fails_plus():
    record = {"task_id": "T/0", "prompt": "def f(x):\n", "entry_point": "f",
              "canonical_solution": "    return abs(x)\n", "base_input": [[1], [2]], "plus_input": [[-3]], "atol": 0}
    task_plus, task_base = B.evalplus_task("humaneval+", record), B.evalplus_task("humaneval", record)
    program = "def f(x):\n    return x\n"
    with Fleet(workers=1) as f:
        plus, base = f.run([B.job_of(task_plus, program), B.job_of(task_base, program)])
    assert base.passed and not plus.passed and "input 2" in plus.stderr


@needs(HUMANEVAL)
def test_a_program_from_a_response_is_sanitized_as_evalplus_does(fleet, tmp_path):
    task = next(t for t in B.load_benchmark("humaneval", HUMANEVAL) if t.task_id == "HumanEval/0")
    program = f"{task.reference}\nif __name__ == '__main__':\n    print({task.entry_point}(input(), 0.5))\n"
    response = f"Here it is.\n\n{FENCE}python\n{program}{FENCE}\n"
    assert pass_rate("humaneval", [task], [Prediction(task.task_id, response=response)], fleet, tmp_path) == 1.0
    # The same program given as code runs as it is: reading stdin at load time, it never loads.
    assert pass_rate("humaneval", [task], [Prediction(task.task_id, code=program)], fleet, tmp_path) == 0.0


@pytest.mark.slow
@needs(HUMANEVAL)
@needs(MBPP)
@pytest.mark.parametrize("name,path", [("humaneval+", HUMANEVAL), ("mbpp+", MBPP)])
def test_every_canonical_solution_passes(name, path, fleet, tmp_path):
    tasks = B.load_benchmark(name, path)
    summary = score_predictions_file(name, tasks, canonical(tasks), fleet, model={"name": "t"}, data=str(path),
                                     out_dir=tmp_path)
    failed = [r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines()) if not r["passed"]]
    assert summary["pass@1"]["value"] == 1.0, [(r["task_id"], r["status"]) for r in failed]


def cruxeval_records(n: int | None = None) -> list[dict]:
    records = [json.loads(line) for line in CRUXEVAL.read_text(encoding="utf-8").splitlines()]
    return records[:n]


def crux_rate(kind: str, answers: dict[str, str], n: int | None, fleet, tmp_path) -> float:
    tasks = B.load_benchmark(kind, CRUXEVAL)[:n]
    return pass_rate(kind, tasks, [Prediction(t.task_id, code=answers[t.task_id]) for t in tasks], fleet, tmp_path)


def check_cruxeval_output(n: int | None, fleet, tmp_path) -> None:
    records = cruxeval_records(n)
    truth = {r["id"]: r["output"] for r in records}
    assert crux_rate("cruxeval-o", truth, n, fleet, tmp_path) == 1.0
    shuffled = [r["output"] for r in records]
    random.Random(0).shuffle(shuffled)
    expected = sum(eval(s) == eval(r["output"]) for s, r in zip(shuffled, records)) / len(records)  # noqa: S307
    answers = {r["id"]: s for s, r in zip(shuffled, records)}
    assert 0 < expected < 1
    assert crux_rate("cruxeval-o", answers, n, fleet, tmp_path) == pytest.approx(expected, abs=1e-12)


@needs(CRUXEVAL)
def test_cruxeval_output_true_answers_pass_and_shuffled_ones_pass_at_the_expected_rate(fleet, tmp_path):
    check_cruxeval_output(60, fleet, tmp_path)


@needs(CRUXEVAL)
def test_cruxeval_input_true_inputs_pass_and_shifted_ones_do_not(fleet, tmp_path):
    records = cruxeval_records(30)
    assert crux_rate("cruxeval-i", {r["id"]: r["input"] for r in records}, 30, fleet, tmp_path) == 1.0
    # Each problem given the next one's input: an error or another output (for none of these 30 the same).
    shifted = {r["id"]: records[(i + 1) % len(records)]["input"] for i, r in enumerate(records)}
    assert crux_rate("cruxeval-i", shifted, 30, fleet, tmp_path) == 0.0


@needs(CRUXEVAL)
def test_reference_grades_the_true_answers_which_may_use_the_codes_names(tmp_path):
    data = subset_file(CRUXEVAL, tmp_path / "crux.jsonl", ["sample_0", "sample_258"], key="id")
    assert "thigh_o_two" in B.load_benchmark("cruxeval-i", data)[1].reference  # a name the code defines
    for kind in ("cruxeval-i", "cruxeval-o"):
        out = tmp_path / kind
        assert cli.main(["eval", "--benchmark", kind, "--data", str(data), "--reference", "--out", str(out),
                         "--workers", "2", "--no-progress"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["model"]["name"] == "reference" and summary["pass@1"]["value"] == 1.0


@pytest.mark.slow
@needs(CRUXEVAL)
def test_cruxeval_output_on_all_800(fleet, tmp_path):
    check_cruxeval_output(None, fleet, tmp_path)


def test_cruxeval_answers_are_read_from_the_answer_tags():
    response = 'Thinking about it.\n[ANSWER]\nassert f([1, 2], k=3) == [(4, 1), "x == y"]\n[/ANSWER]\n'
    assert B.cruxeval_answer(response, B.OUTPUT) == '[(4, 1), "x == y"]'
    assert B.cruxeval_answer(response, B.INPUT) == "[1, 2], k=3"
    assert B.cruxeval_answer("assert f('a') == 'b'", B.OUTPUT) == "'b'"  # no tags: the whole text
    assert B.cruxeval_answer("[ANSWER]\nassert f(1) == (2", B.OUTPUT) == "(2"  # unparsable: CRUXEval's split
    assert B.cruxeval_answer("I do not know.", B.INPUT) is None


@needs(CRUXEVAL)
def test_a_cruxeval_answer_cannot_pass_with_a_handle(fleet, tmp_path):
    tasks = B.load_benchmark("cruxeval-o", CRUXEVAL)[:2]
    forged = "type('Eq', (), {'__eq__': lambda self, other: True, '__hash__': None})()"
    assert pass_rate("cruxeval-o", tasks, [Prediction(t.task_id, code=forged) for t in tasks], fleet, tmp_path) == 0.0


@needs(BIGCODEBENCH)
@pytest.mark.skipif(not B.unittest_supported(), reason="reward/schema.py has no `unittest` tests kind on this branch "
                                                       "(it lands on main with the BigCodeBench sandbox mode)")
def test_bigcodebench_canonical_solutions_pass(fleet, tmp_path):
    tasks = B.load_benchmark("bigcodebench", BIGCODEBENCH)[:3]
    assert pass_rate("bigcodebench", tasks, canonical(tasks), fleet, tmp_path) == 1.0
    assert pass_rate("bigcodebench", tasks, [Prediction(t.task_id, code="pass\n") for t in tasks], fleet,
                     tmp_path) == 0.0


@needs(BIGCODEBENCH)
@pytest.mark.skipif(B.unittest_supported(), reason="the sandbox runs unittest tests here")
def test_bigcodebench_without_the_unittest_kind_is_one_error_line(tmp_path, capsys):
    code = cli.main(["eval", "--benchmark", "bigcodebench", "--data", str(BIGCODEBENCH), "--predictions",
                     str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "unittest" in err and err.count("\n") == 1


def test_benchmark_files_that_are_not_the_benchmark_are_refused(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"id": "sample_0", "code": "def f(x):\n    return x"}) + "\n")
    with pytest.raises(B.BenchmarkError, match=r"x.jsonl:1: not a cruxeval-o record \(KeyError"):
        B.load_benchmark("cruxeval-o", path)


HE_E2E = ["HumanEval/0", "HumanEval/2", "HumanEval/4"]


@needs(HUMANEVAL)
def test_eval_benchmark_end_to_end_with_a_scripted_server_resumes_and_compares(tmp_path):
    data = subset_file(HUMANEVAL, tmp_path / "he.jsonl", HE_E2E)
    tasks = B.load_benchmark("humaneval+", data)
    answers = {}
    for task, right in zip(tasks, (True, True, False)):
        signature = task.reference.split("def ", 1)[1].split(":", 1)[0]
        program = task.reference if right else f"def {signature}:\n    return 0.5\n"
        answers[f"def {signature}"] = f"Easy.\n</think>\n\n{FENCE}python\n{program}{FENCE}\n"

    def run(out: Path, name: str) -> int:
        return cli.main(["eval", "--benchmark", "humaneval+", "--data", str(data), "--engine", "openai",
                         "--base-url", server.base_url, "--model-name", server.model, "--name", name,
                         "--out", str(out), "--workers", "2", "--no-progress"])

    with FakeOpenAI(answers) as server:
        assert run(tmp_path / "a", "base") == 0
        sent = [b["messages"] for path, b in server.requests if path == "/v1/chat/completions"]
        assert run(tmp_path / "a", "base") == 0  # resumed: everything was sampled, nothing is sent again
        assert len(server.requests) == len(tasks)
        assert run(tmp_path / "b", "tuned") == 0
    assert sorted(map(json.dumps, sent)) == sorted(json.dumps(t.messages) for t in tasks)
    assert sent[0][0]["content"].startswith("Please provide a self-contained Python script")
    assert tasks[0].messages == prompts.benchmark_messages("evalplus", problem=json.loads(
        data.read_text().splitlines()[0])["prompt"].strip())
    rows = [json.loads(line) for line in (tmp_path / "a" / "results.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["passed"]) for r in rows] == [("HumanEval/0", True), ("HumanEval/2", True),
                                                          ("HumanEval/4", False)]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["benchmark"] == "humaneval+" and summary["pass@1"]["value"] == pytest.approx(2 / 3)
    assert summary["settings"]["temperature"] == 0.6 and summary["settings"]["samples"] == 1
    assert cli.main(["eval", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| model | humaneval+ (n=3) |" in table
    assert "| base | 66.7 (" in table and "| tuned | 66.7 (" in table
    assert cli.main(["eval", "compare", "--group", f"x={tmp_path / 'a'}", "--out", str(tmp_path / "g")]) == 2


@needs(CRUXEVAL)
def test_completions_api_sends_the_rendered_prompt_and_reads_answers_inside_the_opened_think(tmp_path):
    tok = load_tokenizer("qwen3_5")
    data = subset_file(CRUXEVAL, tmp_path / "crux.jsonl", ["sample_0", "sample_1"], key="id")
    tasks = B.load_benchmark("cruxeval-o", data)
    records = [json.loads(line) for line in data.read_text().splitlines()]
    answers = {r["code"]: f"Run it.\n</think>\n\n[ANSWER]\nassert f({r['input']}) == {r['output']}\n[/ANSWER]"
               for r in records}
    out = tmp_path / "run"
    with FakeOpenAI(answers, decode=tok.decode) as server:
        assert cli.main(["eval", "--benchmark", "cruxeval-o", "--data", str(data), "--engine", "openai",
                         "--base-url", server.base_url, "--model-name", server.model, "--api", "completions",
                         "--tokenizer", "qwen3_5", "--out", str(out), "--workers", "2", "--no-progress"]) == 0
        sent = sorted(tok.decode(b["prompt"]) for _, b in server.requests)
    assert sent == sorted(tok.render_chat(t.messages) for t in tasks)
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(p["think_opened"] for p in preds)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass@1"]["value"] == 1.0 and summary["model"]["api"] == "completions"


def test_table6_has_a_row_per_model_and_a_column_per_benchmark():
    def run(model: str, benchmark: str, value: float) -> dict:
        return {"model": {"name": model}, "benchmark": benchmark, "tasks": 10, "samples": 10,
                "pass@1": {"value": value, "ci": [value - 0.1, value + 0.1]}}

    table = benchmark_table([run("base", "humaneval+", 0.5), run("base", "cruxeval-o", 0.25),
                             run("precisecoder", "humaneval+", 0.625)])
    assert "| model | humaneval+ (n=10) | cruxeval-o (n=10) |" in table
    assert "| base | 50.0 (40.0–60.0) | 25.0 (15.0–35.0) |" in table
    assert "| precisecoder | 62.5 (52.5–72.5) | – |" in table
    with pytest.raises(ValueError, match="two runs of humaneval\\+ by base"):
        benchmark_table([run("base", "humaneval+", 0.5), run("base", "humaneval+", 0.6)])


@needs(CRUXEVAL)
def test_predictions_file_grades_responses_and_codes(tmp_path):
    records = cruxeval_records(3)
    first = f"assert f({records[0]['input']}) == {records[0]['output']}"
    preds = [{"task_id": records[0]["id"], "response": f"<think>\nhm\n</think>\n[ANSWER]\n{first}\n[/ANSWER]"},
             {"task_id": records[1]["id"], "code": records[1]["output"]},
             {"task_id": records[2]["id"], "response": "<think>\nstill thinking"}]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in preds))
    out = tmp_path / "run"
    assert cli.main(["eval", "--benchmark", "cruxeval-o", "--data", str(CRUXEVAL), "--limit", "3", "--predictions",
                     str(path), "--out", str(out), "--workers", "2", "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["passed"], r["status"]) for r in rows] == [(True, "pass"), (True, "pass"), (False, "no_answer")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["name"] == "answers" and summary["pass@1"]["value"] == pytest.approx(2 / 3)


def test_benchmark_flags_that_do_not_fit_are_one_error_line(tmp_path, capsys):
    code = cli.main(["eval", "--benchmark", "humaneval+", "--data", str(tmp_path / "x"), "--prompt", "abstain",
                     "--predictions", str(tmp_path / "p"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "--prompt" in err and err.count("\n") == 1
