"""Values both ways between the tests and the program in proxy mode (docs/sandbox.md, "Objects of the tests"
and "Values of libraries"): the tests' callbacks, generators, iterators, files and class instances are lent
to the program by reference and never show it the tests' code or data; `range`, `datetime`, `Decimal`,
`Fraction` and numpy values cross as values, rebuilt exactly by the receiver's own library.

The tasks are the hand-written ones of tests/fixtures/values_tasks.jsonl (each buggy program has one wrong
line; every solution passes and every bug fails in plain Python)."""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import fractions
import json
import socket
import subprocess
import sys
import threading
import zoneinfo
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal, assert_index_equal, assert_series_equal

from jaxrl.cli import main
from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.sandbox_codec import MAX_DEPTH, CodecError, decode, encode, from_wire, to_wire
from reward.schema import AssertTests, load_tasks

ROOT = Path(__file__).parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "values_tasks.jsonl"
TASKS = load_tasks(FIXTURE)
FAST = Limits(timeout_s=30.0, memory_mb=512)
SECRET = "tests-secret-4242"


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2, cache=False, isolation="bwrap") as f:
        yield f


def run(fleet, program: str, tests: str, limits: Limits = FAST):
    return fleet.run([Job(program, AssertTests(tests), limits)])[0]


# ---- the codec, on the host ---------------------------------------------------------------------------------

def _same(a, b) -> bool:
    """Equal value, exact type, and for numpy the same dtype, shape and bits (NaN payloads and -0.0 kept)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind == "O":
            return all(_same(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
        return a.tobytes() == b.tobytes()
    if isinstance(a, collections.defaultdict) and a.default_factory is not b.default_factory:
        return False
    if isinstance(a, (dt.datetime, dt.time)):
        return a == b and repr(a) == repr(b) and a.fold == b.fold
    return repr(a) == repr(b)


def _stdlib_values() -> list:
    named = dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")
    return [range(0), range(-5, 10**30, 7), range(10, 0, -3),
            decimal.Decimal("-0.00"), decimal.Decimal("NaN"), decimal.Decimal("1E+400"),
            decimal.Decimal("3.14159265358979323846264338327950288419716939937510"),
            fractions.Fraction(-3, 7), fractions.Fraction(10**40, 3),
            dt.date(2024, 2, 29), dt.date.min, dt.time(23, 59, 59, 999999), dt.time(1, tzinfo=named),
            dt.datetime(2020, 1, 1, 3, 4, 5, 6), dt.datetime(2021, 11, 7, 1, 30, fold=1),
            dt.datetime(2020, 6, 1, tzinfo=dt.timezone.utc), dt.datetime(2020, 6, 1, tzinfo=named),
            dt.datetime(2020, 6, 1, tzinfo=dt.timezone(dt.timedelta(hours=-7))),
            dt.timedelta(days=-1, seconds=5, microseconds=6), dt.timedelta.max,
            slice(1, None, -1), slice(None), Ellipsis, NotImplemented,
            collections.OrderedDict([("b", 1), ("a", [2])]), collections.Counter("abracadabra"),
            collections.Counter({"x": -2}), collections.defaultdict(list, {1: [2]}), collections.defaultdict(None),
            collections.deque([1, (2, 3)], maxlen=3), collections.deque()]


def _numpy_values() -> list:
    rng = np.random.default_rng(41)
    nan_payload = np.array([0x7FF8_0000_0000_1234], dtype=np.uint64).view(np.float64)
    values = [np.arange(12.0).reshape(3, 4), np.array([np.nan, -0.0, np.inf]), nan_payload,
              np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max]), np.array([True, False]),
              np.array([1 + 2j], dtype=np.complex64), np.array(["ab", "", "ünï"]), np.array([b"x\x00y"]),
              np.array(["2020-01-01T00:00:00.123456789"], dtype="M8[ns]"), np.array([3, -4], dtype="m8[s]"),
              np.array(7, dtype=np.uint16), np.zeros((0, 3), dtype=np.int32), np.asfortranarray(np.eye(3)),
              np.arange(10)[::3], np.array([1, "a", None, [2, 3.5]], dtype=object),
              np.float64(1.5), np.float32(-0.0), np.int8(-3), np.uint64(2**64 - 1), np.bool_(True),
              np.str_("hi"), np.bytes_(b"b"), np.datetime64("2020-01-01T00:00"), np.timedelta64(5, "D"),
              np.complex128(1 - 1j)]
    for dtype in ("<f8", ">f4", "<i2", ">u4", "|b1", "<c16", "<f2"):  # random bits, both byte orders
        for shape in ((5,), (2, 3), (1, 1, 4)):
            raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
            values.append(np.frombuffer(raw.tobytes(), dtype=dtype).reshape(shape))
    return values


@pytest.mark.parametrize("value", _stdlib_values() + _numpy_values(), ids=lambda v: type(v).__name__)
def test_library_values_round_trip_exactly(value):
    back = decode(encode(value))
    assert _same(value, back), (value, back)
    if isinstance(back, np.ndarray):
        assert back.flags.writeable and back.flags.c_contiguous


def test_any_time_zone_crosses_as_its_utc_offset():
    when = dt.datetime(2020, 7, 1, 12, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    back = decode(encode(when))
    assert back == when and back.utcoffset() == dt.timedelta(hours=2) and type(back.tzinfo) is dt.timezone


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_subclasses_of_library_types_are_not_values():
    """A subclass crosses as a handle (its methods may change what its values mean: a mask, `*` of np.matrix)."""
    class Stamp(dt.date):
        pass
    for value in (np.ma.masked_array([1, 2], mask=[0, 1]), np.matrix([[1, 2]]), Stamp(2020, 1, 1),
                  np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")])):
        assert to_wire(value, handle=lambda v: ["handle", 0]) == ["handle", 0]
        with pytest.raises(CodecError):
            encode(value)


@pytest.mark.parametrize("wire", [
    ["ndarray", "|O8", [1], ""], ["ndarray", "<V8", [1], "AAAAAAAAAAA="], ["ndarray", "f8", [1], "AAAAAAAAAAA="],
    ["ndarray", "<f8", [2], "AAAAAAAAAAA="], ["ndarray", "<f8", [-1], ""], ["ndarray", "<f8", [1 << 20] * 3, ""],
    ["ndarray", "<f8", [1] * 40, "AAAAAAAAAAA="], ["ndarray", "<U2", ["1"], ""], ["npscalar", "<f8", "AAAA"],
    ["ndarray_object", [2], [1]], ["decimal", "x" * 2000], ["decimal", "1e"], ["fraction", 1, 0],
    ["fraction", ["float", "1.0"], 2], ["date", [2020, 13, 1]], ["datetime", [2020, 1, 1, 0, 0, 0, 0, 2], None],
    ["time", [0, 0, 0, 0, 0], [86400 * 1_000_000, None]], ["timedelta", [10**12, 0, 0]], ["range", 0, 1, 0],
    ["range", 0, ["float", "1.0"], 1], ["date", [2020, 1]], ["deque", [], -1], ["defaultdict", "len", []],
    ["counter", [[1]]], ["constant", "print"], ["slice", 1, 2]])
def test_malformed_library_values_are_codec_errors(wire):
    with pytest.raises(CodecError):
        from_wire(wire)


def test_object_arrays_obey_the_depth_limit():
    nested: list = []
    for _ in range(MAX_DEPTH + 5):
        nested = [nested]
    array = np.empty(1, dtype=object)
    array[0] = nested
    with pytest.raises(CodecError):
        encode(array)


def _pandas_values() -> list:
    frame = pd.DataFrame({"i": [1, 2, 3], "f": [1.5, np.nan, -0.0], "s": ["x", None, "z"],
                          "o": np.array([1, "a", None], dtype=object),
                          "c": pd.Categorical(["u", "v", "u"], ordered=True),
                          "tz": pd.date_range("2020", periods=3, tz="Europe/Paris"),
                          "n": pd.array([1, None, 3], dtype="Int64"),
                          "d": pd.to_datetime(["2020-01-01", None, "2021-01-01"]),
                          "td": pd.to_timedelta([1, 2, 3], unit="s"), "b": [True, False, True]},
                         index=pd.Index([10, 20, 10], name="k"))
    return [frame, frame.set_index(["i", "s"]), frame["f"], frame.index, pd.RangeIndex(2, 10, 3, name="r"),
            pd.date_range("2020", periods=4, freq="h"), pd.CategoricalIndex(["a", "b", "a"]), pd.DataFrame(),
            pd.DataFrame({("x", 1): [1], ("x", 2): [2]}), pd.Series([], dtype=float), pd.Series(["a"], dtype="string"),
            pd.DataFrame([[1, 2]], columns=["a", "a"])]


@pytest.mark.parametrize("value", _pandas_values(), ids=lambda v: type(v).__name__)
def test_pandas_values_round_trip_with_their_dtypes_index_and_names(value):
    back = decode(encode(value))
    assert type(back) is type(value)
    if isinstance(value, pd.DataFrame):
        assert_frame_equal(back, value, check_exact=True, check_freq=True, check_flags=True)
    elif isinstance(value, pd.Series):
        assert_series_equal(back, value, check_exact=True, check_freq=True)
    else:
        assert_index_equal(back, value, exact=True, check_exact=True)
        assert getattr(back, "freq", None) == getattr(value, "freq", None)
    assert back.equals(value)


def test_pandas_scalars_round_trip():
    for value in (pd.Timestamp("2020-03-01 12:00:00.000000001", tz="US/Eastern"), pd.Timestamp("2020-01-01"),
                  pd.Timestamp("2020-01-01", tz=dt.timezone(dt.timedelta(hours=3))),
                  pd.Timedelta("1 days 00:00:00.000001")):
        back = decode(encode(value))
        assert type(back) is type(value) and back == value and back.unit == value.unit
        assert str(getattr(back, "tz", None)) == str(getattr(value, "tz", None))
    assert decode(encode(pd.NaT)) is pd.NaT and decode(encode([pd.NA])) == [pd.NA]
    categorical = pd.Categorical(["a", "b", "a"], categories=["b", "a"])
    back = decode(encode(categorical))
    assert type(back) is pd.Categorical and list(back) == list(categorical) and back.dtype == categorical.dtype


def test_other_pandas_objects_are_not_values():
    class Frame(pd.DataFrame):
        pass
    for value in (Frame({"a": [1]}), pd.Series(pd.period_range("2020", periods=2, freq="D")),
                  pd.DataFrame({"a": [object()]}), pd.Series(pd.arrays.SparseArray([0, 1]))):
        wire = to_wire(value, handle=lambda v: ["handle", 0])
        assert wire == ["handle", 0] or value.dtypes.iloc[0] == object, (type(value), wire)


@pytest.mark.parametrize("wire", [
    ["pd_dataframe", [["ndarray", "<i8", [2], "AQAAAAAAAAACAAAAAAAAAA=="]], ["pd_rangeindex", 0, 1, 1, None],
     ["pd_rangeindex", 0, 1, 1, None]],
    ["pd_series", ["extension", "period[D]", []], ["pd_rangeindex", 0, 0, 1, None], None],
    ["pd_index", ["datetime_tz", ["ndarray", "<i8", [0], ""], ["name", "UTC"]], None, None],
    ["pd_timestamp", 5, None], ["pd_rangeindex", 0, 1, 0, None], ["pd_nat", 1]])
def test_malformed_pandas_values_are_codec_errors(wire):
    with pytest.raises(CodecError):
        from_wire(wire)


def _mutations(wire, rng):
    """Copies of `wire` with one leaf or list replaced by another JSON value (hostile input)."""
    paths = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, path + (i,))
    walk(wire, ())
    replacements = [None, True, -1, 0, 2**62, "", "<f8", "|O8", "x" * 40, [], [0], ["ndarray"], ["ref", 0],
                    ["handle", 0], ["float", "nan"], [[1, 2]], "AAAA"]
    for _ in range(100):
        path = paths[int(rng.integers(len(paths)))]
        copy = json.loads(json.dumps(wire))
        if not path:
            continue
        parent = copy
        for i in path[:-1]:
            parent = parent[i]
        parent[path[-1]] = replacements[int(rng.integers(len(replacements)))]
        yield copy


@pytest.mark.parametrize("value", _numpy_values()[:15] + _pandas_values()[:3] + _stdlib_values()[:10],
                         ids=lambda v: type(v).__name__)
def test_hostile_library_wires_are_codec_errors_or_values(value):
    rng = np.random.default_rng(7)
    for wire in _mutations(json.loads(encode(value)), rng):
        try:
            from_wire(wire)
        except CodecError:
            pass


def test_the_codec_works_in_a_bare_interpreter_without_numpy():
    """As the sandbox servers run it (`python -I -S`): stdlib values cross, numpy is never imported to send
    them, and a numpy value is a CodecUnavailable (unverifiable to the judge), not a malformed message."""
    script = (ROOT / "reward" / "sandbox_codec.py").read_text() + """
import sys, datetime, decimal
try:
    import numpy
    print("numpy importable")
    raise SystemExit(0)
except ImportError:
    pass
value = [range(3), decimal.Decimal("1.5"), datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)]
assert decode(encode(value)) == value and "numpy" not in sys.modules
try:
    from_wire(["ndarray", "<f8", [1], "AAAAAAAAAAA="])
except CodecUnavailable as e:
    print("unavailable:", e)
"""
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("numpy importable"):
        pytest.skip("numpy is importable in a bare interpreter here")
    assert out.stdout.strip() == "unavailable: numpy cannot be imported here"


# ---- the tests' objects in the program, in the sandbox ------------------------------------------------------

def test_values_tasks_verify_through_check(tmp_path, capsys):
    rc = main(["check", "--tasks", str(FIXTURE), "--out", str(tmp_path / "check.jsonl"), "--workers", "2",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"{len(TASKS)}/{len(TASKS)} verified" in err and "unverifiable 0" in err
    records = [json.loads(line) for line in (tmp_path / "check.jsonl").read_text().splitlines()]
    # Every task but the file one runs in proxy mode; that one's tests make a temporary file, which
    # `choose_mode` sends to the program's process (the fleet test below runs it in proxy mode too).
    assert {r["task_id"]: r["mode"] for r in records} == {
        t.task_id: "inprocess" if t.task_id == "values/count_words" else "proxy" for t in TASKS}
    assert sorted((r["target"], r["status"]) for r in records) == \
        sorted([("solution", "pass")] * len(TASKS) + [("buggy", "fail")] * len(TASKS))


def test_values_tasks_through_the_fleet(fleet):
    """Each task in proxy mode, the file one included (the tests' open file lent to the program)."""
    proxy = {t.task_id: AssertTests(t.tests.code, "proxy") for t in TASKS}
    results = fleet.run([Job(t.solution, proxy[t.task_id], FAST) for t in TASKS]
                        + [Job(t.buggy_code, proxy[t.task_id], FAST) for t in TASKS])
    solutions, bugs = results[:len(TASKS)], results[len(TASKS):]
    assert [(t.task_id, r.status) for t, r in zip(TASKS, solutions)] == [(t.task_id, "pass") for t in TASKS], \
        [r.stderr[-400:] for r in solutions if not r.passed]
    assert [(t.task_id, r.status) for t, r in zip(TASKS, bugs)] == [(t.task_id, "fail") for t in TASKS], \
        [r.stderr[-400:] for r in bugs]


# The program's own way to a request the `Borrowed` proxy would refuse: the raw link under it.
RAW = "def raw(obj, op, *args):\n    link = object.__getattribute__(obj, '_Borrowed__link')\n" \
      "    return link.request(op, (obj, *args))\n"
LEAKS = {
    "globals": ("def leak(cb):\n    return cb.__globals__['SECRET']\n", "lambda x: x"),
    "co_consts": (f"def leak(cb):\n    return cb.__code__.co_consts[1]\n", f"lambda: {SECRET!r}"),
    "closure": ("def leak(cb):\n    return cb.__closure__[0].cell_contents\n", "(lambda s: lambda: s)(SECRET)"),
    "gi_frame": ("def leak(g):\n    return g.gi_frame.f_back.f_globals['SECRET']\n", "(x for x in [1])"),
    "dict": ("def leak(o):\n    return o.__dict__['s']\n", "Hidden()"),
    "raw_globals": (RAW + "def leak(cb):\n    return raw(cb, 'getattr', '__globals__')['SECRET']\n", "lambda x: x"),
    "raw_gi_frame": (RAW + "def leak(g):\n    return raw(raw(g, 'getattr', 'gi_frame'), 'getattr', 'f_globals')"
                     "['SECRET']\n", "(x for x in [1])"),
    "raw_class": (RAW + "def leak(o):\n    return raw(raw(o, 'getattr', '__class__'), 'getattr', 's')\n", "Hidden()"),
    "raw_plain_target": ("import gc\ndef leak(cb):\n    link = [o for o in gc.get_objects() if type(o).__name__ == "
                         "'JudgeLink'][0]\n    return link.request('getattr', ([1], '__class__'))\n", "lambda x: x"),
    "forged_reference": ("import gc\ndef leak(cb):\n    link = [o for o in gc.get_objects() if type(o).__name__ =="
                         " 'JudgeLink'][0]\n    return link.request('call', (link.borrow(7),))\n", "lambda x: x"),
    "getattr_builtin": ("def leak(get, cb):\n    return get(cb, '__globals__')['SECRET']\n", "getattr, lambda x: x"),
    "getframe": ("def leak(frame):\n    return frame(0).f_globals['SECRET']\n", "__import__('sys')._getframe"),
}


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_references_never_show_the_program_the_tests_code_or_data(fleet, name):
    program, argument = LEAKS[name]
    tests = f"SECRET = {SECRET!r}\nclass Hidden:\n    s = SECRET\n    def __init__(self):\n        self.s = SECRET\n" \
            f"for _ in [0]:\n    assert leak({argument}) == SECRET\n"
    result = run(fleet, program, tests)
    assert result.status in {"fail", "error", "unverifiable"}, (result.status, result.stderr[-800:])
    assert SECRET not in result.stderr + result.stdout


def test_a_program_cannot_catch_a_failure_of_the_tests_code(fleet):
    program = "def call(cb):\n    try:\n        cb(1)\n    except BaseException:\n        pass\n    return 'ok'\n"
    result = run(fleet, program, "def cb(x):\n    assert x == 2\nassert call(cb) == 'ok'\n")
    assert result.status == "fail", result.stderr[-800:]


def test_a_program_cannot_replace_a_method_of_the_tests_object(fleet):
    program = "def fake(node):\n    node.total = lambda: 6\n    return node\ndef fix(node):\n    node.v = 6\n" \
              "    return node\n"
    tests = "class N:\n    def __init__(self):\n        self.v = 1\n    def total(self):\n        return self.v\n" \
            "assert {name}(N()).total() == 6\n"
    faked, fixed = (run(fleet, program, tests.format(name=name)) for name in ("fake", "fix"))
    assert faked.status == "error" and "may not set 'total'" in faked.stderr, faked.stderr[-800:]
    assert fixed.passed, fixed.stderr[-800:]


def test_calls_nest_both_ways_and_identity_holds_both_ways(fleet):
    program = ("class P:\n    pass\ndef down(n, cb):\n    return 0 if n == 0 else 1 + cb(n - 1)\n"
               "def same(a, b):\n    return a is b\ndef echo(a):\n    return a\ndef roundtrip(cb):\n    p = P()\n"
               "    return cb(p) is p\ndef safe(cb):\n    try:\n        return cb()\n    except ValueError as e:\n"
               "        return 'caught ' + str(e)\n")
    tests = ("def cb(n):\n    return down(n, cb)\nassert down(60, cb) == 60\n"
             "o = object.__new__(type('T', (), {}))\nassert same(o, o) and not same(o, [])\nassert echo(o) is o\n"
             "assert roundtrip(lambda p: p) is True\n"
             "def bad():\n    raise ValueError('no')\nassert safe(bad) == 'caught no'\n")
    result = run(fleet, program, tests)
    assert result.passed, result.stderr[-800:]


def test_slices_classes_generators_and_containers_of_the_tests_work_in_the_program(fleet):
    program = ("import collections\ndef f(xs, s, cls, obj, gen, counts, queue):\n"
               "    return (xs[s], isinstance(obj, cls), isinstance(3, cls), list(gen), counts.most_common(1),\n"
               "            queue.maxlen, collections.deque([1]))\n")
    tests = ("import collections\nclass K:\n    pass\n"
             "r = f([1, 2, 3, 4], slice(1, None, 2), K, K(), (i for i in range(3)), collections.Counter('aab'),"
             " collections.deque([1], 4))\n"
             "assert r == ([2, 4], True, False, [0, 1, 2], [('a', 2)], 4, collections.deque([1])), r\n")
    result = run(fleet, program, tests)
    assert result.passed, result.stderr[-800:]


def test_what_a_callback_changes_in_the_programs_lists_is_copied_back(fleet):
    program = "def walk(visit):\n    path, seen = [1], {}\n    visit(path, seen=seen)\n    return path, seen\n"
    tests = "def visit(path, seen):\n    path.append(2)\n    seen['x'] = [path[0]]\n" \
            "assert walk(visit) == ([1, 2], {'x': [1]})\n"
    result = run(fleet, program, tests)
    assert result.passed, result.stderr[-800:]


def test_threads_of_the_program_take_turns_with_the_tests_callback(fleet):
    program = ("from concurrent.futures import ThreadPoolExecutor\ndef pmap(fn, xs):\n"
               "    with ThreadPoolExecutor(4) as pool:\n        return list(pool.map(fn, xs))\n")
    result = run(fleet, program, "def square(x):\n    return x * x\n"
                                 "assert pmap(square, range(200)) == [x * x for x in range(200)]\n")
    assert result.passed, result.stderr[-800:]


def test_a_program_that_floods_callbacks_is_bounded_by_the_runs_deadline(fleet):
    result = run(fleet, "def flood(cb):\n    while True:\n        cb(1)\n", "flood(lambda x: x)\n",
                 Limits(timeout_s=1.5, memory_mb=512))
    assert result.status == "timeout", result.stderr[-400:]


def test_library_values_cross_the_sandbox(fleet):
    """range, datetime, Decimal and Fraction both ways (stdlib only in the sandbox); numpy once the
    sandbox can import it."""
    program = ("import datetime, decimal, fractions\ndef shift(d, r, q, x):\n"
               "    return d + datetime.timedelta(days=1), r[::-1], q * 2, x + decimal.Decimal('0.1')\n")
    tests = ("import datetime, decimal, fractions\nd = datetime.datetime(2020, 2, 28, tzinfo=datetime.timezone.utc)\n"
             "out = shift(d, range(5), fractions.Fraction(1, 3), decimal.Decimal('0.2'))\n"
             "assert out == (datetime.datetime(2020, 2, 29, tzinfo=datetime.timezone.utc), range(4, -1, -1),"
             " fractions.Fraction(2, 3), decimal.Decimal('0.3'))\n"
             "assert type(out[0]) is datetime.datetime and str(out[3]) == '0.3'\n")
    result = run(fleet, program, tests)
    assert result.passed, result.stderr[-800:]
    probe = run(fleet, "import numpy\n", "pass\n")
    if not probe.passed:
        pytest.skip(f"numpy is not importable in the sandbox: {probe.stderr.strip().splitlines()[-1][:200]}")
    result = run(fleet, "import numpy as np\ndef scale(a, k):\n    return a * k, a.dtype.str, np.float32(k)\n",
                 "import numpy as np\na = np.array([[1.5, np.nan], [-0.0, 2]])\nb, dtype, k = scale(a, 2)\n"
                 "assert type(b) is np.ndarray and b.shape == (2, 2) and dtype == '<f8' and type(k) is np.float32\n"
                 "np.testing.assert_array_equal(b, a * 2)\n")
    assert result.passed, result.stderr[-800:]


def test_operators_on_the_tests_objects_run_their_own_methods(fleet):
    """Comparisons, hashing, arithmetic and copies as in plain Python: the tests' own methods, else the
    program's reflected one, else TypeError (never a loop between the two sides)."""
    program = ("import copy, heapq\nclass P:\n    def __radd__(self, other):\n        return 'p'\n"
               "def use(a, b):\n    h = [b, a]\n    heapq.heapify(h)\n"
               "    return (h[0] is a, a == b, a != b, a < b, {a: 1}[a], a + 1, 2 * a, -a, int(a),\n"
               "            copy.deepcopy(a) is a, copy.copy([a])[0] is a, a + P(), a == 1)\n"
               "def add(x, y):\n    try:\n        return x + y\n    except TypeError:\n        return 'TypeError'\n")
    tests = ("class V:\n    def __init__(self, v):\n        self.v = v\n"
             "    def __eq__(self, o):\n        return isinstance(o, V) and o.v == self.v\n"
             "    def __hash__(self):\n        return hash(self.v)\n"
             "    def __lt__(self, o):\n        return self.v < o.v\n"
             "    def __add__(self, k):\n        return self.v + k if isinstance(k, int) else NotImplemented\n"
             "    def __rmul__(self, k):\n        return self.v * k\n    def __neg__(self):\n        return -self.v\n"
             "    def __int__(self):\n        return self.v\n"
             "r = use(V(1), V(2))\nassert r == (True, False, True, True, 1, 2, 2, -1, 1, False, True, 'p', False), r\n"
             "class T:\n    pass\nassert add(T(), T()) == 'TypeError' and add(T(), 1) == 'TypeError'\n")
    result = run(fleet, program, tests)
    assert result.passed, result.stderr[-800:]


def _host_pair(program: str, program_lacks: str = ""):
    """The judge's `Channel` and the run process's `serve_calls` over a socket pair in this process (numpy and
    pandas importable on both ends, unlike in the sandbox today, except the library `program_lacks`): the
    tests' namespace, the channel, and a function that ends the conversation."""
    from reward.sandbox import JUDGE_SOURCE, ZYGOTE_SOURCE
    server, judge = {"__name__": "values_server"}, {"__name__": "values_judge"}
    exec(compile(ZYGOTE_SOURCE, "sandbox_server", "exec"), server)
    if program_lacks:
        library = server["_library"]

        def lacking(name):
            if name == program_lacks:
                raise server["CodecUnavailable"](f"{name} cannot be imported here")
            return library(name)
        server["_library"] = lacking
    exec(compile(JUDGE_SOURCE, "sandbox_judge", "exec"), judge)
    program_side, judge_side = socket.socketpair()
    namespace: dict = {"__name__": "__main__"}
    exec(program, namespace)
    handles = server["Handles"]()
    names = json.loads(json.dumps(server["describe_names"](namespace, handles)))
    link = server["JudgeLink"](program_side, handles)
    thread = threading.Thread(target=server["serve_calls"], args=(program_side, link))
    thread.start()
    channel = judge["Channel"](judge_side)

    def close():
        judge["send_frame"](judge_side, {"op": "exit"})
        thread.join(10)
        program_side.close()
        judge_side.close()
    return judge["bind_names"](names, channel), channel, close


def test_numpy_and_pandas_values_cross_both_ways_through_the_channel():
    program = ("import numpy as np\nimport pandas as pd\n"
               "def summary(df, key):\n    out = df.assign(total=df['a'] + df['b'])\n"
               "    return out, out['total'].map(key), np.asarray(out['total']), out.index\n")
    tests, channel, close = _host_pair(program)
    try:
        frame = pd.DataFrame({"a": [1.0, np.nan, 3.0], "b": [1.0, 2.0, -0.0]},
                             index=pd.Index(["x", "y", "z"], name="k"))
        out, keyed, totals, index = tests["summary"](frame, lambda v: f"<{v}>")
        expected = frame.assign(total=frame["a"] + frame["b"])
        assert_frame_equal(out, expected, check_exact=True) and out.equals(expected)
        assert_series_equal(keyed, expected["total"].map(lambda v: f"<{v}>"))
        assert type(totals) is np.ndarray and totals.tobytes() == expected["total"].to_numpy().tobytes()
        assert_index_equal(index, frame.index, exact=True)
        assert channel.failure is None
    finally:
        close()


def test_a_library_value_the_other_side_cannot_import_makes_the_run_unverifiable():
    tests, channel, close = _host_pair("def size(a):\n    return len(a)\n", program_lacks="numpy")
    try:
        with pytest.raises(BaseException) as raised:
            tests["size"](np.zeros(3))
        assert type(raised.value).__name__ == "Unverifiable" and channel.failure is raised.value
        assert "numpy cannot be imported here" in str(raised.value)
    finally:
        close()
