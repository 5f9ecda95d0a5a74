"""The judge: runs `assert` tests in a trusted process, against proxies of the program's names.

Stdlib only: `reward/sandbox_codec.py` followed by this source runs in a bare
interpreter inside a sandbox of its own (its own namespaces and, as root, its
own uid), apart from the program's sandbox: the program can neither see, signal
nor trace it, nor read its memory.

Per run the host takes a spare test process (forked before the request, see
`reward/sandbox_spares.py`) and sends it the test code (in a memfd) and one end
of a socket whose other end the program's run process holds. It reads the
program's top-level names, binds them in a new `__main__` namespace (plain
data by value, stdlib modules by importing them here, everything else as
a `Handle`; never over a built-in name), then executes the tests. Each use of a
handle (a call, an attribute, `len`, `==` with another handle, ...) sends plain
data and handles, and gets back plain data or handles, the arguments the call
mutated (copied back in place) and any exception (raised here as its built-in
type and message). A broken rule (a malformed or oversized reply, the program
gone) raises `ProxyError`, which is not an `Exception`, so no test's `except`
clause mistakes it for an expected error, and the channel remembers it: the run
is then `error` even if a bare `except:` swallowed it. A value of the tests'
own that is not plain data (a callback, a generator, a file) is lent to the
program by reference (`Lent`): the program's uses of it come back as requests,
answered here while the judge waits for its own reply, limited to `BACK_OPS`
and to public attributes. One that is never lent (a module) makes the run
`unverifiable`: no program could make it cross. A plain value over the codec's
limits is the program's `error`: the tests' own values fit (their reference
passes), so one that does not was made large by the program. No value of the
tests enters the program's process except as an argument of a call the tests
make (or the return value of a callback of theirs the program calls): an
operator between a handle and plain data is refused here (`Handle`). The
outcome (pass, fail, error, unverifiable) goes straight to the host; the
program never learns it.
"""

import builtins
import copy
import gc
import importlib
import operator
import os
import resource
import socket
import sys
import time
import traceback
import types

DETAIL = 4000
JUDGE_MARGIN_S = 2.0  # past the run's limit: the host's kill at the limit comes first, this is a backstop
PRELOADED_BYTES = 0  # address space the library environment's preloaded modules take (set by `judge_main`)


class ProxyError(BaseException):
    """A proxied call that broke the rules (the program went away, a malformed or oversized reply)."""


class Unverifiable(ProxyError):
    """The tests need something the proxy cannot carry (a value of the tests' own that is not plain data)."""


class _Foreign(CodecError):
    """A value of the tests' own that is not plain data (a callback): no program could receive it."""


class Channel:
    """The judge's end of the socket to the program's run process.

    It remembers the first `ProxyError` of the run, so a test that swallows it
    (a bare `except:`) still ends the run as `error` (or `unverifiable`).
    `deadline` (time.monotonic) bounds every read of a reply, however the
    program drips its bytes.
    """

    def __init__(self, sock, deadline=None):
        self.sock = sock
        self.deadline = deadline
        self.calls = 0
        self.failure = None
        self.handles = {}
        self.lent = Lent()

    def fail(self, exc):
        if self.failure is None:
            self.failure = exc
        return exc

    def request(self, msg):
        try:
            send_frame(self.sock, msg)
            return recv_frame(self.sock, self.deadline)
        except EOFError:
            raise self.fail(ProxyError("the program's process ended during a call")) from None
        except (OSError, CodecError) as e:
            raise self.fail(ProxyError(f"broken channel to the program: {e}")) from None

    def handle(self, number):
        """The one proxy of the program's object `number`, so `is` works as it does in the program."""
        found = self.handles.get(number)
        if found is None:
            found = self.handles[number] = Handle(number, self)
        return found

    def call(self, op, args, kwargs=None):
        """Run operation `op` (see `OPS` of the run process) on plain data and handles in the program."""
        self.calls += 1
        kwargs = kwargs or {}
        budget = _Budget()  # one per message, as the program's side spends it
        try:
            wire_args = to_wire(list(args), budget=budget, handle=self.lent.wire)
            wire_kwargs = to_wire(dict(kwargs), budget=budget, handle=self.lent.wire)
        except _Foreign as e:
            raise self.fail(Unverifiable(f"the tests pass the program a value that cannot cross ({op}): {e}")) from None
        except (CodecError, RecursionError) as e:
            raise self.fail(ProxyError(f"a value the tests pass the program ({op}) is over the limits: {e}")) from None
        reply = self.request({"op": "call", "fn": op, "args": wire_args, "kwargs": wire_kwargs})
        while reply.get("op") == "back":  # the program uses an object of the tests while it answers
            reply = self.request(self.answer_back(reply))
        kind = reply.get("op")
        if kind == "ok":
            try:
                result = from_wire(reply.get("result"), handle=self.handle, ref=self.lent.get)
                copy_back(args, reply.get("args"), range(len(args)), self.handle, self.lent.get)
                copy_back(kwargs, reply.get("kwargs"), kwargs.keys(), self.handle, self.lent.get)
            except CodecUnavailable as e:
                raise self.fail(Unverifiable(f"the reply to {op} holds a value the judge cannot build: {e}")) from None
            except (CodecError, RecursionError, TypeError, ValueError) as e:
                raise self.fail(ProxyError(f"malformed reply to {op}: {e}")) from None
            return result
        if kind == "raise":
            raise rebuild_exception(reply.get("type"), reply.get("message"))
        if kind == "stop" and op == "next":
            raise StopIteration
        if kind == "exit":
            raise self.fail(ProxyError(f"{op} in the program raised {str(reply.get('type'))[:40]}"))
        if kind == "bad":
            raise self.fail(ProxyError(f"{str(reply.get('message'))[:300]}"))
        if kind == "unavailable":
            raise self.fail(Unverifiable(f"the program's side cannot rebuild a value of the tests: "
                                         f"{str(reply.get('message'))[:300]}"))
        raise self.fail(ProxyError(f"unexpected reply to {op}"))

    def answer_back(self, msg):
        """The reply to the program's use of an object of the tests (`BACK_OPS`), run here on the real object.

        An `Exception` of the tests' code goes to the program, as it would in plain Python; an
        `AssertionError` or anything that is not an `Exception` stays here and ends the tests' own call,
        so no program can catch a failure of the tests.
        """
        try:
            fn = BACK_OPS[msg["fn"]]
            wire = msg["args"]
            if not (type(wire) is list and len(wire) == 2 and wire[0] == "list" and type(wire[1]) is list
                    and wire[1] and type(wire[1][0]) is list and wire[1][0][:1] == ["ref"]):
                raise CodecError("not a use of an object of the tests")
            args = from_wire(wire, handle=self.handle, ref=self.lent.get)
            kwargs = from_wire(msg["kwargs"], handle=self.handle, ref=self.lent.get)
            if type(kwargs) is not dict:
                raise CodecError("bad keyword arguments")
        except (KeyError, TypeError, CodecError, RecursionError) as e:
            raise self.fail(ProxyError(f"malformed request from the program: {str(e)[:200]}")) from None
        try:
            result = fn(*args, **kwargs)
        except StopIteration:
            if fn is next:
                return {"op": "stop"}
            return {"op": "raise", "type": "RuntimeError", "message": "StopIteration raised"}
        except AssertionError:
            raise
        except Exception as e:
            return {"op": "raise", "type": _builtin_name(e), "message": _text(e)}
        if result is NotImplemented:
            return {"op": "notimplemented"}
        try:
            changed, changed_kw = mutated(args, kwargs, lambda v: to_wire(v, handle=self.lent.wire), skip=1)
            return {"op": "ok", "result": to_wire(result, handle=self.lent.wire), "args": changed, "kwargs": changed_kw}
        except (CodecError, RecursionError) as e:
            return {"op": "raise", "type": "TypeError", "message": f"{msg['fn']} returned a value never lent: {e}"}


class Lent:
    """The tests' objects lent to the program by number: they never leave the judge, and each use there is a
    request here, limited to `BACK_OPS` (docs/sandbox.md, "Objects of the tests")."""

    def __init__(self):
        self.objects = []
        self.numbers = {}

    def wire(self, value):
        """The wire form of a value of the tests that is not plain data: a handle back, or a reference."""
        if type(value) is Handle:
            return ["handle", value._Handle__number]
        if isinstance(value, NEVER_LENT) or any(value is f for f in INTROSPECTION_FUNCTIONS):
            raise _Foreign(f"a value of type {type(value).__name__} is never lent to the program")
        number = self.numbers.get(id(value))
        if number is None:
            number = self.numbers[id(value)] = len(self.objects)
            self.objects.append(value)  # held for the run, so its id is never reused
        return ["ref", number]

    def get(self, number):
        if number >= len(self.objects):
            raise CodecError("unknown reference")
        return self.objects[number]


# Objects that would show the program the tests' code or data: never lent, whoever asks.
NEVER_LENT = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType, types.CellType)
INTROSPECTION_FUNCTIONS = (eval, exec, compile, getattr, setattr, delattr, hasattr, vars, globals, locals, dir,
                           __import__, breakpoint, input, open, memoryview, sys._getframe, gc.get_objects,
                           gc.get_referrers, gc.get_referents)
# Public attribute names of generators, coroutines, frames, code and tracebacks that reach frames or code.
INTROSPECTION_PREFIXES = ("gi_", "cr_", "ag_", "f_", "tb_", "co_")


def public_name(target, name):
    """The attribute `name` of `target`, if the program may read it: a public name that reaches no code."""
    if type(name) is not str or not name.isidentifier() or name.startswith("_"):
        raise AttributeError(f"the tests' objects do not lend the attribute {str(name)[:60]!r}")
    if name.startswith(INTROSPECTION_PREFIXES) and type(target).__module__ == "builtins":
        raise AttributeError(f"the tests' objects do not lend the attribute {name!r}")
    return name


def lent_getattr(target, name):
    return getattr(target, public_name(target, name))


def lent_setattr(target, name, value):
    """Set a data attribute of an instance of a class of the tests (never a method, a class or a built-in)."""
    public_name(target, name)
    kind = type(target)
    if isinstance(target, type) or kind.__module__ == "builtins" or callable(getattr(kind, name, None)):
        raise AttributeError(f"the program may not set {name!r} on a {kind.__name__} of the tests")
    setattr(target, name, value)


def lent_call(target, *args, **kwargs):
    if not callable(target):
        raise TypeError(f"'{type(target).__name__}' object is not callable")
    return target(*args, **kwargs)


def lent_exit(target, raised_type, message):
    """`with` on an object of the tests ends: its `__exit__` sees the program's exception as a built-in one."""
    if raised_type is None:
        return bool(type(target).__exit__(target, None, None, None))
    exc = rebuild_exception(raised_type, message)
    return bool(type(target).__exit__(target, type(exc), exc, None))


# What the program may do with an object of the tests, each run here by the real built-in.
BACK_OPS = {"call": lent_call, "getattr": lent_getattr, "setattr": lent_setattr, "iter": iter, "next": next,
            "len": len, "getitem": operator.getitem, "setitem": operator.setitem, "contains": operator.contains,
            "bool": bool, "str": str, "repr": repr, "enter": lambda t: type(t).__enter__(t), "exit": lent_exit,
            "hash": hash, "neg": operator.neg, "pos": operator.pos, "abs": abs, "int": int, "float": float,
            "index": operator.index, "copy": copy.copy, "deepcopy": copy.deepcopy,
            "instancecheck": lambda t, value: isinstance(value, t), "subclasscheck": lambda t, cls: issubclass(cls, t)}


def own_method(name):
    """The tests' object's own binary method `name` (NotImplemented without one): Python's operator protocol
    then runs in the program, which tries the other operand's method, as plain Python would."""
    def run(target, other):
        method = getattr(type(target), f"__{name}__", None)
        return NotImplemented if method is None else method(target, other)
    return run


for _op in ("eq", "ne", "lt", "le", "gt", "ge", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "radd",
            "rsub", "rmul", "rtruediv", "rfloordiv", "rmod", "rpow"):
    BACK_OPS[_op] = own_method(_op)


def _builtin_name(exc):
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "Exception"


def _text(exc):
    try:
        return str(exc)[:2000]
    except Exception:
        return ""


class Handle:
    """An object of the program: it stays in the program's process, and each use here is a call there.

    Comparisons are decided here (docs/sandbox.md, "Objects of the program"):
    a handle is never equal to plain data and never ordered against it, so an
    object never sees an expected value it is compared with; between two
    handles the program's own comparison decides, and it must return a bool.
    Binary operators (`-`, `+`, `divmod`, `pow`, in-place forms, ...) are
    forwarded only between handles: with plain data they are Python's
    `TypeError`, so `abs(result - 1.0)` never hands `1.0` to the program. `x in
    handle` iterates the handle here and compares each item here.
    """

    __slots__ = ("__number", "__channel")

    def __init__(self, number, channel):
        object.__setattr__(self, "_Handle__number", number)
        object.__setattr__(self, "_Handle__channel", channel)

    def __getattr__(self, name):
        return self.__channel.call("getattr", (self, name))

    def __setattr__(self, name, value):
        self.__channel.call("setattr", (self, name, value))

    def __delattr__(self, name):
        self.__channel.call("delattr", (self, name))

    def __call__(self, *args, **kwargs):
        return self.__channel.call("call", (self, *args), kwargs)

    def __iter__(self):
        return self.__channel.call("iter", (self,))

    def __next__(self):
        return self.__channel.call("next", (self,))

    def __instancecheck__(self, value):
        return self.__channel.call("isinstance", (value, self))

    def __subclasscheck__(self, value):
        return self.__channel.call("issubclass", (value, self))


def _forward(op):
    def method(self, *args):
        if op == "deepcopy":
            args = ()  # the memo is the tests' own; the program copies with a memo of its own
        return self._Handle__channel.call(op, (self, *args))
    return method


def _arithmetic(op):
    def method(self, *others):
        if any(type(other) is not Handle for other in others):
            return NotImplemented  # Python then raises its TypeError for unsupported operands
        return self._Handle__channel.call(op, (self, *others))
    return method


def _compare(op):
    def method(self, other):
        if type(other) is not Handle:
            return NotImplemented
        result = self._Handle__channel.call(op, (self, other))
        if type(result) is not bool:
            raise TypeError(f"a comparison ({op}) of the program's objects returned {type(result).__name__}, not bool")
        return result
    return method


for _name, _op in (("len", "len"), ("bool", "bool"), ("str", "str"), ("repr", "repr"), ("hash", "hash"),
                   ("format", "format"), ("int", "int"), ("float", "float"), ("complex", "complex"),
                   ("index", "index"), ("abs", "abs"), ("neg", "neg"), ("pos", "pos"), ("invert", "invert"),
                   ("round", "round"), ("reversed", "reversed"), ("getitem", "getitem"),
                   ("setitem", "setitem"), ("delitem", "delitem"), ("copy", "copy"), ("deepcopy", "deepcopy")):
    setattr(Handle, f"__{_name}__", _forward(_op))
# No reflected forms: between two handles the left one's method runs, and plain data on the left is refused.
for _op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "lshift", "rshift", "and", "or", "xor",
            "divmod", "pow"):
    setattr(Handle, f"__{_op}__", _arithmetic(_op))
    if _op not in ("divmod", "pow"):  # `h **= g` is `h = h ** g`, as for any type without `__ipow__`
        setattr(Handle, f"__i{_op}__", _arithmetic("i" + _op))
for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Handle, f"__{_op}__", _compare(_op))


def rebuild_exception(name, message):
    """A built-in `Exception` subclass named `name` carrying `message` (anything else: `Exception`)."""
    cls = getattr(builtins, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = Exception
    if issubclass(cls, (StopIteration, StopAsyncIteration)):  # the program's side should have sent RuntimeError
        cls = RuntimeError
    text = message if isinstance(message, str) else ""
    for base in cls.__mro__:
        try:
            return base(text)
        except TypeError:  # a constructor that needs more arguments (UnicodeDecodeError, ...)
            continue
    return Exception(text)


def bind_names(names, channel):
    """The tests' `__main__` namespace built from the program's description of its names."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if not isinstance(names, dict):
        raise ProxyError("malformed name list from the program")
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    for name, desc in names.items():
        if not name.isidentifier() or name.startswith("__") or hasattr(builtins, name) \
                or not isinstance(desc, list) or not desc:
            continue
        kind = desc[0]
        if kind == "value" and len(desc) == 2:
            try:
                namespace[name] = from_wire(desc[1], handle=channel.handle)
            except (CodecError, RecursionError):
                continue
        elif kind == "module" and len(desc) == 2 and isinstance(desc[1], str) \
                and desc[1].split(".")[0] in stdlib and all(p.isidentifier() for p in desc[1].split(".")):
            try:
                namespace[name] = importlib.import_module(desc[1])
            except Exception:
                continue
    return namespace


def test_main(sock, tests_source, deadline=None):
    """Run the tests against the program; returns (outcome, detail, number of calls).

    `deadline` bounds every read from the program (the host kills the test process at its own deadline first).
    """
    channel = Channel(sock, deadline)
    outcome, detail = "error", ""
    try:
        try:
            hello = recv_frame(sock, deadline)
        except EOFError:
            raise ProxyError("the program's process ended before its names were read") from None
        except (OSError, CodecError) as e:
            raise ProxyError(f"broken channel to the program: {e}") from None
        if hello.get("op") == "load_failed":
            detail = f"the program raised {str(hello.get('type'))[:60]}: {str(hello.get('message'))[:500]}"
        elif hello.get("op") != "ready":
            raise ProxyError("the program did not describe its names")
        else:
            namespace = bind_names(hello.get("names"), channel)
            exec(compile(tests_source, "tests.py", "exec"), namespace)
            outcome = "pass"
            try:
                send_frame(sock, {"op": "exit"})
            except OSError:
                pass
    except AssertionError:
        outcome, detail = "fail", traceback.format_exc()[-DETAIL:]
    except BaseException:
        outcome, detail = "error", traceback.format_exc()[-DETAIL:]
    if channel.failure is not None:  # raised during the tests, even if they caught it
        outcome = "unverifiable" if isinstance(channel.failure, Unverifiable) else "error"
        detail = f"{type(channel.failure).__name__}: {str(channel.failure)[:DETAIL]}"
    return outcome, detail, channel.calls


def set_limits(limits):
    cpu = int(limits["timeout_s"]) + 1
    memory = (max(limits["memory_mb"], 2048) << 20) + PRELOADED_BYTES
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))


def test_process(host):
    """A spare test process: waits for its run's socket to the program and the tests, then judges."""
    host.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the host learns our pid from the kernel
    send_frame(host, {"op": "hello"})
    host.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)  # else credentials crowd out the descriptors
    _, fds, _, _ = socket.recv_fds(host, 1, 4)
    msg = recv_frame(host)
    deadline = time.monotonic() + float(msg["limits"]["timeout_s"]) + JUDGE_MARGIN_S
    os.setsid()
    program = socket.socket(fileno=fds[0])
    with os.fdopen(fds[1], "rb") as f:
        tests_source = f.read().decode("utf-8", "surrogatepass")
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    set_limits(msg["limits"])
    outcome, detail, calls = test_main(program, tests_source, deadline)
    send_frame(host, {"op": "result", "outcome": outcome, "detail": detail, "calls": calls})
    os._exit(0)


def judge_main():
    global PRELOADED_BYTES
    PRELOADED_BYTES = load_libraries(sys.argv)  # before any fork: every test process shares it
    control = socket.socket(fileno=int(sys.argv[1]))
    control.send(frame({"op": "ready"})[4:])
    serve_spares(control, test_process)


if __name__ == "__main__":
    judge_main()
