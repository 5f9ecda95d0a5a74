"""Bug operators: each on small programs, plus the one-line and frozen-prompt invariants on HumanEval."""

import ast
import textwrap

import pytest

from reward.data.mutations import (ALGORITHM, ASSIGNMENT, BUILD, CHECKING, OPERATORS, TIMING, Edit,
                                   apply_edits, block_shift_mutants, single_line_mutants)
from reward.data.sources import humaneval_problems


def mutated(operator: str, program: str, seed: str = "0") -> list[str]:
    """The programs one operator makes from a dedented program."""
    program = textwrap.dedent(program)
    return [apply_edits(program, m.edits) for m in single_line_mutants(program, seed=seed, operators=[operator])]


def changed_lines(operator: str, program: str, seed: str = "0") -> set[str]:
    """The new text of the changed line of each mutant (stripped), or '<deleted>'."""
    out = set()
    for m in single_line_mutants(textwrap.dedent(program), seed=seed, operators=[operator]):
        (edit,) = m.edits
        out.add("<deleted>" if edit.text is None else edit.text.strip())
    return out


ADD = """
def f(a, b):
    total = a+b  # sum
    total += 1
    return total
"""


def test_arith_swap_keeps_spacing_and_comments():
    assert changed_lines("arith_swap", ADD) == {"total = a-b  # sum", "total -= 1"}


def test_arith_swap_handles_utf8_before_the_operator():
    assert changed_lines("arith_swap", "s = 'é' + t\n") == {"s = 'é' - t"}


def test_swap_operands_parenthesises_compound_operands_and_skips_parenthesised_ones():
    assert changed_lines("swap_operands", "x = a - b * 2\n") == {"x = (b * 2) - a"}
    assert changed_lines("swap_operands", "x = (a + 1) - b\n") == set()
    assert changed_lines("swap_operands", "x = a + b\n") == set()  # commutative


def test_range_bound_moves_each_bound_and_simplifies():
    got = changed_lines("range_bound", "for i in range(1, len(s) - 1):\n    pass\n")
    assert got == {"for i in range(2, len(s) - 1):", "for i in range(0, len(s) - 1):",
                   "for i in range(1, len(s)):", "for i in range(1, len(s) - 2):"}


def test_slice_bound():
    assert changed_lines("slice_bound", "t = s[1:-1]\n") == {"t = s[2:-1]", "t = s[0:-1]", "t = s[1:0]", "t = s[1:-2]"}


def test_wrong_index():
    assert changed_lines("wrong_index", "x = a[i] + a[-1]\n") == {
        "x = a[i + 1] + a[-1]", "x = a[i - 1] + a[-1]", "x = a[i] + a[0]", "x = a[i] + a[-2]"}
    assert changed_lines("wrong_index", "x = d['k']\n") == set()


def test_off_by_one():
    assert changed_lines("off_by_one", "n = 10\n") == {"n = 11", "n = 9"}
    assert changed_lines("off_by_one", "ok = True\n") == set()


def test_wrong_builtin():
    assert changed_lines("wrong_builtin", "x = max(a)\ny = any(b)\n") == {"x = min(a)", "y = all(b)"}


def test_wrong_return():
    program = """
    def f(a, b):
        if a:
            return True
        if b:
            return a == b
        return a
    """
    assert changed_lines("wrong_return", program) == {"return False", "return not (a == b)", "return None"}


def test_break_continue():
    assert changed_lines("break_continue", "for x in y:\n    break\n") == {"continue"}


def test_comparison_swap():
    assert changed_lines("comparison_swap", "t = a < b\nu = c not in d\nv = e is not None\n") == {
        "t = a <= b", "u = c in d", "v = e is None"}


def test_boolean_swap():
    assert changed_lines("boolean_swap", "t = a and b or c\n") == {"t = a and b and c", "t = a or b or c"}


def test_negate_condition():
    program = "if x > 0:\n    pass\nwhile a and b:\n    pass\ny = [v for v in w if v]\n"
    assert changed_lines("negate_condition", program) == {
        "if not x > 0:", "while not (a and b):", "y = [v for v in w if not v]"}


def test_missing_not():
    assert changed_lines("missing_not", "if not done:\n    pass\n") == {"if done:"}


def test_wrong_variable_uses_names_bound_in_the_function_only():
    program = """
    import math

    def f(a, b, c):
        total = sum(x for x in a)
        return math.sqrt(total)
    """
    got = changed_lines("wrong_variable", program)
    allowed = {f"total = sum(x for x in {n})" for n in ("b", "c", "total")} | {
        f"return math.sqrt({n})" for n in ("a", "b", "c")}
    assert len(got) == 4 and got <= allowed  # two names per site; never `x` or `math`


def test_wrong_variable_is_deterministic_per_seed():
    program = "def f(a, b, c, d, e):\n    return a\n"
    assert changed_lines("wrong_variable", program, seed="1") == changed_lines("wrong_variable", program, seed="1")
    draws = {frozenset(changed_lines("wrong_variable", program, seed=str(s))) for s in range(10)}
    assert len(draws) > 1 and all(len(d) == 2 for d in draws)


def test_swap_arguments():
    assert changed_lines("swap_arguments", "x = pow(a, b)\ny = g(c, c)\n") == {"x = pow(b, a)"}


def test_bool_constant():
    assert changed_lines("bool_constant", "found = False\n") == {"found = True"}


def test_delete_statement_leaves_every_body_non_empty():
    program = """
    def f(xs):
        total = 0
        for x in xs:
            total += x
        return total
    """
    assert changed_lines("delete_statement", program) == {"<deleted>"}
    (buggy,) = mutated("delete_statement", program)
    assert "total = 0" not in buggy and "total += x" in buggy


def test_wrong_api():
    assert changed_lines("wrong_api", "a = s.lower()\nb = math.floor(x)\n") == {"a = s.upper()", "b = math.ceil(x)"}


def test_loop_boundary_moves_one_statement_across_the_loop_end():
    program = """
    def f(xs):
        out = []
        for x in xs:
            y = x * 2
            out.append(y)
        return out
    """
    buggies = mutated("loop_boundary", program)
    assert len(buggies) == 2
    assert any("\n    out.append(y)\n" in b for b in buggies)  # dedented out of the loop
    assert any("\n        return out" in b for b in buggies)  # indented into the loop


def test_block_shift_moves_contiguous_statements_together():
    program = textwrap.dedent("""
    def f(xs):
        for x in xs:
            print(x)
            y = x * 2
            z = y + 1
        return 0
    """)
    shifts = block_shift_mutants(program)
    assert shifts and all(2 <= len(m.edits) <= 4 and m.category == TIMING for m in shifts)
    lines = [e.line for e in shifts[0].edits]
    assert lines == list(range(lines[0], lines[0] + len(lines)))


def test_apply_edits_replaces_and_deletes_keeping_blank_lines():
    assert apply_edits("a\n\nb\nc", [Edit(2, "B"), Edit(3, None)]) == "a\n\nB"


def test_registry_has_enough_operators_in_every_category():
    assert len(OPERATORS) >= 12
    assert {category for category, _ in OPERATORS.values()} == {ALGORITHM, CHECKING, ASSIGNMENT, BUILD, TIMING}


def test_unparsable_program_gives_no_mutants():
    assert single_line_mutants("def f(:\n") == []


@pytest.fixture(scope="module")
def humaneval():
    return humaneval_problems()


def test_humaneval_mutants_change_one_body_line_and_parse(humaneval):
    total = 0
    for problem in humaneval:
        original = problem.solution.split("\n")
        for m in single_line_mutants(problem.solution, problem.frozen_lines, problem.base_id):
            (edit,) = m.edits
            assert edit.line >= problem.frozen_lines, (problem.base_id, m)
            program = apply_edits(problem.solution, m.edits)
            ast.parse(program)
            lines = program.split("\n")
            if edit.text is None:
                assert lines == original[:edit.line] + original[edit.line + 1:]
            else:
                assert [i for i, (a, b) in enumerate(zip(original, lines)) if a != b] == [edit.line]
            total += 1
    assert total > 3000


def test_mutants_are_deterministic_and_distinct(humaneval):
    problem = humaneval[12]
    first = single_line_mutants(problem.solution, problem.frozen_lines, "7")
    assert first == single_line_mutants(problem.solution, problem.frozen_lines, "7")
    programs = [apply_edits(problem.solution, m.edits) for m in first]
    assert len(set(programs)) == len(programs) and problem.solution not in programs
