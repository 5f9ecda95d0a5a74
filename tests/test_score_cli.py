"""`precisecoder score`: outputs, summary, and the errors it must raise."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl.cli import main
from reward.schema import AssertTests, Prediction, Task, write_predictions, write_tasks

BUGGY = "def inc(x):\n    return x + 2\n\ndef dec(x):\n    return x - 1\n"
FIXED = BUGGY.replace("x + 2", "x + 1")
TESTS = AssertTests("assert inc(1) == 2\nassert dec(1) == 0\n")
TASKS = [
    Task("inc#1", "inc", "increment", BUGGY, FIXED, TESTS),
    Task("inc#clean", "inc", "increment", FIXED, FIXED, TESTS),
    Task("inc#2", "inc", "increment", BUGGY, FIXED, TESTS, epsilon=0),
]
KEYS = {"task_id", "valid", "unit", "precision", "recall", "f1", "edited_lines", "faults", "faults_fixed",
        "noop", "damage", "reward", "blocks", "components", "runs", "window_search_capped"}


def _files(tmp_path, predictions):
    tasks, preds = tmp_path / "tasks.jsonl", tmp_path / "preds.jsonl"
    write_tasks(tasks, TASKS)
    write_predictions(preds, predictions)
    return tasks, preds


def test_scores_summary_and_missing_tasks(tmp_path, capsys):
    tasks, preds = _files(tmp_path, [
        Prediction("inc#1", response=f"<think>x</think>\n```python\n{FIXED}```"),
        # Fix + unrelated edit of line 5 (3 lines away): p = 1/2, f1 = 2/3, reward = 2/3 + 2/9.
        Prediction("inc#1", code=FIXED.replace("x - 1", "x + -1")),
        Prediction("inc#clean", response="no code"),
    ])
    out, summary = tmp_path / "scores.jsonl", tmp_path / "summary.json"
    rc = main(["score", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(out),
               "--summary-json", str(summary), "--workers", "2", "--no-progress"])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["inc#1", "inc#1", "inc#clean"]
    assert all(KEYS <= set(r) for r in rows)
    assert (rows[0]["unit"], rows[0]["precision"], rows[0]["reward"]) == (1, 1.0, 1.0)
    assert abs(rows[1]["reward"] - 8 / 9) < 1e-12 and rows[1]["edited_lines"] == 2
    assert (rows[2]["valid"], rows[2]["damage"], rows[2]["precision"], rows[2]["noop"]) == (False, 1, None, False)
    s = json.loads(summary.read_text())
    # Buggy: inc#1 averages (1, 1) pass, precision (1 + 1/2)/2; inc#2 is missing (invalid, 0).
    assert s["buggy"]["tasks"] == 2 and s["missing"] == 1
    assert abs(s["buggy"]["pass"] - 0.5) < 1e-12 and abs(s["buggy"]["precision"] - 0.375) < 1e-12
    assert s["buggy"]["lines"] == 1.5
    assert s["clean"] == {"tasks": 1, "noop": 0.0, "damage": 1.0}
    captured = capsys.readouterr()
    assert "50.0" in captured.out and "37.5" in captured.out and "1.50" in captured.out
    assert "inc#2" in captured.err and "no prediction" in captured.err


def test_epsilon_flag_and_task_override(tmp_path):
    # One block of two edits over line 2: insert "y = x" at 1.5, modify to "return y + 1"; ℓ_K = 2.
    code = FIXED.replace("    return x + 1", "    y = x\n    return y + 1")
    tasks, preds = _files(tmp_path, [Prediction("inc#1", code=code), Prediction("inc#2", code=code)])
    out = tmp_path / "scores.jsonl"
    assert main(["score", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(out),
                 "--epsilon", "3", "--workers", "1", "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # inc#1 (ε = 3, cap 4): windows of 1: [insert y = x] fails, [modify → y + 1] fails (y undefined):
    # |ess| = 2, credit 2, p = 1. inc#2 (ε = 0, cap 1): credit 1, p = 1/2.
    assert [r["precision"] for r in rows] == [1.0, 0.5]
    assert [r["runs"] for r in rows] == [3, 1]


def test_max_window_runs_and_think_opened_flags(tmp_path):
    # Comment + fix in one block: windows [insert comment] (fails), [modify] (passes). With
    # --max-window-runs 1 the bound is reached first: |ess| = ℓ_K = 2, credit 2, p = 1, capped.
    code = FIXED.replace("    return x + 1", "    # off by one\n    return x + 1")
    answer = f"```python\n{FIXED}```"
    tasks, preds = _files(tmp_path, [Prediction("inc#1", code=code), Prediction("inc#1", response=answer),
                                     Prediction("inc#1", response=answer, think_opened=False)])
    out = tmp_path / "scores.jsonl"
    args = ["score", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(out), "--workers", "1",
            "--no-progress"]
    assert main(args + ["--max-window-runs", "1", "--think-opened"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert (rows[0]["precision"], rows[0]["window_search_capped"], rows[0]["runs"]) == (1.0, True, 2)
    # --think-opened: a response without </think> has no answer, unless the record says otherwise.
    assert [r["valid"] for r in rows[1:]] == [False, True]
    assert main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert (rows[0]["precision"], rows[0]["window_search_capped"]) == (0.5, False)
    assert [r["valid"] for r in rows[1:]] == [True, True]


def test_malformed_record_names_file_and_line(tmp_path, capsys):
    tasks, preds = _files(tmp_path, [Prediction("inc#1", code=FIXED)])
    preds.write_text(preds.read_text() + '{"task_id": "inc#1"}\n')
    rc = main(["score", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert f"{preds}:2:" in capsys.readouterr().err


def test_unknown_task_is_an_error(tmp_path, capsys):
    tasks, preds = _files(tmp_path, [Prediction("inc#1", code=FIXED), Prediction("nope", code=FIXED)])
    rc = main(["score", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{preds}:2:" in err and "nope" in err
    assert not (tmp_path / "o").exists()


def test_bad_json_in_tasks(tmp_path, capsys):
    tasks, preds = _files(tmp_path, [Prediction("inc#1", code=FIXED)])
    tasks.write_text(tasks.read_text() + "{oops\n")
    assert main(["score", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(tmp_path / "o")]) == 2
    assert f"{tasks}:4:" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_score_prints_table_and_json():
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_score.py"
    done = subprocess.run([sys.executable, str(script), "--tasks", "6", "--k", "2", "--workers", "2", "--json",
                           "--worst-lines", "300"],
                          capture_output=True, text=True, timeout=300, check=True)
    lines = done.stdout.strip().splitlines()
    assert "preds/s" in done.stdout
    summary = json.loads(lines[-1])
    assert set(summary) == {"predictions_per_s", "runs_per_prediction", "batch96_s", "worst_case"}
    # 300 lines before the fix: the first 256 windows (comments) fail, so the bound caps the search.
    assert summary["worst_case"]["before"]["runs"] <= 2 + 256 and summary["worst_case"]["before"]["window_search_capped"]
    assert not summary["worst_case"]["after"]["window_search_capped"]
