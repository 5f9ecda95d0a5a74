"""Helpers the tests trust, bound from the reference solution instead of the program.

Some tests call a function of the program other than the one under test to
check its answer: HumanEval/32 asserts `poly(coeffs, find_zero(coeffs)) ≈ 0`,
/38 and /50 decode what `encode_cyclic` / `encode_shift` made. Run against
the program's own helper, such a test passes any program that also replaces
the helper (a `poly` that returns 0). `bind_helpers` puts the reference's
definitions of those helpers at the top of the tests, so in the judge the
tests' own trusted copy shadows the program's name.

A helper here is a top-level function or class of the reference that the
tests name only inside their own functions (HumanEval's `check`); a name the
tests use at their top level (`check(find_zero)`, MBPP's `assert f(...)`) is
an entry point and stays the program's.
"""

from __future__ import annotations

import ast

HEADER = "# Helpers the tests trust, from the reference solution (reward/trusted_helpers.py)\n"


def _loaded(nodes: list[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound_at_top(tree: ast.Module) -> set[str]:
    """Names a module's top-level statements bind (definitions, assignments, imports)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def helper_names(tests: str, solution: str) -> list[str]:
    """The reference's functions and classes the tests name only inside their own functions (sorted).

    Definitions the helpers need from the reference (other functions, constants)
    come along, except the entry points. Empty when either text does not parse.
    """
    test_tree, ref_tree = _parse(tests), _parse(solution)
    if test_tree is None or ref_tree is None:
        return []
    defs = {s.name: s for s in ref_tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    inside = [s for s in test_tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    at_top = [s for s in test_tree.body if s not in inside]
    entry_points = _loaded(at_top)
    wanted = (_loaded(inside) - entry_points - _bound_at_top(test_tree)) & defs.keys()
    todo = list(wanted)
    while todo:  # what the helpers themselves call
        for name in _loaded([defs[todo.pop()]]) & defs.keys():
            if name not in wanted and name not in entry_points:
                wanted.add(name)
                todo.append(name)
    return sorted(wanted)


def bind_helpers(tests: str, solution: str) -> tuple[str, list[str]]:
    """The tests with the reference's helpers (and its imports and constants) defined first, and their names."""
    names = helper_names(tests, solution)
    if not names:
        return tests, []
    tree = ast.parse(solution)
    keep = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            keep.append(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if stmt.name in names:
                keep.append(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _bound_at_top(ast.Module([stmt], [])) & _loaded(
                [s for s in tree.body if getattr(s, "name", None) in names]):
            keep.append(stmt)
    lines = solution.splitlines()
    text = "\n\n".join("\n".join(lines[_first_line(stmt) - 1:stmt.end_lineno]) for stmt in keep)
    return f"{HEADER}{text}\n\n\n{tests}", names


def _first_line(stmt: ast.stmt) -> int:
    """A statement's first line, its decorators included."""
    return min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
