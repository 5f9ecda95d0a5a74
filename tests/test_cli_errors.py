"""Bad arguments and bad files end in one clear line and exit code 2, before any sandbox run, leaving no files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl.cli import main
from reward.schema import AssertTests, Task, write_tasks

GOOD = Task("t", "t", "p", "x = 1\n", "x = 2\n", AssertTests("assert x == 2\n"))


@pytest.fixture
def tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, [GOOD])
    return path


def _run(argv, capsys) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


@pytest.mark.parametrize("flag, value", [("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "-1"),
                                         ("--timeout", "1e999"), ("--workers", "-1"), ("--workers", "0"),
                                         ("--memory-mb", "0"), ("--memory-mb", "x")])
def test_bad_numbers(tasks, tmp_path, capsys, flag, value):
    for command in (["check", "--tasks", tasks], ["score", "--tasks", tasks, "--predictions", tasks,
                                                  "--out", tmp_path / "s.jsonl"]):
        rc, line = _run([*command, flag, value], capsys)
        assert rc == 2 and flag in line, line


def test_missing_output_directory_is_found_before_any_run(tasks, tmp_path, capsys, monkeypatch):
    import reward.fleet

    def no_fleet(*a, **k):
        raise AssertionError("a fleet was started")

    monkeypatch.setattr(reward.fleet.Fleet, "__init__", no_fleet)
    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"task_id": "t", "code": "x = 2"}) + "\n")
    for argv in (["check", "--tasks", tasks, "--out", tmp_path / "nope" / "r.jsonl"],
                 ["score", "--tasks", tasks, "--predictions", preds, "--out", tmp_path / "nope" / "s.jsonl"],
                 ["score", "--tasks", tasks, "--predictions", preds, "--out", tmp_path / "s.jsonl",
                  "--summary-json", tmp_path / "nope" / "x.json"],
                 ["data", "build", "--out", tasks / "sub"]):
        rc, line = _run(argv, capsys)
        assert rc == 2 and line.startswith("error: --"), line
    assert sorted(os.listdir(tmp_path)) == ["p.jsonl", "tasks.jsonl"]


@pytest.mark.parametrize("content, message", [
    (b'{"task_id": "\xff"}\n', "not valid UTF-8"),
    (json.dumps(dict(json.loads(json.dumps({"task_id": "a", "base_id": "a", "prompt": "p", "buggy_code": "x",
                                            "solution": "y", "tests": {"kind": "assert", "code": "pass"}})),
                     solution="\ud800")).encode() + b"\n", "lone surrogate"),
    (b'{"task_id": "a", "base_id": "a", "prompt": "p", "buggy_code": "x", "solution": "y", '
     b'"tests": {"kind": "assert", "code": "pass"}, "timeout_s": 1e999}\n', "timeout_s"),
    (b'{"task_id": "a", "base_id": "a", "prompt": "p", "buggy_code": "x", "solution": "y", '
     b'"tests": {"kind": "assert", "code": "pass"}, "timeout_s": NaN}\n', "NaN"),
    (b'{"task_id": "a", "base_id": "a", "prompt": "p", "buggy_code": "x", "solution": "y", '
     b'"tests": {"kind": "assert", "code": "pass"}, "memory_mb": 0}\n', "memory_mb"),
    (b"[" * 100000 + b"\n", "nested too deeply"),
])
def test_bad_task_files_name_the_line(tmp_path, capsys, content, message):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"\n" + content)
    rc, line = _run(["check", "--tasks", path], capsys)
    assert rc == 2 and f"{path}:2:" in line and message in line, line


@pytest.mark.parametrize("mbpp, message", [
    ('{"task_id": 1, "text": "t", "code": "x"}\n', "missing field 'test_list'"),
    ('{"task_id": 1, "text": "t", "code": 5, "test_list": []}\n', "field 'code' must be a string"),
    ('{"task_id": 1\n', "malformed JSON"),
    ("[1, 2]", "not a JSON object"),
])
def test_malformed_mbpp(tmp_path, capsys, mbpp, message):
    path = tmp_path / "mbpp.jsonl"
    path.write_text(mbpp)
    rc, line = _run(["data", "build", "--source", "none", "--mbpp", path, "--out", tmp_path / "out"], capsys)
    assert rc == 2 and message in line and str(path) in line, line
    assert not (tmp_path / "out").exists()


def test_malformed_pdb(tmp_path, capsys):
    data, tests = tmp_path / "pdb.json", tmp_path / "tests.json"
    data.write_text(json.dumps([{"task_id": "X_1", "task_prompt": "p", "buggy_code": "a", "gt_solution": "b"}]))
    tests.write_text(json.dumps({"Y": "assert True"}))
    out = tmp_path / "out.jsonl"
    rc, line = _run(["data", "import-pdb", "--data", data, "--tests", tests, "--out", out], capsys)
    assert rc == 2 and "no tests for PDB task 'X_1'" in line, line
    data.write_text(json.dumps([{"task_id": "X_1"}]))
    tests.write_text(json.dumps({"X": "assert True"}))
    rc, line = _run(["data", "import-pdb", "--data", data, "--tests", tests, "--out", out], capsys)
    assert rc == 2 and "record 1: missing field" in line, line
    assert sorted(os.listdir(tmp_path)) == ["pdb.json", "tests.json"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    from reward.schema import write_jsonl

    with pytest.raises(TypeError):
        write_jsonl(tmp_path / "out.jsonl", [{"ok": 1}, {"bad": {1, 2}}])
    assert os.listdir(tmp_path) == []


REPO = Path(__file__).parents[1]


def test_a_closed_pipe_ends_a_command_quietly_after_its_files_are_written(tmp_path):
    """`precisecoder score ... | head -1`: the reader is gone before the table is printed. The command
    ends with the shell's SIGPIPE status (141) and no traceback, and its scores file is complete."""
    examples = REPO / "reward" / "examples"
    cmd = [sys.executable, "-m", "jaxrl.cli", "score", "--tasks", str(examples / "tasks.jsonl"),
           "--predictions", str(examples / "predictions.jsonl"), "--out", "s.jsonl", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.stdout.close()  # the reader leaves at once, as `head` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 4


def test_no_arguments_print_the_help_and_exit_2(capsys):
    assert main([]) == 2
    assert "subcommands:" in capsys.readouterr().err
