"""Rule-based, AST-aware bug operators: every single-line operator changes one line.

An operator finds sites in the parsed program and rewrites the source text of
one node (or one operator token) in place, so the rest of the line (spacing,
comments) and every other line stay byte for byte: the diff to the original is
exactly that line. Operators are grouped in PDB's defect categories, taken
from the Orthogonal Defect Classification: Algorithm, Checking, Assignment,
Build/Package and Timing/Serialization.

Only nodes that start and end on one line at or after `frozen_lines` (0-based
index of the first line that may change) are touched; a rewrite that does not
parse is dropped. Generation is pure and deterministic: the only choice
(`wrong_variable`'s replacement names) is drawn from a `random.Random` seeded
by the caller's seed and the site. Whether a mutant is a bug (its tests fail)
is decided later, in the sandbox (`reward.data.build`).
"""

from __future__ import annotations

import ast
import dataclasses
import random
from collections.abc import Callable, Iterable, Iterator

ALGORITHM, CHECKING, ASSIGNMENT = "Algorithm", "Checking", "Assignment"
BUILD, TIMING = "Build/Package", "Timing/Serialization"


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace line `line` (0-based index into `program.split("\\n")`) by `text`; None deletes it."""

    line: int
    text: str | None


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One candidate bug: the operator that made it and its line edits."""

    operator: str
    category: str
    edits: tuple[Edit, ...]


def apply_edits(program: str, edits: Iterable[Edit]) -> str:
    """The program with the edits applied (lines replaced or deleted, blank lines kept)."""
    lines = program.split("\n")
    for edit in edits:
        lines[edit.line] = edit.text
    return "\n".join(line for line in lines if line is not None)


@dataclasses.dataclass
class _Source:
    """A parsed program and what operators need to rewrite it."""

    tree: ast.Module
    lines: list[bytes]
    frozen: int
    seed: str
    scopes: dict[int, list[str]]  # id(Name node) -> other names bound in its function

    def mutable(self, node: ast.AST) -> bool:
        """True when the node lies on one line that may change."""
        return (getattr(node, "lineno", None) is not None and node.lineno == node.end_lineno
                and node.lineno - 1 >= self.frozen)

    def text(self, node: ast.AST) -> str:
        return self.lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode()

    def replace(self, lineno: int, start: int, end: int, new: str) -> tuple[int, str]:
        """Line `lineno` (1-based) with byte columns [start, end) replaced by `new`."""
        line = self.lines[lineno - 1]
        return lineno - 1, (line[:start] + new.encode() + line[end:]).decode()

    def sub(self, node: ast.AST, new: str) -> tuple[int, str]:
        return self.replace(node.lineno, node.col_offset, node.end_col_offset, new)

    def token_between(self, left: ast.AST, right: ast.AST) -> tuple[int, int, str] | None:
        """The operator token between two operands on one line: (start, end, text), parentheses excluded."""
        if left.end_lineno != right.lineno:
            return None
        gap = self.lines[left.end_lineno - 1][left.end_col_offset:right.col_offset].decode()
        token = gap.strip().strip("()").strip()
        if not token or "#" in token or "\\" in token:
            return None
        start = left.end_col_offset + len(gap[:gap.index(token)].encode())
        return start, start + len(token.encode()), " ".join(token.split())

    def indent(self, lineno: int) -> str:
        line = self.lines[lineno - 1].decode()
        return line[:len(line) - len(line.lstrip())]


Site = tuple[int, str | None]  # (0-based line, new line text or None to delete it)
Operator = Callable[[_Source], Iterator[Site]]

_ATOMIC = (ast.Name, ast.Constant, ast.Call, ast.Attribute, ast.Subscript, ast.List, ast.Dict, ast.Set)


def _paren(src: _Source, node: ast.AST) -> str:
    text = src.text(node)
    return text if isinstance(node, _ATOMIC) else f"({text})"


def _int_value(node: ast.AST) -> int | None:
    """The value of an int literal, or of a negated one (`-1`)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_value(node.operand)
        return None if inner is None else -inner
    return None


def _shift(src: _Source, node: ast.AST, delta: int) -> str:
    """Source of `node` plus `delta`, simplified for literals and `x ± c`."""
    value = _int_value(node)
    if value is not None:
        return str(value + delta)
    if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
            and _int_value(node.right) is not None and src.token_between(node.left, node.right)):
        c = _int_value(node.right) * (1 if isinstance(node.op, ast.Add) else -1) + delta
        left = src.text(node.left)
        return left if c == 0 else f"{left} {'+' if c > 0 else '-'} {abs(c)}"
    return f"{_paren(src, node)} {'+' if delta > 0 else '-'} 1"


def _nodes(src: _Source, kind: type | tuple[type, ...]) -> Iterator:
    for node in ast.walk(src.tree):
        if isinstance(node, kind) and src.mutable(node):
            yield node


# Algorithm ---------------------------------------------------------------------------------

_ARITH = {"+": "-", "-": "+", "*": "//", "/": "*", "//": "/", "%": "//", "**": "*",
          "<<": ">>", ">>": "<<", "&": "|", "|": "&", "^": "&"}


def arith_swap(src: _Source) -> Iterator[Site]:
    """An arithmetic or bitwise operator replaced (`+` by `-`, `*` by `//`, `+=` by `-=`, ...)."""
    for node in _nodes(src, (ast.BinOp, ast.AugAssign)):
        left, right = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.target, node.value)
        found = src.token_between(left, right)
        if found is None:
            continue
        start, end, token = found
        aug = isinstance(node, ast.AugAssign)
        new = _ARITH.get(token[:-1] if aug else token)
        if new is not None:
            yield src.replace(left.end_lineno, start, end, new + "=" if aug else new)


def swap_operands(src: _Source) -> Iterator[Site]:
    """The operands of a non-commutative operator exchanged (`a - b` becomes `b - a`)."""
    for node in _nodes(src, ast.BinOp):
        if not isinstance(node.op, (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)):
            continue
        found = src.token_between(node.left, node.right)
        if found is None or src.text(node.left) == src.text(node.right):
            continue
        gap = src.lines[node.lineno - 1][node.left.end_col_offset:node.right.col_offset].decode()
        if gap.strip() != found[2]:
            continue  # a parenthesised operand: its parenthesis lies in the gap
        yield src.sub(node, f"{_paren(src, node.right)}{gap}{_paren(src, node.left)}")


def range_bound(src: _Source) -> Iterator[Site]:
    """A bound of `range(...)` moved by one."""
    for node in _nodes(src, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "range":
            for arg in node.args[:2]:
                if not isinstance(arg, ast.Starred):
                    for delta in (1, -1):
                        yield src.sub(arg, _shift(src, arg, delta))


def slice_bound(src: _Source) -> Iterator[Site]:
    """A slice bound moved by one (`s[1:]` becomes `s[2:]`, `s[:k]` becomes `s[:k + 1]`)."""
    for node in _nodes(src, ast.Slice):
        for bound in (node.lower, node.upper):
            if bound is not None and src.mutable(bound):
                for delta in (1, -1):
                    yield src.sub(bound, _shift(src, bound, delta))


def off_by_one(src: _Source) -> Iterator[Site]:
    """An integer literal moved by one."""
    for node in _nodes(src, ast.Constant):
        if type(node.value) is int:
            for delta in (1, -1):
                yield src.sub(node, str(node.value + delta))


_BUILTINS = {"min": "max", "max": "min", "any": "all", "all": "any", "int": "round", "round": "int",
             "sorted": "reversed", "reversed": "sorted", "list": "set", "sum": "len", "abs": "int"}


def wrong_builtin(src: _Source) -> Iterator[Site]:
    """A builtin call replaced by a related one (`min`/`max`, `any`/`all`, ...)."""
    for node in _nodes(src, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in _BUILTINS:
            yield src.sub(node.func, _BUILTINS[node.func.id])


def wrong_return(src: _Source) -> Iterator[Site]:
    """A wrong return value: a flipped boolean, a negated test, or `None`."""
    for node in _nodes(src, ast.Return):
        value = node.value
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            yield src.sub(value, str(not value.value))
        elif isinstance(value, (ast.Compare, ast.BoolOp)):
            yield src.sub(value, f"not ({src.text(value)})")
        else:
            yield src.sub(value, "None")


def break_continue(src: _Source) -> Iterator[Site]:
    """`break` and `continue` exchanged."""
    for node in _nodes(src, (ast.Break, ast.Continue)):
        yield src.sub(node, "continue" if isinstance(node, ast.Break) else "break")


# Checking ----------------------------------------------------------------------------------

_COMPARE = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==",
            "in": "not in", "not in": "in", "is": "is not", "is not": "is"}


def comparison_swap(src: _Source) -> Iterator[Site]:
    """A comparison operator replaced (`<` by `<=`, `==` by `!=`, `in` by `not in`, ...)."""
    for node in _nodes(src, ast.Compare):
        for left, right in zip([node.left, *node.comparators], node.comparators):
            found = src.token_between(left, right)
            if found is not None and found[2] in _COMPARE:
                yield src.replace(left.end_lineno, found[0], found[1], _COMPARE[found[2]])


def boolean_swap(src: _Source) -> Iterator[Site]:
    """`and` and `or` exchanged."""
    for node in _nodes(src, ast.BoolOp):
        for left, right in zip(node.values, node.values[1:]):
            found = src.token_between(left, right)
            if found is not None and found[2] in ("and", "or"):
                yield src.replace(left.end_lineno, found[0], found[1], "or" if found[2] == "and" else "and")


def _tests(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            yield node.test
        elif isinstance(node, ast.comprehension):
            yield from node.ifs


def negate_condition(src: _Source) -> Iterator[Site]:
    """The test of an `if`, `while`, conditional expression or comprehension filter negated."""
    for test in _tests(src.tree):
        if src.mutable(test) and not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)):
            simple = isinstance(test, (*_ATOMIC, ast.Compare))
            yield src.sub(test, f"not {src.text(test)}" if simple else f"not ({src.text(test)})")


def missing_not(src: _Source) -> Iterator[Site]:
    """A `not` dropped."""
    for node in _nodes(src, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            text = src.text(node)
            yield src.sub(node, text[len("not"):].lstrip())


# Assignment --------------------------------------------------------------------------------

def wrong_variable(src: _Source) -> Iterator[Site]:
    """A variable read replaced by another name bound in the same function (up to two choices)."""
    for node in _nodes(src, ast.Name):
        others = src.scopes.get(id(node))
        if isinstance(node.ctx, ast.Load) and others:
            rng = random.Random(f"{src.seed}:{node.lineno}:{node.col_offset}")
            for name in rng.sample(others, min(2, len(others))):
                yield src.sub(node, name)


def wrong_index(src: _Source) -> Iterator[Site]:
    """A subscript index moved by one (`a[i]` becomes `a[i + 1]`, `a[-1]` becomes `a[0]`)."""
    for node in _nodes(src, ast.Subscript):
        index = node.slice
        if isinstance(index, (ast.Slice, ast.Tuple)) or (isinstance(index, ast.Constant) and type(index.value) is not int):
            continue
        for delta in (1, -1):
            yield src.sub(index, _shift(src, index, delta))


def swap_arguments(src: _Source) -> Iterator[Site]:
    """Two adjacent positional arguments of a call exchanged."""
    for node in _nodes(src, ast.Call):
        args = node.args
        if any(isinstance(a, ast.Starred) for a in args):
            continue
        for a, b in zip(args, args[1:]):
            if src.text(a) != src.text(b):
                line = src.lines[node.lineno - 1]
                new = line[:a.col_offset] + src.text(b).encode() + line[a.end_col_offset:b.col_offset] \
                    + src.text(a).encode() + line[b.end_col_offset:]
                yield node.lineno - 1, new.decode()


def bool_constant(src: _Source) -> Iterator[Site]:
    """`True` and `False` exchanged."""
    for node in _nodes(src, ast.Constant):
        if isinstance(node.value, bool):
            yield src.sub(node, str(not node.value))


def _bodies(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body


def _alone_on_line(src: _Source, stmt: ast.stmt) -> bool:
    """True for a one-line statement that is the only code on its line."""
    if not src.mutable(stmt):
        return False
    line = src.lines[stmt.lineno - 1]
    rest = line[stmt.end_col_offset:].strip()
    return not line[:stmt.col_offset].strip() and (not rest or rest.startswith(b"#"))


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def delete_statement(src: _Source) -> Iterator[Site]:
    """A simple statement (assignment, update or call) deleted from a body that keeps others."""
    for body in _bodies(src.tree):
        code = [s for s in body if not _is_docstring(s)]
        if len(code) < 2:
            continue
        for stmt in code:
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)) and _alone_on_line(src, stmt):
                yield stmt.lineno - 1, None


# Build/Package -----------------------------------------------------------------------------

_API = {"lower": "upper", "upper": "lower", "startswith": "endswith", "endswith": "startswith",
        "isupper": "islower", "islower": "isupper", "isdigit": "isalpha", "isalpha": "isdigit",
        "append": "extend", "find": "rfind", "rfind": "find", "lstrip": "rstrip", "rstrip": "lstrip",
        "strip": "lstrip", "keys": "values", "values": "keys", "floor": "ceil", "ceil": "floor",
        "sort": "reverse", "index": "count", "count": "index", "pop": "copy"}


def wrong_api(src: _Source) -> Iterator[Site]:
    """A library method or module function replaced by its sibling (`lower`/`upper`, `floor`/`ceil`, ...)."""
    for node in _nodes(src, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _API and src.mutable(func):
            end = func.end_col_offset
            yield src.replace(func.lineno, end - len(func.attr.encode()), end, _API[func.attr])


# Timing/Serialization ----------------------------------------------------------------------

def _loop_moves(src: _Source, size: range) -> Iterator[tuple[list[ast.stmt], str]]:
    """Runs of `size` statements that can move across a loop boundary, with their new indent.

    The last statements of a loop body move after the loop (dedent); the
    statements right after a loop move into its body (indent).
    """
    for body in _bodies(src.tree):
        for i, stmt in enumerate(body):
            if not isinstance(stmt, (ast.For, ast.While)) or stmt.orelse or stmt.lineno - 1 < src.frozen:
                continue
            inner = src.indent(stmt.body[0].lineno)
            for n in size:
                tail, after = stmt.body[-n:], body[i + 1:i + 1 + n]
                if len(stmt.body) > n and all(_alone_on_line(src, s) for s in tail):
                    yield tail, src.indent(stmt.lineno)
                if len(after) == n and all(_alone_on_line(src, s) for s in after):
                    yield after, inner


def _moved(src: _Source, stmts: list[ast.stmt], indent: str) -> list[Site]:
    return [(s.lineno - 1, indent + src.lines[s.lineno - 1].decode().lstrip()) for s in stmts]


def loop_boundary(src: _Source) -> Iterator[Site]:
    """One statement moved out of the end of a loop body, or into it from right after the loop."""
    for stmts, indent in _loop_moves(src, range(1, 2)):
        yield from _moved(src, stmts, indent)


# Registry ----------------------------------------------------------------------------------

# name -> (category, operator). Order matters: when two operators make the same
# program, the earlier one names it.
OPERATORS: dict[str, tuple[str, Operator]] = {
    "range_bound": (ALGORITHM, range_bound),
    "slice_bound": (ALGORITHM, slice_bound),
    "wrong_index": (ASSIGNMENT, wrong_index),
    "off_by_one": (ALGORITHM, off_by_one),
    "arith_swap": (ALGORITHM, arith_swap),
    "swap_operands": (ALGORITHM, swap_operands),
    "wrong_builtin": (ALGORITHM, wrong_builtin),
    "wrong_return": (ALGORITHM, wrong_return),
    "break_continue": (ALGORITHM, break_continue),
    "comparison_swap": (CHECKING, comparison_swap),
    "boolean_swap": (CHECKING, boolean_swap),
    "negate_condition": (CHECKING, negate_condition),
    "missing_not": (CHECKING, missing_not),
    "wrong_variable": (ASSIGNMENT, wrong_variable),
    "swap_arguments": (ASSIGNMENT, swap_arguments),
    "bool_constant": (ASSIGNMENT, bool_constant),
    "delete_statement": (ASSIGNMENT, delete_statement),
    "wrong_api": (BUILD, wrong_api),
    "loop_boundary": (TIMING, loop_boundary),
}

BLOCK_SHIFT = "loop_block_shift"


def _function_scopes(tree: ast.Module) -> dict[int, list[str]]:
    """For each Name node inside a function: the other names bound in that function, sorted."""
    scopes: dict[int, list[str]] = {}
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = func.args
        bound = {arg.arg for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if arg}
        inner: list[ast.Name] = []
        comprehension_targets: set[int] = set()
        stack: list[ast.AST] = list(func.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.comprehension):
                comprehension_targets.update(id(n) for n in ast.walk(node.target))
            if isinstance(node, ast.Name):
                inner.append(node)
                if not isinstance(node.ctx, ast.Load) and id(node) not in comprehension_targets:
                    bound.add(node.id)
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.extend(ast.iter_child_nodes(node))
        for name in inner:
            if name.id in bound:
                scopes[id(name)] = sorted(bound - {name.id})
    return scopes


def _source(program: str, frozen_lines: int, seed: str) -> _Source | None:
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return None
    return _Source(tree, [line.encode() for line in program.split("\n")], frozen_lines, seed,
                   _function_scopes(tree))


def _parses(program: str) -> bool:
    try:
        ast.parse(program)
    except (SyntaxError, ValueError):
        return False
    return True


def single_line_mutants(program: str, frozen_lines: int = 0, seed: str = "0",
                        operators: Iterable[str] | None = None) -> list[Mutant]:
    """Every distinct one-line mutant of `program` that parses, in operator order.

    Args:
        program: the correct program.
        frozen_lines: lines before this 0-based index never change (e.g. HumanEval's prompt).
        seed: seeds the operators' choices (combine the run seed with the problem id).
        operators: names of the operators to use (default: all of `OPERATORS`).
    """
    src = _source(program, frozen_lines, seed)
    if src is None:
        return []
    lines = program.split("\n")
    names = list(OPERATORS) if operators is None else list(operators)
    seen, mutants = {program}, []
    for name in names:
        category, operator = OPERATORS[name]
        for line, text in operator(src):
            if text is not None and text.strip() == "":
                continue
            edit = Edit(line, text)
            mutated = apply_edits(program, [edit])
            if mutated not in seen and lines[line] != text and _parses(mutated):
                seen.add(mutated)
                mutants.append(Mutant(name, category, (edit,)))
    return mutants


def block_shift_mutants(program: str, frozen_lines: int = 0) -> list[Mutant]:
    """Multi-line faults: 2 to 4 contiguous statements moved together across a loop boundary."""
    src = _source(program, frozen_lines, "0")
    if src is None:
        return []
    seen, mutants = {program}, []
    for stmts, indent in _loop_moves(src, range(2, 5)):
        edits = tuple(Edit(line, text) for line, text in _moved(src, stmts, indent))
        if any(e.line + 1 != f.line for e, f in zip(edits, edits[1:])):
            continue  # statements with a blank or comment line between them are not one block
        mutated = apply_edits(program, edits)
        if mutated not in seen and _parses(mutated):
            seen.add(mutated)
            mutants.append(Mutant(BLOCK_SHIFT, TIMING, edits))
    return mutants
