"""Selection of SFT targets, DPO pairs and RECAP examples from hand-made pools, with the documented tie-breaks."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI

from jaxrl.cli import main
from jaxrl.selection import (SelectionError, mix_recap, parse_ratio, read_pool, recap_candidates, recap_example,
                             row_from_json, select_dpo, select_sft)
from reward.schema import AssertTests, Task, write_tasks


def row(task, sample, unit=1, valid=True, precision=None, recall=None, f1=None, edited=1, text=None):
    return {"task_id": task, "sample": sample, "text": text or f"{task}-{sample}", "token_ids": [1, 2],
            "unit": unit, "precision": precision, "recall": recall, "f1": f1, "edited_lines": edited, "valid": valid}


def rows_of(objs):
    return [row_from_json(o, f"pool:{i}") for i, o in enumerate(objs, 1)]


def write_pool(tmp_path, objs):
    (tmp_path / "pool").mkdir(exist_ok=True)
    path = tmp_path / "pool" / "pool.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return tmp_path / "pool"


def read_out(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# SFT ------------------------------------------------------------------------


def test_sft_keeps_top_two_passing_by_key_with_lower_sample_on_ties():
    pool = rows_of([
        row("a", 0, precision=0.5, f1=0.9),
        row("a", 1, precision=1.0, f1=0.2),
        row("a", 2, precision=0.5, f1=0.9),  # ties sample 0 on both keys: sample 0 first
        row("a", 3, unit=0, precision=1.0, f1=1.0),  # failing: dropped however precise
        row("a", 4, valid=False, unit=1, precision=1.0),  # invalid: dropped
    ])
    by_precision = select_sft(pool, "precision", 2)
    assert [(r["task_id"], r["sample"]) for r in by_precision] == [("a", 1), ("a", 0)]
    assert by_precision[0]["text"] == "a-1" and set(by_precision[0]) == {"task_id", "sample", "text"}
    by_f1 = select_sft(pool, "f1", 2)
    assert [r["sample"] for r in by_f1] == [0, 2]
    assert [r["sample"] for r in select_sft(pool, "f1", 3)] == [0, 2, 1]


def test_sft_all_failing_task_gives_nothing_and_few_passing_give_what_they_have():
    pool = rows_of([row("bad", i, unit=0, f1=0.5, precision=0.5) for i in range(16)]
                   + [row("one", 0, precision=0.3), row("one", 1, unit=0)])
    out = select_sft(pool, "precision", 2)
    assert [(r["task_id"], r["sample"]) for r in out] == [("one", 0)]


def test_sft_missing_scores_count_zero_and_missing_unit_or_valid_fail():
    objs = [row("a", 0, precision=0.2), {"task_id": "a", "sample": 1, "text": "no scores", "unit": 1, "valid": True},
            {"task_id": "a", "sample": 2, "text": "no unit", "valid": True, "precision": 1.0},
            {"task_id": "a", "sample": 3, "text": "no valid", "unit": 1, "precision": 1.0}]
    out = select_sft(rows_of(objs), "precision", 5)
    assert [r["sample"] for r in out] == [0, 1]


def test_sft_tasks_in_pool_order_and_samples_by_index():
    pool = rows_of([row("z", 1, precision=0.5), row("b", 0, precision=0.5), row("z", 0, precision=0.5)])
    assert [(r["task_id"], r["sample"]) for r in select_sft(pool, "precision", 2)] == [("z", 0), ("z", 1), ("b", 0)]


# DPO ------------------------------------------------------------------------


def test_dpo_pairs_first_with_fifteenth_and_second_with_sixteenth():
    # Sample i has unit 1 for i < 8 and f1 = i / 16, so the ranking is 7, 6, ..., 0, 15, 14, ..., 8.
    pool = rows_of([row("t", i, unit=int(i < 8), f1=i / 16) for i in range(16)])
    pairs = select_dpo(pool)
    assert [(p["chosen_sample"], p["rejected_sample"]) for p in pairs] == [(7, 9), (6, 8)]
    assert pairs[0]["chosen"] == "t-7" and pairs[0]["rejected"] == "t-9"
    assert set(pairs[0]) == {"task_id", "chosen_sample", "rejected_sample", "chosen", "rejected"}


def test_dpo_ties_keep_lower_sample_and_equal_pairs_are_skipped():
    # Scores: samples 0..3 score 1.5 (unit 1, f1 1), 4..15 score 0: ranked 0, 1, 2, 3, 4, ..., 15.
    pool = rows_of([row("t", i, unit=int(i < 4), f1=1.0 if i < 4 else 0.0) for i in range(16)])
    assert [(p["chosen_sample"], p["rejected_sample"]) for p in select_dpo(pool)] == [(0, 14), (1, 15)]
    # Only 15th and 16th differ from 1st ... : sample 15 alone is worse, so 1st vs 15th ties and is skipped.
    pool = rows_of([row("t", i, unit=1, f1=1.0 if i < 15 else 0.0) for i in range(16)])
    assert [(p["chosen_sample"], p["rejected_sample"]) for p in select_dpo(pool)] == [(1, 15)]


def test_dpo_all_failing_task_gives_no_pair_but_f1_still_ranks():
    flat = rows_of([row("flat", i, unit=0, valid=False) for i in range(16)])
    assert select_dpo(flat) == []
    # Ranked 0 (0.2), then 1..15 (0): 1st vs 15th is (0, 14); 2nd vs 16th ties and is skipped.
    graded = rows_of([row("g", i, unit=0, f1=None if i else 0.4) for i in range(16)])
    assert [(p["chosen_sample"], p["rejected_sample"]) for p in select_dpo(graded)] == [(0, 14)]


def test_dpo_fewer_than_sixteen_samples():
    three = rows_of([row("t", 0, unit=0), row("t", 1, unit=1, f1=0.5), row("t", 2, unit=1, f1=1.0)])
    # Ranked 2 (1.5), 1 (1.25), 0 (0): 1st vs 2nd-to-last = (2, 1), 2nd vs last = (1, 0).
    assert [(p["chosen_sample"], p["rejected_sample"]) for p in select_dpo(three)] == [(2, 1), (1, 0)]
    two = rows_of([row("t", 0, unit=0), row("t", 1, unit=1)])
    assert select_dpo(two) == []
    assert select_dpo(rows_of([row("t", 0)])) == []


def test_dpo_missing_f1_counts_zero():
    pool = rows_of([{"task_id": "t", "sample": 0, "text": "x", "unit": 1, "valid": True},
                    row("t", 1, unit=1, f1=0.2), row("t", 2, unit=0, f1=0.9)])
    # Scores 1.0, 1.1, 0.45: ranked 1, 0, 2.
    assert [(p["chosen_sample"], p["rejected_sample"]) for p in select_dpo(pool)] == [(1, 0), (0, 2)]


# Pool reading ---------------------------------------------------------------


@pytest.mark.parametrize("obj, message", [
    ({"sample": 0, "text": "x"}, "missing task_id"),
    ({"task_id": "t", "text": "x"}, "missing sample"),
    ({"task_id": "t", "sample": 0}, "missing text"),
    ({"task_id": "t", "sample": "0", "text": "x"}, "sample must be a int"),
    ({"task_id": "t", "sample": 0, "text": "x", "unit": 0.5}, "unit must be 0 or 1"),
    ({"task_id": "t", "sample": 0, "text": "x", "f1": "high"}, "f1 must be a finite number"),
    ({"task_id": "t", "sample": 0, "text": "x", "valid": 1}, "valid must be true or false"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_rows_are_one_line_errors(obj, message):
    with pytest.raises(SelectionError, match=message):
        row_from_json(obj, "pool.jsonl:3")


def test_read_pool_rejects_repeats_and_bad_json(tmp_path):
    directory = write_pool(tmp_path, [row("t", 0), row("t", 0)])
    with pytest.raises(SelectionError, match=r"pool.jsonl:2: task 't' sample 0 appears twice"):
        read_pool(directory)
    (directory / "pool.jsonl").write_text(json.dumps(row("t", 0)) + "\n\n{oops\n")
    with pytest.raises(SelectionError, match=r"pool.jsonl:3: malformed JSON"):
        read_pool(directory)
    with pytest.raises(SelectionError, match="no pool at"):
        read_pool(tmp_path / "nowhere")


# RECAP ----------------------------------------------------------------------

BUGGY = "def f(x):\n    return x - 1\n"
SOLUTION = "def f(x):\n    return x + 1\n"
TASK = Task("t", "t", "Add one.", BUGGY, SOLUTION, AssertTests("assert f(1) == 2\n"))


def fenced(code):
    return f"<think>\nok\n</think>\n\n```python\n{code}```"


def recap_pool():
    minimal = fenced(SOLUTION)
    wordy = fenced("def f(x):\n    y = x\n    return y + 1\n")
    wrong = fenced(BUGGY)
    return rows_of([
        row("t", 0, unit=1, precision=0.5, edited=3, text=wordy),        # trim
        row("t", 1, unit=0, precision=0.0, edited=0, text=wrong),        # repair
        row("t", 2, unit=1, precision=1.0, edited=1, text=minimal),      # keep, and the target
        row("t", 3, unit=1, precision=0.5, edited=3, text=wordy),        # trim
        row("t", 4, unit=0, valid=False, text="no code block"),          # no program: skipped
        row("t", 5, unit=1, precision=0.5, edited=3, text=wordy),        # trim
        row("other", 0, unit=1, precision=0.5, text=wordy),              # not in the tasks: skipped
    ])


def test_recap_kinds_and_targets():
    candidates = recap_candidates(recap_pool(), [TASK])
    assert [(c.candidate_sample, c.kind, c.target_source) for c in candidates] == [
        (0, "trim", "sample:2"), (1, "repair", "sample:2"), (2, "keep", "candidate"),
        (3, "trim", "sample:2"), (5, "trim", "sample:2")]
    assert all(c.target == SOLUTION.rstrip() for c in candidates)
    assert candidates[1].candidate == BUGGY.rstrip()


def test_recap_target_is_the_solution_without_a_minimal_passing_sample():
    pool = [r for r in recap_pool() if r.sample != 2]
    candidates = recap_candidates(pool, [TASK])
    assert {c.target_source for c in candidates} == {"solution"}
    assert all(c.kind in ("trim", "repair") for c in candidates)


def test_recap_mix_at_ratio_is_exact_and_seeded():
    candidates = recap_candidates(recap_pool(), [TASK])  # 3 trim, 1 repair, 1 keep
    mixed = mix_recap(candidates, (3, 1, 1), seed=0)
    assert [c.kind for c in mixed] == ["trim", "repair", "keep", "trim", "trim"]
    two_trims = mix_recap(candidates, (2, 1, 1), seed=0)
    assert sorted(c.kind for c in two_trims) == ["keep", "repair", "trim", "trim"]
    draws = {tuple(c.candidate_sample for c in mix_recap(candidates, (1, 1, 1), seed=s)) for s in range(20)}
    assert draws == {(0, 1, 2), (1, 2, 3), (1, 2, 5)}  # one trim of three, drawn by the seed
    assert [c.kind for c in mix_recap(candidates, (1, 0, 0))] == ["trim"] * 3
    assert mix_recap(candidates, (1, 2, 0)) == []  # 1 repair cannot fill 2 shares


def test_recap_mix_of_at_most_n_examples_keeps_the_ratio():
    candidates = recap_candidates(recap_pool(), [TASK])  # 3 trim, 1 repair, 1 keep
    assert mix_recap(candidates, (1, 1, 1), seed=3, max_examples=100) == mix_recap(candidates, (1, 1, 1), seed=3)
    assert len(mix_recap(candidates, (3, 1, 1), max_examples=5)) == 5
    assert mix_recap(candidates, (3, 1, 1), max_examples=4) == []  # fewer than one whole 3:1:1 mix
    assert [c.kind for c in mix_recap(candidates, (1, 0, 0), max_examples=2)] == ["trim"] * 2
    assert sorted(c.kind for c in mix_recap(candidates, (1, 1, 1), max_examples=5)) == ["keep", "repair", "trim"]
    with pytest.raises(SelectionError, match="--max"):
        mix_recap(candidates, (3, 1, 1), max_examples=-1)


def test_parse_ratio():
    assert parse_ratio("3:1:1") == (3, 1, 1)
    for bad in ("3:1", "a:1:1", "-1:1:1", "0:0:0"):
        with pytest.raises(SelectionError):
            parse_ratio(bad)


def test_recap_example_renders_the_refine_prompt():
    candidate = recap_candidates(recap_pool(), [TASK])[0]
    example = recap_example(candidate, TASK)
    assert example["messages"][0]["role"] == "system" and "candidate fix" in example["messages"][0]["content"]
    user = example["messages"][1]["content"]
    assert "Add one." in user and "return x - 1" in user and "y = x" in user
    assert example["response"] == f"```python\n{SOLUTION.rstrip()}\n```"
    traced = recap_example(candidate, TASK, trace="drop the temporary")
    assert traced["response"].startswith("<think>\ndrop the temporary\n</think>\n\n```python\n")


def test_recap_example_under_the_demo_refine_prompt():
    candidate = recap_candidates(recap_pool(), [TASK])[0]
    example = recap_example(candidate, TASK, prompt="demo_refine")
    code, shown = BUGGY.rstrip("\n"), candidate.candidate.rstrip("\n")
    assert example["messages"] == [{"role": "user", "content":
                                     f"{TASK.prompt}\n```python\n{code}\n```\n```python\n{shown}\n```"}]
    assert example["response"] == recap_example(candidate, TASK)["response"]


# The command ------------------------------------------------------------------


def _run(argv, capsys):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def test_select_commands_write_the_rows(tmp_path, capsys, monkeypatch):
    pool = write_pool(tmp_path, [row("a", 0, precision=0.5, f1=0.5), row("a", 1, precision=1.0, f1=1.0),
                                 row("a", 2, unit=0, f1=0.1)])
    monkeypatch.chdir(tmp_path)
    rc, err = _run(["select", "sft", "--pool", "pool", "--rank-by", "f1", "--top", "1", "--out", "out/sft.jsonl"],
                   capsys)
    assert rc == 0, err
    assert read_out(tmp_path / "out" / "sft.jsonl") == [{"task_id": "a", "sample": 1, "text": "a-1"}]
    assert "1 sft rows from 1 of 1 tasks" in err
    rc, err = _run(["select", "dpo", "--pool", pool / "pool.jsonl", "--out", "dpo.jsonl"], capsys)
    assert rc == 0, err
    assert [(p["chosen_sample"], p["rejected_sample"]) for p in read_out(tmp_path / "dpo.jsonl")] == [(1, 0), (0, 2)]


def test_select_recap_command(tmp_path, capsys):
    pool, tasks = _write_recap_inputs(tmp_path)
    rc, err = _run(["select", "recap", "--pool", pool, "--tasks", tasks,
                    "--out", tmp_path / "recap.jsonl"], capsys)
    assert rc == 0, err
    assert "available: trim 3, repair 1, keep 1" in err
    assert [r["kind"] for r in read_out(tmp_path / "recap.jsonl")] == ["trim", "repair", "keep", "trim", "trim"]
    rc, err = _run(["select", "recap", "--pool", pool, "--tasks", tasks, "--ratio", "1:1:1", "--max", "4",
                    "--prompt", "demo_refine", "--out", tmp_path / "small.jsonl"], capsys)
    assert rc == 0, err
    small = read_out(tmp_path / "small.jsonl")
    assert sorted(r["kind"] for r in small) == ["keep", "repair", "trim"]
    assert all([m["role"] for m in r["messages"]] == ["user"] for r in small)


def _write_recap_inputs(tmp_path):
    pool = write_pool(tmp_path, [])
    (pool / "pool.jsonl").write_text("".join(json.dumps(dict(
        task_id=r.task_id, sample=r.sample, text=r.text, unit=r.unit, valid=r.valid, precision=r.precision,
        edited_lines=r.edited_lines)) + "\n" for r in recap_pool()))
    write_tasks(tmp_path / "tasks.jsonl", [TASK])
    return pool, tmp_path / "tasks.jsonl"


def test_select_recap_with_a_teacher_trace(tmp_path, capsys):
    pool, tasks = _write_recap_inputs(tmp_path)
    with FakeOpenAI({"The correct minimal fix is": "Only the sign is wrong; y is not needed.\n</think>\n\nDone."},
                    model="teacher") as teacher:
        rc, err = _run(["select", "recap", "--pool", pool, "--tasks", tasks, "--ratio", "1:1:1",
                        "--teacher-base-url", teacher.base_url, "--teacher-model", "teacher",
                        "--out", tmp_path / "recap.jsonl"], capsys)
        requests = list(teacher.requests)
    assert rc == 0, err
    rows = read_out(tmp_path / "recap.jsonl")
    assert len(rows) == len(requests) == 3
    assert all(r["response"].startswith("<think>\nOnly the sign is wrong; y is not needed.\n</think>\n\n```python\n")
               for r in rows)
    path, body = requests[0]
    assert path.endswith("/chat/completions") and body["model"] == "teacher"
    assert "Candidate fix:" in body["messages"][-1]["content"] and "return x + 1" in body["messages"][-1]["content"]
    # A teacher that refuses is one line and no file.
    with FakeOpenAI({}, model="teacher") as teacher:
        rc, err = _run(["select", "recap", "--pool", pool, "--tasks", tasks, "--teacher-base-url", teacher.base_url,
                        "--teacher-model", "teacher", "--out", tmp_path / "none.jsonl"], capsys)
    assert rc == 2 and "the teacher failed" in err and not (tmp_path / "none.jsonl").exists()


@pytest.mark.parametrize("argv, message", [
    (["select", "sft", "--pool", "{pool}", "--top", "0", "--out", "{out}"], "--top must be >= 1"),
    (["select", "recap", "--pool", "{pool}", "--tasks", "{missing}", "--teacher-model", "m", "--out", "{out}"],
     "go together"),
    (["select", "sft", "--pool", "{missing}", "--out", "{out}"], "no pool at"),
    (["select", "recap", "--pool", "{pool}", "--tasks", "{missing}", "--out", "{out}"], "--tasks"),
    (["select", "recap", "--pool", "{pool}", "--tasks", "{missing}", "--ratio", "3:1", "--out", "{out}"],
     "ratio must be three"),
])
def test_select_usage_errors_exit_2(tmp_path, capsys, argv, message):
    pool = write_pool(tmp_path, [row("a", 0)])
    fill = {"pool": pool, "missing": tmp_path / "missing", "out": tmp_path / "out.jsonl"}
    rc, err = _run([a.format(**fill) for a in argv], capsys)
    assert rc == 2 and message in err.strip().splitlines()[-1], err
    assert not (tmp_path / "out.jsonl").exists()
