"""The judge: runs `assert` tests in a trusted process, against proxies of the program's names.

Stdlib only: `reward/sandbox_codec.py` followed by this source runs in a bare
interpreter inside a sandbox of its own (its own namespaces and, as root, its
own uid), apart from the program's sandbox: the program can neither see, signal
nor trace it, nor read its memory.

Per run the host takes a spare test process (forked before the request, see
`reward/sandbox_spares.py`) and sends it the test code (in a memfd) and one end
of a socket whose other end the program's run process holds. It reads the
program's top-level names, binds them in a new `__main__` namespace (callables
as `ProgramFunction` proxies, plain-data constants by value, stdlib modules by
importing them here; never over a built-in name), then executes the tests. A
proxy call sends plain-data arguments, and gets back a plain-data result, the
arguments the call mutated (copied back in place) and any exception (raised
here as its built-in type and message). Anything else (a result that is not
plain data, a malformed reply, the program gone) raises `ProxyError`, which is
not an `Exception`, so no test's `except` clause mistakes it for an expected
error. The outcome (pass, fail, error) goes straight to the host; the program never
learns it.
"""

import builtins
import importlib
import os
import resource
import socket
import sys
import traceback

MUTABLE = (list, dict, set, bytearray)
DETAIL = 4000


class ProxyError(BaseException):
    """A proxied call that did not return plain data (or the program went away)."""


class Channel:
    """The judge's end of the socket to the program's run process."""

    def __init__(self, sock):
        self.sock = sock
        self.calls = 0

    def request(self, msg):
        try:
            send_frame(self.sock, msg)
            return recv_frame(self.sock)
        except EOFError:
            raise ProxyError("the program's process ended during a call") from None
        except (OSError, CodecError) as e:
            raise ProxyError(f"broken channel to the program: {e}") from None

    def call(self, name, args, kwargs):
        self.calls += 1
        try:
            wire_args, wire_kwargs = to_wire(list(args)), to_wire(dict(kwargs))
        except (CodecError, RecursionError) as e:
            raise ProxyError(f"an argument of {name}() cannot cross to the program: {e}") from None
        reply = self.request({"op": "call", "name": name, "args": wire_args, "kwargs": wire_kwargs})
        op = reply.get("op")
        if op == "ok":
            try:
                result = from_wire(reply.get("result"))
                copy_back(args, reply.get("args"), range(len(args)))
                copy_back(kwargs, reply.get("kwargs"), kwargs.keys())
            except (CodecError, RecursionError, TypeError, ValueError) as e:
                raise ProxyError(f"malformed reply from {name}(): {e}") from None
            return result
        if op == "raise":
            raise rebuild_exception(reply.get("type"), reply.get("message"))
        if op == "exit":
            raise ProxyError(f"{name}() raised {str(reply.get('type'))[:40]}")
        if op == "bad":
            raise ProxyError(f"{str(reply.get('message'))[:300]}: only plain data crosses")
        raise ProxyError(f"unexpected reply from {name}()")


def copy_back(target, changes, keys):
    """Apply the program's mutated copies of arguments to the originals, in place."""
    if not isinstance(changes, list):
        raise ValueError("bad copy-back list")
    allowed = set(keys)
    for item in changes:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) in (int, str) and item[0] in allowed):
            raise ValueError("bad copy-back entry")
        sync(target[item[0]], from_wire(item[1]))


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
    text = message if isinstance(message, str) else ""
    for base in cls.__mro__:
        try:
            return base(text)
        except TypeError:  # a constructor that needs more arguments (UnicodeDecodeError, ...)
            continue
    return Exception(text)


class ProgramFunction:
    """A callable of the program: each call runs in the program's process."""

    def __init__(self, name, channel):
        self.__name__ = self.__qualname__ = name
        self._channel = channel

    def __call__(self, *args, **kwargs):
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self):
        return f"<program function {self.__name__}>"


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
        if kind == "callable":
            namespace[name] = ProgramFunction(name, channel)
        elif kind == "value" and len(desc) == 2:
            try:
                namespace[name] = from_wire(desc[1])
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
    return outcome, detail, channel.calls


def set_limits(limits):
    cpu = int(limits["timeout_s"]) + 1
    memory = max(limits["memory_mb"], 2048) << 20
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
    control = socket.socket(fileno=int(sys.argv[1]))
    control.send(frame({"op": "ready"})[4:])
    serve_spares(control, test_process)


if __name__ == "__main__":
    judge_main()
