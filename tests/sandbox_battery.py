"""Programs that attack the sandbox's verdict (each must fail), and right programs of many kinds (each must pass).

Shared by tests/test_sandbox.py (verdicts) and tests/test_sandbox_score.py (reward 0 through
`precisecoder score`). Every hostile program is wrong: it can only pass by forging or stealing
the verdict. A secret expected value (`SECRET`) appears only in the tests, or in an io case's
expected stdout.
"""

from __future__ import annotations

import textwrap

SECRET = "S3CR3T-" + "7f1c9a"

# Finds the secret anywhere the program can look: live objects, frames (its own, other threads',
# tracebacks'), open descriptors, the environment, the disk. Returns "" when it finds nothing.
SEARCH = '''
import gc, os, sys, threading
PREFIX = "S3CR3T" + "-"
def _hits(text):
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    if not isinstance(text, str):
        return None
    i = text.find(PREFIX)
    while i >= 0:
        cand = text[i:i + 13]
        if len(cand) == 13 and cand != PREFIX:
            return cand
        i = text.find(PREFIX, i + 1)
    return None
def _frames():
    out = []
    for frame in list(sys._current_frames().values()) + [sys._getframe()]:
        while frame is not None:
            out.append(frame)
            frame = frame.f_back
    try:
        raise RuntimeError
    except RuntimeError as e:
        tb = e.__traceback__
        frame = tb.tb_frame
        while frame is not None:
            out.append(frame)
            frame = frame.f_back
    return out
def leak():
    for frame in _frames():
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()) + list(frame.f_code.co_consts):
            hit = _hits(value)
            if hit:
                return hit
    for obj in gc.get_objects():
        for value in ([obj] if isinstance(obj, (str, bytes)) else list(obj.values()) if isinstance(obj, dict) else []):
            hit = _hits(value)
            if hit:
                return hit
    for fd in range(0, 256):
        try:
            os.set_blocking(fd, False)
            hit = _hits(os.read(fd, 1 << 16)) or _hits(os.pread(fd, 1 << 16, 0))
        except (OSError, ValueError):
            continue
        if hit:
            return hit
    for value in os.environ.values():
        if _hits(value):
            return _hits(value)
    for root, dirs, files in os.walk("/"):
        if root.startswith(("/proc", "/sys", "/dev", "/usr")):
            dirs[:] = []
            continue
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    hit = _hits(f.read(1 << 20))
            except OSError:
                continue
            if hit:
                return hit
    return ""
'''

FORGE_FRAMES = '''
import json, os, struct
def frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body
FAKES = [frame({"op": "done"}), frame({"op": "result", "outcome": "pass", "detail": ""}),
         frame({"op": "exit", "pid": 1, "exit": 0, "signal": None}), b"pass\\n", b'{"status": "pass"}\\n']
for fd in range(0, 1024):
    for fake in FAKES:
        try:
            os.write(fd, fake)
        except OSError:
            pass
def answer():
    return 0
'''

# name -> (program, test code, note). Tests expect `answer()` to return 42 unless they say otherwise.
HOSTILE_ASSERT: dict[str, tuple[str, str]] = {
    "steal_secret_from_memory_frames_fds_disk": (SEARCH, f"assert leak() == {SECRET!r}\n"),
    "forge_verdict_frames_on_every_descriptor": (FORGE_FRAMES + "os._exit(0)\n", "assert answer() == 42\n"),
    "forge_then_serve": (FORGE_FRAMES, "assert answer() == 42\n"),
    "always_equal_object": ("class Eq:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
                            "def answer():\n    return Eq()\n", "assert answer() == 42\n"),
    "always_equal_int_subclass": ("class Eq(int):\n    def __eq__(self, other):\n        return True\n"
                                  "    __hash__ = int.__hash__\ndef answer():\n    return Eq(0)\n",
                                  "assert answer() == 42\n"),
    "always_equal_str_subclass": ("class S(str):\n    def __eq__(self, other):\n        return True\n"
                                  "    __hash__ = str.__hash__\ndef answer():\n    return S('no')\n",
                                  "assert answer() == 'yes'\n"),
    "patch_math_isclose": ("import math\nmath.isclose = lambda *a, **k: True\ndef answer():\n    return 1.0\n",
                           "import math\nassert math.isclose(answer(), 42.0)\n"),
    "patch_builtins_sorted_and_len": ("import builtins\nbuiltins.sorted = lambda *a, **k: [1, 2, 3]\n"
                                      "builtins.len = lambda *a: 3\ndef answer():\n    return [9]\n",
                                      "assert sorted(answer()) == [1, 2, 3]\nassert len(answer()) == 3\n"),
    "shadow_builtins_at_top_level": ("def sorted(*a, **k):\n    return [1, 2, 3]\ndef len(*a):\n    return 3\n"
                                     "def abs(*a):\n    return 0\ndef answer():\n    return [9]\n",
                                     "assert sorted(answer()) == [1, 2, 3]\nassert len(answer()) == 3\n"
                                     "assert abs(answer()[0] - 1) < 1\n"),
    "shadow_isclose_the_tests_import": ("def isclose(*a, **k):\n    return True\ndef answer():\n    return 1.0\n",
                                        "from math import isclose\nassert isclose(answer(), 42.0)\n"),
    "patch_os_write_and_exit_hooks": ("import atexit, os, threading\natexit.register(os._exit, 0)\n"
                                      "threading._shutdown = lambda: os._exit(0)\nos.write = lambda *a: len(a[1])\n"
                                      "def answer():\n    return 0\n", "assert answer() == 42\n"),
    "exit_zero_inside_the_call": ("import sys\ndef answer():\n    sys.exit(0)\n", "assert answer() == 42\n"),
    "os_exit_inside_the_call": ("import os\ndef answer():\n    os._exit(0)\n", "assert answer() == 42\n"),
    "keyboard_interrupt_inside_the_call": ("def answer():\n    raise KeyboardInterrupt\n",
                                           "try:\n    assert answer() == 42\nexcept Exception:\n    pass\n"),
    "raise_what_the_test_expects_for_wrong_input": (
        "def answer(x):\n    raise ValueError('x')\n",
        "try:\n    answer(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError\nassert answer(1) == 42\n"),
    "generator_where_a_list_is_expected": ("def answer():\n    yield 42\n", "assert answer() == [42]\n"),
    "return_a_function": ("def answer():\n    return lambda: 42\n", "assert answer() == 42\n"),
    "return_huge_string": ("def answer():\n    return 'x' * (64 << 20)\n", "assert answer() == 42\n"),
    "return_deep_nesting": ("def answer():\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x\n",
                            "assert answer() == 42\n"),
    "garbage_on_the_judge_socket": ("import os\ndef answer():\n    for fd in range(3, 64):\n        try:\n"
                                    "            os.write(fd, b'\\xff' * 1000)\n        except OSError:\n"
                                    "            pass\n    return 0\n", "assert answer() == 42\n"),
    "fake_ready_message_without_names": (
        "import json, os, struct\nbody = json.dumps({'op': 'ready', 'names': {}}).encode()\n"
        "for fd in range(3, 64):\n    try:\n        os.write(fd, struct.pack('>I', len(body)) + body)\n"
        "    except OSError:\n        pass\ndef answer():\n    return 0\n", "assert answer() == 42\n"),
    "fake_ready_replacing_builtins_and_names": (
        "import json, os, struct\nnames = {'__builtins__': ['value', ['dict', []]], '__name__': ['value', 'x'],\n"
        "         'answer': ['module', 'math'], 'expected': ['value', 0]}\n"
        "body = json.dumps({'op': 'ready', 'names': names}).encode()\n"
        "for fd in range(3, 64):\n    try:\n        os.write(fd, struct.pack('>I', len(body)) + body)\n"
        "    except OSError:\n        pass\ndef answer():\n    return 0\n",
        "expected = 42\nassert answer() == expected\n"),
    "signal_and_trace_everyone": (
        "import ctypes, os, signal\nlibc = ctypes.CDLL(None)\nfor pid in range(1, 5000):\n"
        "    for sig in (signal.SIGSTOP, signal.SIGKILL):\n        try:\n            os.kill(pid, sig) if pid != 1 else None\n"
        "        except OSError:\n            pass\n    libc.ptrace(16, pid, 0, 0)\n"
        "def answer():\n    return 0\n", "assert answer() == 42\n"),
    "override_the_tests_check_function": ("def check(candidate):\n    pass\ndef answer():\n    return 0\n",
                                          "def check(candidate):\n    assert candidate() == 42\ncheck(answer)\n"),
    "print_pass_markers": ("print('PASS')\nprint('{\"status\": \"pass\", \"passed\": true}')\ndef answer():\n"
                           "    return 0\n", "assert answer() == 42\n"),
    "always_less_and_greater_object": ("class Lt:\n    def __lt__(self, other):\n        return True\n"
                                       "    __gt__ = __le__ = __ge__ = __lt__\ndef answer():\n    return Lt()\n",
                                       "assert 41 < answer() < 43\n"),
    "isinstance_lie_through_class_attribute": ("class Fake:\n    __class__ = int\n    def __eq__(self, other):\n"
                                               "        return True\ndef answer():\n    return Fake()\n",
                                               "assert isinstance(answer(), int) and answer() == 42\n"),
    "bare_except_swallows_os_exit": ("def answer():\n    __import__('os')._exit(0)\n",
                                     "ok = True\ntry:\n    ok = answer() == 42\nexcept:\n    pass\nassert ok\n"),
    "bare_except_swallows_an_oversized_result": ("def answer():\n    return 'x' * (64 << 20)\n",
                                                 "ok = True\ntry:\n    ok = len(answer()) == 1\nexcept:\n"
                                                 "    pass\nassert ok\n"),
    "stop_iteration_ends_all_early": ("def answer(x):\n    raise StopIteration\n",
                                      "assert all(map(answer, [1, 2]))\n"),
    "server_patched_to_forge_stop_iteration": (
        "import sys\nserver = sys._getframe(1).f_globals\n"
        "server['answer_call'] = lambda msg, handles: {'op': 'raise', 'type': 'StopIteration', 'message': ''}\n"
        "def answer(x):\n    return 0\n", "assert all(map(answer, [1, 2]))\n"),
    "server_patched_to_reply_stop_to_everything": (
        "import sys\nserver = sys._getframe(1).f_globals\n"
        "server['answer_call'] = lambda msg, handles: {'op': 'stop'}\n"
        "def answer(x):\n    return 0\n", "assert all(map(answer, [1, 2]))\n"),
    "write_into_hidden_packages_for_later_runs": (
        "import os\nfor d in ('/usr/lib/python3/dist-packages', '/usr/local/lib/python3.11/dist-packages'):\n"
        "    try:\n        open(os.path.join(d, 'sitecustomize.py'), 'w').write('x')\n    except OSError:\n"
        "        pass\ndef answer():\n    return 0\n", "assert answer() == 42\n"),
}

# Round 3 (issue #42): an operator between the program's object and an expected value would hand the
# value to the program, whose method answers what makes the comparison hold (HumanEval/4's check is
# `abs(candidate(...) - 1.0) < 1e-6`). The judge refuses operators with plain data (a TypeError).
OPERATOR_CHEAT = textwrap.dedent('''
    class Cheat:
        def __sub__(self, other):
            return 0.0
        __rsub__ = __isub__ = __mod__ = __sub__
        def __truediv__(self, other):
            return 1
        __floordiv__ = __truediv__
        def __divmod__(self, other):
            return (1, 0)
        def __and__(self, other):
            return other
        __or__ = __ror__ = __and__
    def answer():
        return Cheat()
    ''')
HOSTILE_ASSERT.update({f"operator_with_an_expected_value_{name}": (OPERATOR_CHEAT, tests) for name, tests in (
    ("sub", "assert abs(answer() - 42.0) < 1e-6\n"),
    ("sub_in_a_check", "def check(candidate):\n    assert abs(candidate() - 42.0) < 1e-6\ncheck(answer)\n"),
    ("rsub", "assert abs(42.0 - answer()) < 1e-6\n"),
    ("isub", "r = answer()\nr -= 42\nassert r == 0\n"),
    ("truediv", "assert answer() / 42 == 1\n"),
    ("floordiv", "assert answer() // 42 == 1\n"),
    ("mod", "assert answer() % 42 == 0\n"),
    ("divmod", "assert divmod(answer(), 42) == (1, 0)\n"),
    ("and", "assert answer() & 42 == 42\n"),
    ("ror", "assert 42 | answer() == 42\n"),
)})

# Round 3 (issue #42): a value at the codec's depth limit, handed back by the tests, once made the run
# unverifiable (left out of the aggregates) instead of the wrong program's error.
HOSTILE_ASSERT["unverifiable_by_nesting_at_the_depth_limit"] = (
    "def answer():\n    x = 0\n    for _ in range(100):\n        x = [x]\n    return x\ndef same(x):\n    return 0\n",
    "assert same(answer()) == 42\n")

# Round 3 (issue #42): 16 MiB of `[],` on every descriptor, the frame that cost its reader 433 MiB before
# its JSON was counted (tests/test_sandbox_codec.py measures the memory; here, the verdict).
HOSTILE_ASSERT["a_frame_of_empty_lists_on_the_judge_socket"] = (
    "import os, struct\nbody = b'[' + b'[],' * ((16 << 20) // 3 - 2) + b'[]]'\nfor fd in range(3, 64):\n"
    "    try:\n        os.write(fd, struct.pack('>I', len(body)) + body)\n    except OSError:\n        pass\n"
    "def answer():\n    return 0\n", "assert answer() == 42\n")

# Round 3 (issue #42): a frame header, then one byte every 0.5 s, on every descriptor (the judge's socket
# among them), before the names (at load) or inside a call. Each read of the host's judge once waited a
# whole timeout again, so a run held its worker until a watchdog. Needs a short limit (a timeout).
DRIP = textwrap.dedent('''
    import os, struct, time
    def drip():
        fds = []
        for fd in range(3, 64):
            try:
                os.write(fd, struct.pack(">I", 1000))
                fds.append(fd)
            except OSError:
                pass
        while True:
            time.sleep(0.5)
            for fd in fds:
                try:
                    os.write(fd, b" ")
                except OSError:
                    pass
    ''')
DRIPS: dict[str, str] = {"drip_a_frame_before_the_names": DRIP + "drip()\n",
                         "drip_a_frame_inside_a_call": DRIP + "def answer():\n    drip()\n"}

# A right program for each hostile case's tests (default: answer() returns 42).
SOLUTIONS = {
    "steal_secret_from_memory_frames_fds_disk": f"def leak():\n    return {SECRET!r}\n",
    "always_equal_str_subclass": "def answer():\n    return 'yes'\n",
    "patch_builtins_sorted_and_len": "def answer():\n    return [3, 1, 2]\n",
    "shadow_builtins_at_top_level": "def answer():\n    return [1, 3, 2]\n",
    "raise_what_the_test_expects_for_wrong_input": "def answer(x):\n    if x < 0:\n        raise ValueError(x)\n"
                                                   "    return 42\n",
    "generator_where_a_list_is_expected": "def answer():\n    return [42]\n",
    "bare_except_swallows_os_exit": "def answer():\n    return 42\n",
    "bare_except_swallows_an_oversized_result": "def answer():\n    return 'x'\n",
    "stop_iteration_ends_all_early": "def answer(x):\n    return True\n",
    "server_patched_to_forge_stop_iteration": "def answer(x):\n    return 1\n",
    "server_patched_to_reply_stop_to_everything": "def answer(x):\n    return 1\n",
    "io_steal_expected_output": f"print({SECRET!r})\n",
    "io_forge_frames": f"print({SECRET!r})\n",
    "unverifiable_by_nesting_at_the_depth_limit": "def answer():\n    return 1\ndef same(x):\n    return 42\n",
}
DEFAULT_SOLUTION = "def answer():\n    return 42\n"
# The buggy program of each case's task: one wrong line of its solution.
BUGGY = {
    "steal_secret_from_memory_frames_fds_disk": "def leak():\n    return ''\n",
    "always_equal_str_subclass": "def answer():\n    return 'no'\n",
    "patch_builtins_sorted_and_len": "def answer():\n    return [3, 1]\n",
    "shadow_builtins_at_top_level": "def answer():\n    return [1, 3]\n",
    "raise_what_the_test_expects_for_wrong_input": "def answer(x):\n    if x < -5:\n        raise ValueError(x)\n"
                                                   "    return 42\n",
    "generator_where_a_list_is_expected": "def answer():\n    return [41]\n",
    "bare_except_swallows_an_oversized_result": "def answer():\n    return 'xy'\n",
    "stop_iteration_ends_all_early": "def answer(x):\n    return x > 1\n",
    "server_patched_to_forge_stop_iteration": "def answer(x):\n    return x - 1\n",
    "server_patched_to_reply_stop_to_everything": "def answer(x):\n    return x - 1\n",
    "io_steal_expected_output": "print('')\n",
    "io_forge_frames": "print('')\n",
    "unverifiable_by_nesting_at_the_depth_limit": "def answer():\n    return 1\ndef same(x):\n    return 41\n",
}
DEFAULT_BUGGY = "def answer():\n    return 41\n"

HOSTILE_IO: dict[str, tuple[str, str, str]] = {
    # name -> (program, stdin, expected stdout)
    "io_steal_expected_output": (SEARCH + "print(leak())\n", "", SECRET + "\n"),
    "io_forge_frames": (FORGE_FRAMES + "print('wrong')\n", "", SECRET + "\n"),
}

RIGHT_ASSERT: dict[str, tuple[str, str]] = {
    "helper_classes": (textwrap.dedent('''
        class Stack:
            def __init__(self):
                self.items = []
            def push(self, x):
                self.items.append(x)
            def pop(self):
                return self.items.pop()
        def balanced(text):
            s = Stack()
            for ch in text:
                if ch == "(":
                    s.push(ch)
                elif ch == ")":
                    if not s.items:
                        return False
                    s.pop()
            return not s.items
        '''), "assert balanced('(())()')\nassert not balanced('(()')\nassert balanced('') is True\n"),
    "nested_plain_data": (textwrap.dedent('''
        def shape():
            return {"a": [1, (2, 3), {4, 5}], "b": {"c": frozenset({6}), "d": None}, 7: b"\\x00\\xff",
                    "e": [1.5, float("inf"), -0.0, 2 + 3j, 10 ** 30, True, "ünï"]}
        '''), textwrap.dedent('''
        r = shape()
        assert r == {"a": [1, (2, 3), {4, 5}], "b": {"c": frozenset({6}), "d": None}, 7: b"\\x00\\xff",
                     "e": [1.5, float("inf"), -0.0, 2 + 3j, 10 ** 30, True, "ünï"]}
        assert type(r["a"][1]) is tuple and type(r["b"]["c"]) is frozenset and r["e"][5] is True
        ''')),
    "big_integers": ("def fact(n):\n    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out\n",
                     "import math\nassert fact(3000) == math.factorial(3000)\nassert fact(20) == 2432902008176640000\n"),
    "nan_crosses": ("def f():\n    return float('nan')\n", "import math\nassert math.isnan(f())\n"),
    "floats_with_isclose": ("import math\ndef area(r):\n    return math.pi * r * r\n",
                            "import math\nassert math.isclose(area(2), 12.566370614359172, rel_tol=1e-9)\n"
                            "assert abs(area(1) - 3.14159) < 1e-4\n"),
    "expected_exceptions": (textwrap.dedent('''
        class NegativeError(ValueError):
            pass
        def root(x):
            if x < 0:
                raise NegativeError(f"negative: {x}")
            return x ** 0.5
        def pick(d, k):
            return d[k]
        '''), textwrap.dedent('''
        try:
            root(-4)
        except ValueError as e:
            assert "negative: -4" in str(e)
        else:
            raise AssertionError("no error")
        try:
            pick({}, "k")
        except KeyError:
            pass
        assert root(9) == 3.0
        ''')),
    "printing_while_called": ("def shout(x):\n    print('called with', x)\n    return x.upper()\n",
                              "assert shout('hi') == 'HI'\n"),
    "in_place_mutation": (textwrap.dedent('''
        def sort_in_place(xs):
            xs.sort()
        def add_key(d, k):
            d[k] = len(d)
        def grow_inner(grid):
            grid[0].append(9)
            grid.append([])
        def clear_set(s):
            s.clear()
        def with_kwargs(*, target):
            target.extend([1, 2])
        '''), textwrap.dedent('''
        xs = [3, 1, 2]
        assert sort_in_place(xs) is None and xs == [1, 2, 3]
        d = {"a": 0}
        add_key(d, "b")
        assert d == {"a": 0, "b": 1}
        inner = [1]
        grid = [inner]
        grow_inner(grid)
        assert grid == [[1, 9], []] and inner == [1, 9]
        s = {1, 2}
        clear_set(s)
        assert s == set()
        t = []
        with_kwargs(target=t)
        assert t == [1, 2]
        ''')),
    "module_constants_and_state": (textwrap.dedent('''
        MOD = 10 ** 9 + 7
        TABLE = {"x": [1, 2]}
        calls = 0
        def bump():
            global calls
            calls += 1
            return calls
        '''), "assert MOD == 1000000007 and TABLE['x'] == [1, 2]\nassert bump() == 1\nassert bump() == 2\n"),
    "stdlib_names_and_modules": ("import math\nfrom collections import Counter\nfrom itertools import accumulate\n"
                                 "def counts(s):\n    return Counter(s)\ndef sums(xs):\n    return list(accumulate(xs))\n",
                                 "assert counts('aab') == {'a': 2, 'b': 1}\nassert sums([1, 2, 3]) == [1, 3, 6]\n"
                                 "assert math.floor(2.5) == 2\n"),
    "namedtuple_result": ("from collections import namedtuple\nP = namedtuple('P', 'x y')\n"
                          "def point():\n    return P(1, 2)\n", "assert point() == (1, 2)\n"),
    "humaneval_style_check": ("def add(a, b):\n    return a + b\n",
                              "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
                              "check(add)\n"),
    "recursion_and_generators_inside": ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
                                        "def evens(n):\n    return [x for x in (i for i in range(n)) if x % 2 == 0]\n",
                                        "assert fib(20) == 6765\nassert evens(7) == [0, 2, 4, 6]\n"),
    "main_guard_and_threads": ("import threading\nresult = []\n"
                               "def work():\n    t = threading.Thread(target=result.append, args=(1,))\n    t.start()\n"
                               "    t.join()\n    return len(result)\nif __name__ == '__main__':\n    MAIN = True\n",
                               "assert MAIN is True\nassert work() == 1\n"),
    "objects_with_operators_hashing_and_copies": (textwrap.dedent('''
        import functools
        @functools.total_ordering
        class P:
            def __init__(self, v):
                self.v = v
            def __lt__(self, o):
                return self.v < o.v
            def __eq__(self, o):
                return isinstance(o, P) and self.v == o.v
            def __hash__(self):
                return hash(self.v)
            def __str__(self):
                return f"P{self.v}"
            def __add__(self, o):
                return P(self.v + o.v)
            def shifted(self, k):
                return P(self.v + k)
            def __getitem__(self, i):
                return [self.v][i]
        def make(n):
            return [P(i) for i in range(n)]
'''), textwrap.dedent('''
        import copy
        a, b, c = make(3)
        assert sorted([c, a, b]) == [a, b, c]
        assert copy.deepcopy(a) == a and copy.deepcopy(a) is not a
        assert str(a) == "P0" and f"{b}" == "P1" and (b + b) == c and a.shifted(2) == c
        assert {a: 1}[P(0)] == 1 and a in {a, b} and b in make(3)
        assert a[0] == 0 and max(make(4)).v == 3
        x = a
        x += b
        assert x == b
        try:
            a < 1
        except TypeError:
            pass
        else:
            raise AssertionError
        assert (a == 0) is False and (a != 0) is True
''')),
}

RIGHT_IO: dict[str, tuple[str, str, str]] = {
    "io_sum_lines": ("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n", "1 2\n3\n", "6\n"),
    "io_trailing_whitespace": ("n = int(input())\nfor i in range(n):\n    print(i, '  ')\nprint()\n", "3\n", "0\n1\n2"),
}

# Attacks on the hand-written class-based tasks of tests/fixtures/class_tasks.jsonl:
# name -> (task_id, program). Each would pass its task's tests in plain Python.
_ALWAYS_EQUAL = "class Eq:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n" \
                "        return False\n    __hash__ = object.__hash__\n"
_STACK_RETURNING = textwrap.dedent('''
    class Stack:
        def __init__(self):
            self.size = 0
        def push(self, x):
            self.size += 1
        def pop(self):
            if not self.size:
                raise IndexError("empty")
            self.size -= 1
            return VALUE
        def peek(self):
            return VALUE
        def __len__(self):
            return self.size
        def is_empty(self):
            return not self.size
    ''')
_TWO_SUM_RETURNING = "class Solution:\n    def twoSum(self, nums, target):\n        return VALUE\n"
CLASS_HACKS: dict[str, tuple[str, str]] = {
    "stack_peek_always_equal": ("classes/stack", _ALWAYS_EQUAL + _STACK_RETURNING.replace("VALUE", "Eq()")),
    "stack_peek_always_equal_int_subclass": (
        "classes/stack", "class Eq(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n" + _STACK_RETURNING.replace("VALUE", "Eq(0)")),
    "stack_peek_raises_in_repr": ("classes/stack", _ALWAYS_EQUAL + "    def __repr__(self):\n        raise ValueError\n"
                                  + _STACK_RETURNING.replace("VALUE", "Eq()")),
    "lru_get_always_equal": ("classes/lru_cache", _ALWAYS_EQUAL + "class LRUCache:\n    def __init__(self, capacity):\n"
                             "        self.data = {}\n    def get(self, key):\n        return Eq()\n"
                             "    def put(self, key, value):\n        self.data[key] = value\n"),
    "two_sum_lying_list": ("leetcode/two_sum", _ALWAYS_EQUAL + textwrap.dedent('''
        class Lie(Eq):
            def __len__(self):
                return 2
            def __iter__(self):
                return iter([0, 1])
            def __hash__(self):
                return hash((0, 1))
            def __contains__(self, x):
                return True
        ''') + _TWO_SUM_RETURNING.replace("VALUE", "Lie()")),
    "two_sum_str_subclass": ("leetcode/two_sum", "class S(str):\n    def __eq__(self, other):\n        return True\n"
                             "    __hash__ = str.__hash__\n" + _TWO_SUM_RETURNING.replace("VALUE", "S('')")),
    "two_sum_generator": ("leetcode/two_sum", "class Solution:\n    def twoSum(self, nums, target):\n"
                          "        yield 0\n        yield 1\n"),
    "two_sum_module": ("leetcode/two_sum", "import sys\n" + _TWO_SUM_RETURNING.replace("VALUE", "sys")),
    "vector_repr_str_subclass": ("classes/vector_equality", textwrap.dedent('''
        class S(str):
            def __eq__(self, other):
                return True
            __hash__ = str.__hash__
        class Vector:
            def __init__(self, x, y):
                self.x, self.y = x, y
            def __add__(self, other):
                return Vector(self.x + other.x, self.y + other.y)
            def __mul__(self, k):
                return Vector(self.x * k, self.y * k)
            def __eq__(self, other):
                return isinstance(other, Vector) and (self.x, self.y) == (other.x, other.y)
            def __hash__(self):
                return hash((self.x, self.y))
            def __repr__(self):
                return S("?")
        ''')),
    "vector_eq_returns_a_truthy_object": ("classes/vector_equality", textwrap.dedent('''
        class Vector:
            def __init__(self, x, y):
                pass
            def __add__(self, other):
                return self
            __mul__ = __add__
            def __eq__(self, other):
                return [1]
            def __ne__(self, other):
                return []
            def __hash__(self):
                return 0
            def __repr__(self):
                return "Vector(0, -1)"
        ''')),
    "countdown_swallowed_exit": ("iterators/countdown_and_chunks", textwrap.dedent('''
        import os
        class Countdown:
            def __init__(self, start):
                os._exit(0)
        def chunks(xs, n):
            os._exit(0)
        ''')),
}

# Channels between runs through kernel-wide state (docs/sandbox.md, "Kernel-wide state between runs"):
# name -> (writer program, reader program, reader's tests, concurrent). The writer sets state that
# encodes `CHANNEL_SECRET`; the reader tries to read it back and its tests pass only if it learned
# nothing. `concurrent`: run the two side by side (two workers), else the writer first. Each reader
# learned the secret before the seccomp filter refused the read.
CHANNEL_SECRET = 0b1011_0011_1000_1101
_STDLIB_FILE = "import os\nFILE = os.path.join(os.path.dirname(os.__file__), 'pydoc_data', 'topics.py')\n"
_PAGE_CACHE_WRITER = _STDLIB_FILE + f'''
fd = os.open(FILE, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: only the pages read are cached
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
for bit in range(16):
    if {CHANNEL_SECRET} >> bit & 1:
        os.pread(fd, 1, 8 * 4096 * bit)
'''
_PAGE_CACHE_READER = _STDLIB_FILE + '''
def learned():
    fd = os.open(FILE, os.O_RDONLY)
    value = 0
    for bit in range(16):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # a missed page reads no neighbours ahead
            os.preadv(fd, [bytearray(1)], 8 * 4096 * bit, os.RWF_NOWAIT)
            value |= 1 << bit
        except BlockingIOError:
            pass
        except OSError:
            return None  # the read is refused
    return value
'''
_LOCK_WRITER = _STDLIB_FILE + f'''
import fcntl, struct, time
fd = os.open(FILE, os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, {CHANNEL_SECRET}, 1, 0))
time.sleep(2.5)
'''
_LOCK_READER = _STDLIB_FILE + '''
import fcntl, struct, time
def learned():
    fd = os.open(FILE, os.O_RDONLY)
    for _ in range(40):  # the writer starts beside us
        try:
            kind, _, start, _, _ = struct.unpack("hhqqi", fcntl.fcntl(
                fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0)))
        except OSError:
            return None
        if kind != fcntl.F_UNLCK:
            return start
        time.sleep(0.1)
    return -1
'''
_FLOCK_WRITER = _STDLIB_FILE + f'''
import fcntl, time
FILES = sorted(os.path.join(os.path.dirname(FILE), "..", n) for n in os.listdir(os.path.dirname(FILE) + "/.."))
held = []
for bit in range(16):
    if {CHANNEL_SECRET} >> bit & 1:
        held.append(os.open(FILES[bit], os.O_RDONLY))
        fcntl.flock(held[-1], fcntl.LOCK_SH)
time.sleep(2.5)
'''
_FLOCK_READER = _STDLIB_FILE + '''
import fcntl, time
FILES = sorted(os.path.join(os.path.dirname(FILE), "..", n) for n in os.listdir(os.path.dirname(FILE) + "/.."))
def learned():
    time.sleep(1)  # the writer starts beside us
    value = 0
    for bit in range(16):
        fd = os.open(FILES[bit], os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            value |= 1 << bit
        except OSError:
            return None
        finally:
            os.close(fd)
    return value
'''
_COOKIE_WRITER = '''
import socket
for _ in range(1000):
    with socket.socket(socket.AF_UNIX) as s:
        s.getsockopt(socket.SOL_SOCKET, 57, 8)  # SO_COOKIE: a number from a kernel-wide counter
'''
_COOKIE_READER = '''
import socket
def learned():
    with socket.socket(socket.AF_UNIX) as s:
        try:
            return [s.getsockopt(socket.SOL_SOCKET, option, 8) for option in (57, 71)]  # SO_(NETNS_)COOKIE
        except OSError:
            return None
'''
_KEYS = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
         "ADD_KEY = {'x86_64': 248, 'aarch64': 217}[os.uname().machine]\n"
         "def add(name):\n    return libc.syscall(ADD_KEY, b'user', name.encode(), b'x' * 100, 100, -3)\n")
_KEY_QUOTA_WRITER = _KEYS + "import time\nn = 0\nwhile add(f'k{n}') > 0:\n    n += 1\ntime.sleep(2.5)\n"
_KEY_QUOTA_READER = _KEYS + '''
import errno, time
def learned():
    time.sleep(1)
    n = 0
    while add(f'r{n}') > 0:
        n += 1
    return None if ctypes.get_errno() == errno.EPERM else n
'''
_SYSINFO_WRITER = ("import threading, time\nthreading.stack_size(1 << 16)\nfor _ in range(40):\n"
                   "    threading.Thread(target=time.sleep, args=(2.5,)).start()\n")
_SYSINFO_READER = '''
import ctypes, time
def learned():
    time.sleep(1)
    info = (ctypes.c_uint16 * 64)()
    if ctypes.CDLL(None).sysinfo(info) != 0:
        return None
    return info[40]  # struct sysinfo's procs: after uptime, loads[3], 4 memory figures (x86_64, aarch64)
'''
_MEMFD_WRITER = "import os\nfor _ in range(1000):\n    os.close(os.memfd_create('x'))\n"
_MEMFD_READER = '''
import os
def learned():
    try:
        return os.fstat(os.memfd_create("x")).st_ino  # from the internal tmpfs's kernel-wide counter
    except OSError:
        return None
'''
_PIDFD_WRITER = ("import os\nfor _ in range(200):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n"
                 "    os.waitpid(pid, 0)\n")
_PIDFD_READER = '''
import os
def learned():
    try:
        return os.fstat(os.pidfd_open(os.getpid())).st_ino  # pidfs: one kernel-wide counter of processes
    except OSError:
        return None
'''
CHANNELS: dict[str, tuple[str, str, str, bool]] = {
    "page_cache_set_by_reading_cleared_by_fadvise_read_by_preadv2_nowait": (
        _PAGE_CACHE_WRITER, _PAGE_CACHE_READER, "assert learned() is None, learned()\n", False),
    "posix_lock_range_on_a_shared_file_read_by_f_getlk": (
        _LOCK_WRITER, _LOCK_READER, "assert learned() is None, learned()\n", True),
    "flock_on_shared_files_read_by_lock_nb": (
        _FLOCK_WRITER, _FLOCK_READER, "assert learned() is None, learned()\n", True),
    "socket_cookies_from_a_kernel_wide_counter": (
        _COOKIE_WRITER, _COOKIE_READER, "assert learned() is None, learned()\n", False),
    "key_quota_of_the_uid": (_KEY_QUOTA_WRITER, _KEY_QUOTA_READER, "assert learned() is None, learned()\n", True),
    "memfd_inode_numbers": (_MEMFD_WRITER, _MEMFD_READER, "assert learned() is None, learned()\n", False),
    "pidfd_inode_numbers": (_PIDFD_WRITER, _PIDFD_READER, "assert learned() is None, learned()\n", False),
    "sysinfo_procs_counts_every_thread": (
        _SYSINFO_WRITER, _SYSINFO_READER, "assert learned() is None, learned()\n", True),
}
