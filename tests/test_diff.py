"""Line diff, edits, blocks, pairing and apply (docs/reward.md, "Lines, edits and blocks")."""

import difflib
import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward.diff import Block, Edit, apply, diff, edits_of, nonblank_lines, pair_lines, ratio


def kinds(blocks):
    return [[(e.kind, e.line, e.old, e.new) for e in b.edits] for b in blocks]


def test_identical_programs_have_no_blocks():
    assert diff("a\nb\n", "a\nb\n") == []


def test_blank_lines_and_trailing_whitespace_never_count():
    c = "def f(x):\n    y = x\n\n    return y\n"
    p = "def f(x):   \n\n\n    y = x\t\n    return y\n\n\n"
    assert diff(c, p) == []


def test_single_modify_keeps_original_line_number():
    c = "a\n\nb\n\nc"
    [block] = diff(c, "a\n\nB\n\nc")
    assert kinds([block]) == [[("modify", 3, "b", "B")]]
    assert block.span == (3.0, 3.0)


def test_indentation_and_comments_are_significant():
    assert kinds(diff("if x:\n  y\n", "if x:\n    y\n")) == [[("modify", 2, "  y", "    y")]]
    assert kinds(diff("x = 1  # one\n", "x = 1  # uno\n")) == [[("modify", 1, "x = 1  # one", "x = 1  # uno")]]


def test_delete_and_separate_blocks():
    blocks = diff("a\nb\nc\nd\ne", "a\nc\nd\nE")
    assert kinds(blocks) == [[("delete", 2, "b", None)], [("modify", 5, "e", "E")]]
    assert [b.span for b in blocks] == [(2.0, 2.0), (5.0, 5.0)]


def test_blank_line_of_c_separates_blocks_of_one_opcode():
    # Lines 2 and 4 are consecutive non-blank lines (one replace opcode) but blank line 3 lies between.
    c = "def inc(x):\n    return x + 2\n\ndef dec(x):\n    return x - 1\n"
    blocks = diff(c, c.replace("x + 2", "x + 1").replace("dec(x)", "dec(y)"))
    assert kinds(blocks) == [[("modify", 2, "    return x + 2", "    return x + 1")],
                             [("modify", 4, "def dec(x):", "def dec(y):")]]
    assert [b.span for b in blocks] == [(2.0, 2.0), (4.0, 4.0)]
    # Without the blank line the same edits are one block.
    joined = c.replace("\n\n", "\n")
    [block] = diff(joined, joined.replace("x + 2", "x + 1").replace("dec(x)", "dec(y)"))
    assert block.span == (2.0, 3.0)


def test_blank_line_splits_an_insert_from_the_next_edit():
    # One replace opcode: bbbb -> [zz, bbbX]; bbbb pairs with bbbX, zz is an insert after line 1
    # (position 1.5); blank line 2 lies between 1.5 and 3: two blocks, the insert-only one at [1.5, 1.5].
    blocks = diff("a\n\nbbbb\nc", "a\nzz\n\nbbbX\nc")
    assert kinds(blocks) == [[("insert", 1, None, "zz")], [("modify", 3, "bbbb", "bbbX")]]
    assert [b.span for b in blocks] == [(1.5, 1.5), (3.0, 3.0)]
    # Inserts at one place are never split (blank lines of P do not count).
    [block] = diff("a\n\n\nb", "a\nx\n\ny\n\nb")
    assert kinds([block]) == [[("insert", 1, None, "x"), ("insert", 1, None, "y")]]


def test_insert_at_top_sits_at_half():
    [block] = diff("a\nb", "x\ny\na\nb")
    assert kinds([block]) == [[("insert", 0, None, "x"), ("insert", 0, None, "y")]]
    assert block.span == (0.5, 0.5)
    assert [e.position for e in block.edits] == [0.5, 0.5]


def test_insert_anchors_on_last_nonblank_line_before_opcode():
    c = "a\n\n\nb"
    [block] = diff(c, "a\n\nx\nb")
    assert kinds([block]) == [[("insert", 1, None, "x")]]
    assert block.span == (1.5, 1.5)
    assert apply(c, block.edits) == "a\nx\n\n\nb"


def test_comment_above_fix_leaves_fix_paired_with_buggy_line():
    c = "def f(x):\n    return x + 1\n"
    [block] = diff(c, "def f(x):\n    # off by one\n    return x - 1\n")
    assert kinds([block]) == [[("insert", 1, None, "    # off by one"),
                               ("modify", 2, "    return x + 1", "    return x - 1")]]
    assert block.span == (2.0, 2.0)
    assert [e.position for e in block.edits] == [1.5, 2.0]


def test_comment_below_fix_anchors_on_the_paired_line():
    c = "def f(x):\n    return x + 1\nz = 0"
    [block] = diff(c, "def f(x):\n    return x - 1\n    # off by one\nz = 0")
    assert kinds([block]) == [[("modify", 2, "    return x + 1", "    return x - 1"),
                               ("insert", 2, None, "    # off by one")]]
    assert [e.position for e in block.edits] == [2.0, 2.5]


def test_pairing_tie_goes_to_lexicographically_smallest():
    # ratio("xy", "xa") == ratio("xy", "xb") == 1/2: the fix pairs with the first added line.
    [block] = diff("q\nxy\nr", "q\nxa\nxb\nr")
    assert kinds([block]) == [[("modify", 2, "xy", "xa"), ("insert", 2, None, "xb")]]
    [block] = diff("q\nxa\nxb\nr", "q\nxy\nr")
    assert kinds([block]) == [[("modify", 2, "xa", "xy"), ("delete", 3, "xb", None)]]


def test_pairing_maximizes_the_sum_not_greedy():
    # (abcd, abcx) + (zzzz, zzzx) = 3/4 + 3/4 beats (abcd, abcx) + (zzzz, abzz) = 3/4 + 1/2.
    removed, added = ["abcd", "zzzz"], ["abcx", "abzz", "zzzx"]
    assert ratio("abcd", "abcx") == Fraction(3, 4)
    assert ratio("zzzz", "zzzx") == Fraction(3, 4)
    assert ratio("zzzz", "abzz") == Fraction(1, 2)
    assert pair_lines(removed, added) == [(0, 0), (1, 2)]


def test_ratio_matches_difflib():
    for a, b in [("return x", "return y"), ("", "a"), ("abc", "cab"), ("x" * 300, "x" * 299 + "y")]:
        assert float(ratio(a, b)) == difflib.SequenceMatcher(None, a, b).ratio()


def test_apply_places_reference_inserts_first_and_replaces_as_written():
    c = "a\nb\n"
    ref = [Edit("insert", 1, None, "r", "r")]
    pred = [Edit("insert", 1, None, "p", "p"), Edit("modify", 2, "b", "B", "B   ")]
    assert apply(c, ref, pred) == "a\nr\np\nB   \n"
    assert apply(c, [Edit("delete", 1, "a")]) == "b\n"


def test_apply_rejects_two_edits_of_one_line():
    with pytest.raises(ValueError):
        apply("a\nb", [Edit("delete", 1, "a")], [Edit("modify", 1, "a", "A", "A")])


def test_edits_of_keeps_position_order_across_blocks():
    blocks = diff("a\nb\nc\nd", "x\na\nB\nc\nd\ny")
    assert [e.position for e in edits_of(blocks)] == [0.5, 2.0, 4.5]
    assert all(isinstance(b, Block) for b in blocks)


def _brute_pairing(removed, added):
    k = min(len(removed), len(added))
    best = None
    for rs in itertools.combinations(range(len(removed)), k):
        for as_ in itertools.combinations(range(len(added)), k):
            pairs = list(zip(rs, as_))
            key = (sum((ratio(removed[r], added[a]) for r, a in pairs), Fraction(0)), [(-r, -a) for r, a in pairs])
            if best is None or key > best[0]:
                best = (key, pairs)
    return best[1]


lines_st = st.lists(st.text(alphabet="ab x", min_size=1, max_size=4), max_size=4)


@settings(max_examples=150, deadline=None)
@given(lines_st, lines_st)
def test_pairing_matches_brute_force(removed, added):
    assert pair_lines(removed, added) == _brute_pairing(removed, added)


programs_st = st.lists(st.sampled_from(["a", "b", "  c", "d  ", "", "e", "# f", "g = 1"]), max_size=8).map("\n".join)


@settings(max_examples=200, deadline=None)
@given(programs_st, programs_st)
def test_apply_of_diff_rebuilds_p_up_to_blank_lines(c, p):
    blocks = diff(c, p)
    rebuilt = apply(c, edits_of(blocks))
    assert [t for _, t in nonblank_lines(rebuilt)] == [t for _, t in nonblank_lines(p)]
    positions = [e.position for e in edits_of(blocks)]
    assert positions == sorted(positions)
    assert sum(len(b) for b in blocks) >= abs(len(nonblank_lines(c)) - len(nonblank_lines(p)))
