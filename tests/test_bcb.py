"""BigCodeBench-style tasks: the mode each task's tests get (reward/modes.py), the importer
(`data import-bcb`) on hand-written fixtures, and BigCodeBench's own references in `check`."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from jaxrl.cli import main as cli_main
from reward.data.bcb import bcb_problem, bcb_problems, drop_category, library_coverage, plain_python_failure
from reward.fleet import Fleet
from reward.modes import SET_IN_FILE, choose_mode, process_features
from reward.sandbox import Job
from reward.schema import (AssertTests, IOCase, IOTests, SchemaError, Task, UnittestTests, load_tasks,
                           tests_from_json as parse_tests, write_tasks)

FIXTURE = Path(__file__).parent / "fixtures" / "bcb_tasks.jsonl"
# The repository's ../shared/data (CI, the main checkout), or one level further up (a worktree beside it).
SHARED_BCB = next((p for p in (Path(__file__).resolve().parents[n] / "shared" / "data" / "bigcodebench_pdb200.jsonl"
                               for n in (2, 3)) if p.exists()), None)
needs_bcb = pytest.mark.skipif(SHARED_BCB is None, reason="shared/data/bigcodebench_pdb200.jsonl absent "
                                                          "(the repository's ../shared/data)")
SAMPLE = 8


@pytest.mark.parametrize("code, kind, line", [
    ("from unittest.mock import patch\n\nwith patch('random.randint', return_value=3):\n    assert f() == 3\n",
     "mock: unittest.mock", 1),
    ("import os, tempfile\nd = tempfile.mkdtemp()\nassert f(d) == []\n", "files: tempfile", 1),
    ("d = mkdtemp()\nassert f(d) == []\n", "files: mkdtemp", 1),
    ("assert f(1) == 2\nwith open('data.txt', 'w') as fh:\n    fh.write('x')\nassert g('data.txt')\n",
     "files: open", 2),
    ("import os\nos.chdir('/tmp')\nassert f() == '/tmp'\n", "cwd/env: os.chdir", 2),
    ("import os\nos.environ['K'] = 'v'\nassert f() == 'v'\n", "cwd/env: os.environ", 2),
    ("import random\nrandom.seed(7)\nassert f() == 5\n", "seeds: random.seed", 2),
    ("import numpy as np\n\nnp.random.seed(0)\nassert f() == 1\n", "seeds: np.random.seed", 3),
    ("import io, sys\nsys.stdout = io.StringIO()\nf()\nassert sys.stdout.getvalue() == 'hi\\n'\n",
     "stdio: sys.stdout", 2),
    ("from contextlib import redirect_stdout\nassert f() is None\n", "stdio: contextlib.redirect_stdout", 1),
])
def test_assert_tests_that_need_the_programs_process_run_inprocess_and_say_why(code, kind, line):
    mode, reason = choose_mode(AssertTests(code))
    assert mode == "inprocess" and f"{kind} (line {line})" in reason, reason


def test_plain_assert_tests_run_in_proxy_mode():
    assert choose_mode(AssertTests("import math\nassert f(3) == 6\nassert math.isclose(g(0.5), 1.0)\n"))[0] == "proxy"
    assert choose_mode(AssertTests("df_text = frame.to_csv()\nassert f(2) == 4\n"))[0] == "proxy"  # no path: no file


def test_other_kinds_and_an_explicit_mode():
    assert choose_mode(IOTests((IOCase("1\n", "2\n"),)))[0] == "io"
    mode, reason = choose_mode(UnittestTests("import unittest\nfrom unittest.mock import patch\n"))
    assert mode == "inprocess" and "unittest tests share the program's process" in reason and "(line 2)" in reason
    assert choose_mode(AssertTests("assert f() == 1\n", "inprocess")) == ("inprocess", SET_IN_FILE)
    assert choose_mode(AssertTests("assert f() == 1\n", "proxy")) == ("proxy", SET_IN_FILE)
    assert process_features("def broken(:\n") == ()


def test_proxy_mode_is_refused_for_tests_that_need_the_programs_process(tmp_path):
    record = {"task_id": "t", "base_id": "b", "prompt": "p", "buggy_code": "x = 1\n", "solution": "x = 2\n",
              "tests": {"kind": "assert", "mode": "proxy", "code": "import random\nrandom.seed(1)\nassert x == 2\n"}}
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(SchemaError, match=r"t.jsonl:1: tests.mode 'proxy' .*\(seeds: random.seed \(line 2\)\)"):
        load_tasks(tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match="drop the mode"):
        parse_tests({"kind": "assert", "code": "from unittest.mock import patch\n", "mode": "proxy"})
    assert parse_tests({"kind": "assert", "code": "assert True\n", "mode": "proxy"}).mode == "proxy"


PATCHED = Task("patched", "patched", "Roll a die.", "import random\ndef roll():\n    return random.randint(1, 5)\n",
               "import random\ndef roll():\n    return random.randint(1, 6)\n",
               AssertTests("from unittest.mock import patch\nwith patch('random.randint', side_effect=lambda a, b: b):\n"
                           "    assert roll() == 6\n"))


def test_check_reports_mode_and_reason_and_a_patching_test_judges_the_program_not_the_harness(tmp_path, capsys):
    """Reproducer: these tests patch `random.randint`; in proxy mode (the old default) the patch
    acts on the judge's process and the correct solution fails."""
    write_tasks(tmp_path / "tasks.jsonl", [PATCHED])
    code = cli_main(["check", "--tasks", str(tmp_path / "tasks.jsonl"), "--out", str(tmp_path / "runs.jsonl"),
                     "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert code == 0, (err, rows)
    assert [(r["target"], r["mode"], r["passed"]) for r in rows] == [("solution", "inprocess", True),
                                                                     ("buggy", "inprocess", False)]
    assert "mock: unittest.mock (line 1)" in rows[0]["mode_reason"]
    assert "tasks per mode: inprocess 1" in err and "1/1 verified" in err


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    """The fixture set through `data import-bcb`, every kept task in a split file (train included)."""
    out = tmp_path_factory.mktemp("bcb") / "out"
    assert cli_main(["data", "import-bcb", "--input", str(FIXTURE), "--out", str(out), "--workers", "2",
                     "--no-progress", "--max-per-operator", "2"]) == 0
    return out


def test_fixtures_are_bigcodebench_records_whose_tests_pass_in_plain_python():
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert len(records) == 10 and {"task_id", "complete_prompt", "instruct_prompt", "canonical_solution", "code_prompt",
                                    "test", "entry_point", "doc_struct", "libs"} <= set(records[0])
    for rec in records:
        assert plain_python_failure(rec) is None, rec["task_id"]


def test_imported_fixture_tasks_verify_in_the_mode_check_chooses(imported, tmp_path, capsys):
    """Every solution passes and every planted bug fails, from the task files as written (no mode field):
    no problem is dropped (numpy, pandas and matplotlib come from the library environment)."""
    manifest = json.loads((imported / "manifest.json").read_text())
    assert manifest["problems_dropped_reasons"] == {} and manifest["problems_per_mode"] == {"inprocess": 10}
    assert manifest["libraries"]["pandas"] == {"problems": 1, "kept": 1, "dropped": {}}
    files = [imported / f"{name}.jsonl" for name in ("train", "val", "test", "gt_debug")]
    lines = [line for f in files for line in f.read_text().splitlines()]
    assert all("mode" not in json.loads(line)["tests"] for line in lines)
    (tmp_path / "all.jsonl").write_text("".join(line + "\n" for line in lines))
    tasks = load_tasks(tmp_path / "all.jsonl")
    assert {t.base_id for t in tasks} == {p.base_id for p in bcb_problems(FIXTURE)}
    assert sum(not t.is_clean for t in tasks) >= 5 * 9  # bugs in every problem but GT Debug's
    code = cli_main(["check", "--tasks", str(tmp_path / "all.jsonl"), "--out", str(tmp_path / "runs.jsonl"),
                     "--workers", "2", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert all(r["mode"] == "inprocess" and r["status"] != "unverifiable" for r in rows)
    assert all(r["passed"] == (r["target"] == "solution") for r in rows)


def test_import_bcb_drops_a_failing_reference_with_its_reason_and_reads_only_the_first_n(tmp_path, capsys):
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()][2:5]
    records[1] = {**records[1], "task_id": "Broken/1", "libs": "['random', 'no_such_library']",
                  "complete_prompt": "import no_such_library\n" + records[1]["complete_prompt"]}
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli_main(["data", "import-bcb", "--input", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out"),
                     "--limit", "2", "--max-per-operator", "0", "--workers", "1", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert summary["problems_dropped"] == 1 and manifest["problems"] == {"bigcodebench": 2}
    assert manifest["problems_dropped_reasons"] == {
        "Broken/1": "error: the program did not load (line 1): ModuleNotFoundError: No module named 'no_such_library'"}
    assert manifest["libraries"]["no_such_library"] == {"problems": 1, "kept": 0,
                                                        "dropped": {"missing library no_such_library": 1}}
    assert manifest["problems_mode_reasons"] == {
        "Fixture/3": "unittest tests share the program's process: mock: unittest.mock (line 2)"}


def test_library_coverage_counts_kept_and_dropped_per_library():
    coverage = library_coverage({"A": ["numpy", "os"], "B": ["numpy"], "C": ["os"]}, ["A", "C"],
                                {"B": "error: ModuleNotFoundError: No module named 'numpy.linalg'"})
    assert coverage == {"numpy": {"problems": 2, "kept": 1, "dropped": {"missing library numpy": 1}},
                        "os": {"problems": 2, "kept": 2, "dropped": {}}}
    assert drop_category("error: urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name "
                         "resolution>") == "network"
    assert drop_category("error: FileNotFoundError: [Errno 2] No such file") == "files (FileNotFoundError)"
    assert drop_category("timeout: timeout") == "timeout"
    assert drop_category("error: the program did not load (line 41): RuntimeError: refused in the sandbox: import "
                         "ctypes") == "refused by the inprocess harness: import ctypes"


def bcb_records() -> list[dict]:
    return [json.loads(line) for line in SHARED_BCB.read_text().splitlines() if line.strip()]


def common_libraries_only(rec: dict) -> bool:
    """Its libraries are the standard library's, numpy, pandas and matplotlib (the default preload)."""
    return all(lib.split(".")[0] in sys.stdlib_module_names or lib in ("numpy", "pandas", "matplotlib")
               for lib in ast.literal_eval(rec["libs"]))


def references_pass_check(records: list[dict], tmp_path: Path, capsys) -> None:
    """Every reference that passes in plain Python passes `check` as a clean task (a 60 s limit)."""
    good = [rec for rec in records if plain_python_failure(rec) is None]
    assert good, "no reference passes in plain Python here"
    tasks = [Task(p.base_id, p.base_id, p.prompt, p.solution, p.solution, p.tests) for p in
             (bcb_problem(rec) for rec in good)]
    write_tasks(tmp_path / "tasks.jsonl", tasks)
    code = cli_main(["check", "--tasks", str(tmp_path / "tasks.jsonl"), "--out", str(tmp_path / "runs.jsonl"),
                     "--workers", "2", "--no-progress", "--timeout", "60"])
    rows = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    failed = {r["task_id"]: r["reason"] for r in rows if not r["passed"]}
    assert code == 0 and not failed, (f"{len(failed)} of {len(good)} references that pass in plain Python do not pass "
                                      f"check", failed, capsys.readouterr().err[-2000:])


@needs_bcb
def test_a_sample_of_bigcodebench_references_pass_check(tmp_path, capsys):
    candidates = [rec for rec in bcb_records() if common_libraries_only(rec)]
    sample = candidates[::len(candidates) // SAMPLE][:SAMPLE]
    references_pass_check(sample, tmp_path, capsys)


@needs_bcb
@pytest.mark.slow
def test_every_bigcodebench_reference_that_passes_in_plain_python_passes_check(tmp_path, capsys):
    references_pass_check(bcb_records(), tmp_path, capsys)
