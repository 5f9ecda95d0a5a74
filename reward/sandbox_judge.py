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
own that cannot cross (a callback) makes the run `unverifiable`. The outcome
(pass, fail, error, unverifiable) goes straight to the host; the program never
learns it.
"""

import builtins
import importlib
import os
import resource
import socket
import sys
import traceback

DETAIL = 4000
PRELOADED_BYTES = 0  # address space the library environment's preloaded modules take (set by `judge_main`)


class ProxyError(BaseException):
    """A proxied call that broke the rules (the program went away, a malformed or oversized reply)."""


class Unverifiable(ProxyError):
    """The tests need something the proxy cannot carry (a value of the tests' own that is not plain data)."""


class Channel:
    """The judge's end of the socket to the program's run process.

    It remembers the first `ProxyError` of the run, so a test that swallows it
    (a bare `except:`) still ends the run as `error` (or `unverifiable`).
    """

    def __init__(self, sock):
        self.sock = sock
        self.calls = 0
        self.failure = None
        self.handles = {}

    def fail(self, exc):
        if self.failure is None:
            self.failure = exc
        return exc

    def request(self, msg):
        try:
            send_frame(self.sock, msg)
            return recv_frame(self.sock)
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
        try:
            wire_args, wire_kwargs = to_wire(list(args), handle=_handle_wire), to_wire(dict(kwargs), handle=_handle_wire)
        except (CodecError, RecursionError) as e:
            raise self.fail(Unverifiable(f"the tests pass the program a value that cannot cross ({op}): {e}")) from None
        reply = self.request({"op": "call", "fn": op, "args": wire_args, "kwargs": wire_kwargs})
        kind = reply.get("op")
        if kind == "ok":
            try:
                result = from_wire(reply.get("result"), handle=self.handle)
                copy_back(args, reply.get("args"), range(len(args)), self.handle)
                copy_back(kwargs, reply.get("kwargs"), kwargs.keys(), self.handle)
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
        raise self.fail(ProxyError(f"unexpected reply to {op}"))


def _handle_wire(value):
    if type(value) is Handle:
        return ["handle", value._Handle__number]
    raise CodecError(f"a value of type {type(value).__name__} is not plain data")


class Handle:
    """An object of the program: it stays in the program's process, and each use here is a call there.

    Comparisons are decided here (docs/sandbox.md, "Objects of the program"):
    a handle is never equal to plain data and never ordered against it, so an
    object never sees an expected value it is compared with; between two
    handles the program's own comparison decides, and it must return a bool.
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


def _forward(op, reflected=False):
    def method(self, *args):
        if op == "deepcopy":
            args = ()  # the memo is the tests' own; the program copies with a memo of its own
        return self._Handle__channel.call(op, (*args, self) if reflected else (self, *args))
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
                   ("round", "round"), ("reversed", "reversed"), ("contains", "contains"), ("getitem", "getitem"),
                   ("setitem", "setitem"), ("delitem", "delitem"), ("copy", "copy"), ("deepcopy", "deepcopy")):
    setattr(Handle, f"__{_name}__", _forward(_op))
for _op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "lshift", "rshift", "and", "or", "xor",
            "divmod", "pow"):
    setattr(Handle, f"__{_op}__", _forward(_op))
    setattr(Handle, f"__r{_op}__", _forward(_op, reflected=True))
    if _op != "divmod":
        setattr(Handle, f"__i{_op}__", _forward("i" + _op))
for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Handle, f"__{_op}__", _compare(_op))


def copy_back(target, changes, keys, handle):
    """Apply the program's mutated copies of arguments to the originals, in place."""
    if not isinstance(changes, list):
        raise ValueError("bad copy-back list")
    allowed = set(keys)
    for item in changes:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) in (int, str) and item[0] in allowed):
            raise ValueError("bad copy-back entry")
        sync(target[item[0]], from_wire(item[1], handle=handle))


def sync(orig, new):
    """Make `orig` equal `new` in place, keeping nested lists and dicts the test may hold."""
    if type(orig) is not type(new):
        return
    if type(orig) is list:
        for i in range(min(len(orig), len(new))):
            if type(orig[i]) in (list, dict) and type(new[i]) is type(orig[i]):
                sync(orig[i], new[i])
            else:
                orig[i] = new[i]
        del orig[len(new):]
        orig.extend(new[len(orig):])
    elif type(orig) is dict:
        for key in [k for k in orig if k not in new]:
            del orig[key]
        for key, value in new.items():
            if key in orig and type(orig[key]) in (list, dict) and type(value) is type(orig[key]):
                sync(orig[key], value)
            else:
                orig[key] = value
    elif type(orig) is set:
        orig.clear()
        orig.update(new)
    elif type(orig) is bytearray:
        orig[:] = new


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


def test_main(sock, tests_source):
    """Run the tests against the program; returns (outcome, detail, number of calls)."""
    channel = Channel(sock)
    outcome, detail = "error", ""
    try:
        try:
            hello = recv_frame(sock)
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
    os.setsid()
    program = socket.socket(fileno=fds[0])
    with os.fdopen(fds[1], "rb") as f:
        tests_source = f.read().decode("utf-8", "surrogatepass")
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    set_limits(msg["limits"])
    outcome, detail, calls = test_main(program, tests_source)
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
