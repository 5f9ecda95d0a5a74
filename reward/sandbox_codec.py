"""Plain data across the sandbox boundary: a tagged JSON encoding that is safe on hostile bytes.

Stdlib only and free of `from __future__`: this source is also prepended to the
sandbox servers' sources, which run in a bare interpreter (`python -I -S -c`).

Only None, bool, int, float (inf and nan included), complex, str, bytes,
bytearray, list, tuple, dict, set and frozenset (and those built-in types
themselves, with `object` and `type`, by name) cross, nested at most
`MAX_DEPTH` deep, at most `MAX_ITEMS` values and `MAX_BYTES` bytes per message.
JSON null, booleans, integers of at most 63 bits and strings stand for
themselves; every other value is a JSON list whose first element names its type
(`["int", "<hex>"]` for larger integers, `["float", "nan"]`,
`["tuple", [...]]`, `["dict", [[k, v], ...]]`). A subclass of a plain type
crosses as its base type, so the receiver only ever builds built-in values:
no pickle, no marshal, no object whose methods the sender chose.

Where a side passes `handle`, values that are not plain data cross as
`["handle", <number>]` instead of being refused: the program's side numbers its
objects (they stay in its process), the judge's side turns numbers into
proxies (docs/sandbox.md, "Objects of the program").

Frames on a stream socket are a 4-byte big-endian length and a UTF-8 JSON object.
A message's wire form holds at most 4 JSON values and 2 JSON containers per value
of its budget (a `["complex", re, im]`, a `["list", [...]]`), so `loads` counts
the JSON tokens of a frame before decoding it (`json_size`), and refuses one that
no message within the budget can be: the host's work on a hostile frame is
bounded by the value budget, not by its 16 MiB. Every read of a frame may be
bounded by an absolute deadline (`recv_frame`), not a timeout per `recv`.
"""

import base64
import json
import struct
import time

MAX_DEPTH = 100
MAX_ITEMS = 1_000_000
MAX_BYTES = 16 << 20
MAX_INT_BITS = 1 << 20
_JSON_INT_BITS = 63  # larger integers cross in hexadecimal (no decimal digit limit applies)


# Built-in types cross by name (a test may pass `int` to a program that filters by type).
_TYPES = {t.__name__: t for t in (bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
                                  frozenset, object, type)}
_TYPE_NAMES = {t: name for name, t in _TYPES.items()}


class CodecError(ValueError):
    """A value that is not plain data, or bytes that are not a valid encoding."""


class _Budget:
    """Values spent so far; one budget may be shared by every value of one message."""

    __slots__ = ("items",)

    def __init__(self):
        self.items = 0

    def spend(self):
        self.items += 1
        if self.items > MAX_ITEMS:
            raise CodecError(f"more than {MAX_ITEMS} values")


def _float_text(x):
    return repr(float(x))


def to_wire(value, depth=0, budget=None, handle=None):
    """The JSON-ready form of a plain-data value; anything else goes to `handle` (default: CodecError)."""
    budget = budget or _Budget()
    budget.spend()
    if depth > MAX_DEPTH:
        raise CodecError(f"nested deeper than {MAX_DEPTH}")
    if value is None or value is True or value is False:
        return value
    kind = type(value)  # not isinstance: an object can claim any class through __class__
    if kind is str:  # the exact types first: most values, and no subclass checks for them
        return value
    if kind is int and value.bit_length() <= _JSON_INT_BITS:
        return value
    if kind is list:
        return ["list", [to_wire(v, depth + 1, budget, handle) for v in value]]
    if issubclass(kind, bool):
        return bool(value)
    if issubclass(kind, int):
        number = int.__index__(value)
        bits = number.bit_length()
        if bits > MAX_INT_BITS:
            raise CodecError(f"integer over {MAX_INT_BITS} bits")
        return number if bits <= _JSON_INT_BITS else ["int", format(number, "x")]
    if issubclass(kind, float):
        return ["float", _float_text(value)]
    if issubclass(kind, complex):
        return ["complex", _float_text(value.real), _float_text(value.imag)]
    if issubclass(kind, str):
        return str.__str__(value)
    if issubclass(kind, bytes):
        return ["bytes", base64.b64encode(bytes(value)).decode("ascii")]
    if issubclass(kind, bytearray):
        return ["bytearray", base64.b64encode(bytes(value)).decode("ascii")]
    d = depth + 1
    if issubclass(kind, list):
        return ["list", [to_wire(v, d, budget, handle) for v in list.__iter__(value)]]
    if issubclass(kind, tuple):
        return ["tuple", [to_wire(v, d, budget, handle) for v in tuple.__iter__(value)]]
    if issubclass(kind, dict):
        return ["dict", [[to_wire(k, d, budget, handle), to_wire(v, d, budget, handle)]
                         for k, v in dict.items(value)]]
    if issubclass(kind, frozenset):
        return ["frozenset", [to_wire(v, d, budget, handle) for v in frozenset.__iter__(value)]]
    if issubclass(kind, set):
        return ["set", [to_wire(v, d, budget, handle) for v in set.__iter__(value)]]
    if kind is type and value in _TYPE_NAMES:
        return ["type", _TYPE_NAMES[value]]
    if handle is not None:
        return handle(value)
    raise CodecError(f"a value of type {type(value).__name__} is not plain data")


def _float(text):
    if not isinstance(text, str) or len(text) > 64:
        raise CodecError("bad float")
    try:
        return float(text)
    except ValueError:
        raise CodecError("bad float") from None


def _items(payload, depth, budget, handle):
    if not isinstance(payload, list):
        raise CodecError("bad container")
    return [from_wire(v, depth + 1, budget, handle) for v in payload]


def _bytes(payload):
    if not isinstance(payload, str):
        raise CodecError("bad bytes")
    try:
        return base64.b64decode(payload.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise CodecError("bad bytes") from None


def from_wire(obj, depth=0, budget=None, handle=None):
    """Rebuild a value from its wire form; CodecError on anything malformed (or a handle without `handle`)."""
    budget = budget or _Budget()
    budget.spend()
    if depth > MAX_DEPTH:
        raise CodecError(f"nested deeper than {MAX_DEPTH}")
    if obj is None or type(obj) in (bool, str):
        return obj
    if type(obj) is int:
        if obj.bit_length() > _JSON_INT_BITS:
            raise CodecError("a large integer must use the int tag")
        return obj
    if type(obj) is not list or not obj or type(obj[0]) is not str:
        raise CodecError(f"not a plain-data encoding: {type(obj).__name__}")
    tag, rest = obj[0], obj[1:]
    try:
        if tag == "int" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) <= MAX_INT_BITS // 4 + 1:
            try:
                return int(rest[0], 16)
            except ValueError:
                raise CodecError("bad int") from None
        if tag == "float" and len(rest) == 1:
            return _float(rest[0])
        if tag == "complex" and len(rest) == 2:
            return complex(_float(rest[0]), _float(rest[1]))
        if tag == "bytes" and len(rest) == 1:
            return _bytes(rest[0])
        if tag == "bytearray" and len(rest) == 1:
            return bytearray(_bytes(rest[0]))
        if tag == "type" and len(rest) == 1 and rest[0] in _TYPES:
            return _TYPES[rest[0]]
        if tag == "handle" and len(rest) == 1 and handle is not None:
            if type(rest[0]) is not int or not 0 <= rest[0] < MAX_ITEMS:
                raise CodecError("bad handle")
            return handle(rest[0])
        if len(rest) == 1:
            if tag == "list":
                return _items(rest[0], depth, budget, handle)
            if tag == "tuple":
                return tuple(_items(rest[0], depth, budget, handle))
            if tag == "set":
                return set(_items(rest[0], depth, budget, handle))
            if tag == "frozenset":
                return frozenset(_items(rest[0], depth, budget, handle))
            if tag == "dict":
                pairs = rest[0]
                if type(pairs) is not list or not all(type(p) is list and len(p) == 2 for p in pairs):
                    raise CodecError("bad dict")
                return {from_wire(k, depth + 1, budget, handle): from_wire(v, depth + 1, budget, handle)
                        for k, v in pairs}
    except TypeError as e:  # an unhashable key or set member
        raise CodecError(str(e)) from None
    raise CodecError(f"unknown tag {tag[:20]!r}")


def encode(value):
    """Wire form of a plain-data value as JSON text."""
    return _ENCODER.encode(to_wire(value))


def decode(text):
    """The plain-data value of JSON text from `encode`."""
    return from_wire(loads(text))


def _no_constant(name):
    raise CodecError(f"non-standard JSON constant {name}")


# Made once: json.loads and json.dumps build a new decoder or encoder per call when given options.
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False)


# JSON values and containers a message may hold: 4 and 2 per value of the budget (see the module's
# docstring), and room for the message's own fields.
MAX_JSON_VALUES = 4 * MAX_ITEMS + 4096
MAX_JSON_CONTAINERS = 2 * MAX_ITEMS + 4096
_CHUNK = 1 << 18


def _token_counts(data):
    """(containers, values after the first): the structural bytes of `data`."""
    containers = data.count(b"[") + data.count(b"{")
    return containers, containers + data.count(b",") + data.count(b":")


def _token_counts_outside_strings(data):
    """`_token_counts` of the bytes of `data` outside JSON strings, read a chunk at a time.

    With escaped backslashes, then escaped quotes, removed, every quote opens or
    closes a string, so the bytes between the quotes of a chunk alternate between
    outside and inside. Only bytes operations (C speed); memory: a chunk's pieces.
    """
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    containers = values = 0
    inside = False
    for start in range(0, len(data), _CHUNK):
        pieces = data[start:start + _CHUNK].split(b'"')
        c, v = _token_counts(b"".join(pieces[1 if inside else 0::2]))
        containers, values = containers + c, values + v
        inside ^= len(pieces) % 2 == 0
    return containers, values


def json_size(data):
    """Upper bounds on the JSON values and containers `data` (UTF-8 JSON) decodes into.

    A value is the first in its container, or follows a comma or a colon: so
    values are at most 1 + brackets + braces + commas + colons (one too many
    per empty container). First counted over all of `data` (more when strings
    hold such bytes), and only when that is over the limits, again outside
    strings, which counts the JSON's own structure (of the valid prefix the
    decoder would build before an error, when `data` is not valid JSON).
    """
    containers, values = _token_counts(data)
    if 1 + values > MAX_JSON_VALUES or containers > MAX_JSON_CONTAINERS:
        containers, values = _token_counts_outside_strings(data)
    return 1 + values, containers


def loads(data):
    """JSON text (str, or bytes in UTF-8) to a value, with every failure on hostile input a CodecError.

    A message that cannot fit the value budget is refused before it is decoded (`json_size`).
    """
    if len(data) > MAX_BYTES:
        raise CodecError(f"message over {MAX_BYTES} bytes")
    values, containers = json_size(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data))
    if values > MAX_JSON_VALUES or containers > MAX_JSON_CONTAINERS:
        raise CodecError(f"message over {MAX_ITEMS} values")
    try:
        return _DECODER.decode(data if isinstance(data, str) else bytes(data).decode("utf-8"))
    except (ValueError, RecursionError, MemoryError) as e:  # UnicodeDecodeError is a ValueError
        raise CodecError(f"malformed message: {str(e)[:100]}") from None


def frame(obj):
    """A length-prefixed frame of one JSON object (the object holds wire values, not raw ones)."""
    body = _ENCODER.encode(obj).encode("ascii")
    if len(body) > MAX_BYTES:
        raise CodecError(f"message over {MAX_BYTES} bytes")
    return struct.pack(">I", len(body)) + body


def send_frame(sock, obj):
    sock.sendall(frame(obj))


def _recv_exact(sock, n, deadline):
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the run's deadline passed during a frame")
            sock.settimeout(left)
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock, deadline=None):
    """One JSON object from a frame; EOFError when the peer is gone, CodecError when it is malformed.

    With `deadline` (time.monotonic), every read waits at most until then, so a
    peer that sends a byte at a time cannot hold the reader past it (TimeoutError).
    """
    (size,) = struct.unpack(">I", _recv_exact(sock, 4, deadline))
    if size > MAX_BYTES:
        raise CodecError(f"message over {MAX_BYTES} bytes")
    obj = loads(_recv_exact(sock, size, deadline))
    if type(obj) is not dict:
        raise CodecError("a message must be a JSON object")
    return obj
