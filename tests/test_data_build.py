"""The data builder: rejection rules in the sandbox, composition, splits, determinism, sources and the CLI."""

import collections
import dataclasses
import json
import os
import textwrap
from pathlib import Path

import pytest

from jaxrl.cli import main as cli_main
from reward.data.build import (MIN_GAP, MULTI, MULTI_LINE, SINGLE, BuildConfig, Candidate, build, sample_multi,
                               sample_multi_line, screen, split_of, write)
from reward.data.mutations import Edit, Mutant, single_line_mutants
from reward.data.sources import Problem, SourceError, humaneval_problems, mbpp_problems, pdb_tasks
from reward.diff import diff
from reward.fleet import Fleet
from reward.sandbox import Job
from reward.schema import AssertTests, load_tasks

FIXTURES = Path(__file__).parent / "fixtures"
SHARED_MBPP = Path(__file__).parents[2] / "shared" / "data" / "mbpp.jsonl"

LOOP = Problem("T/loop", "toy", "Sum 0..n-1, checking the count.", textwrap.dedent("""\
    def f(n):
        total = 0
        step = 1
        count = 0
        for i in range(n):
            total += i * step
            count += 1
        assert count == n
        return total
    """), AssertTests("assert f(4) == 6\nassert f(0) == 0\nassert f(1) == 0\n"))


def fault(line: int, text: str | None, operator: str = "hand") -> Mutant:
    return Mutant(operator, "Algorithm", (Edit(line, text),))


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


@pytest.fixture(scope="module")
def run(fleet):
    return lambda jobs, phase: fleet.run(jobs)


def test_single_fault_rejection_rules(run):
    kept_fault = fault(4, "    for i in range(n + 1):")
    candidates = [
        Candidate(LOOP, SINGLE, (fault(1, "    total = 0 * 1"),)),  # still passes
        Candidate(LOOP, SINGLE, (fault(1, "    while n >= 0: pass"),)),  # times out
        Candidate(LOOP, SINGLE, (Mutant("hand", "Algorithm", (Edit(1, "    total = 1"), Edit(8, "    return total + 1"))),)),
        Candidate(LOOP, SINGLE, (kept_fault,)),
        Candidate(LOOP, SINGLE, (kept_fault,)),  # the same buggy program again
    ]
    stats, seen = collections.Counter(), {LOOP.solution}
    kept = screen(candidates, run, seen, "test", stats)
    assert [k.candidate.parts for k in kept] == [(kept_fault,)]
    assert kept[0].program in seen
    assert kept[0].status == "fail"  # an assertion of the tests, not a crash
    assert stats == {"candidates": 5, "kept": 1, "still_passes": 1, "timeout": 1, "diff_shape": 1, "duplicate": 1}


def test_multi_fault_needs_every_fault(run):
    plus_one, minus_one = fault(1, "    total = 1"), fault(8, "    return total - 1")
    wrong_range, no_op = fault(4, "    for i in range(n + 1):"), fault(2, "    step = 1 * 1")
    candidates = [
        Candidate(LOOP, MULTI, (plus_one, wrong_range)),  # both matter: kept
        Candidate(LOOP, MULTI, (plus_one, wrong_range, minus_one)),  # plus_one and minus_one cancel
        Candidate(LOOP, MULTI, (no_op, minus_one)),  # no_op alone passes
        Candidate(LOOP, MULTI, (plus_one, minus_one)),  # the two cancel: passes
    ]
    stats = collections.Counter()
    kept = screen(candidates, run, {LOOP.solution}, "test", stats)
    assert [k.candidate.parts for k in kept] == [(plus_one, wrong_range)]
    assert stats == {"candidates": 4, "kept": 1, "fault_not_needed": 2, "still_passes": 1}
    assert len(diff(kept[0].program, LOOP.solution)) == 2


def test_multi_line_fault_must_be_one_block_and_atomic(run):
    double = fault(5, "        total += i * step * 2")
    candidates = [
        Candidate(LOOP, MULTI_LINE, (double, fault(6, "        count += 2"))),  # atomic: kept
        Candidate(LOOP, MULTI_LINE, (double, fault(6, "        count += 1 * 1"))),  # a partial revert passes
        Candidate(LOOP, MULTI_LINE, (double, fault(8, "    return total + 1"))),  # not contiguous: two blocks
    ]
    stats = collections.Counter()
    kept = screen(candidates, run, {LOOP.solution}, "test", stats)
    assert len(kept) == 1 and kept[0].candidate is candidates[0]
    (block,) = diff(kept[0].program, LOOP.solution)
    assert len(block) == 2
    assert stats == {"candidates": 3, "kept": 1, "fault_not_needed": 1, "diff_shape": 1}


def test_sample_multi_keeps_faults_apart_and_is_deterministic():
    problem = humaneval_problems()[129]
    singles = single_line_mutants(problem.solution, problem.frozen_lines, "0")
    cfg = BuildConfig(multi_per_k=5)
    got = sample_multi(problem, singles, cfg)
    assert got == sample_multi(problem, singles, cfg)
    assert {len(c.parts) for c in got} == {2, 3, 4}
    nonblank = [i for i, line in enumerate(problem.solution.split("\n")) if line.strip()]
    for c in got:
        ranks = [nonblank.index(m.edits[0].line) for m in c.parts]
        assert all(b - a >= MIN_GAP for a, b in zip(ranks, ranks[1:])), ranks


def test_sample_multi_line_uses_contiguous_lines():
    problem = humaneval_problems()[129]
    singles = single_line_mutants(problem.solution, problem.frozen_lines, "0")
    nonblank = [i for i, line in enumerate(problem.solution.split("\n")) if line.strip()]
    got = sample_multi_line(problem, singles, BuildConfig(multi_line_per_problem=6))
    assert len(got) == 6
    for c in got:
        ranks = [nonblank.index(e.line) for m in c.parts for e in m.edits]
        assert 2 <= len(ranks) <= 4 and ranks == list(range(ranks[0], ranks[0] + len(ranks)))


def test_splits_are_disjoint_deterministic_and_per_source():
    problems = [Problem(f"A/{i}", "a", "", "", AssertTests("")) for i in range(50)] + \
               [Problem(f"B/{i}", "b", "", "", AssertTests("")) for i in range(20)]
    splits = split_of(problems, BuildConfig(seed=3))
    assert splits == split_of(problems, BuildConfig(seed=3))
    assert splits != split_of(problems, BuildConfig(seed=4))
    old = split_of(problems, BuildConfig(seed=3, gt_debug_from_val_test=True))
    for source, n in (("A", 50), ("B", 20)):
        mine = [splits[f"{source}/{i}"] for i in range(n)]
        assert mine.count("val") == mine.count("test") == mine.count("gt_debug") == round(0.1 * n)
        assert mine.count("train") == n - 3 * round(0.1 * n)
        # The old layout holds no problem out for GT Debug; val and test are the same problems in both.
        theirs = [old[f"{source}/{i}"] for i in range(n)]
        assert "gt_debug" not in theirs and theirs.count("train") == n - 2 * round(0.1 * n)
        assert all((a == b) or (a, b) == ("gt_debug", "train") for a, b in zip(mine, theirs))
    with pytest.raises(ValueError, match="gt_debug_fraction"):
        BuildConfig(val_fraction=0.4, gt_debug_fraction=0.2)


def test_gt_debug_problems_are_in_no_other_split_and_the_old_layout_overlaps_test(run):
    """4 HumanEval problems at 25% each: one val, one test, one GT Debug (no mutants), one train."""
    problems = humaneval_problems()[:4]
    cfg = BuildConfig(seed=1, max_per_operator=1, multi_per_k=0, multi_line_per_problem=0, val_fraction=0.25,
                      gt_debug_fraction=0.25)
    result = build(problems, run, cfg)
    files, manifest = result.files, result.manifest
    bases = {name: {t.base_id for t in files[name]} for name in ("train", "val", "test", "gt_debug")}
    assert manifest["base_problems"] == {"train": 1, "val": 1, "test": 1, "gt_debug": 1}
    assert len(files["gt_debug"]) == 1 and files["gt_debug"][0].is_clean
    assert files["gt_debug"][0].meta["split"] == "gt_debug"
    assert not bases["gt_debug"] & (bases["train"] | bases["val"] | bases["test"])
    assert manifest["config"]["gt_debug_fraction"] == 0.25 and not manifest["config"]["gt_debug_from_val_test"]

    old = build(problems, run, dataclasses.replace(cfg, gt_debug_from_val_test=True))
    old_bases = {name: {t.base_id for t in old.files[name]} for name in ("train", "val", "test", "gt_debug")}
    assert old.manifest["base_problems"] == {"train": 2, "val": 1, "test": 1, "gt_debug": 0}
    assert old_bases["gt_debug"] == old_bases["val"] | old_bases["test"] == bases["val"] | bases["test"]
    assert old_bases["train"] == bases["train"] | bases["gt_debug"]
    assert {t.meta["split"] for t in old.files["gt_debug"]} == {"val", "test"}


def small_problems():
    return [LOOP, *humaneval_problems()[:4]]


def read_dir(path):
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path)) if not name.startswith(".")}


def test_build_is_verified_split_by_problem_and_deterministic(tmp_path, run, fleet):
    cfg = BuildConfig(seed=5, max_per_operator=2)
    first = build(small_problems(), run, cfg)
    write(first, tmp_path / "a")
    with Fleet(workers=2, cache=False) as fresh:  # the same verdicts again, without the cache
        write(build(small_problems(), lambda jobs, phase: fresh.run(jobs), cfg), tmp_path / "b")
    assert read_dir(tmp_path / "a") == read_dir(tmp_path / "b")

    files = {name: load_tasks(tmp_path / "a" / f"{name}.jsonl") for name in ("train", "val", "test", "gt_debug")}
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["files"] == {name: len(tasks) for name, tasks in files.items()}
    assert manifest["seed"] == 5 and manifest["version"]
    bases = {name: {t.base_id for t in files[name]} for name in ("train", "val", "test")}
    assert not (bases["train"] & bases["val"]) and not (bases["train"] & bases["test"]) and not (bases["val"] & bases["test"])
    assert all(t.is_clean and t.base_id not in bases["train"] for t in files["gt_debug"])
    assert len(files["gt_debug"]) == manifest["base_problems"]["gt_debug"]
    assert not {t.base_id for t in files["gt_debug"]} & (bases["train"] | bases["val"] | bases["test"])

    buggy = [t for name in ("train", "val", "test") for t in files[name]]
    assert len({t.buggy_code for t in buggy}) == len(buggy)
    assert {t.meta["kind"] for t in buggy} == {SINGLE, MULTI, MULTI_LINE}
    assert sum(manifest["counts"]["kind"].values()) == len(buggy)
    for t in buggy:
        blocks = diff(t.buggy_code, t.solution)
        assert len(blocks) == t.meta["faults"] == (1 if t.meta["kind"] != MULTI else len(t.meta["operators"]))
    results = fleet.run([Job(t.buggy_code, t.tests) for t in buggy] + [Job(t.solution, t.tests) for t in files["gt_debug"]])
    assert not any(r.passed for r in results[:len(buggy)]) and all(r.passed for r in results[len(buggy):])


def write_mbpp(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


MBPP_RECORDS = [
    {"task_id": 1, "text": "Write a function to count the vowels in a string.",
     "code": "def count_vowels(s):\r\n    n = 0\r\n    for c in s.lower():\r\n        if c in 'aeiou':\r\n            n += 1\r\n    return n",
     "test_list": ["assert count_vowels('Hello') == 2", "assert count_vowels('') == 0", "assert count_vowels('AEx') == 2"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 2, "text": "Write a function to find the largest of three numbers.",
     "code": "def largest(a, b, c):\r\n    if a >= b and a >= c:\r\n        return a\r\n    if b >= c:\r\n        return b\r\n    return c",
     "test_list": ["assert largest(1, 2, 3) == 3", "assert largest(3, 2, 1) == 3", "assert largest(1, 3, 2) == 3"],
     "test_setup_code": "import math", "challenge_test_list": []},
]


def test_mbpp_source_normalises_line_ends_and_joins_setup_and_asserts(tmp_path):
    write_mbpp(tmp_path / "mbpp.jsonl", MBPP_RECORDS)
    first, second = mbpp_problems(tmp_path / "mbpp.jsonl")
    assert first.base_id == "MBPP/1" and "\r" not in first.solution and first.frozen_lines == 0
    assert second.tests.code.startswith("import math\nassert largest(1, 2, 3) == 3\n")


@pytest.mark.skipif(not SHARED_MBPP.exists(), reason="shared MBPP data absent")
def test_mbpp_release_file_loads():
    problems = mbpp_problems(SHARED_MBPP)
    assert len(problems) == 974 and len({p.base_id for p in problems}) == 974


def test_cli_build_writes_files_and_reruns_from_cache(tmp_path, capsys):
    write_mbpp(tmp_path / "mbpp.jsonl", MBPP_RECORDS)
    args = ["data", "build", "--out", str(tmp_path / "out"), "--source", "none", "--mbpp", str(tmp_path / "mbpp.jsonl"),
            "--workers", "2", "--no-progress", "--seed", "1"]
    assert cli_main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    files = read_dir(tmp_path / "out")
    assert set(files) == {"train.jsonl", "val.jsonl", "test.jsonl", "gt_debug.jsonl", "manifest.json"}
    assert first["sandbox_runs"] > 0 and first["source"] == {"mbpp": sum(first["kind"].values())}
    assert cli_main(args) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["sandbox_runs"] == 0 and read_dir(tmp_path / "out") == files


def test_cli_gt_debug_layout_flags(tmp_path, capsys):
    write_mbpp(tmp_path / "mbpp.jsonl", MBPP_RECORDS)
    base = ["data", "build", "--source", "none", "--mbpp", str(tmp_path / "mbpp.jsonl"), "--workers", "2",
            "--no-progress", "--max-per-operator", "0"]
    assert cli_main([*base, "--out", str(tmp_path / "bad"), "--gt-debug-fraction", "0.9"]) == 2
    assert "--gt-debug-fraction" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    # Two problems at 50%: the new layout holds one out for GT Debug; the old one makes none.
    assert cli_main([*base, "--out", str(tmp_path / "new"), "--gt-debug-fraction", "0.5"]) == 0
    assert cli_main([*base, "--out", str(tmp_path / "old"), "--gt-debug-fraction", "0.5",
                     "--gt-debug-from-val-test"]) == 0
    new, old = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("new", "old"))
    assert new["base_problems"] == {"train": 1, "val": 0, "test": 0, "gt_debug": 1} and new["files"]["gt_debug"] == 1
    assert old["base_problems"] == {"train": 2, "val": 0, "test": 0, "gt_debug": 0} and old["files"]["gt_debug"] == 0


def test_pdb_importer(fleet):
    tasks = pdb_tasks(FIXTURES / "pdb_sample.json", FIXTURES / "pdb_sample_tests.json")
    assert [t.task_id for t in tasks] == ["PDB/sum_range_0", "PDB/sum_range_1", "PDB/palindrome_0"]
    assert [t.base_id for t in tasks] == ["PDB/sum_range", "PDB/sum_range", "PDB/palindrome"]
    assert [t.meta["faults"] for t in tasks] == [1, 2, 1]
    assert tasks[0].meta["gt_diff"]["3"]["modified"] == "    for i in range(lo, hi + 1):"
    assert type(tasks[2].tests).__name__ == "IOTests"
    results = fleet.run([Job(t.solution, t.tests) for t in tasks] + [Job(t.buggy_code, t.tests) for t in tasks])
    assert [r.passed for r in results] == [True] * 3 + [False] * 3


def test_pdb_importer_cli_and_missing_tests(tmp_path):
    out = tmp_path / "pdb.jsonl"
    assert cli_main(["data", "import-pdb", "--data", str(FIXTURES / "pdb_sample.json"),
                     "--tests", str(FIXTURES / "pdb_sample_tests.json"), "--out", str(out)]) == 0
    assert len(load_tasks(out)) == 3
    (tmp_path / "tests.json").write_text(json.dumps({"PDB/sum_range": "assert True\n"}))
    with pytest.raises(SourceError, match="palindrome"):
        pdb_tasks(FIXTURES / "pdb_sample.json", tmp_path / "tests.json")


@pytest.mark.slow
def test_full_humaneval_build_meets_the_scale_targets(tmp_path, run):
    result = build(humaneval_problems(), run, BuildConfig(seed=0))
    kinds = result.manifest["counts"]["kind"]
    assert kinds["single"] >= 1000 and kinds["multi"] >= 200
    assert result.manifest["problems_dropped"] == []


def test_tests_needing_more_than_plain_data_are_marked_and_trained_unless_kept_out(run):
    """A problem whose tests pass a module to the program (never lent to it: unverifiable in `proxy` mode) runs
    `inprocess`, marked; its tasks train like proxy ones, or stay out of train with `train_inprocess=False`."""
    boxed = Problem("T/box", "toy", "A box holding twice its value.", textwrap.dedent("""\
        class Box:
            def __init__(self, v):
                self.v = v * 2
            def apply(self, module, name):
                return getattr(module, name)(self.v)
        def make(v):
            return Box(v)
        """), AssertTests("import math\nassert make(8).apply(math, 'sqrt') == 4\nassert make(0).apply(math, 'exp') == 1\n"))
    result = build([boxed, LOOP], run, BuildConfig(val_fraction=0.0, train_inprocess=False))
    assert result.manifest["problems_inprocess"] == ["T/box"]
    assert result.manifest["problems_dropped"] == []
    assert all(t.meta["tests_mode"] == "proxy" for t in result.files["train"])
    assert any(t.base_id == "T/loop" for t in result.files["train"])
    excluded = result.manifest["train_inprocess_excluded"]
    assert excluded and all(i.startswith("T/box#") for i in excluded)
    kept = build([boxed], run, BuildConfig(val_fraction=0.0)).files["train"]
    assert kept and all(not t.forgeable and t.meta["tests_mode"] == "inprocess" for t in kept)
