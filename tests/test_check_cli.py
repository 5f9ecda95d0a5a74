"""`precisecoder check` end to end on the bundled example and on broken inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from reward.schema import AssertTests, IOCase, IOTests, Prediction, Task, load_tasks, write_predictions, write_tasks

EXAMPLES = Path(__file__).resolve().parents[1] / "reward" / "examples"


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxrl.cli", "check", "--no-progress", *args],
                          capture_output=True, text=True, timeout=120)


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "jaxrl.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "check" in out.stdout
    sub = subprocess.run([sys.executable, "-m", "jaxrl.cli", "check", "--help"], capture_output=True, text=True)
    assert sub.returncode == 0 and "--predictions" in sub.stdout
    bad = subprocess.run([sys.executable, "-m", "jaxrl.cli", "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command" in bad.stderr


def test_bundled_task_set_verifies(tmp_path):
    out = tmp_path / "runs.jsonl"
    proc = check("--tasks", str(EXAMPLES / "tasks.jsonl"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    tasks = load_tasks(EXAMPLES / "tasks.jsonl")
    assert len(rows) == 2 * len(tasks) - sum(t.is_clean for t in tasks)
    for row in rows:
        assert set(row) == {"task_id", "target", "mode", "mode_reason", "passed", "status", "reason", "duration_s"}
        assert row["passed"] == (row["target"] == "solution")
        assert (row["reason"] is None) == row["passed"]
    assert "4/4 verified" in proc.stderr


def test_predictions_run_and_invalid_ones_are_reported(tmp_path):
    out = tmp_path / "runs.jsonl"
    proc = check("--tasks", str(EXAMPLES / "tasks.jsonl"), "--predictions", str(EXAMPLES / "predictions.jsonl"),
                 "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["status"], r["reason"]) for r in rows] == [
        ("example/add#b0", "pass", None), ("example/triangle#b0", "pass", None),
        ("example/max_run#b0", "invalid", "think block never closed"), ("example/clamp#clean", "pass", None)]
    assert "3/4 passed" in proc.stderr


def test_check_says_why_runs_failed(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, [Task("f", "f", "", "def f(x):\n    return x\n", "def f(x):\n    return x + 1\n",
                             AssertTests("assert f(1) == 2\n"), timeout_s=1.0),
                        Task("io", "io", "", "print(int(input()))\n", "print(int(input()) + 1)\n",
                             IOTests((IOCase("1\n", "2\n"),)))])
    preds = tmp_path / "preds.jsonl"
    write_predictions(preds, [
        Prediction("f", code="def f(x):\n    return x\n"),  # the buggy program: the assert fails
        Prediction("f", code="def f(x):\n    return y\n"),
        Prediction("f", code="def f(x):\n    while True:\n        pass\n"),
        Prediction("f", code="import sys\nsys.exit(0)\n"),
        Prediction("f", response="Just add one."),
        Prediction("f", response="Draft:\n```python\ndef f(x):\n    return x + 1\n```", think_opened=True),
        Prediction("io", code="print(int(input()))\n"),
        Prediction("io", code="print(int(input()) + z)\n"),
    ])
    out = tmp_path / "runs.jsonl"
    proc = check("--tasks", str(tasks), "--predictions", str(preds), "--out", str(out), "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["status"], r["reason"]) for r in rows] == [
        ("fail", "AssertionError"), ("error", "NameError: name 'y' is not defined"), ("timeout", "timeout"),
        ("error", "exited before the tests finished"), ("invalid", "no closed code block"),
        ("invalid", "think block never closed"), ("fail", "wrong output"),
        ("error", "NameError: name 'z' is not defined")]


def test_think_opened_flag_applies_to_predictions_without_the_field(tmp_path):
    preds = tmp_path / "preds.jsonl"
    write_predictions(preds, [Prediction("example/add#b0", response="```python\ndef add(a, b):\n    return a + b\n```"),
                              Prediction("example/add#b0", response="```python\ndef add(a, b):\n    return a + b\n```",
                                         think_opened=False)])
    out = tmp_path / "runs.jsonl"
    proc = check("--tasks", str(EXAMPLES / "tasks.jsonl"), "--predictions", str(preds), "--out", str(out),
                 "--think-opened")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["status"], r["reason"]) for r in rows] == [("invalid", "think block never closed"), ("pass", None)]


def test_unverified_task_set_exits_1(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, [Task("ok", "ok", "", "x = 1", "x = 2", AssertTests("assert x == 2")),
                       Task("bad", "bad", "", "x = 2", "x = 3", AssertTests("assert x > 1"))])
    proc = check("--tasks", str(path))
    assert proc.returncode == 1
    assert "1/2 verified" in proc.stderr and "not verified: bad" in proc.stderr


def test_bad_inputs_are_clear_errors(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task_id": "a"}\n')
    proc = check("--tasks", str(path))
    assert proc.returncode == 2 and f"{path}:1: missing field 'base_id'" in proc.stderr
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"task_id": "nope", "code": "x = 1"}\n')
    proc = check("--tasks", str(EXAMPLES / "tasks.jsonl"), "--predictions", str(preds))
    assert proc.returncode == 2 and "unknown tasks: nope" in proc.stderr
