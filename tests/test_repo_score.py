"""Repository tasks: prediction forms, patches, and multi-file scores re-derived by hand (docs/reward.md,
"Repository tasks").

The tree is a tiny package of three modules; `verify` execs the files of the tree (the clean tree with the
given files over it) and runs asserts on their functions: the scorer's contract is that callable, so a
pure-Python one is an honest stand-in for the sandbox's pytest runner. Every expected count below (ℓ, m,
credits, fixes, runs) is derived by hand in the comments, and the scores from them with the spec's formulas
(`expected`), not with the scorer's helpers.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.machinery
import io
import json
import sys
import tarfile
import types

import pytest

from reward import check_cli, score_cli
from reward.repo_extract import (PatchError, RepoPrediction, apply_patch, files_to_patch, prediction_files,
                                 repo_prediction_from_json, repo_prediction_to_json)
from reward.repo_score import analyze_repo, score_repo_prediction, tree_reader
from reward.repo_task import repo_task_from_json, repo_task_to_json
from reward.sandbox import RunResult
from reward.schema import AssertTests, Prediction, Task
from reward.score import aggregate, format_summary, score_predictions

CALC = "def add(a, b):\n    return a + b\n\n\ndef scale(xs, k):\n    out = []\n    for x in xs:\n" \
       "        out.append(x * k)\n    return out\n"
TEXT = 'def shout(s):\n    return s.upper() + "!"\n\n\ndef first_word(s):\n    return s.split()[0]\n'
OPS = "def sub(a, b):\n    return a - b\n"
CLEAN_TREE = {"pkg/calc.py": CALC, "pkg/text.py": TEXT, "pkg/ops.py": OPS, "tests/test_pkg.py": "# the tests"}
CHECKS = """
assert calc.add(2, 3) == 5
assert calc.scale([1, 2], 3) == [3, 6]
assert text.shout("hi") == "HI!"
assert text.first_word("a b") == "a"
assert ops.sub(5, 3) == 2
"""

BUGGY_CALC = CALC.replace("return a + b", "return a - b")  # line 2
BUGGY_TEXT = TEXT.replace("s.upper()", "s.lower()")  # line 2
LAM = 1 / 3


def task(buggy: dict[str, str], solution: dict[str, str] | None = None, **extra):
    """A repository task record over the tree, loaded as a `precisecoder score` run would load it."""
    return repo_task_from_json({
        "task_id": extra.pop("task_id", "pkg/t#1"), "base_id": "pkg/calc", "prompt": "Fix the package.",
        "repo": {"name": "pkg", "version": "1.0", "archive": "pkg.tar.gz", "sha256": "0" * 64},
        "buggy_files": buggy, "solution_files": solution or {p: CLEAN_TREE[p] for p in buggy},
        "tests": {"kind": "pytest", "fail_to_pass": ["tests/test_pkg.py::test_all"], "pass_to_pass": []},
        **extra})


TWO_FAULTS = task({"pkg/calc.py": BUGGY_CALC, "pkg/text.py": BUGGY_TEXT})  # m = 2, one per file
ONE_FAULT = task({"pkg/calc.py": BUGGY_CALC}, task_id="pkg/t#2")  # m = 1
CLEAN = task({"pkg/calc.py": CALC}, task_id="pkg/clean")  # m = 0


def tree_text(path: str) -> str | None:
    return CLEAN_TREE.get(path)


class Verifier:
    """Exec every module of the tree with `files` in place and run CHECKS; records each call."""

    def __init__(self, answer: bool | None = True):
        self.calls: list[dict[str, str]] = []
        self.answer = answer  # what a run that passes returns (None: a harness that cannot decide)

    def __call__(self, files):
        self.calls.append(dict(files))
        modules = {}
        try:
            for path, source in {**CLEAN_TREE, **files}.items():
                namespace: dict = {}
                exec(compile(source, path, "exec"), namespace)
                modules[path.rsplit("/", 1)[-1].removesuffix(".py")] = types.SimpleNamespace(**namespace)
            exec(CHECKS, modules)
        except Exception:
            return False
        return self.answer


def expected(unit: int, ell: int, credits: int, faults: int, fixed: int) -> dict[str, float]:
    """precision, recall, f1 and reward from hand-derived counts, by the spec's formulas."""
    p = credits / ell if ell else 0.0
    r = fixed / faults
    gated = 1.0 if unit else r
    f1 = 2 * p * gated / (p + gated) if p + gated else 0.0
    return {"precision": p, "recall": r, "f1": f1, "reward": (1 - LAM) * unit + LAM * f1}


def score(t, prediction: RepoPrediction | dict, verify=None, **kw):
    if isinstance(prediction, dict):
        prediction = RepoPrediction(t.task_id, files=prediction)
    return score_repo_prediction(t, prediction, verify or Verifier(), tree_text, **kw)


def assert_scores(s, unit: int, ell: int, credits: int, faults: int, fixed: int, edited_files: int):
    assert (s.valid, s.unit, s.edited_lines, s.faults, s.faults_fixed, s.edited_files) == \
        (True, unit, ell, faults, fixed, edited_files)
    assert sum(c.credit for c in s.components) == credits
    want = expected(unit, ell, credits, faults, fixed)
    assert {k: getattr(s, k) for k in want} == pytest.approx(want)


# Scores re-derived by hand ------------------------------------------------------


def test_reference_prediction_scores_one():
    # Two one-line blocks, one per file, each aligned with its fault: 2 components, verified (each program
    # is the solution), cap 1 + ε = 2 > ℓ_K = 1: no window, credit 1 each. ℓ = 2, m = 2.
    verify = Verifier()
    s = score(TWO_FAULTS, {"pkg/calc.py": CALC, "pkg/text.py": TEXT}, verify)
    assert_scores(s, unit=1, ell=2, credits=2, faults=2, fixed=2, edited_files=2)
    assert (s.precision, s.recall, s.f1, s.reward) == (1.0, 1.0, 1.0, 1.0)
    assert [(c.refs, c.preds) for c in s.components] == [((0,), (0,)), ((1,), (1,))]
    # The unit program and both verification programs are the solution: one run.
    assert s.runs == len(verify.calls) == 1


def test_noop_prediction():
    s = score(TWO_FAULTS, {"pkg/calc.py": BUGGY_CALC + "\n\n"})  # blank lines only: no edit
    assert s.noop and s.edited_files == 0
    assert_scores(s, unit=0, ell=0, credits=0, faults=2, fixed=0, edited_files=0)


def test_partial_multi_file_fix_earns_its_share():
    # Only calc fixed: K = {δ*₁, calc block}; its program is calc fixed + text's reference fix (the
    # solution): verified, fix₁ = 1. unit 0 (text still broken). p = 1/1, r = 1/2.
    s = score(TWO_FAULTS, {"pkg/calc.py": CALC})
    assert_scores(s, unit=0, ell=1, credits=1, faults=2, fixed=1, edited_files=1)
    assert s.reward == pytest.approx(LAM * 2 / 3)


def test_multi_file_prediction_with_a_comment():
    # calc: a comment above the fix: one block {insert at 1.5, modify 2}, ℓ_K = 2, cap 2, windows of size 1:
    # [comment] fails, [modify 2] passes: |ess| = 1. text: the exact fix, credit 1. ℓ = 3, credits 2.
    calc = CALC.replace("    return a + b", "    # add, do not subtract\n    return a + b")
    verify = Verifier()
    s = score(TWO_FAULTS, {"pkg/calc.py": calc, "pkg/text.py": TEXT}, verify)
    assert_scores(s, unit=1, ell=3, credits=2, faults=2, fixed=2, edited_files=2)
    assert s.reward == pytest.approx(14 / 15)
    assert [(c.verified, c.essential, c.cap, c.credit) for c in s.components] == [(True, 1, 2, 1), (True, 1, 2, 1)]
    # Runs: the answer (= K₁'s program), K₂'s program (= the window [modify 2]), the window [comment].
    assert s.runs == len(verify.calls) == 3
    window = verify.calls[2]
    assert "# add" in window["pkg/calc.py"] and "a - b" in window["pkg/calc.py"] and window["pkg/text.py"] == TEXT


def test_extra_edit_in_another_file_lowers_precision():
    # The fix of calc plus a harmless rewrite in text.py, a path outside buggy_files (its C is the tree's
    # version). The extra block aligns with nothing: ℓ = 2, credit 1, p = 1/2; unit 1, so r̃ = 1.
    extra = TEXT.replace("s.split()[0]", "s.split(None)[0]")
    verify = Verifier()
    s = score(ONE_FAULT, {"pkg/calc.py": CALC, "pkg/text.py": extra}, verify)
    assert_scores(s, unit=1, ell=2, credits=1, faults=1, fixed=1, edited_files=2)
    assert s.reward == pytest.approx(8 / 9)
    # The verification program holds calc's fix only; the tree keeps its own text.py.
    assert verify.calls[1] == {"pkg/calc.py": CALC}
    alone = score(ONE_FAULT, {"pkg/calc.py": CALC})
    assert (alone.precision, alone.reward, alone.edited_files) == (1.0, 1.0, 1)


def test_fix_in_the_wrong_file_earns_no_recall():
    # ops.py holds the same line as calc's fault, at the same line number; the prediction makes the
    # reference's very edit there. Per path, nothing aligns (a path-blind scorer would pair them: same
    # edit, distance 0): no component, recall 0, precision 0. unit 0 (calc still fails, sub now fails).
    s = score(ONE_FAULT, {"pkg/ops.py": OPS.replace("a - b", "a + b")})
    assert_scores(s, unit=0, ell=1, credits=0, faults=1, fixed=0, edited_files=1)
    assert s.components == () and s.reward == 0.0


def test_clean_repo_task_counts_damage():
    broken = score(CLEAN, {"pkg/calc.py": CALC.replace("a + b", "a * b")})
    assert (broken.unit, broken.damage, broken.noop, broken.edited_lines, broken.faults) == (0, 1, False, 1, 0)
    assert (broken.precision, broken.recall, broken.f1, broken.reward) == (None, None, None, 0.0)
    kept = score(CLEAN, {"pkg/calc.py": CALC})
    assert (kept.unit, kept.damage, kept.noop, kept.edited_files) == (1, 0, True, 0)
    assert kept.reward == pytest.approx(1 - LAM)
    # An edit outside buggy_files damages a clean task too.
    elsewhere = score(CLEAN, {"pkg/ops.py": OPS.replace("a - b", "b - a")})
    assert (elsewhere.unit, elsewhere.damage, elsewhere.edited_files) == (0, 1, 1)


def test_window_search_is_capped_across_files():
    # As the comment case, with max_window_runs = 1: the [comment] window fails and uses the bound:
    # |ess₁| = ℓ₁ = 2, credit 2; credits 3 over ℓ 3.
    calc = CALC.replace("    return a + b", "    # add, do not subtract\n    return a + b")
    s = score(TWO_FAULTS, {"pkg/calc.py": calc, "pkg/text.py": TEXT}, max_window_runs=1)
    assert s.window_search_capped
    assert_scores(s, unit=1, ell=3, credits=3, faults=2, fixed=2, edited_files=2)


def test_undecided_run_makes_the_prediction_unverifiable():
    s = score(TWO_FAULTS, {"pkg/calc.py": CALC, "pkg/text.py": TEXT}, Verifier(answer=None))
    assert (s.status, s.unit, s.reward, s.edited_files) == ("unverifiable", 0, 0.0, 2)
    assert s.reason


def test_positions_are_per_path_in_path_order():
    files = {"pkg/text.py": TEXT, "pkg/calc.py": CALC, "pkg/new.py": "x = 1\n"}
    repo = analyze_repo(TWO_FAULTS, files, tree_text, 1)
    assert repo.paths == ("pkg/calc.py", "pkg/text.py")
    assert repo.bases["pkg/new.py"] == "" and repo.edited_files == 3
    assert len(repo.analysis.predicted) == 3 and repo.analysis.edited_lines == 3


SCALE = "    out = []\n    for x in xs:\n        out.append(x * k)\n"
ONE_FILE_PROGRAMS = [
    CALC,  # the exact fix
    CALC.replace("    return a + b", "    # add, do not subtract\n    return a + b"),  # a comment beside it
    CALC.replace(SCALE, "    out = [x * k for x in xs]\n"),  # the fix and a harmless rewrite
    CALC.replace("x * k", "x + k"),  # the fix and a breaking edit
    BUGGY_CALC,  # a no-op
    BUGGY_CALC.replace("a - b", "-(b - a)").replace("out = []", "out = list()"),  # a fix unlike the reference
    "def add(a, b):\n    return sum((a, b))\n",  # scale deleted
]


@pytest.mark.parametrize("faults", [1, 2])
@pytest.mark.parametrize("n", range(len(ONE_FILE_PROGRAMS)))
def test_one_file_repository_task_scores_as_a_single_file_task(n, faults):
    # The same buggy program as a single-file task and as a repository task with one buggy file: the
    # scores, components and runs must agree (the repository scorer reuses the single-file pieces).
    buggy = BUGGY_CALC if faults == 1 else BUGGY_CALC.replace("x * k", "x * k * 1")
    program = ONE_FILE_PROGRAMS[n]
    verify = Verifier()
    single = Task("calc", "calc", "Fix it.", buggy, CALC, AssertTests("unused"))

    def run_batch(jobs):
        return [RunResult(bool(verify({"pkg/calc.py": job.program})), "pass", 0.0) for job in jobs]

    want = score_predictions([(single, Prediction("calc", code=program))], run_batch, window_batch=1)[0]
    got = score(task({"pkg/calc.py": buggy}, task_id="calc"), {"pkg/calc.py": program})
    fields = ("valid", "unit", "precision", "recall", "f1", "reward", "edited_lines", "faults", "faults_fixed",
              "noop", "damage", "blocks", "components", "window_search_capped")
    assert {f: getattr(got, f) for f in fields} == {f: getattr(want, f) for f in fields}
    # A window that equals a verification program runs again in the single-file scorer (a window job has
    # its own timeout, so it is another job); `verify` has no limits, so here it is one run.
    assert got.runs <= want.runs
    assert got.edited_files == int(bool(want.edited_lines)) and want.edited_files is None


# Prediction forms ---------------------------------------------------------------


def test_patch_prediction_scores_as_its_files():
    patch = files_to_patch(TWO_FAULTS.buggy_files, TWO_FAULTS.solution_files)
    assert patch.startswith("diff --git a/pkg/calc.py b/pkg/calc.py\n--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@")
    s = score(TWO_FAULTS, RepoPrediction(TWO_FAULTS.task_id, patch=patch))
    assert_scores(s, unit=1, ell=2, credits=2, faults=2, fixed=2, edited_files=2)


def test_response_with_path_blocks_and_with_a_diff_block():
    response = ("Two fixes.\n```python pkg/calc.py\nwrong\n```\n```python pkg/calc.py\n" + CALC
                + "```\n```py pkg/text.py\n" + TEXT + "```\n```python\nignored = 1\n```\n")
    s = score(TWO_FAULTS, RepoPrediction(TWO_FAULTS.task_id, response=response))  # the last calc block wins
    assert_scores(s, unit=1, ell=2, credits=2, faults=2, fixed=2, edited_files=2)
    patch = files_to_patch(ONE_FAULT.buggy_files, {"pkg/calc.py": CALC})
    diffed = score(ONE_FAULT, RepoPrediction(ONE_FAULT.task_id, response=f"<think>x</think>\n```diff\n{patch}```"))
    assert_scores(diffed, unit=1, ell=1, credits=1, faults=1, fixed=1, edited_files=1)


def test_first_present_form_wins():
    pred = repo_prediction_from_json({"task_id": "pkg/t#1", "files": {"pkg/calc.py": CALC}, "patch": "junk",
                                      "response": "junk"})
    assert prediction_files(pred, ONE_FAULT, tree_text) == ({"pkg/calc.py": CALC}, None)
    assert repo_prediction_from_json(repo_prediction_to_json(pred)) == pred
    dotted = RepoPrediction("pkg/t#1", response="```python ./pkg//calc.py\n" + CALC + "```")
    assert prediction_files(dotted, ONE_FAULT, tree_text) == ({"pkg/calc.py": CALC.rstrip("\n")}, None)
    old = repo_prediction_from_json({"task_id": "pkg/t#1", "response": "r"})  # a single-file record loads
    assert (old.response, old.files, old.patch) == ("r", None, None)
    for bad, field in (({"task_id": "t"}, "needs"), ({"task_id": "t", "files": {"a.py": 1}}, "files"),
                       ({"task_id": "t", "code": "x"}, "code"), ({"task_id": "t", "patch": 3}, "patch")):
        with pytest.raises(ValueError, match=field):
            repo_prediction_from_json(bad)


HUNK_ELSEWHERE = ("--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a * b\n"
                  "+    return a + b\n")


@pytest.mark.parametrize("prediction, reason", [
    ({"files": {"/pkg/calc.py": CALC}}, "relative"),
    ({"files": {"pkg/../calc.py": CALC}}, "'..'"),
    ({"files": {"tests/test_pkg.py": "assert True"}}, "test file"),
    ({"files": {"pkg/conftest.py": "x = 1"}}, "test file"),
    ({"files": {"pkg/calc_test.py": "x = 1"}}, "test file"),
    ({"files": {"README.md": "x"}}, "not a .py file"),
    ({"files": {"pkg/calc.py": CALC, "./pkg/calc.py": CALC}}, "given twice"),
    ({"response": "```python pkg/calc.py\n" + CALC + "```\n```python /etc/x.py\nx\n```"}, "relative"),
    ({"patch": HUNK_ELSEWHERE}, "does not apply"),
    ({"patch": "--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,3 +1,3 @@\n def add(a, b):\n"}, "header says"),
    ({"patch": "--- a/pkg/calc.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-def add(a, b):\n"}, "deletes"),
    ({"patch": "--- /dev/null\n+++ b/pkg/ops.py\n@@ -0,0 +1 @@\n+x = 1\n"}, "exists"),
    ({"patch": "no diff here"}, "no file diff"),
    ({"response": "```diff\n" + HUNK_ELSEWHERE + "```"}, "does not apply"),
    ({"response": "I would change add.\n```python\n" + CALC + "```"}, "no python block with a path"),
    ({"response": "<think>still thinking"}, "think block never closed"),
])
def test_invalid_predictions_say_why_and_run_nothing(prediction, reason):
    verify = Verifier()
    s = score(ONE_FAULT, RepoPrediction(ONE_FAULT.task_id, **prediction), verify)
    assert (s.valid, s.unit, s.precision, s.recall, s.f1, s.reward, s.edited_lines, s.noop, s.runs) == \
        (False, 0, 0.0, 0.0, 0.0, 0.0, None, False, 0)
    assert reason in s.reason and verify.calls == []
    clean = score(CLEAN, RepoPrediction(CLEAN.task_id, **prediction))
    assert (clean.valid, clean.damage, clean.reward) == (False, 1, 0.0)


# Patches ------------------------------------------------------------------------


def test_patch_round_trip_new_files_and_missing_final_newline():
    buggy = {"pkg/calc.py": BUGGY_CALC, "pkg/ops.py": OPS.rstrip("\n")}
    files = {"pkg/calc.py": CALC, "pkg/ops.py": "def sub(a, b):\n    return a - b  # no newline",
             "pkg/extra.py": "X = 1\n", "pkg/text.py": TEXT}
    patch = files_to_patch(buggy, files, tree_text)
    assert "\\ No newline at end of file" in patch and "--- /dev/null\n+++ b/pkg/extra.py" in patch
    assert "pkg/text.py" not in patch  # unchanged from the tree's version
    base = {**CLEAN_TREE, **buggy}
    assert apply_patch(patch, base.get) == {p: t for p, t in files.items() if p != "pkg/text.py"}


def test_hunks_apply_exactly_at_the_nearest_offset():
    text = "a\nb\nx\nc\nd\nx\ne\n"  # "x" on lines 3 and 6

    def patched(hunk: str) -> str:
        return apply_patch("--- a/m.py\n+++ b/m.py\n" + hunk, {"m.py": text}.get)["m.py"]

    assert patched("@@ -6 +6 @@\n-x\n+y\n") == "a\nb\nx\nc\nd\ny\ne\n"  # at its line
    assert patched("@@ -1 +1 @@\n-x\n+y\n") == "a\nb\ny\nc\nd\nx\ne\n"  # nearest to line 1: line 3
    assert patched("@@ -5 +5 @@\n-x\n+y\n") == "a\nb\nx\nc\nd\ny\ne\n"  # nearest to line 5: line 6
    assert patched("@@ -2,2 +2,2 @@\n-x\n+y\n e\n") == "a\nb\nx\nc\nd\ny\ne\n"  # context decides
    two = "@@ -3 +3 @@\n-x\n+y\n@@ -3 +3 @@\n-x\n+z\n"  # a later hunk never applies before an earlier one
    assert patched(two) == "a\nb\ny\nc\nd\nz\ne\n"
    for bad in ("@@ -3,2 +3,2 @@\n c\n-x\n+y\n",  # no "c" right before an "x"
                "@@ -3 +3 @@\n-x \n+y\n"):  # whitespace counts
        with pytest.raises(PatchError, match="does not apply"):
            patched(bad)
    with pytest.raises(PatchError, match="does not exist"):
        apply_patch("--- a/gone.py\n+++ b/gone.py\n@@ -1 +1 @@\n-x\n+y\n", {"m.py": text}.get)


# Aggregates ---------------------------------------------------------------------


def test_aggregate_reports_mean_edited_files():
    scores = [score(TWO_FAULTS, {"pkg/calc.py": CALC, "pkg/text.py": TEXT}),
              score(TWO_FAULTS, {"pkg/calc.py": CALC}),
              score(ONE_FAULT, RepoPrediction(ONE_FAULT.task_id, response="nothing"))]
    summary = aggregate([TWO_FAULTS, ONE_FAULT, CLEAN], scores)
    # TWO_FAULTS averages 2 and 1 files; ONE_FAULT has no valid prediction; CLEAN has no prediction.
    assert summary["buggy"]["files"] == 1.5 and summary["buggy"]["lines"] == 1.5
    assert summary["buggy"]["tasks"] == 2 and summary["clean"] == {"tasks": 1, "noop": 0.0, "damage": 1.0}
    assert "files" in format_summary(summary) and "1.50" in format_summary(summary)


# The worked example of docs/reward.md, "Repository tasks" ----------------------


def test_docs_repository_example():
    # docs/reward.md, "A worked multi-file example": the numbers printed there.
    calc = CALC.replace("    return a + b", "    # add, do not subtract\n    return a + b")
    s = score(TWO_FAULTS, {"pkg/calc.py": calc, "pkg/text.py": TEXT})
    assert (s.edited_lines, s.faults, s.faults_fixed, s.edited_files, s.runs, s.blocks) == (3, 2, 2, 2, 3, 2)
    assert (s.precision, s.recall, s.f1, s.reward) == pytest.approx((2 / 3, 1, 4 / 5, 14 / 15))


# `precisecoder score` and `check` on repository task files ------------------------


def fake_runner(monkeypatch, verify: Verifier) -> list:
    """A stand-in `reward.repo_run` whose `run_repo_task` answers with `verify`; returns its calls."""
    module = types.ModuleType("reward.repo_run")
    module.__spec__ = importlib.machinery.ModuleSpec("reward.repo_run", None)
    calls = []

    def run_repo_task(task, files, task_dir, **limits):
        calls.append((task.task_id, limits))
        ok = verify(files)
        status = {True: "pass", False: "fail", None: "error"}[ok]
        return types.SimpleNamespace(status=status, outcomes={}, detail=None if ok else "1 failed", seconds=0.01)

    module.run_repo_task = run_repo_task
    monkeypatch.setitem(sys.modules, "reward.repo_run", module)
    return calls


def task_file(tmp_path, tasks) -> str:
    tree = tmp_path / "tree"
    for path, text in CLEAN_TREE.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    records = [{**repo_task_to_json(t), "repo": {**repo_task_to_json(t)["repo"], "archive": "tree"}} for t in tasks]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def cli_args(module, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args([*argv, "--no-progress"])


def test_score_command_dispatches_repository_tasks(tmp_path, monkeypatch, capsys):
    calls = fake_runner(monkeypatch, Verifier())
    tasks = task_file(tmp_path, [TWO_FAULTS, ONE_FAULT])
    preds = tmp_path / "preds.jsonl"
    ops_edit = {"pkg/calc.py": CALC, "pkg/ops.py": OPS.replace("a - b", "a - b  # checked")}
    preds.write_text("".join(json.dumps(p) + "\n" for p in [
        {"task_id": TWO_FAULTS.task_id, "patch": files_to_patch(TWO_FAULTS.buggy_files, TWO_FAULTS.solution_files)},
        {"task_id": ONE_FAULT.task_id, "files": ops_edit},
        {"task_id": ONE_FAULT.task_id, "response": "```python tests/test_pkg.py\nassert True\n```"}]))
    out = tmp_path / "scores.jsonl"
    args = cli_args(score_cli, "--tasks", tasks, "--predictions", str(preds), "--out", str(out), "--timeout", "30")
    assert score_cli.main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["unit"], r["precision"], r["edited_files"], r["valid"]) for r in rows] == \
        [(1, 1.0, 2, True), (1, 0.5, 2, True), (0, 0.0, None, False)]
    # The ops.py comment is read from the tree's copy of ops.py (C outside buggy_files): one extra edit.
    assert rows[1]["edited_lines"] == 2 and "test file" in rows[2]["reason"]
    assert {limits["timeout_s"] for _, limits in calls} == {30.0}
    table = capsys.readouterr().out
    assert "files" in table and "2.00" in table  # two buggy tasks, each with valid predictions editing 2 files


def test_check_command_verifies_repository_tasks(tmp_path, monkeypatch, capsys):
    calls = fake_runner(monkeypatch, Verifier())
    tasks = task_file(tmp_path, [TWO_FAULTS, CLEAN])
    out = tmp_path / "check.jsonl"
    assert check_cli.main(cli_args(check_cli, "--tasks", tasks, "--out", str(out))) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["target"], r["passed"], r["mode"]) for r in rows] == [
        (TWO_FAULTS.task_id, "solution", True, "pytest"), (TWO_FAULTS.task_id, "buggy", False, "pytest"),
        (CLEAN.task_id, "solution", True, "pytest")]
    assert {limits["timeout_s"] for _, limits in calls} == {60.0}  # the repository default
    assert "tasks: 2/2 verified" in capsys.readouterr().err
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"task_id": TWO_FAULTS.task_id, "files": {"pkg/calc.py": CALC}}) + "\n"
                     + json.dumps({"task_id": CLEAN.task_id, "patch": "nothing"}) + "\n")
    assert check_cli.main(cli_args(check_cli, "--tasks", tasks, "--predictions", str(preds), "--out", str(out))) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["passed"], r["status"], r["reason"]) for r in rows] == [
        (False, "fail", "1 failed"), (False, "invalid", "patch: no file diff in it")]


def test_repository_commands_need_the_runner(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "reward.repo_run", None)  # as on an installation without it
    tasks = task_file(tmp_path, [ONE_FAULT])
    assert check_cli.main(cli_args(check_cli, "--tasks", tasks)) == 2
    assert "reward.repo_run" in capsys.readouterr().err


def test_tree_reader_reads_a_source_archive(tmp_path):
    archive = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path, text in CLEAN_TREE.items():
            data = text.encode()
            info = tarfile.TarInfo(f"pkg-1.0/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    read = tree_reader(dataclasses.replace(ONE_FAULT, repo=dataclasses.replace(ONE_FAULT.repo,
                                                                                archive="pkg-1.0.tar.gz")), tmp_path)
    assert read("pkg/ops.py") == OPS and read("pkg/missing.py") is None
