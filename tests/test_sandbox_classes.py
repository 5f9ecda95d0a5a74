"""Class-based and LeetCode-style tasks in proxy mode: objects stay in the program's process and
the judge holds handles (docs/sandbox.md, "Objects of the program"); a run the judge cannot
verify is `unverifiable`, never a silent zero.

The tasks are the hand-written ones of tests/fixtures/class_tasks.jsonl (each buggy program
has one wrong line); every run is a real sandbox run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from jaxrl import metrics as M
from jaxrl.cli import main
from jaxrl.eval import EvalSettings, metrics_of, stats
from jaxrl.eval.evaluate import summarize
from jaxrl.eval.report import report_markdown
from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.schema import AssertTests, Prediction, Task, load_tasks, write_predictions
from reward.score import aggregate, analyze, score_of, score_predictions, unverifiable_score
from sandbox_battery import CLASS_HACKS

FIXTURE = Path(__file__).parent / "fixtures" / "class_tasks.jsonl"
TASKS = {t.task_id: t for t in load_tasks(FIXTURE)}
BUGGY = [t for t in TASKS.values() if not t.is_clean]
UNVERIFIABLE = "unverifiable/module_argument"
FAST = Limits(timeout_s=30.0, memory_mb=256)


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2, cache=False, isolation="bwrap") as f:
        yield f


def test_reference_passes_and_buggy_code_fails(fleet):
    verifiable = [t for t in TASKS.values() if t.task_id != UNVERIFIABLE]
    jobs = [Job(t.solution, t.tests, FAST) for t in verifiable] + [Job(t.buggy_code, t.tests, FAST) for t in BUGGY]
    results = fleet.run(jobs)
    solutions, buggy = results[:len(verifiable)], results[len(verifiable):]
    assert [(t.task_id, r.status) for t, r in zip(verifiable, solutions)] == \
        [(t.task_id, "pass") for t in verifiable], [r.stderr[-400:] for r in solutions if not r.passed]
    assert all(r.status in {"fail", "error"} for r in buggy), [(t.task_id, r.status) for t, r in zip(BUGGY, buggy)]


def test_a_correct_fix_is_rewarded_like_a_function_tasks(fleet):
    """The reference fix scores unit 1, F1 1 and reward 1; the untouched buggy code scores 0."""
    items = [(t, Prediction(t.task_id, code=t.solution)) for t in BUGGY] + \
            [(t, Prediction(t.task_id, code=t.buggy_code)) for t in BUGGY]
    scores = score_predictions(items, fleet.run, limits=FAST, window_batch=4)
    fixed, untouched = scores[:len(BUGGY)], scores[len(BUGGY):]
    assert [(s.task_id, s.status, s.unit, s.f1, s.reward) for s in fixed] == \
        [(t.task_id, "scored", 1, 1.0, 1.0) for t in BUGGY]
    assert [(s.unit, s.reward, s.noop) for s in untouched] == [(0, 0.0, True)] * len(BUGGY)


@pytest.mark.parametrize("name", sorted(CLASS_HACKS))
def test_hacks_on_class_based_tasks_do_not_pass(fleet, name):
    task_id, program = CLASS_HACKS[name]
    result = fleet.run([Job(program, TASKS[task_id].tests, FAST)])[0]
    assert result.status in {"fail", "error"}, (result.status, result.stderr[-500:])


def test_objects_keep_their_identity_and_state_across_calls(fleet):
    program = "class Box:\n    def __init__(self):\n        self.items = []\n    def add(self, x):\n" \
              "        self.items.append(x)\n        return self\n"
    tests = "b = Box()\nassert b.add(1) is b and b.add(2).items == [1, 2]\nb.items = [7]\nassert b.items == [7]\n" \
            "del b.items\nassert not hasattr(b, 'items')\nassert isinstance(b, Box) and not isinstance(3, Box)\n" \
            "assert b != Box() and b == b and [b] == [b]\n"
    result = fleet.run([Job(program, AssertTests(tests), FAST)])[0]
    assert result.passed, result.stderr[-800:]


# A value nested exactly at the codec's depth limit (100) crosses; the tests handing it back wrap it once
# more. The program made it so: the run is its error, never unverifiable (issue #42, item 6).
_NEST = "def nest(n):\n    x = 0\n    for _ in range(n):\n        x = [x]\n    return x\n"
_DEPTH_TESTS = "d = nest(NEST)\nassert depth(d) == NEST\n"


def _depth_task(task_id: str, nest: int) -> Task:
    solution = _NEST + "def depth(x):\n    n = 0\n    while type(x) is list:\n" \
                       "        x, n = x[0], n + 1\n    return n\n"
    buggy = solution.replace("n = 0\n    while", "n = 1\n    while")
    return Task(task_id, task_id, "Fix the bug.", buggy, solution,
                AssertTests(_DEPTH_TESTS.replace("NEST", str(nest))), timeout_s=30.0)


def test_a_program_cannot_make_its_own_run_unverifiable(fleet):
    """A wrong program answering at the depth limit is `error`; a half-wrong set's pass is 0.5, not 1.0."""
    right, wrong = _depth_task("depth/right", 5), _depth_task("depth/wrong", 5)
    at_limit = _NEST.replace("def nest(n):", "def nest(n):\n    n = 100")
    items = [(right, Prediction(right.task_id, code=right.solution)),
             (wrong, Prediction(wrong.task_id, code=wrong.buggy_code.replace(_NEST, at_limit)))]
    scores = score_predictions(items, fleet.run, limits=FAST, window_batch=4)
    assert [s.status for s in scores] == ["scored", "scored"], [(s.status, s.reason) for s in scores]
    assert [s.unit for s in scores] == [1, 0]
    assert aggregate([right, wrong], scores)["buggy"]["pass"] == 0.5
    result = fleet.run([Job(wrong.buggy_code.replace(_NEST, at_limit), wrong.tests, FAST)])[0]
    assert result.status == "error" and "over the limits" in result.stderr, result


def _score_cli(tmp_path, preds: list[Prediction]) -> tuple[int, list[dict], dict]:
    write_predictions(tmp_path / "preds.jsonl", preds)
    rc = main(["score", "--tasks", str(FIXTURE), "--predictions", str(tmp_path / "preds.jsonl"),
               "--out", str(tmp_path / "scores.jsonl"), "--summary-json", str(tmp_path / "summary.json"),
               "--workers", "2", "--no-progress"])
    rows = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    return rc, rows, json.loads((tmp_path / "summary.json").read_text())


def test_an_unverifiable_task_is_reported_counted_and_never_damage(tmp_path, capsys):
    """The task's tests pass a function to the program: the clean, untouched program is unverifiable."""
    preds = [Prediction(t.task_id, code=t.solution) for t in TASKS.values()]
    rc, rows, summary = _score_cli(tmp_path, preds)
    assert rc == 0
    row = next(r for r in rows if r["task_id"] == UNVERIFIABLE)
    assert row["status"] == "unverifiable" and "cannot cross" in row["reason"]
    assert row["unit"] == 0 and row["reward"] == 0.0 and row["damage"] is None
    assert all(r["status"] == "scored" and r["unit"] == 1 for r in rows if r["task_id"] != UNVERIFIABLE)
    assert summary["unverifiable"] == 1 and summary["unverifiable_tasks"] == 1
    assert summary["clean"] == {"tasks": 2, "noop": 1.0, "damage": 0.0}  # clean/lru_cache only
    assert summary["reward"] == pytest.approx((7 + 2 / 3) / 8)  # 7 fixed buggy tasks, one clean: (1 − λ)
    assert "unverifiable 1 (left out" in capsys.readouterr().out


def test_check_counts_unverifiable_runs_and_does_not_verify_their_task(tmp_path, capsys):
    rc = main(["check", "--tasks", str(FIXTURE), "--out", str(tmp_path / "check.jsonl"), "--workers", "2",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "unverifiable 1 (the judge could not verify them)" in err and f"not verified: {UNVERIFIABLE}" in err
    assert f"{len(TASKS) - 1}/{len(TASKS)} verified" in err
    records = [json.loads(line) for line in (tmp_path / "check.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records if r["task_id"] == UNVERIFIABLE] == ["unverifiable"]


def _scores_with_one_unverifiable():
    """One verifiable and one unverifiable score of the clean task, one damaging score of the other."""
    clean, callback = TASKS["clean/lru_cache"], TASKS[UNVERIFIABLE]
    kept = score_of(clean, True, 1, analyze(clean.buggy_code, clean.solution, clean.solution, 1), (), (), 1)
    lost = unverifiable_score(clean, True, None, 1, "a value of the tests cannot cross")
    other = unverifiable_score(callback, True, None, 1, "a value of the tests cannot cross")
    return [clean, callback], [kept, lost, other]


def test_aggregates_and_eval_columns_leave_unverifiable_rows_out():
    tasks, scores = _scores_with_one_unverifiable()
    summary = aggregate(tasks, scores)
    assert summary["clean"]["damage"] == 0.0 and summary["unverifiable"] == 2 and summary["unverifiable_tasks"] == 1
    assert summary["unverifiable_reasons"] == {"a value of the tests cannot cross": 2}
    values = stats.per_task_values(tasks, scores, lam=1 / 3)
    assert values["clean/lru_cache"]["damage"] == 0.0 and values["clean/lru_cache"]["noop"] == 1.0
    assert math.isnan(values[UNVERIFIABLE]["damage"])
    assert stats.columns(tasks, values, clean=True)["damage"]["value"] == 0.0
    summary = summarize(tasks, [], scores, EvalSettings(), {})  # eval's summary.json and report.md
    assert summary["unverifiable"] == {"count": 2, "tasks": 1, "reasons": {"a value of the tests cannot cross": 2}}
    assert summary["clean"]["damage"]["value"] == 0.0 and metrics_of(summary)["unverifiable"] == 2.0
    assert "unverifiable (the judge could not verify them; left out of every column): 2 predictions" \
        in report_markdown(summary)


def test_trainer_metrics_count_unverifiable_rollouts_and_leave_them_out_of_rollout_means():
    _, scores = _scores_with_one_unverifiable()

    class Completion:
        token_ids, budget_hit, finish_reason = [1, 2], False, "stop"

    cols = M.rollout_columns(scores, [Completion()] * 3, [False] * 3, think_end_id=99)
    m = M.rollout_metrics(cols, np.asarray([[s.unit, 0.0] for s in scores], np.float64), ("unit", "f1"),
                          group_size=3)
    assert m["reward/unverifiable"] == 2.0
    assert m["rollout/pass"] == 1.0 and m["rollout/reward"] == pytest.approx(2 / 3)
    assert m["reward/unit"] == pytest.approx(1 / 3)  # what the advantages saw: unverifiable rollouts get 0
