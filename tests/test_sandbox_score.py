"""Every attack in the battery scores reward 0 through `precisecoder score`; the right answers score 1."""

from __future__ import annotations

import json

from jaxrl.cli import main
from reward.schema import AssertTests, IOCase, IOTests, Prediction, Task, write_predictions, write_tasks
from sandbox_battery import (BUGGY, DEFAULT_BUGGY, DEFAULT_SOLUTION, FORGE_FRAMES, HOSTILE_ASSERT, HOSTILE_IO,
                             SOLUTIONS)


def _tasks_and_attacks() -> tuple[list[Task], list[Prediction]]:
    tasks, preds = [], []
    for name, (program, tests) in HOSTILE_ASSERT.items():
        tasks.append(_task(name, AssertTests(tests)))
        preds.append(Prediction(name, code=program))
    for name, (program, stdin, expected) in HOSTILE_IO.items():
        tasks.append(_task(name, IOTests((IOCase(stdin, expected),))))
        preds.append(Prediction(name, code=program))
    # The buggy program plus lines that forge a verdict: the forging lines must not pass for the fix.
    forge = FORGE_FRAMES.split("def answer")[0]
    preds += [Prediction(t.task_id, code=t.buggy_code + forge) for t in tasks]
    return tasks, preds


def _task(name: str, tests) -> Task:
    solution = SOLUTIONS.get(name, DEFAULT_SOLUTION)
    return Task(name, name, "make the tests pass", BUGGY.get(name, DEFAULT_BUGGY), solution, tests, timeout_s=30.0,
                memory_mb=256)


def test_attacks_score_zero_and_right_answers_score_one(tmp_path, capsys):
    tasks, attacks = _tasks_and_attacks()
    right = [Prediction(t.task_id, code=t.solution) for t in tasks]
    write_tasks(tmp_path / "tasks.jsonl", tasks)
    write_predictions(tmp_path / "preds.jsonl", attacks + right)
    rc = main(["score", "--tasks", str(tmp_path / "tasks.jsonl"), "--predictions", str(tmp_path / "preds.jsonl"),
               "--out", str(tmp_path / "scores.jsonl"), "--workers", "2", "--no-progress"])
    assert rc == 0
    scores = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    attack_scores, right_scores = scores[:len(attacks)], scores[len(attacks):]
    assert [(s["task_id"], s["unit"], s["reward"]) for s in attack_scores] == \
        [(p.task_id, 0, 0.0) for p in attacks]
    assert all(s["unit"] == 1 and s["reward"] == 1.0 for s in right_scores), right_scores


def test_windows_that_hang_alone_cannot_buy_worker_time():
    """A passing prediction whose module-level lines hang alone but not together (issue #24): each window run
    gets a timeout from the unit run's duration, is not retried, and all of them share a wall-time budget."""
    from reward.fleet import Fleet
    from reward.score import score_predictions, window_budget_s, window_timeout_s

    lines = []
    for i in range(12):
        lines += [f"B{i} = 1", f"W{i} = any(iter(lambda: 'B{i}' in globals(), True))"]  # one statement a line
    prediction = "\n".join(lines + ["f = lambda x: x + 2"]) + "\n"
    task = Task("hang", "hang", "fix", "f = lambda x: x + 1\n", "f = lambda x: x + 2\n",
                AssertTests("assert f(1) == 3\n"), timeout_s=5.0)
    log = []
    with Fleet(workers=2, cache=False, timeout_retries=1) as fleet:
        def run_batch(jobs):
            results = fleet.run(jobs)
            log.extend(zip(jobs, results))
            return results

        score, = score_predictions([(task, Prediction("hang", code=prediction))], run_batch, max_window_runs=16)
        assert fleet.stats.retries == 0
    unit_s = log[0][1].duration_s
    windows = [(job, result) for job, result in log if not job.retry_timeout]
    timeout = window_timeout_s(5.0, unit_s)
    assert score.unit == 1 and score.window_search_capped and timeout < 5.0
    assert {job.limits.timeout_s for job, _ in windows} == {timeout}
    assert any(result.status == "timeout" for _, result in windows)
    assert sum(result.duration_s for _, result in windows) <= window_budget_s(timeout, unit_s, 16) + 2 * timeout
