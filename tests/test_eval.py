"""`evaluate` against engines answering from a table: protocol, scores, summary, resume, reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_fakes import ANSWERS, TASKS, TableEngine

from jaxrl import cli, prompts
from jaxrl.eval import EvalError, EvalSettings, evaluate, metrics_of, task_kind
from jaxrl.eval.protocol import invalid_reason, response_text
from jaxrl.eval.stats import bootstrap_ci
from jaxrl.rollout.engine import Completion
from models.tokenizer import load_tokenizer
from reward.fleet import Fleet
from reward.schema import Prediction, write_tasks
from reward.score import aggregate, score_predictions


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3_5")


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


def run(tok, fleet, tmp_path=None, engine=None, settings=EvalSettings(), **kw):
    engine = engine or TableEngine(tok)
    return engine, evaluate(engine, tok, TASKS, settings, fleet, model={"name": "table"},
                            out_dir=tmp_path, **kw)


# Protocol ---------------------------------------------------------------------


def test_task_kinds_from_meta_or_from_the_diff():
    assert [task_kind(t) for t in TASKS] == ["single", "multi", "multi_line", "clean", "clean"]


def test_budgets_and_temperature_follow_the_paper():
    """The budgets of appendix C and the evaluation temperature of B.6, which `eval --help` cites."""
    import argparse

    from jaxrl.eval.cli import add_arguments

    s = EvalSettings()
    buggy, clean = s.params(clean=False), s.params(clean=True)
    assert (buggy.n, buggy.temperature, buggy.top_p) == (1, 0.6, 1.0)
    assert (buggy.thinking_budget, buggy.max_tokens) == (4096, 6144)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).temperature == 0.6
    assert "default 0.6: the paper's evaluation temperature, appendix B.6" in " ".join(parser.format_help().split())
    assert (clean.thinking_budget, clean.max_tokens) == (16384, 16384 + 2048)
    with pytest.raises(ValueError, match="room for an answer"):
        EvalSettings(thinking_budget=6144, max_tokens=6144)


def test_no_thinking_drops_the_budgets_not_given():
    """`--no-thinking` needs no budget (the demo's runs: `--no-thinking --max-tokens 80`); one given is kept."""
    import argparse

    from jaxrl.eval.cli import add_arguments, settings_of

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    off = settings_of(parser.parse_args(["--no-thinking", "--max-tokens", "80", "--prompt", "demo"]))
    assert (off.thinking_budget, off.clean_thinking_budget, off.enable_thinking) == (None, None, False)
    assert (off.params(clean=True).max_tokens, off.prompt) == (80, "demo")
    on = settings_of(parser.parse_args(["--prompt", "minimal"]))
    assert (on.thinking_budget, on.clean_thinking_budget, on.enable_thinking) == (4096, 16384, True)
    kept = settings_of(parser.parse_args(["--no-thinking", "--thinking-budget", "100", "--max-tokens", "200",
                                          "--prompt", "minimal"]))
    assert (kept.thinking_budget, kept.clean_thinking_budget) == (100, None)


def test_response_text_keeps_token_text_and_wraps_separate_reasoning():
    c = Completion((1,), (0.0,), "stop", "why\n</think>\n\nok", "why", "\n\nok")
    assert response_text(c) == c.text
    cut = Completion((1,), (0.0,), "length", "\nnever closed\n", "never closed", "")
    assert response_text(cut) == cut.text
    assert invalid_reason(response_text(cut), think_opened=True) == "unclosed_think"
    api = Completion((1,), (0.0,), "stop", "```python\nx = 1\n```", "my reasoning", "```python\nx = 1\n```")
    assert response_text(api) == "<think>\nmy reasoning\n</think>\n\n```python\nx = 1\n```"
    assert invalid_reason(response_text(api), think_opened=False) is None
    assert invalid_reason("", True) == "empty" and invalid_reason("no code", False) == "no_code_block"
    assert invalid_reason("```js\nx\n```", False) == "no_python_block"


def test_prompts_reach_the_engine_as_the_chat_template_renders_them(tok, fleet):
    for name in ("minimal", "abstain"):
        engine, _ = run(tok, fleet, settings=EvalSettings(prompt=name))
        sent = sorted(t for texts, _ in engine.calls for t in texts)
        want = sorted(tok.render_chat(prompts.messages(name, t.prompt, t.buggy_code)) for t in TASKS)
        assert sent == want
        assert all(t.endswith("<|im_start|>assistant\n<think>\n") for t in sent)
    budgets = {(p.thinking_budget, p.max_tokens) for _, p in engine.calls}
    assert budgets == {(4096, 6144), (16384, 18432)}


def test_refine_shows_each_task_its_first_candidate(tok, fleet):
    cands = {t.task_id: Prediction(t.task_id, code=f"# candidate of {t.task_id}\n{t.solution}") for t in TASKS}
    cands["ident#clean"] = Prediction("ident#clean", response="no program here")
    engine, result = run(tok, fleet, settings=EvalSettings(prompt="refine"), candidates=cands)
    sent = {t for texts, _ in engine.calls for t in texts}
    for t in TASKS:
        shown = t.buggy_code if t.task_id == "ident#clean" else cands[t.task_id].code
        assert tok.render_chat(prompts.messages("refine", t.prompt, t.buggy_code, shown)) in sent
    assert result.summary["refine_candidates_replaced"] == 1
    with pytest.raises(EvalError, match="have no candidate"):
        run(tok, fleet, settings=EvalSettings(prompt="refine"), candidates={})


# Scores and summary ---------------------------------------------------------------


def test_outputs_and_scores_equal_precisecoder_score(tok, fleet, tmp_path):
    out = tmp_path / "run"
    _, result = run(tok, fleet, out)
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["task_id"] for p in preds] == [t.task_id for t in TASKS]
    add = preds[0]
    assert add["response"] == ANSWERS["Return the sum of a and b."] and add["think_opened"] is True
    assert add["thinking"] == "Minus should be plus.\n" and add["answer"].startswith("\n\n```python")

    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks(tasks_file, TASKS)
    assert cli.main(["score", "--tasks", str(tasks_file), "--predictions", str(out / "predictions.jsonl"),
                     "--out", str(tmp_path / "scored.jsonl"), "--summary-json", str(tmp_path / "agg.json"),
                     "--workers", "2", "--no-progress"]) == 0
    assert (tmp_path / "scored.jsonl").read_text() == (out / "scores.jsonl").read_text()
    summary = json.loads((out / "summary.json").read_text())
    agg = json.loads((tmp_path / "agg.json").read_text())
    for key in ("tasks", "predictions", "missing", "invalid", "reward", "buggy", "clean"):
        assert summary["aggregate"][key] == agg[key]

    # The paper's columns: add passes (p = 1), f fixes 1 of 2 faults with one precise edit, g never answers.
    b, c = summary["buggy"], summary["clean"]
    assert b["tasks"] == 3 and c["tasks"] == 2
    assert b["pass"]["value"] == pytest.approx(1 / 3)
    assert b["precision"]["value"] == pytest.approx((1 + 1) / 3)
    assert b["recall"]["value"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert b["lines"]["value"] == pytest.approx(1.0)
    assert (c["noop"]["value"], c["damage"]["value"]) == (0.5, 0.5)
    for name in ("pass", "precision", "recall", "f1"):
        assert b[name]["value"] == pytest.approx(agg["buggy"][name])
        lo, hi = b[name]["ci"]
        assert lo <= b[name]["value"] <= hi
    assert set(summary["kinds"]) == {"single", "multi", "multi_line", "clean"}
    assert summary["kinds"]["multi"]["recall"]["value"] == 0.5
    assert summary["invalid"] == {"count": 2, "share": 0.4, "reasons": {"empty": 1, "unclosed_think": 1}}
    assert summary["model"] == {"name": "table"} and summary["settings"]["thinking_budget"] == 4096
    flat = metrics_of(summary)
    assert flat["pass"] == b["pass"]["value"] and flat["noop"] == 0.5 and flat["multi/recall"] == 0.5
    assert "multi_line/lines" not in flat and flat["invalid_share"] == 0.4
    report = (out / "report.md").read_text()
    assert "| multi-fault | 1 |" in report and "invalid (no program" in report


def test_several_samples_are_averaged_per_task(tok, fleet):
    _, result = run(tok, fleet, settings=EvalSettings(samples=3))
    assert len(result.samples) == 3 * len(TASKS)
    assert [s.sample for s in result.samples[:3]] == [0, 1, 2]
    assert result.summary["buggy"]["pass"]["value"] == pytest.approx(1 / 3)
    assert result.summary["aggregate"]["predictions"] == 15


def test_columns_match_aggregate_with_missing_tasks(tok, fleet):
    _, result = run(tok, fleet)
    items = [(t, Prediction(t.task_id, response=s.response, think_opened=True)) for t, s in zip(TASKS, result.samples)]
    scores = score_predictions(items, fleet.run)
    assert [s.to_json() for s in scores] == [s.to_json() for s in result.scores]
    seen = []
    _, via_scorer = run(tok, fleet, scorer=lambda pairs: seen.extend(pairs) or score_predictions(pairs, fleet.run))
    assert [p for _, p in seen] == [p for _, p in items] and via_scorer.summary == result.summary
    spec = aggregate(TASKS, scores[1:])  # the first task has no prediction: counted invalid
    from jaxrl.eval.evaluate import summarize
    summary = summarize(TASKS, result.samples[1:], scores[1:], EvalSettings(), {})
    assert summary["buggy"]["pass"]["value"] == spec["buggy"]["pass"] == 0.0
    assert summary["buggy"]["precision"]["value"] == pytest.approx(spec["buggy"]["precision"])
    assert summary["aggregate"]["missing"] == 1


# Resume -------------------------------------------------------------------------


def test_resume_after_a_failed_engine_samples_only_the_rest(tok, fleet, tmp_path):
    out = tmp_path / "run"
    broken = TableEngine(tok, fail_after=1)
    with pytest.raises(EvalError, match="rerun the same command"):
        run(tok, fleet, out, engine=broken, batch_size=2, retries=1, backoff_s=0)
    kept = [json.loads(x)["task_id"] for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert kept == ["add#b0", "f#b0"]
    with open(out / "predictions.jsonl", "a") as f:  # a torn line, as a kill mid-write leaves
        f.write('{"task_id": "g#b0", "sample": 0, "resp')
    engine, resumed = run(tok, fleet, out, batch_size=2)
    asked = sorted(t for texts, _ in engine.calls for t in texts)
    assert asked == sorted(tok.render_chat(prompts.messages("minimal", t.prompt, t.buggy_code)) for t in TASKS[2:])
    whole_engine, whole = run(tok, fleet, batch_size=2)
    assert resumed.samples == whole.samples
    assert {p.seed for _, p in engine.calls} < {p.seed for _, p in whole_engine.calls}  # batches keep their seeds
    assert [s.to_json() for s in resumed.scores] == [s.to_json() for s in whole.scores]


def test_a_run_directory_with_other_settings_is_refused(tok, fleet, tmp_path):
    run(tok, fleet, tmp_path)
    with pytest.raises(EvalError, match="other settings"):
        run(tok, fleet, tmp_path, settings=EvalSettings(temperature=0.5))


# Bootstrap ----------------------------------------------------------------------


def test_bootstrap_equals_a_loop_re_derivation():
    values = np.array([1.0, 0.0, 0.5, 1.0, np.nan, 0.25, 0.0, 1.0])
    lo, hi = bootstrap_ci(values, resamples=200, seed=7)
    idx = np.random.default_rng(7).integers(0, len(values), size=(200, len(values)))
    means = []
    for row in idx:
        present = [values[i] for i in row if not np.isnan(values[i])]
        if present:
            means.append(sum(present) / len(present))
    means.sort()

    def quantile(q):  # linear interpolation between order statistics
        pos = q * (len(means) - 1)
        k = int(pos)
        return means[k] + (pos - k) * (means[min(k + 1, len(means) - 1)] - means[k])

    assert lo == pytest.approx(quantile(0.025), abs=1e-12)
    assert hi == pytest.approx(quantile(0.975), abs=1e-12)


def test_bootstrap_worked_cases():
    assert bootstrap_ci(np.full(10, 0.3)) == pytest.approx((0.3, 0.3))
    assert bootstrap_ci(np.array([])) is None and bootstrap_ci(np.array([np.nan])) is None
    rng = np.random.default_rng(0)
    coin = (rng.random(400) < 0.3).astype(float)
    lo, hi = bootstrap_ci(coin)
    normal = 1.96 * np.sqrt(coin.mean() * (1 - coin.mean()) / 400)  # the normal approximation's half-width
    assert (hi - lo) / 2 == pytest.approx(normal, rel=0.15)
    assert lo < coin.mean() < hi


# Compare ------------------------------------------------------------------------


def test_compare_table_and_figures(tok, fleet, tmp_path, capsys):
    dirs = []
    for name, prompt in (("base", "minimal"), ("base", "abstain"), ("tuned", "minimal")):
        out = tmp_path / f"{name}-{prompt}"
        answers = dict(ANSWERS, **({"Return x unchanged.": ANSWERS["Clamp x into [lo, hi]."]
                                    .replace("clamp(x, lo, hi)", "ident(x)").replace("max(lo, min(x, hi))", "x")}
                                   if prompt == "abstain" else {}))
        evaluate(TableEngine(tok, answers), tok, TASKS, EvalSettings(prompt=prompt), fleet,
                 model={"name": name}, out_dir=out)
        dirs.append(str(out))
    figs = tmp_path / "figs"
    assert cli.main(["eval", "compare", *dirs, "--out", str(figs)]) == 0
    table = (figs / "compare.md").read_text()
    assert "| base | abstain |" in table and "| tuned | minimal |" in table
    assert "## multi-line" in table
    assert "| base | abstain | 33.3 (" in table  # pass % with its interval
    for png in ("precision_vs_pass.png", "noop_vs_damage.png"):
        data = (figs / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert cli.main(["eval", "compare", str(tmp_path / "nothing"), "--out", str(figs)]) == 2
    assert "summary.json" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--out", "x"], "--tasks and --out are required"),
    (["--tasks", "T", "--out", "x"], "say what to evaluate"),
    (["--tasks", "T", "--out", "x", "--engine", "openai", "--base-url", "http://127.0.0.1:1/v1"], "--served-model"),
    (["--tasks", "T", "--out", "x", "--engine", "sglang"], "needs --url"),
    (["--tasks", "T", "--out", "x", "--model", "m", "--prompt", "refine"], "needs --candidates"),
    (["--tasks", "T", "--out", "x", "--model", "m", "--thinking-budget", "7000"], "room for an answer"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys, tmp_path):
    tasks = tmp_path / "T"
    write_tasks(tasks, TASKS)
    argv = [str(tasks) if a == "T" else a for a in argv]
    assert cli.main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


KILLED_RUN = """
import sys, time
sys.path.insert(0, {tests!r})
from eval_fakes import TASKS, TableEngine
from jaxrl.eval import EvalSettings, evaluate
from models.tokenizer import load_tokenizer

class Slow(TableEngine):
    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        time.sleep(0.3 if len(self.calls) <= 3 else 600)
        return out

tok = load_tokenizer("qwen3_5")
evaluate(Slow(tok), tok, TASKS, EvalSettings(), fleet=None, model={{"name": "table"}}, out_dir={out!r}, batch_size=1)
"""


def test_resume_after_sigkill(tok, fleet, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    script = KILLED_RUN.format(tests=os.path.dirname(__file__), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            path = out / "predictions.jsonl"
            if path.exists() and len(path.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3
    engine, resumed = run(tok, fleet, out, batch_size=1)
    assert sum(len(texts) for texts, _ in engine.calls) == len(TASKS) - 3
    _, whole = run(tok, fleet, batch_size=1)
    assert resumed.samples == whole.samples
    assert (out / "scores.jsonl").exists() and json.loads((out / "summary.json").read_text())["samples"] == 5


def test_a_clean_only_set_reports_and_compares(tok, fleet, tmp_path):
    out = tmp_path / "gt"
    result = evaluate(TableEngine(tok), tok, TASKS[3:], EvalSettings(prompt="abstain"), fleet,
                      model={"name": "table"}, out_dir=out)
    assert result.summary["buggy"]["tasks"] == 0 and result.summary["buggy"]["pass"]["value"] is None
    assert set(metrics_of(result.summary)) == {"noop", "damage", "clean/noop", "clean/damage", "invalid_share",
                                                    "unverifiable"}
    assert "## Buggy" not in (out / "report.md").read_text()
    assert cli.main(["eval", "compare", str(out), "--out", str(tmp_path / "cmp")]) == 0
    assert not (tmp_path / "cmp" / "precision_vs_pass.png").exists()
    assert (tmp_path / "cmp" / "noop_vs_damage.png").exists()


def test_the_trainers_validation_reports_evals_numbers(tok, fleet):
    from jaxrl.config import load_config
    from jaxrl.rewards import RewardPipeline
    from jaxrl.validate import eval_settings, validate
    from reward.sandbox import Limits

    cfg = load_config("tiny")
    pipeline = RewardPipeline(fleet, cfg.reward.lam, cfg.reward.epsilon, Limits(timeout_s=cfg.reward.timeout_s))
    metrics = validate(TableEngine(tok), tok, pipeline, TASKS, cfg, seed=3)
    pipeline.close()
    summary = evaluate(TableEngine(tok), tok, TASKS, eval_settings(cfg, 3), fleet).summary
    for name in ("pass", "precision", "recall", "f1", "lines"):
        assert metrics[f"val/{name}"] == pytest.approx(summary["buggy"][name]["value"])
    for name in ("noop", "damage"):
        assert metrics[f"gt_debug/{name}"] == pytest.approx(summary["clean"][name]["value"])


def test_validation_on_several_hosts_samples_equal_batches_and_reports_every_task_once(tok, fleet, monkeypatch):
    """Two hosts (simulated): 3 buggy + 2 clean tasks give host 1 a padded buggy share, so both
    hosts make the same engine calls (a collective on a pod); the gathered metrics are one host's."""
    import jax

    from jaxrl import hosts
    from jaxrl.config import load_config
    from jaxrl.rewards import RewardPipeline
    from jaxrl.validate import PAD, host_share, validate
    from reward.sandbox import Limits

    cfg = load_config("tiny")
    pipeline = RewardPipeline(fleet, cfg.reward.lam, cfg.reward.epsilon, Limits(timeout_s=cfg.reward.timeout_s))
    single = validate(TableEngine(tok), tok, pipeline, TASKS, cfg, seed=3)
    shares = [host_share(TASKS, p, 2) for p in range(2)]
    assert [len(s) for s in shares] == [3, 3] and sum(PAD in t.task_id for s in shares for t in s) == 1
    assert sorted(t.task_id for s in shares for t in s if PAD not in t.task_id) == sorted(t.task_id for t in TASKS)

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    payloads, engines, metrics = {}, [], []
    for index in (1, 0):  # host 1 first, so host 0's gather can return both payloads
        monkeypatch.setattr(jax, "process_index", lambda index=index: index)
        monkeypatch.setattr(hosts, "gather_json", lambda obj, index=index: (
            payloads.__setitem__(index, obj) or [payloads.get(0, obj), payloads.get(1, obj)]))
        engines.append(TableEngine(tok))
        metrics.append(validate(engines[-1], tok, pipeline, TASKS, cfg, seed=3))
    pipeline.close()
    assert [[len(texts) for texts, _ in e.calls] for e in engines] == [[2, 1], [2, 1]]
    assert all(PAD not in d["task_id"] for obj in payloads.values() for d in obj[0])
    assert metrics[1] == pytest.approx(single)


def test_candidates_of_other_tasks_are_skipped_only_when_asked(tmp_path):
    """`--candidates EVAL_DIR` may come from an eval over more tasks (the demo base's covers test and
    clean) or `--limit` may cut the tasks: the refiner skips those; `score` still refuses them."""
    from reward.schema import SchemaError
    from reward.score_cli import load_predictions_for

    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps({"task_id": tid, "response": "```python\nx = 1\n```"}) + "\n"
                            for tid in (TASKS[0].task_id, "elsewhere/0", TASKS[1].task_id)))
    by_id = {t.task_id: t for t in TASKS[:2]}
    with pytest.raises(SchemaError, match="unknown task 'elsewhere/0'"):
        load_predictions_for(str(path), by_id)
    assert [p.task_id for p in load_predictions_for(str(path), by_id, skip_unknown=True)] == \
        [TASKS[0].task_id, TASKS[1].task_id]
