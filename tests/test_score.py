"""The PreciseCoder scorer against worked cases derived by hand from docs/reward.md.

Every expected number below was computed from the spec on paper; the comment
above each case gives the derivation. Test runs go through the real sandbox
fleet (a recording wrapper checks the one-call-per-phase contract).
"""

import dataclasses
import math
from fractions import Fraction as F
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward.diff import diff
from reward.fleet import Fleet
from reward.sandbox import Limits, RunResult
from reward.schema import AssertTests, IOCase, IOTests, Prediction, Task, load_tasks
from reward.score import (UNIT_ONLY, Score, aggregate, alignment, analyze, baseline_terms, canonical_job, components,
                          credit, format_summary, identical_pairs, precision_recall_f1, scalar_reward,
                          score_predictions, span_distance)

MEAN_C = """def mean(xs):
    n = len(xs) + 1
    total = sum(xs)
    return total / n

def double(y):
    return y * 2
"""
MEAN_FIX = MEAN_C.replace("len(xs) + 1", "len(xs)")
MEAN = Task("mean#1", "mean", "average", MEAN_C, MEAN_FIX,
            AssertTests("assert mean([1, 2, 3]) == 2\nassert mean([4]) == 4\nassert double(3) == 6\n"))

TRIO_C = """def lo(xs):
    return max(xs)

def hi(xs):
    return max(xs)

def total(xs):
    return sum(xs) - 1
"""
TRIO_FIX = TRIO_C.replace("def lo(xs):\n    return max", "def lo(xs):\n    return min").replace(" - 1", "")
TRIO = Task("trio#2", "trio", "three helpers", TRIO_C, TRIO_FIX,
            AssertTests("assert lo([3, 1, 2]) == 1\nassert hi([3, 1, 2]) == 3\nassert total([1, 2]) == 3\n"))

FIRST_C = "def first(xs):\n    return xs[0]\n"
FIRST_FIX = "def first(xs):\n    if not xs:\n        return None\n    return xs[0]\n"
FIRST = Task("first#1", "first", "first or None", FIRST_C, FIRST_FIX,
             AssertTests("assert first([]) is None\nassert first([5, 6]) == 5\n"))

CLEAN = Task("mean#clean", "mean", "average", MEAN_FIX, MEAN_FIX, MEAN.tests)

SQUARE_C = "n = int(input())\nprint(n * n + 1)\n"
SQUARE = Task("square#1", "square", "print n squared", SQUARE_C, SQUARE_C.replace(" + 1", ""),
              IOTests((IOCase("3\n", "9\n"), IOCase("0\n", "0"))))

# Two functions separated by a blank line; the fix is on line 2, line 4 is two lines away.
INC_C = "def inc(x):\n    return x + 2\n\ndef dec(x):\n    return x - 1\n"
INC = Task("inc#1", "inc", "increment and decrement", INC_C, INC_C.replace("x + 2", "x + 1"),
           AssertTests("assert inc(1) == 2\nassert dec(1) == 0\n"))

# Twin faults with the same fix (== 0 -> == 1) on lines 2 and 6.
TWIN_C = "def is_one(x):\n    return x == 0\n\ndef first_is_one(xs):\n    x = xs[0]\n    return x == 0\n"
TWIN = Task("twin#2", "twin", "is one", TWIN_C, TWIN_C.replace("== 0", "== 1"),
            AssertTests("assert is_one(1) and not is_one(0)\nassert first_is_one([1, 0]) and not first_is_one([0])\n"))

TASKS = [MEAN, TRIO, FIRST, CLEAN, SQUARE]


def fence(code: str, info: str = "python") -> str:
    return f"```{info}\n{code}```\n"


class Recorder:
    """Passes jobs to the fleet and remembers every call."""

    def __init__(self, fleet: Fleet):
        self.fleet, self.calls = fleet, []

    def __call__(self, jobs):
        self.calls.append(list(jobs))
        return self.fleet.run(jobs)


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


def score_one(fleet, task, code=None, response=None, **kw):
    kw.setdefault("window_batch", 4)  # twice the fleet's workers, fixed so `runs` does not depend on the machine
    [s] = score_predictions([(task, Prediction(task.task_id, response, code))], Recorder(fleet), **kw)
    return s


def r(unit, f1, lam=F(1, 3)):
    return float((1 - lam) * unit + lam * f1)


# name, task, prediction code (or None), response (or None), kwargs, expected fields.
# For a passing single-fault fix: f1 = 2p/(1+p); reward = 2/3·unit + 1/3·f1.
CASES = [
    # Exact fix: ℓ = 1, K verified, cap = 2, no window (min(1, 2) − 1 = 0): credit 1; the
    # verification program equals P, so one run.
    ("exact fix", MEAN, MEAN_FIX, None, {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, edited_lines=1, faults=1, faults_fixed=1, runs=1)),
    # Fix + unrelated edit at line 7 (3 lines from the fix: unaligned): p = 1/2, r̃ = 1, f1 = 2/3.
    ("fix plus unrelated edit", MEAN, MEAN_FIX.replace("y * 2", "y + y"), None, {},
     dict(unit=1, precision=0.5, recall=1, f1=F(2, 3), reward=r(1, F(2, 3)), edited_lines=2, faults_fixed=1,
          blocks=2, runs=2)),
    # Fix + harmless edit of line 3 in the same block: windows of 1 = [mod 2] (passes), [mod 3]:
    # |ess| = 1, credit 1, p = 1/2. Runs: P (= verification) + 2 windows.
    ("essential subset smaller than block", MEAN, MEAN_FIX.replace("sum(xs)", "sum(xs[:])"), None, {},
     dict(unit=1, precision=0.5, recall=1, f1=F(2, 3), reward=r(1, F(2, 3)), edited_lines=2, blocks=1, runs=3)),
    # Comment above the fix: insert at 1.5 + modify 2 in one block; window [modify] passes: p = 1/2.
    ("fix with a comment above", MEAN, MEAN_FIX.replace("    n = len", "    # drop the + 1\n    n = len"), None, {},
     dict(unit=1, precision=0.5, recall=1, f1=F(2, 3), reward=r(1, F(2, 3)), edited_lines=2, blocks=1, runs=3)),
    # Rewrite of mean's body as one line: a block of 3 edits (1 modify, 2 deletes) over lines 2-4;
    # cap 2, windows of 1: exactly the modify passes alone (it returns early or computes the mean):
    # credit 1; line 7 rewritten too (unaligned): ℓ = 4, p = 1/4, f1 = 2/5.
    ("full rewrite that passes", MEAN,
     "def mean(xs):\n    return sum(xs) / len(xs)\n\ndef double(y):\n    return y + y\n", None, {},
     dict(unit=1, precision=0.25, recall=1, f1=F(2, 5), reward=r(1, F(2, 5)), edited_lines=4, blocks=2, runs=5)),
    # Rewrite of lines 2-4 with new names: no window of 1 passes: |ess| = 3, credit = cap = 2,
    # p = 2/3, f1 = 4/5. Runs: P + 3 windows.
    ("rewrite, no window passes, eps 1", MEAN,
     MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                    "    count = len(xs)\n    acc = sum(xs)\n    return acc / count"), None, {},
     dict(unit=1, precision=F(2, 3), recall=1, f1=F(4, 5), reward=r(1, F(4, 5)), edited_lines=3, runs=4)),
    # Same with ε = 0: cap 1, no search: credit 1, p = 1/3, f1 = 1/2.
    ("epsilon 0 caps the credit", MEAN,
     MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                    "    count = len(xs)\n    acc = sum(xs)\n    return acc / count"), None, {"epsilon": 0},
     dict(unit=1, precision=F(1, 3), recall=1, f1=F(1, 2), reward=r(1, F(1, 2)), runs=1)),
    # ε = 5: cap 6, windows of 1 (3) and 2 (2) all fail: |ess| = 3, credit 3, p = 1.
    ("large epsilon searches longer windows", MEAN,
     MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                    "    count = len(xs)\n    acc = sum(xs)\n    return acc / count"), None, {"epsilon": 5},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, runs=6)),
    # Wrong fix on the buggy line: aligned, verification (= P) fails: everything 0.
    ("wrong fix", MEAN, MEAN_C.replace("len(xs) + 1", "len(xs) - 1"), None, {},
     dict(unit=0, precision=0, recall=0, f1=0, reward=0, edited_lines=1, faults_fixed=0, runs=1)),
    # Alternative fix on line 3 (distance 1 from line 2: aligned): total·n/(n−1) makes total/n the mean.
    ("alternative fix on the adjacent line", MEAN, MEAN_C.replace("sum(xs)\n", "sum(xs) * n / (n - 1)\n"), None, {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, runs=1)),
    # Alternative fix on line 4 (distance 2: unaligned): p = r = 0 but unit = 1, so r̃ = 1, f1 = 0.
    ("alternative fix far away", MEAN, MEAN_C.replace("total / n", "total / (n - 1)"), None, {},
     dict(unit=1, precision=0, recall=0, f1=0, reward=F(2, 3), faults_fixed=0, runs=1)),
    # No edit: a valid no-op; the buggy program fails.
    ("no edit", MEAN, MEAN_C, None, {},
     dict(valid=True, noop=True, unit=0, precision=0, recall=0, f1=0, reward=0, edited_lines=0, runs=1)),
    # Only blank lines and trailing whitespace changed: still a no-op.
    ("whitespace-only change", MEAN, MEAN_C.replace("\n", "   \n\n"), None, {},
     dict(noop=True, unit=0, precision=0, recall=0, f1=0, edited_lines=0)),
    # The exact fix with blank lines and trailing whitespace added: scores as the exact fix; the
    # verification program (built from C) differs from P, so two runs.
    ("fix with whitespace noise", MEAN, MEAN_FIX.replace("\n", " \t\n\n"), None, {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, edited_lines=1, runs=2)),
    # Responses: think block skipped, last python block taken. The extracted program lacks C's final
    # newline only, so it and the verification program are one run.
    ("think block then fix", MEAN, None, "<think>\n" + fence(MEAN_C) + "</think>\nFixed:\n" + fence(MEAN_FIX), {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, runs=1)),
    ("several code blocks, last python wins", MEAN, None,
     fence(MEAN_FIX) + fence("print(1)\n", "bash") + fence(MEAN_C.replace("+ 1", "- 1"), "py") + fence(MEAN_FIX, ""), {},
     dict(unit=0, precision=0, recall=0, edited_lines=1, reward=0)),
    ("no code block", MEAN, None, "Change len(xs) + 1 to len(xs).", {},
     dict(valid=False, unit=0, precision=0, recall=0, f1=0, reward=0, edited_lines=None, noop=False, runs=0)),
    ("unclosed think", MEAN, None, "<think>\nthe fix is\n" + fence(MEAN_FIX), {},
     dict(valid=False, unit=0, precision=0, recall=0, f1=0, reward=0, edited_lines=None, noop=False, runs=0)),
    ("code wins over response", MEAN, MEAN_FIX, "no block here", {}, dict(valid=True, unit=1, reward=1)),
    # Two faults, both fixed: both verification programs equal the solution = P: one run.
    ("two faults both fixed", TRIO, TRIO_FIX, None, {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, faults=2, faults_fixed=2, edited_lines=2, runs=1)),
    # One of two fixed: unit 0; K1 verified with the other reference block applied: p = 1, r = 1/2,
    # f1 = 2/3, reward = 2/9. Runs: P, solution.
    ("two faults one fixed", TRIO, TRIO_C.replace("def lo(xs):\n    return max", "def lo(xs):\n    return min"),
     None, {}, dict(unit=0, precision=1, recall=0.5, f1=F(2, 3), reward=F(2, 9), faults=2, faults_fixed=1, runs=2)),
    # One fixed, the other wrongly: K1 verified, K2 not: p = 1/2, r = 1/2, f1 = 1/2, reward 1/6.
    # K2's verification (reference fix of lo + the wrong line 8) is P itself: runs P, solution.
    ("two faults one fixed one wrong", TRIO,
     TRIO_C.replace("def lo(xs):\n    return max", "def lo(xs):\n    return min").replace(" - 1", " + 1"),
     None, {}, dict(unit=0, precision=0.5, recall=0.5, f1=0.5, reward=F(1, 6), faults_fixed=1, runs=2)),
    # The reference edit made on the identical line 5 instead: aligned by identical edits, but the
    # verification (line 8 fixed, hi broken, lo still broken) fails: all 0.
    ("identical edit elsewhere", TRIO, TRIO_C.replace("def hi(xs):\n    return max", "def hi(xs):\n    return min"),
     None, {}, dict(unit=0, precision=0, recall=0, f1=0, reward=0, faults_fixed=0, runs=2)),
    # Fix by insertion: two inserts after line 1; cap 3, windows of 1 are indentation errors: |ess| = 2.
    ("fix by insertion", FIRST, FIRST_FIX, None, {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, edited_lines=2, runs=3)),
    # Alternative one-line fix: modify line 2, 0.5 from the insert span [1.5, 1.5]: aligned, credit 1.
    ("alternative fix of an insertion", FIRST, "def first(xs):\n    return xs[0] if xs else None\n", None, {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, edited_lines=1, runs=1)),
    # Insertion in the wrong place (before the def, span [0.5, 0.5], 1 from 1.5: aligned) that fails.
    ("insertion at the wrong place", FIRST, "if not xs:\n    return None\n" + FIRST_C, None, {},
     dict(unit=0, precision=0, recall=0, f1=0, reward=0, runs=1)),
    # Clean task kept: no-op, unit 1, damage 0, reward 2/3, precision/recall/f1 null.
    ("clean task kept", CLEAN, MEAN_FIX, None, {},
     dict(unit=1, noop=True, damage=0, precision=None, recall=None, f1=None, reward=F(2, 3), faults=0, runs=1)),
    ("clean task harmless edit", CLEAN, MEAN_FIX.replace("y * 2", "2 * y"), None, {},
     dict(unit=1, noop=False, damage=0, reward=F(2, 3), edited_lines=1)),
    ("clean task broken", CLEAN, MEAN_C, None, {},
     dict(unit=0, noop=False, damage=1, precision=None, reward=0, edited_lines=1)),
    ("clean task invalid", CLEAN, None, "It is already correct.", {},
     dict(valid=False, unit=0, noop=False, damage=1, f1=None, reward=0, runs=0)),
    # io tasks.
    ("io exact fix", SQUARE, SQUARE.solution, None, {}, dict(unit=1, precision=1, recall=1, reward=1)),
    ("io wrong fix", SQUARE, SQUARE_C.replace("n * n + 1", "n + n"), None, {},
     dict(unit=0, precision=0, recall=0, reward=0)),
    # The example of docs/reward.md: comment + fix in one block, line 7 rewritten. ℓ = 3; K = {δ*, block 1}
    # verified; window [modify] passes: credit 1; p = 1/3, f1 = 1/2, reward 5/6. Runs: P, C + block 1,
    # 2 windows.
    ("docs example", MEAN,
     MEAN_FIX.replace("    n = len", "    # the mean divides by len(xs)\n    n = len").replace("y * 2", "y + y"), None,
     {}, dict(unit=1, precision=F(1, 3), recall=1, f1=F(1, 2), reward=F(5, 6), edited_lines=3, blocks=2, runs=4)),
    # Spec revision 2, blank lines separate blocks: the exact fix on line 2 and a harmful rename on line 4
    # (dec(y) uses x: NameError) with only the blank line 3 between. One replace opcode, cut at line 3
    # into {modify 2} (span [2, 2]) and {modify 4} (span [4, 4], 2 lines from δ*: unaligned). K = {δ*,
    # block 1}: C + block 1 is the solution: verified; cap 2, ℓ_K = 1: credit 1. ℓ = 2: p = 1/2; r = 1;
    # unit 0 (dec fails), so r̃ = r = 1: f1 = 2·(1/2)·1/(3/2) = 2/3, reward = λ·f1 = 2/9. Runs: P, solution.
    # (Revision 1 made one block over [2, 4] whose verification is P: all 0.)
    ("blank line separates blocks", INC, INC_C.replace("x + 2", "x + 1").replace("dec(x)", "dec(y)"), None, {},
     dict(unit=0, precision=F(1, 2), recall=1, f1=F(2, 3), reward=F(2, 9), edited_lines=2, blocks=2,
          faults=1, faults_fixed=1, runs=2)),
    # Spec revision 2, identical edits align one to one: twin faults δ*₁ (line 2) and δ*₂ (line 6), both
    # == 0 -> == 1; the prediction fixes line 2 only. Identical pairs by distance: (δ*₁, p) at 0 kept,
    # (δ*₂, p) at 4 dropped (p taken). K = {δ*₁, p}: C + δ*₂ + p = the solution: verified, credit 1.
    # p = 1/1, r = 1/2, unit 0: f1 = 2·1·(1/2)/(3/2) = 2/3, reward 2/9. Runs: P, solution.
    # (Revision 1 aligned p with both: K's verification was P itself, which fails: all 0.)
    ("twin faults, first fixed", TWIN, TWIN_C.replace("x == 0\n\n", "x == 1\n\n"), None, {},
     dict(unit=0, precision=1, recall=F(1, 2), f1=F(2, 3), reward=F(2, 9), faults=2, faults_fixed=1, runs=2)),
    # The same fix of line 6 only: (δ*₂, p) at distance 0 comes first: the same scores.
    ("twin faults, second fixed", TWIN, TWIN_C[:-2] + "1\n", None, {},
     dict(unit=0, precision=1, recall=F(1, 2), f1=F(2, 3), reward=F(2, 9), faults=2, faults_fixed=1, runs=2)),
    # Both fixed: pairs (δ*₁, p₁) and (δ*₂, p₂) at 0: two verified components, all 1.
    ("twin faults, both fixed", TWIN, TWIN.solution, None, {},
     dict(unit=1, precision=1, recall=1, f1=1, reward=1, faults_fixed=2, runs=1)),
    # Bounded window search: the comment-above case (windows [insert comment], [modify 2]) with
    # max_window_runs = 1: the comment's window fails and uses the budget before any window passes,
    # so |ess_K| = ℓ_K = 2, credit min(2, cap 2) = 2: p = 1, f1 = 1, reward 1, capped. Runs: P, 1 window.
    ("window search capped", MEAN, MEAN_FIX.replace("    n = len", "    # drop the + 1\n    n = len"), None,
     {"max_window_runs": 1}, dict(unit=1, precision=1, f1=1, reward=1, window_search_capped=True, runs=2)),
    # A bound of 2 reaches the passing window: p = 1/2 as without a bound, not capped.
    ("window search within the bound", MEAN, MEAN_FIX.replace("    n = len", "    # drop the + 1\n    n = len"),
     None, {"max_window_runs": 2}, dict(precision=F(1, 2), window_search_capped=False, runs=3)),
    # The rewrite with ε = 5 tries 5 windows, all failing: a bound of exactly 5 is not reached before the
    # search ends (|ess| = 3 by exhaustion, not capped); a bound of 0 caps at once: |ess| = 3 too.
    ("bound equal to the windows needed", MEAN,
     MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                    "    count = len(xs)\n    acc = sum(xs)\n    return acc / count"), None,
     {"epsilon": 5, "max_window_runs": 5}, dict(precision=1, window_search_capped=False, runs=6)),
    ("bound zero", MEAN,
     MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                    "    count = len(xs)\n    acc = sum(xs)\n    return acc / count"), None,
     {"epsilon": 5, "max_window_runs": 0}, dict(precision=1, window_search_capped=True, runs=1)),
    # Windows one at a time: [modify 2] passes first, so [modify 3] is never run (3 runs with batches of 4).
    ("window batch of one", MEAN, MEAN_FIX.replace("sum(xs)", "sum(xs[:])"), None, {"window_batch": 1},
     dict(precision=0.5, runs=2)),
    # Cut-off thinking: a prompt that opened <think> and a response that never closes it: invalid, even
    # though the draft holds the exact fix.
    ("think opened by the prompt, never closed", MEAN, None, "the fix is\n" + fence(MEAN_FIX), {"think_opened": True},
     dict(valid=False, unit=0, precision=0, recall=0, reward=0, edited_lines=None, runs=0)),
    ("think opened by the prompt and closed", MEAN, None, "the fix is\n</think>\n" + fence(MEAN_FIX),
     {"think_opened": True}, dict(valid=True, unit=1, reward=1)),
    # The rewrite packed on line 2 (docs example 5): one modify of weight 3 (three statements), ℓ = 3,
    # cap 2, no window weighs 1: |ess| = ℓ_K = 3, credit 2, p = 2/3 as written on three lines. Runs: P.
    ("packed line", MEAN, MEAN_C.replace("n = len(xs) + 1", "k = list(xs); c = len(k); n = c"), None, {},
     dict(unit=1, precision=F(2, 3), recall=1, f1=F(4, 5), reward=r(1, F(4, 5)), edited_lines=3, blocks=1, runs=1)),
    # The fix and a line-3 edit of weight 2: ℓ_K = 3, windows of weight 1: only [modify 2], which passes:
    # |ess| = 1, credit 1, p = 1/3. Runs: P + 1 window.
    ("fix beside a packed line", MEAN, MEAN_FIX.replace("total = sum(xs)", "total = sum(xs); total += 0"), None, {},
     dict(unit=1, precision=F(1, 3), recall=1, f1=F(1, 2), reward=r(1, F(1, 2)), edited_lines=3, blocks=1, runs=2)),
    # λ = 0.5 on the fix plus an unrelated edit: 0.5 + 0.5·2/3.
    ("lambda", MEAN, MEAN_FIX.replace("y * 2", "y + y"), None, {"lam": 0.5}, dict(reward=F(5, 6))),
]


@pytest.mark.parametrize("name,task,code,response,kwargs,expected", CASES, ids=[c[0] for c in CASES])
def test_worked_case(fleet, name, task, code, response, kwargs, expected):
    score = score_one(fleet, task, code, response, **kwargs)
    for field, value in expected.items():
        got = getattr(score, field)
        if value is None or isinstance(value, bool):
            assert got is value, (field, got)
        else:
            assert got == pytest.approx(float(value), abs=1e-12), (field, got)


def test_task_epsilon_overrides_default(fleet):
    rewrite = MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                             "    count = len(xs)\n    acc = sum(xs)\n    return acc / count")
    task = dataclasses.replace(MEAN, epsilon=0)
    assert score_one(fleet, task, rewrite, epsilon=5).precision == pytest.approx(1 / 3)


def test_component_diagnostics(fleet):
    s = score_one(fleet, TRIO, TRIO_C.replace("def lo(xs):\n    return max", "def lo(xs):\n    return min")
                  .replace(" - 1", " + 1"))
    assert [(c.refs, c.preds, c.verified, c.essential, c.cap, c.credit) for c in s.components] == [
        ((0,), (0,), True, 1, 2, 1), ((1,), (1,), False, None, 2, 0)]
    assert s.to_json()["components"][0]["verified"] is True


def test_one_run_batch_call_per_phase_and_no_repeats(fleet):
    """Unit runs and verifications share the first call (neither depends on the other); then one call
    per round of windows; no job is sent twice."""
    rewrite = MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                             "    count = len(xs)\n    acc = sum(xs)\n    return acc / count")
    items = [(MEAN, Prediction(MEAN.task_id, code=p)) for p in (MEAN_FIX, MEAN_FIX, rewrite, MEAN_C)]
    items += [(TRIO, Prediction(TRIO.task_id, code=TRIO_C.replace(" - 1", " + 1"))),
              (MEAN, Prediction(MEAN.task_id, response="no code"))]
    rec = Recorder(fleet)
    scores = score_predictions(items, rec, epsilon=5)
    # unit and verification, windows of 1, windows of 2.
    assert len(rec.calls) == 3
    sent = [job for call in rec.calls for job in call]
    assert len(sent) == len(set(sent))
    # Unit runs: 4 distinct programs (the fix comes twice). Every verification program equals its
    # unit program except TRIO's, which adds reference block 0 to the wrong line 8. The rewrite's
    # windows (ε = 5, cap 6): three of 1 and two of 2.
    assert len(rec.calls[0]) == 4 + 1
    assert [len(c) for c in rec.calls[1:]] == [3, 2]
    assert [s.runs for s in scores] == [1, 1, 6, 1, 2, 0]


def test_unit_runs_alone_then_the_rest_score_as_one_call(fleet):
    """`verify=False` makes only the unit runs (what unit-only reward terms read); a later call with the
    same `done` makes only the verification and window runs and scores exactly as one call does."""
    rewrite = MEAN_C.replace("    n = len(xs) + 1\n    total = sum(xs)\n    return total / n",
                             "    count = len(xs)\n    acc = sum(xs)\n    return acc / count")
    items = [(MEAN, Prediction(MEAN.task_id, code=p)) for p in (MEAN_FIX, MEAN_FIX, rewrite, MEAN_C)]
    items += [(TRIO, Prediction(TRIO.task_id, code=TRIO_C.replace(" - 1", " + 1"))),
              (MEAN, Prediction(MEAN.task_id, response="no code")),
              (CLEAN, Prediction(CLEAN.task_id, code=MEAN_FIX.replace("y * 2", "2 * y")))]
    want = score_predictions(items, Recorder(fleet), epsilon=5)
    done, units = {}, Recorder(fleet)
    first = score_predictions(items, units, epsilon=5, verify=False, done=done)
    assert len(units.calls) == 1 and len(units.calls[0]) == 5  # one run per distinct program
    for got, full in zip(first, want):
        assert (got.unit, got.valid, got.edited_lines, got.noop, got.damage, got.faults) == \
            (full.unit, full.valid, full.edited_lines, full.noop, full.damage, full.faults)
        assert (got.precision, got.recall, got.f1, got.faults_fixed) == (None, None, None, 0)
        assert math.isnan(got.reward) and got.status == UNIT_ONLY
    rest = Recorder(fleet)
    second = score_predictions(items, rest, epsilon=5, done=done)
    assert [s.to_json() for s in second] == [s.to_json() for s in want]
    sent = [job for call in rest.calls for job in call]
    assert not set(sent) & set(units.calls[0])  # no unit run twice
    assert [len(c) for c in rest.calls] == [1, 3, 2]  # TRIO's verification, then the rewrite's windows


class FakeRuns:
    """A run_batch without a sandbox: a program passes iff it holds the fix `x + 1`; records each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, jobs):
        self.calls.append(len(jobs))
        return [RunResult("x + 1" in job.program, "pass" if "x + 1" in job.program else "fail", 0.0) for job in jobs]


INC1 = Task("inc1", "inc1", "increment", "def f(x):\n    return x + 2\n", "def f(x):\n    return x + 1\n",
            AssertTests("assert f(1) == 2\n"))


def _padded_fix(n, before):
    comments = "".join(f"    # note {i}\n" for i in range(n))
    return "def f(x):\n" + (comments + "    return x + 1\n" if before else "    return x + 1\n" + comments)


def test_window_batches_and_bound_without_a_sandbox():
    # The fix then 10 comments: one component (cap 2, windows of 1: [fix], [c0] ... [c9]). Batches of 3:
    # the first batch holds the fix, which passes: 3 window runs in one call, no second batch.
    runs = FakeRuns()
    [s] = score_predictions([(INC1, Prediction("inc1", code=_padded_fix(10, before=False)))], runs, window_batch=3)
    assert runs.calls == [1, 3]  # the answer (= the verification program), then one batch of windows
    assert (s.precision, s.window_search_capped, s.runs) == (pytest.approx(1 / 11), False, 4)
    # 10 comments then the fix: windows [c0] ... [c9], [fix]. A bound of 4 in batches of 3: [c0-c2], [c3],
    # all failing: capped, |ess| = ℓ_K = 11, credit = cap = 2, precision 2/11.
    runs = FakeRuns()
    [s] = score_predictions([(INC1, Prediction("inc1", code=_padded_fix(10, before=True)))], runs,
                            window_batch=3, max_window_runs=4)
    assert runs.calls == [1, 3, 1]
    assert (s.precision, s.window_search_capped, s.runs) == (pytest.approx(2 / 11), True, 5)
    assert s.components[0].essential == 11
    # Unbounded, the search reaches the fix: |ess| = 1 after all 11 windows (4 batches of at most 3).
    runs = FakeRuns()
    [s] = score_predictions([(INC1, Prediction("inc1", code=_padded_fix(10, before=True)))], runs, window_batch=3)
    assert runs.calls == [1, 3, 3, 3, 2]
    assert (s.precision, s.window_search_capped, s.runs) == (pytest.approx(1 / 11), False, 12)
    with pytest.raises(ValueError):
        score_predictions([], runs, max_window_runs=-1)


def test_empty_batch_makes_no_calls(fleet):
    rec = Recorder(fleet)
    assert score_predictions([(MEAN, Prediction(MEAN.task_id, response="none"))], rec)[0].valid is False
    assert rec.calls == []


# Pure math ----------------------------------------------------------------------


def test_alignment_distance_and_identity():
    [ref] = diff("a\nb\nc\nd\ne\nf", "a\nB\nc\nd\ne\nf")
    near, far = diff("a\nb\nc\nd\ne\nf", "a\nb\nC\nd\ne\nf")[0], diff("a\nb\nc\nd\ne\nf", "a\nb\nc\nD\ne\nf")[0]
    assert (span_distance(ref, near), span_distance(ref, far)) == (1, 2)
    assert alignment([ref], [near]) == {(0, 0)} and alignment([ref], [far]) == set()
    [twin] = diff("b\nx\ny\nz\nb", "b\nx\ny\nz\nB")
    [ref2] = diff("b\nx\ny\nz\nb", "B\nx\ny\nz\nb")
    assert alignment([ref2], [twin]) == {(0, 0)}


def test_identical_edits_pair_one_to_one_nearest_first():
    lines = ["b", "x1", "x2", "b", "x3", "x4", "b", "x5", "x6", "b"]  # b on lines 1, 4, 7, 10

    def fixed(*at):
        return "\n".join("B" if n in at else text for n, text in enumerate(lines, start=1))

    c = "\n".join(lines)
    refs = diff(c, fixed(1, 4, 7, 10))  # four identical reference blocks
    assert [r.span for r in refs] == [(1, 1), (4, 4), (7, 7), (10, 10)]
    # One prediction at line 7: only the reference at 7 (distance 0) takes it.
    [at7] = diff(c, fixed(7))
    assert identical_pairs(refs, [at7]) == {(2, 0)}
    assert alignment(refs, [at7]) == {(2, 0)}
    # Equal distances go to the lower reference index: references at 1 and 7, prediction at 4.
    [at4] = diff(c, fixed(4))
    assert identical_pairs([refs[0], refs[2]], [at4]) == {(0, 0)}
    # Two predictions, four references: nearest pairs first, each block used once.
    preds = diff(c, fixed(4, 10))
    assert identical_pairs(refs, preds) == {(1, 0), (3, 1)}
    assert components(refs, preds) == [((1,), (0,)), ((3,), (1,))]
    # Distance ≤ 1 still aligns whatever the identity pairing: a prediction at line 2 (x1 -> B) is 1 from
    # the reference at 1 and identical to none.
    [near] = diff(c, "\n".join(["b", "B"] + lines[2:]))
    assert alignment(refs, [near]) == {(0, 0)}


def test_components_chain_through_shared_blocks():
    c = "\n".join("abcdefghij")
    reference = diff(c, c.replace("b", "B").replace("e", "E").replace("i", "I"))
    predicted = diff(c, c.replace("c", "C").replace("d", "D").replace("j", "J"))
    # ref b (2) – pred c,d [3, 4] – ref e (5); ref i (9) – pred j (10).
    assert len(predicted) == 2
    assert components(reference, predicted) == [((0, 1), (0,)), ((2,), (1,))]
    assert components(reference, []) == [] and components([], predicted) == []


def test_score_math_golden():
    assert credit(True, 3, 2) == 2 and credit(True, 1, 2) == 1 and credit(False, 1, 2) == 0
    assert precision_recall_f1(1, 4, 1, 1, 1) == pytest.approx((0.25, 1.0, 0.4))
    assert precision_recall_f1(0, 2, 1, 2, 1) == pytest.approx((0.5, 0.5, 0.5))
    assert precision_recall_f1(1, 0, 0, 1, 0) == (0.0, 0.0, 0.0)
    assert precision_recall_f1(0, 0, 0, 1, 0) == (0.0, 0.0, 0.0)
    assert scalar_reward(1, 0.4) == pytest.approx(2 / 3 + 0.4 / 3)
    assert scalar_reward(1, None) == pytest.approx(2 / 3)


def test_gdpo_vector_and_baseline_terms(fleet):
    s = score_one(fleet, MEAN, MEAN_FIX.replace("y * 2", "y + y"))
    assert s.vector == pytest.approx((1.0, 2 / 3))
    clean = score_one(fleet, CLEAN, MEAN_FIX)
    assert clean.vector == (1.0, 0.0)
    assert baseline_terms(clean, CLEAN.buggy_code) == (1.0, 0.0)
    assert baseline_terms(s, MEAN.buggy_code) == (1.0, 2.0)
    invalid = score_one(fleet, CLEAN, None, "none")
    assert baseline_terms(invalid, CLEAN.buggy_code) == (0.0, 6.0)


def _score(task_id, unit, p, r, f1, ell, valid=True, noop=False, damage=None):
    return Score(task_id, valid, unit, p, r, f1, ell, 1, 0, noop, damage, 0.0)


def test_aggregate_golden():
    buggy_b = dataclasses.replace(MEAN, task_id="b")
    buggy_d = dataclasses.replace(MEAN, task_id="d")
    tasks = [MEAN, buggy_b, CLEAN, buggy_d]
    scores = [_score("mean#1", 1, 1.0, 1.0, 1.0, 1), _score("mean#1", 0, 0.5, 0.5, 0.5, 2),
              _score("b", 0, 0.0, 0.0, 0.0, None, valid=False),
              Score("mean#clean", True, 1, None, None, None, 0, 0, 0, True, 0, 2 / 3)]
    summary = aggregate(tasks, scores)
    # Buggy: mean#1 averages to unit .5, p .75, r .75, f1 .75, lines 1.5; b invalid; d missing.
    assert summary["buggy"] == pytest.approx({"tasks": 3, "pass": 0.5 / 3, "precision": 0.25, "recall": 0.25,
                                              "f1": 0.25, "lines": 1.5})
    assert summary["clean"] == {"tasks": 1, "noop": 1.0, "damage": 0.0}
    assert (summary["missing"], summary["invalid"], summary["predictions"]) == (1, 1, 4)
    table = format_summary(summary)
    assert "16.7" in table and "25.0" in table and "1.50" in table and "100.0" in table
    with pytest.raises(KeyError):
        aggregate([MEAN], scores)


# Properties ---------------------------------------------------------------------

POOL = ["    return 0", "    x = 1", "    # note", "pass", "    return xs[-1]", "        return None"]


@st.composite
def mutated(draw, task):
    lines = task.buggy_code.split("\n")
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            lines.insert(i, draw(st.sampled_from(POOL)))
        elif i < len(lines):
            if op == "delete":
                del lines[i]
            else:
                lines[i] = draw(st.sampled_from(POOL + task.solution.split("\n")))
    return "\n".join(lines)


def noisy(draw, program):
    return "\n".join(line + draw(st.sampled_from(["", " ", "\t", "  "])) + draw(st.sampled_from(["", "", "\n"]))
                     for line in program.split("\n"))


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BUGGY = [MEAN, TRIO, FIRST, SQUARE]


@SETTINGS
@given(st.data())
def test_scores_lie_in_unit_interval(fleet, data):
    task = data.draw(st.sampled_from(TASKS))
    program, eps = data.draw(mutated(task)), data.draw(st.integers(0, 3))
    s = score_one(fleet, task, program, epsilon=eps)
    for value in (s.unit, s.precision, s.recall, s.f1, s.reward, s.damage):
        assert value is None or 0 <= value <= 1
    if s.valid:
        analysis = analyze(task.buggy_code, task.solution, program, eps)
        windows = sum(k.size - w + 1 for k in analysis.components for w in range(1, k.search_bound + 1))
        assert s.runs <= 1 + len(analysis.components) + windows


@SETTINGS
@given(st.data())
def test_reference_scores_one_and_buggy_scores_zero(fleet, data):
    task = data.draw(st.sampled_from(BUGGY))
    eps = data.draw(st.integers(0, 3))
    ref = score_one(fleet, task, noisy(data.draw, task.solution), epsilon=eps)
    assert (ref.unit, ref.precision, ref.recall, ref.f1, ref.reward) == (1, 1.0, 1.0, 1.0, 1.0)
    bug = score_one(fleet, task, noisy(data.draw, task.buggy_code), epsilon=eps)
    assert (bug.unit, bug.precision, bug.recall, bug.f1, bug.reward, bug.noop) == (0, 0.0, 0.0, 0.0, 0.0, True)


@SETTINGS
@given(st.data())
def test_scores_ignore_trailing_whitespace(fleet, data):
    task = data.draw(st.sampled_from(TASKS))
    program = data.draw(mutated(task))
    plain = score_one(fleet, task, program)
    spaced = score_one(fleet, task, noisy(data.draw, program))
    assert dataclasses.replace(spaced, runs=0) == dataclasses.replace(plain, runs=0)


def test_bundled_examples_reference_scores_one_and_buggy_zero(fleet):
    tasks = load_tasks(Path(__file__).resolve().parents[1] / "reward" / "examples" / "tasks.jsonl")
    refs = score_predictions([(t, Prediction(t.task_id, code=t.solution)) for t in tasks], Recorder(fleet))
    bugs = score_predictions([(t, Prediction(t.task_id, code=t.buggy_code)) for t in tasks], Recorder(fleet))
    for task, ref, bug in zip(tasks, refs, bugs):
        assert ref.unit == 1 and bug.noop
        if ref.faults:
            assert (ref.precision, ref.recall, ref.reward) == (1.0, 1.0, 1.0)
            assert (bug.unit, bug.precision, bug.recall, bug.reward) == (0, 0.0, 0.0, 0.0)
        else:
            assert ref.damage == 0 and ref.reward == pytest.approx(2 / 3)


@st.composite
def padded_fix(draw, task):
    """The reference solution with up to 3 harmless or harmful lines added or changed."""
    lines = task.solution.split("\n")
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(1, len(lines) - 1))
        line = draw(st.sampled_from(["    # note", "    x = 1", "    xs = list(xs)", "    return 0"]))
        if draw(st.booleans()):
            lines.insert(i, line)
        else:
            lines[i] = line
    return "\n".join(lines)


@SETTINGS
@given(st.data())
def test_batched_window_search_matches_sequential_search(fleet, data):
    """Any batch size gives the scores of the spec's one-window-at-a-time search with its budget."""
    task = data.draw(st.sampled_from([MEAN, TRIO, FIRST, TWIN]))
    program, eps = data.draw(padded_fix(task)), data.draw(st.integers(0, 3))
    budget, batch = data.draw(st.integers(0, 6)), data.draw(st.sampled_from([1, 2, 3, 7]))
    score = score_one(fleet, task, program, epsilon=eps, max_window_runs=budget, window_batch=batch)

    def passes(text):
        return fleet.run([canonical_job(text, task.tests, Limits())])[0].passed

    # The sequential search: sizes s = 1, 2, ...; per size, components in order, windows in position
    # order; each window tried costs one of the budget; an empty budget with a window still to try caps.
    analysis = analyze(task.buggy_code, task.solution, program, eps)
    comps = analysis.components
    essential = {}
    for i, k in enumerate(comps):
        if not passes(k.program(task.buggy_code)):
            essential[i] = None
        elif k.search_bound < 1:
            essential[i] = k.size
    capped = False
    for s in range(1, max((k.search_bound for k in comps), default=0) + 1):
        for i, k in enumerate(comps):
            if i in essential or s > k.search_bound:
                continue
            for window in k.windows(s):
                if budget == 0:
                    capped = True
                    break
                budget -= 1
                if passes(k.program(task.buggy_code, window)):
                    essential[i] = s
                    break
            else:
                if s == k.search_bound:
                    essential[i] = k.size
    for i, k in enumerate(comps):
        if i not in essential:
            assert capped
            essential[i] = k.size
    assert [c.essential for c in score.components] == [essential[i] for i in range(len(comps))]
    assert score.window_search_capped is capped


def test_unicode_whitespace_python_rejects_is_not_stripped_before_running(fleet):
    """The fix followed by a line holding only U+00A0: Python cannot compile it, so unit = 0.

    The diff strips only the whitespace Python ignores (space, tab, form feed), so the U+00A0
    line is an edit: the fix (a modify whose verification program passes) and the insert are
    one block of ℓ = 2 with credit 1, so p = 1/2, r = 1 and, with unit = 0, f1 = 2/3.
    """
    s = score_one(fleet, MEAN, MEAN_FIX + "\u00a0")
    assert (s.unit, s.edited_lines, s.precision, s.recall) == (0, 2, 0.5, 1.0)
    assert s.f1 == pytest.approx(2 / 3)
    assert s.reward == pytest.approx(r(0, 2 / 3))
