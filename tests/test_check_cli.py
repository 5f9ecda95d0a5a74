"""`precisecoder check` end to end on the bundled example and on broken inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from reward.schema import AssertTests, Task, load_tasks, write_tasks

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
        assert set(row) == {"task_id", "target", "mode", "passed", "status", "duration_s"}
        assert row["passed"] == (row["target"] == "solution")
    assert "4/4 verified" in proc.stderr


def test_predictions_run_and_invalid_ones_are_reported(tmp_path):
    out = tmp_path / "runs.jsonl"
    proc = check("--tasks", str(EXAMPLES / "tasks.jsonl"), "--predictions", str(EXAMPLES / "predictions.jsonl"),
                 "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["status"]) for r in rows] == [
        ("example/add#b0", "pass"), ("example/triangle#b0", "pass"),
        ("example/max_run#b0", "invalid"), ("example/clamp#clean", "pass")]
    assert "3/4 passed" in proc.stderr


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
