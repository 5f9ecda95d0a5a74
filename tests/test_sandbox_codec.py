"""The plain-data codec and the cgroup layer, without running a sandbox."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward.cgroups import RunCgroup
from reward.sandbox_codec import (MAX_DEPTH, MAX_ITEMS, MAX_JSON_CONTAINERS, MAX_JSON_VALUES, CodecError,
                                  _ENCODER, _token_counts_outside_strings, decode, encode, from_wire, json_size,
                                  loads, to_wire)


@pytest.mark.parametrize("value", [None, True, 0, -5, 10 ** 40, -(3 ** 5000), 2 ** 63, 1.5, -0.0, float("inf"), 2 - 3j, "", "ünï\u2028",
                                   b"\x00\xff", bytearray(b"ab"), [], [1, [2, [3]]], (1, (2,)), {1: {"a": (2,)}},
                                   {1, "a"}, frozenset({(1, 2)}), {(1, 2): frozenset()}])
def test_round_trip_keeps_types_and_values(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)


def test_builtin_types_cross_by_name_and_handles_only_where_asked():
    assert decode(encode([int, str, type, {1: frozenset}])) == [int, str, type, {1: frozenset}]
    with pytest.raises(CodecError):
        from_wire(["type", "os"])
    with pytest.raises(CodecError):
        from_wire(["handle", 3])  # no handle callback: a handle is not plain data
    objects = [object(), print]
    wire = to_wire([1, objects[0], (objects[1],)], handle=lambda v: ["handle", objects.index(v)])
    assert wire == ["list", [1, ["handle", 0], ["tuple", [["handle", 1]]]]]
    assert from_wire(wire, handle=lambda n: objects[n]) == [1, objects[0], (objects[1],)]
    for bad in (["handle", -1], ["handle", "0"], ["handle", True], ["handle", 0, 1]):
        with pytest.raises(CodecError):
            from_wire(bad, handle=lambda n: objects[n])


def test_integers_beyond_the_decimal_digit_limit_cross():
    big = -(7 ** 6000)  # more digits than int() parses from decimal text by default
    assert decode(encode([big])) == [big]


def test_nan_and_subclasses_cross_as_builtins():
    assert math.isnan(decode(encode(float("nan"))))

    class Always(int):
        def __eq__(self, other):
            return True

    back = decode(encode([Always(3)]))
    assert back == [3] and type(back[0]) is int and back != [4]


@pytest.mark.parametrize("value", [object(), lambda: 1, iter([1]), type("Int", (int,), {}), [1, object()], {1: print}])
def test_other_types_are_refused(value):
    with pytest.raises(CodecError):
        encode(value)


@pytest.mark.parametrize("text", ['{"a": 1}', '["float", "x"]', '["list", 3]', '["set", [["list", []]]]',
                                  '["dict", [[1]]]', '["evil", []]', '1.5', '["bytes", "!!"]', "NaN", "[" * 5000,
                                  '["dict", [[["list", []], 1]]]', "1" * 5000, '["int", "zz"]', str(2 ** 70)])
def test_hostile_bytes_raise_codec_error_only(text):
    with pytest.raises(CodecError):
        decode(text)


def test_depth_and_size_caps():
    deep = 1
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(CodecError):
        encode(deep)
    wire = 0
    for _ in range(MAX_DEPTH + 5):
        wire = ["list", [wire]]
    with pytest.raises(CodecError):
        from_wire(json.loads(json.dumps(wire)))
    with pytest.raises(CodecError):
        loads(b" " * (17 << 20))


def _json_counts(obj) -> tuple[int, int]:
    """(values, containers) of a decoded JSON value, object keys counted as values."""
    if isinstance(obj, list):
        inner = [_json_counts(v) for v in obj]
    elif isinstance(obj, dict):
        inner = [(1, 0)] * len(obj) + [_json_counts(v) for v in obj.values()]
    else:
        return 1, 0
    return 1 + sum(v for v, _ in inner), 1 + sum(c for _, c in inner)


_TEXT = st.text(alphabet=st.sampled_from(list('[]{},:"\\ab\u00e9\u2028\n')), max_size=12)
_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _TEXT | st.binary(max_size=6)
    | st.complex_numbers(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.frozensets(st.integers(), max_size=3)
    | st.dictionaries(_TEXT | st.integers(), inner, max_size=3),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_PLAIN)
def test_the_pre_scan_keeps_every_value_the_codec_takes(value):
    """Within the budget, a message decodes as it did without the pre-scan; its count bounds the real one."""
    text = _ENCODER.encode({"op": "ok", "result": to_wire(value), "args": [], "kwargs": []})
    values, containers = json_size(text.encode())
    real_values, real_containers = _json_counts(json.loads(text))
    assert values >= real_values and containers >= real_containers
    outside_containers, values_after_first = _token_counts_outside_strings(text.encode())
    assert outside_containers == real_containers  # strings do not count, however they are escaped
    assert real_values <= 1 + values_after_first <= real_values + real_containers  # one more per empty one
    before = from_wire(json.loads(text)["result"])  # the codec as it was: decode, then the budget
    assert _ENCODER.encode(to_wire(from_wire(loads(text.encode())["result"]))) == _ENCODER.encode(to_wire(before))


def test_the_pre_scan_counts_brackets_in_strings_only_when_it_must():
    """An 8 MiB string of brackets, commas and escaped quotes is one value: over the first count, kept by the second."""
    value = ['[,{:\\"' * (1 << 20)]
    text = encode(value)
    assert json_size(text.encode()) == (4, 2)
    assert decode(text) == value


@pytest.mark.slow
def test_a_message_at_the_value_budget_still_decodes():
    """999,999 empty lists (the wire's most containers per value) fit; one list more is refused (6 s)."""
    wire = ["list", [["list", []]] * (MAX_ITEMS - 1)]
    assert json_size(_ENCODER.encode(wire).encode()) <= (MAX_JSON_VALUES, MAX_JSON_CONTAINERS)
    assert len(from_wire(loads(_ENCODER.encode(wire)))) == MAX_ITEMS - 1
    with pytest.raises(CodecError):
        from_wire(loads(_ENCODER.encode(["list", [["list", []]] * MAX_ITEMS])))


# Frames read by `recv_frame` in a fresh interpreter, which prints its peak memory added (MiB) and CPU
# seconds. "issue": 16 MiB of `[],` (issue #42: 433 MiB and 2.1 s before the pre-scan); "commas in strings":
# 4 million strings holding a comma, over the quick count, refused by the count outside strings; "strings":
# the costliest frame under the count, 3.3 million two-letter strings, which the budget admits.
_READ_FRAME = """
import resource, socket, struct, sys, threading, time
from reward.sandbox_codec import CodecError, MAX_BYTES, recv_frame
if sys.argv[1] == "issue":
    body = b"[" + b"[]," * ((MAX_BYTES - 4) // 3) + b"[]]"
elif sys.argv[1] == "commas in strings":
    body = b"[" + b'",",' * ((MAX_BYTES - 4) // 4 - 1) + b'","]'
else:
    body = b"[" + b'"ab",' * ((MAX_BYTES - 4) // 5 - 1) + b'"ab"]'
a, b = socket.socketpair()
threading.Thread(target=lambda: a.sendall(struct.pack(">I", len(body)) + body), daemon=True).start()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.process_time()
try:
    recv_frame(b, time.monotonic() + 60)
except CodecError:
    pass
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10, round(time.process_time() - start, 2))
"""


def _read_frame(kind: str) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", _READ_FRAME, kind], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).parents[1]), check=True)
    added_mib, cpu_s = out.stdout.split()
    print(f"{kind}: peak memory +{added_mib} MiB, {cpu_s} s of CPU")
    return int(added_mib), float(cpu_s)


@pytest.mark.parametrize("kind", ["issue", "commas in strings"])
def test_a_hostile_frame_is_refused_before_it_is_decoded(kind):
    """The reader's peak grows by the frame's bytes (read, joined, copied), not by what they would decode into."""
    added_mib, _ = _read_frame(kind)
    assert added_mib < 64


@pytest.mark.slow
def test_the_costliest_frame_the_budget_admits():
    """What the value budget still lets a frame cost (docs/sandbox.md, "What a frame costs its reader")."""
    added_mib, _ = _read_frame("strings")
    assert added_mib < 400


def test_cgroup_v2_layout(tmp_path, monkeypatch):
    """A fake v2 tree: the group is made under this process's cgroup with memory and pids enabled."""
    own = tmp_path / "user.slice"
    own.mkdir()
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("")

    real_mkdir = type(own).mkdir

    def mkdir(self, *a, **k):  # the kernel fills a new group with its interface files
        real_mkdir(self, *a, **k)
        for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.procs", "memory.events"):
            (self / name).write_text("")
        (self / "memory.events").write_text("low 0\noom 1\noom_kill 2\n")

    monkeypatch.setattr(type(own), "mkdir", mkdir)
    group = RunCgroup.create("run-1", root=tmp_path, proc_cgroup="0::/user.slice\n")
    assert group is not None and group.version == 2 and group.dirs == [own / "run-1"]
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    group.set_limits(256, 32)
    assert (own / "run-1" / "memory.max").read_text() == str(256 << 20)
    assert (own / "run-1" / "memory.swap.max").read_text() == "0"
    assert (own / "run-1" / "pids.max").read_text() == "32"
    assert (own / "run-1" / "cpu.max").read_text() == "100000 100000" and group.cpu_bounded
    assert group.oom_kills() == 2


def test_no_writable_cgroup_means_none(tmp_path):
    assert RunCgroup.create("run-1", root=tmp_path / "absent", proc_cgroup="0::/\n") is None
