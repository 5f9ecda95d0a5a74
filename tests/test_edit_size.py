"""An edit's size is what a reader sees (issue 42, item 5; docs/reward.md, "Lines, edits and blocks").

Lines are split as Python splits them, a line weighs the statements a reader sees on it (and the
code of `exec`/`eval`/`compile` of a literal), and trailing whitespace counts where it is program
text. Scores go through the real sandbox fleet.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl.cli import main
from reward.diff import INSERT, Edit, diff, line_weights, nonblank_lines, program_size, split_lines
from reward.fleet import Fleet
from reward.schema import AssertTests, Prediction, Task, write_predictions, write_tasks
from reward.score import Component, baseline_terms, score_predictions

# A module-level fault, so every packing style (`;`, `exec`, `\r`) can hold a rewrite of it.
AREA_C = """def area(r):
    return 3 * r * r

RADII = [1, 2, 3]
TOTAL = sum(area(r) for r in RADII) + 1

def total():
    return TOTAL
"""
AREA = Task("area#1", "area", "sum of areas", AREA_C, AREA_C.replace(" + 1\n", "\n"),
            AssertTests("assert total() == 42\nassert area(2) == 12\n"))

# Rewrites of the buggy line TOTAL = ..., written normally: no window of one line passes alone.
REWRITES = {
    "six lines": ["t = 0", "t += area(1)", "t += area(2)", "t += area(3)", "TOTAL = t", "del t"],
    "three lines": ["squares = [r * r for r in RADII]", "scaled = [3 * s for s in squares]", "TOTAL = sum(scaled)"],
    "with a loop": ["TOTAL = 0", "for r in RADII:", "    TOTAL += area(r)"],
}
PACKINGS = {
    "semicolons": lambda lines: "; ".join(lines),
    "compound header": lambda lines: "if True: " + "; ".join(lines),
    "exec literal": lambda lines: f"exec({chr(10).join(lines)!r})",
    "carriage returns": lambda lines: "\r".join(lines),
}


def with_rewrite(line: str) -> str:
    """AREA's C with its buggy line replaced by `line` (which may hold several lines)."""
    return AREA_C.replace("TOTAL = sum(area(r) for r in RADII) + 1", line)


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


def score_all(fleet, task, programs):
    return score_predictions([(task, Prediction(task.task_id, code=p)) for p in programs], fleet.run,
                             window_batch=4)


# Lines and weights (pure) -------------------------------------------------------


@pytest.mark.parametrize("program, weights", [
    ("x = 1", {1: 1}),
    ("x = 1; y = 2; z = 3", {1: 3}),
    ("x = 1;", {1: 1}),
    ("if x: a; b", {1: 3}),
    ("def f(): return 1\nclass A: pass", {1: 2, 2: 2}),
    ("if x:\n    a\nelse: b; c", {1: 1, 2: 1, 3: 2}),
    ("f = lambda x: x + 1\nd = {1: 2}\nx: int = 3", {1: 1, 2: 1, 3: 1}),
    ("y = (1,\n     2); z = 3", {1: 1, 2: 1}),
    ("# a comment\n@dec\ndef f(x):\n    return x", {1: 1, 2: 1, 3: 1, 4: 1}),
    # exec/eval/compile of a literal: the statement itself plus the literal code's size, recursively.
    ("exec('a = 1\\nb = 2; c = 3')", {1: 4}),
    ("exec(\"exec('a = 1; b = 2')\")", {1: 4}),
    ("x = eval('1 + 2')", {1: 2}),
    ("code = compile(source='a = 1\\nb = 2', filename='f', mode='exec')", {1: 3}),
    ("exec(b'a = 1; b = 2')", {1: 3}),
    ("exec(s)", {1: 1}),
    # A program that does not parse: each line alone, in a context that accepts it, else 1.
    ("  return a; b\nelse: c; d\nx = (", {1: 2, 2: 2, 3: 1}),
])
def test_line_weights(program, weights):
    assert line_weights(program) == weights
    assert program_size(program) == sum(weights.values())


def test_lines_split_as_python_splits_them():
    assert split_lines("a\rb\r\nc\nd") == ["a", "b", "c", "d"]
    assert diff("a = 1\nb = 2\nc = 3\n", "a = 1\r\nb = 2\rc = 3\r\n") == []


def test_trailing_whitespace_counts_where_it_is_program_text():
    program = 's = """one  \n\n  two\t\n"""   \nt = "x \\\n  y"\nu = 1 + \\  \n2\nv = 4\u00a0\nw = 5 \t\f'
    assert split_lines(program) == ['s = """one  ', "", "  two\t", '"""', 't = "x \\', '  y"', "u = 1 + \\  ", "2",
                                    "v = 4\u00a0", "w = 5"]
    assert [n for n, _ in nonblank_lines(program)] == list(range(1, 11))  # the empty line inside the string too
    assert nonblank_lines("x = 1 + \\\n\n2\n\ny = 3") == [(1, "x = 1 + \\"), (2, ""), (3, "2"), (5, "y = 3")]


def test_weights_count_toward_blocks_and_edits():
    c = "def f(x):\n    y = x\n    return y\n"
    [block] = diff(c, "def f(x):\n    y = x; y += 1; y *= 2\n    return y\n")
    assert [(e.kind, e.weight) for e in block.edits] == [("modify", 3)] and (len(block), block.size) == (1, 3)
    [block] = diff("def f(x):\n    y = x; y += 1\n    return y\n", c)
    assert [(e.kind, e.weight) for e in block.edits] == [("modify", 2)]  # the larger of old and new
    [block] = diff(c, "def f(x):\n    return x\n")
    assert block.size == 2


@given(st.lists(st.sampled_from([1, 1, 1, 2, 3, 5]), max_size=9), st.integers(0, 15))
@settings(max_examples=200, deadline=None)
def test_windows_are_the_contiguous_runs_of_each_weight(weights, cap):
    edits = tuple(Edit(INSERT, n, None, str(n), str(n), w) for n, w in enumerate(weights))
    component = Component((0,), (0,), cap, edits, ())
    runs = [edits[a:b] for a in range(len(edits)) for b in range(a + 1, len(edits) + 1)]

    def weighing(s):
        return [run for run in runs if sum(e.weight for e in run) == s]

    assert component.size == sum(weights)
    assert all(component.windows(s) == weighing(s) for s in range(1, sum(weights) + 2))
    assert component.window_count() == sum(len(weighing(s)) for s in range(1, component.search_bound + 1))


# Packed rewrites ------------------------------------------------------------------

SIMPLE = st.sampled_from(["t = 0", "t += 1", "u = t * 2", "del u", "assert t", "pass", "TOTAL = t", "x = 'a; b'",
                          "exec('y = 1; z = 2')", "f = lambda v: v + 1"])


@given(st.lists(SIMPLE, min_size=1, max_size=8), st.sampled_from(sorted(PACKINGS)))
@settings(max_examples=200, deadline=None)
def test_packing_never_makes_the_diff_smaller(lines, packing):
    """Pure: for any rewrite of simple statements, the packed line's ℓ is at least the normal form's
    (equal for `\\r` and `;`), so packing cannot raise precision by shrinking ℓ."""
    def ell(program):
        return sum(b.size for b in diff(AREA_C, program))

    normal, packed = ell(with_rewrite("\n".join(lines))), ell(with_rewrite(PACKINGS[packing](lines)))
    assert packed >= normal
    if packing in ("semicolons", "carriage returns"):
        assert packed == normal


def test_packed_rewrites_never_earn_more_than_written_normally(fleet):
    """Every rewrite in every packing style: reward and precision at most those of the normal form,
    and ℓ, where the program runs, at least its number of lines. The red-team case (six lines:
    normal ℓ = 6, credit = cap = 2, p = 1/3, f1 = 1/2, reward 5/6 = 0.833) gave the packed line
    ℓ = 1, p = 1, reward 1.000."""
    names = [(r, p) for r in REWRITES for p in PACKINGS]
    normal = score_all(fleet, AREA, [with_rewrite("\n".join(lines)) for lines in REWRITES.values()])
    packed = score_all(fleet, AREA, [with_rewrite(PACKINGS[p](REWRITES[r])) for r, p in names])
    by_rewrite = dict(zip(REWRITES, normal))
    assert [s.unit for s in normal] == [1, 1, 1]
    assert (by_rewrite["six lines"].edited_lines, by_rewrite["six lines"].precision) == (6, pytest.approx(1 / 3))
    assert by_rewrite["six lines"].reward == pytest.approx(5 / 6)
    for (r, p), s in zip(names, packed):
        ref = by_rewrite[r]
        assert s.reward <= ref.reward + 1e-12, (r, p, s)
        assert (s.precision or 0.0) <= ref.precision + 1e-12, (r, p, s)
        assert s.edited_lines >= len(REWRITES[r]) or not s.unit, (r, p, s)  # a line that does not parse weighs 1
    assert sum(s.unit for s in packed) == 10  # all but the two `;` packings of a loop, which do not parse


def test_carriage_returns_score_as_the_normal_form_and_run_it(fleet):
    """The `\\r` program is the normal one once its line ends are normalized: same score, same runs."""
    lines = REWRITES["six lines"]
    normal, packed = score_all(fleet, AREA, [with_rewrite("\n".join(lines)), with_rewrite("\r".join(lines))])
    assert packed == normal


def test_cli_scores_a_packed_line_by_its_statements(tmp_path):
    """`precisecoder score` on the red-team's `;` packing: ℓ = 6 (was 1) and reward 5/6 (was 1.000)."""
    tasks, preds, out = tmp_path / "tasks.jsonl", tmp_path / "preds.jsonl", tmp_path / "scores.jsonl"
    write_tasks(tasks, [AREA])
    write_predictions(preds, [Prediction(AREA.task_id, code=with_rewrite("; ".join(REWRITES["six lines"])))])
    assert main(["score", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(out),
                 "--workers", "2", "--no-progress"]) == 0
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["unit"], row["edited_lines"], row["blocks"]) == (1, 6, 1)
    assert row["reward"] == pytest.approx(5 / 6)


def test_an_exact_one_line_compound_fix_keeps_precision_one(fleet):
    """The reference fix itself on a line holding two statements: ℓ = |δ*| = 2, no window lighter than
    min(ℓ, cap) = 2, so |ess| = 2 and credit 2: precision 1, reward 1."""
    c = "def sign(x):\n    if x < 0: return 1\n    return 1 if x > 0 else 0\n"
    task = Task("sign#1", "sign", "sign", c, c.replace("return 1\n", "return -1\n", 1),
                AssertTests("assert sign(-3) == -1\nassert sign(2) == 1\nassert sign(0) == 0\n"))
    [s] = score_all(fleet, task, [task.solution])
    assert (s.unit, s.edited_lines, s.precision, s.reward) == (1, 2, 1.0, 1.0)
    assert [(k.cap, k.essential, k.credit) for k in s.components] == [(3, 2, 2)]


def test_baseline_length_of_an_invalid_rollout_is_the_weighted_size_of_c(fleet):
    [s] = score_predictions([(AREA, Prediction(AREA.task_id, response="no code"))], fleet.run)
    assert baseline_terms(s, "a = 1; b = 2\nc = 3\n") == (0.0, 3.0)


# Clean tasks: no-op and damage never together -----------------------------------

BANNER_C = '''BANNER = """hello
world"""
SIZE = 2 + \\
    3

def banner():
    return BANNER

def size():
    return SIZE
'''
CLEAN = Task("banner#clean", "banner", "banner", BANNER_C, BANNER_C,
             AssertTests("assert banner() == 'hello\\nworld'\nassert size() == 5\n"))
BREAKING = {  # whitespace that changes what the program means: each is an edit, none a no-op
    "trailing space inside a string (red team)": BANNER_C.replace("hello\n", "hello \n"),
    "trailing tab inside a string": BANNER_C.replace("hello\n", "hello\t\n"),
    "empty line inside a string": BANNER_C.replace("hello\n", "hello\n\n"),
    "space after a line-continuation backslash": BANNER_C.replace("\\\n", "\\ \n"),
    "empty line after a line-continuation backslash": BANNER_C.replace("\\\n", "\\\n\n"),
    "U+00A0 at a line end": BANNER_C.replace("return SIZE", "return SIZE\u00a0"),
}
HARMLESS = {  # whitespace Python ignores: a no-op that passes
    "trailing spaces outside strings": BANNER_C.replace("return BANNER", "return BANNER  \t"),
    "CRLF line ends": BANNER_C.replace("\n", "\r\n"),
    "blank lines added": BANNER_C.replace("\n\ndef", "\n\n   \n\ndef"),
}


def test_on_a_clean_task_noop_and_damage_never_hold_together(fleet):
    scores = score_all(fleet, CLEAN, list(BREAKING.values()) + list(HARMLESS.values()))
    for name, s in zip(list(BREAKING) + list(HARMLESS), scores):
        assert not (s.noop and s.damage), (name, s)
    assert [(s.noop, s.damage) for s in scores[:len(BREAKING)]] == [(False, 1)] * len(BREAKING)
    assert [(s.noop, s.damage) for s in scores[len(BREAKING):]] == [(True, 0)] * len(HARMLESS)
