"""Plain assert tests judged in the host: calls of the program's functions on literals, answers compared with literals.

Most assert tests only do this: `assert f(1, [2, 3]) == 5`, HumanEval's
`def check(candidate): assert abs(candidate(x) - 2.5) < 1e-6` then
`check(entry)`, the demo's `assert f(3, 4) == 12`. Such tests need no test
process: this module reads them into a `Plan` (or None when the tests hold
anything else) and the host judges the run itself, over the same socket and
with the judge's own `Channel` and `Handle` (loaded from the source the judge
process runs, so a handle follows the same rules). No test code is executed:
the plan is walked node by node, and the only operations it applies to the
program's answers are `==`, `!=`, `is`, `is not`, `<`, `<=`, `abs(x - literal)`,
`not` and truth, on plain data (built-in types only, bounded by the codec) or
on handles (each use a call in the program's process, except what `Handle`
decides itself: `handle - literal` is a TypeError, the literal never reaches
the program). Every read of the socket ends at the run's deadline. See
docs/sandbox.md, "Plain assert tests are judged by the host".
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import marshal
import operator
import time
import types
from pathlib import Path
from typing import Any

from reward.sandbox_codec import CodecError, from_wire, recv_frame, send_frame

_HERE = Path(__file__).parent
# The judge process's own classes (its Channel, Handle and ProxyError), from the same sources.
_JUDGE: dict[str, Any] = {"__name__": "precisecoder_direct_judge"}
exec(compile((_HERE / "sandbox_codec.py").read_text() + "\n" + (_HERE / "sandbox_judge.py").read_text(),
             str(_HERE / "sandbox_judge.py"), "exec"), _JUDGE)
Channel, Handle, ProxyError, Unverifiable = (_JUDGE[k] for k in ("Channel", "Handle", "ProxyError", "Unverifiable"))
DETAIL = _JUDGE["DETAIL"]

_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.Lt: operator.lt, ast.LtE: operator.le}


BUILTIN_NAMES = frozenset(dir(builtins))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The tests as a list of asserts over calls of the program's names.

    `steps` holds (test, message, line, names) per assert, in order: `test` is
    the assert's test as nested tuples (below) whose literals are kept as
    `marshal` bytes, so each run gets fresh objects as Python would build them;
    `names` maps a name the test calls to the program's name (a `check(entry)`
    of a `def check(candidate)` contributes check's asserts with `candidate`
    standing for `entry`).

    Tests: ("lit", v) | ("call", name, args, kwargs) | ("not", call) |
    ("cmp", op, call, v) | ("absdiff", op, call, v, bound).
    """

    steps: tuple[tuple[tuple, Any, int, tuple[tuple[str, str], ...]], ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(program for *_, names in self.steps for _, program in names)


def _literal(node: ast.AST) -> bytes | None:
    """A literal's value as marshal bytes, or None for anything else."""
    try:
        return marshal.dumps(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _call(node: ast.AST, callables: frozenset[str] | None) -> tuple | None:
    """A call of a name (one of `callables`, or any non-built-in name when None) on literals."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    name = node.func.id
    if name in BUILTIN_NAMES or (callables is not None and name not in callables):
        return None
    args = [None if isinstance(a, ast.Starred) else _literal(a) for a in node.args]
    kwargs = [(k.arg, _literal(k.value)) for k in node.keywords]
    if None in args or any(key is None or value is None for key, value in kwargs):
        return None
    return ("call", name, tuple(args), tuple(kwargs))


def _test(node: ast.AST, callables: frozenset[str] | None) -> tuple | None:
    """An assert's test in the grammar: literal, call, not call, call OP literal, abs(call - literal) < literal."""
    value = _literal(node)
    if value is not None:
        return ("lit", value)
    call = _call(node, callables)
    if call is not None:
        return call
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        call = _call(node.operand, callables)
        return None if call is None else ("not", call)
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return None
    right, left, op = _literal(node.comparators[0]), node.left, type(node.ops[0])
    if right is None:
        return None
    if op in (ast.Eq, ast.NotEq, ast.Is, ast.IsNot):
        call = _call(left, callables)
        return None if call is None else ("cmp", _COMPARE[op], call, right)
    if op in (ast.Lt, ast.LtE) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name) \
            and left.func.id == "abs" and len(left.args) == 1 and not left.keywords \
            and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub):
        call, sub = _call(left.args[0].left, callables), _literal(left.args[0].right)
        return None if call is None or sub is None else ("absdiff", _COMPARE[op], call, sub, right)
    return None


def _asserts(body: list[ast.stmt], callables: frozenset[str] | None) -> list[tuple] | None:
    """(test, message, line) of each assert of `body` (docstrings skipped), or None if anything else is there."""
    out = []
    for statement in body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue
        if not isinstance(statement, ast.Assert):
            return None
        test = _test(statement.test, callables)
        message = None if statement.msg is None else _literal(statement.msg)
        if test is None or (statement.msg is not None and message is None):
            return None
        out.append((test, message, statement.lineno))
    return out


def _called(test: tuple) -> list[str]:
    """The names a test calls, in order."""
    if test[0] == "call":
        return [test[1]]
    return [] if test[0] == "lit" else _called(test[1] if test[0] == "not" else test[2])


@functools.lru_cache(maxsize=4096)
def plan_of(code: str) -> Plan | None:
    """The tests as a `Plan`, or None when they hold anything but the grammar above.

    Top level: asserts, literal assignments (HumanEval's METADATA) to names no
    assert calls, `def check(x):` holding only asserts that call `x`, and
    `check(name)` calls. A call's target must be a name the program may define,
    never a built-in (the judge would call the built-in).
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    checks: dict[str, tuple[str, list[tuple]]] = {}
    assigned: set[str] = set()
    steps: list = []
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef):
            a = statement.args
            if statement.decorator_list or statement.returns or len(a.args) != 1 or a.posonlyargs \
                    or a.kwonlyargs or a.vararg or a.kwarg or a.defaults or statement.name in checks:
                return None
            param = a.args[0].arg
            body = _asserts(statement.body, frozenset({param}))
            if body is None:
                return None
            checks[statement.name] = (param, body)
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name) and _literal(statement.value) is not None:
            assigned.add(statement.targets[0].id)
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) \
                and isinstance(statement.value.func, ast.Name) and statement.value.func.id in checks \
                and len(statement.value.args) == 1 and isinstance(statement.value.args[0], ast.Name) \
                and not statement.value.keywords:
            param, body = checks[statement.value.func.id]
            target = statement.value.args[0].id
            if target in BUILTIN_NAMES or target in checks:
                return None
            steps += [(*item, ((param, target),)) for item in body]
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue
        else:
            body = _asserts([statement], None)
            if body is None:
                return None
            steps.append((*body[0], tuple((name, name) for name in dict.fromkeys(_called(body[0][0])))))
    used = {program for *_, names in steps for _, program in names}
    if used & (assigned | set(checks)):
        return None  # a name the tests rebind: the judge process would see the tests' value
    return Plan(tuple(steps))


def _bind(names: Any, wanted: frozenset[str], channel: Any) -> dict[str, Any]:
    """The program's values of the names the plan uses, as the judge binds them (`bind_names`)."""
    if not isinstance(names, dict):
        raise ProxyError("malformed name list from the program")
    bound = {}
    for name in wanted:
        desc = names.get(name)
        if not isinstance(desc, list) or not desc or name.startswith("__"):
            continue
        if desc[0] == "value" and len(desc) == 2:
            try:
                bound[name] = from_wire(desc[1], handle=channel.handle)
            except (CodecError, RecursionError):
                continue
        elif desc[0] == "module" and len(desc) == 2:
            bound[name] = types.ModuleType(str(desc[1]))  # not imported here: calling it is the judge's TypeError
    return bound


def _value(test: tuple, env: dict[str, Any]) -> Any:
    """Python's value of a test of the plan, in Python's order of evaluation."""
    kind = test[0]
    if kind == "lit":
        return marshal.loads(test[1])
    if kind == "call":
        _, name, args, kwargs = test
        if name not in env:
            raise NameError(f"name {name!r} is not defined")
        return env[name](*[marshal.loads(a) for a in args], **{k: marshal.loads(v) for k, v in kwargs})
    if kind == "not":
        return not _value(test[1], env)
    if kind == "cmp":
        _, op, call, right = test
        return op(_value(call, env), marshal.loads(right))
    _, op, call, sub, bound = test
    return op(abs(_value(call, env) - marshal.loads(sub)), marshal.loads(bound))


def _traceback(e: BaseException, line: int) -> str:
    """The judge's detail for an exception the tests raised, as Python prints it (the line of the tests)."""
    text = str(e)
    where = f'  File "tests.py", line {line}, in <module>\n' if line else ""
    return (f"Traceback (most recent call last):\n{where}{type(e).__name__}{': ' + text if text else ''}")[-DETAIL:]


class _Late(Exception):
    """The run's deadline passed during the conversation."""


class _TimedChannel(Channel):
    """The judge's channel, whose requests (the send and every read of the reply) end at the run's deadline."""

    def request(self, msg: dict) -> dict:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Late()
        self.sock.settimeout(left)  # the send's bound; the reply's reads are bounded by the deadline itself
        return super().request(msg)


def judge(sock: Any, plan: Plan, deadline: float) -> tuple[str, str, bool]:
    """(outcome, detail, late) of the run behind `sock`, as the judge process would decide it.

    `late`: the deadline (time.monotonic) passed first; the outcome is then meaningless.
    """
    channel = _TimedChannel(sock, deadline)
    outcome, detail, line = "error", "", 0
    try:
        try:
            hello = recv_frame(sock, deadline)
        except EOFError:
            raise channel.fail(ProxyError("the program's process ended before its names were read")) from None
        except (OSError, CodecError) as e:
            raise channel.fail(ProxyError(f"broken channel to the program: {e}")) from None
        if hello.get("op") == "load_failed":
            detail = f"the program raised {str(hello.get('type'))[:60]}: {str(hello.get('message'))[:500]}"
        elif hello.get("op") != "ready":
            raise channel.fail(ProxyError("the program did not describe its names"))
        else:
            bound = _bind(hello.get("names"), plan.names, channel)
            for test, message, line, names in plan.steps:
                env = {name: bound[program] for name, program in names if program in bound}
                if not _value(test, env):
                    raise AssertionError(*(() if message is None else (marshal.loads(message),)))
            outcome = "pass"
            try:
                send_frame(sock, {"op": "exit"})
            except OSError:
                pass
    except _Late:
        return "error", "", True
    except AssertionError as e:
        outcome, detail = "fail", _traceback(e, line)
    except (Exception, ProxyError) as e:
        outcome, detail = "error", _traceback(e, line)
    if time.monotonic() >= deadline:
        return "error", "", True
    if channel.failure is not None:  # raised during the tests, even if swallowed
        outcome = "unverifiable" if isinstance(channel.failure, Unverifiable) else "error"
        detail = f"{type(channel.failure).__name__}: {str(channel.failure)[:DETAIL]}"
    return outcome, detail, False
