"""Plain data across the sandbox boundary: a tagged JSON encoding that is safe on hostile bytes.

Stdlib only and free of `from __future__`: this source is also prepended to the
sandbox servers' sources, which run in a bare interpreter (`python -I -S -c`).

Only None, bool, int, float (inf and nan included), complex, str, bytes,
bytearray, list, tuple, dict, set, frozenset and range (and those built-in types
themselves, with `object` and `type`, by name) cross, nested at most
`MAX_DEPTH` deep, at most `MAX_ITEMS` values and `MAX_BYTES` bytes per message.
JSON null, booleans, integers of at most 63 bits and strings stand for
themselves; every other value is a JSON list whose first element names its type
(`["int", "<hex>"]` for larger integers, `["float", "nan"]`,
`["tuple", [...]]`, `["dict", [[k, v], ...]]`). A subclass of a plain type
crosses as its base type, so the receiver only ever builds built-in values:
no pickle, no marshal, no object whose methods the sender chose.

Values of `datetime`, `decimal`, `fractions`, numpy and pandas cross too, by
exact type (`_value_to_wire`): the receiver rebuilds them with its own library,
imported only when such a value arrives (docs/sandbox.md, "Values of libraries").

Where a side passes `handle`, values that are not plain data go to it instead of
being refused: the program's side sends `["handle", <number>]` for its objects
(they stay in its process), the judge's side `["ref", <number>]` for the tests'
objects (they stay in the judge), and each side turns the other's numbers into
proxies (`from_wire`'s `handle` and `ref`; docs/sandbox.md, "Objects of the
program" and "Objects of the tests").

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
    if kind is range:
        return ["range", to_wire(value.start), to_wire(value.stop), to_wire(value.step)]
    if kind not in _TYPE_NAMES and kind.__module__.partition(".")[0] in _VALUE_MODULES:
        wire = _value_to_wire(value, kind, depth, budget, handle)
        if wire is not None:
            return wire
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
    if kind is slice:
        return ["slice", *(to_wire(v, d, budget) for v in (value.start, value.stop, value.step))]
    if value is Ellipsis or value is NotImplemented:
        return ["constant", repr(value)]
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


def _items(payload, depth, budget, handle, ref=None):
    if not isinstance(payload, list):
        raise CodecError("bad container")
    return [from_wire(v, depth + 1, budget, handle, ref) for v in payload]


def _bytes(payload):
    if not isinstance(payload, str):
        raise CodecError("bad bytes")
    try:
        return base64.b64decode(payload.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise CodecError("bad bytes") from None


def from_wire(obj, depth=0, budget=None, handle=None, ref=None):
    """Rebuild a value from its wire form; CodecError on anything malformed (or a handle without `handle`,
    a reference to an object of the tests without `ref`)."""
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
        if tag == "ref" and len(rest) == 1 and ref is not None:
            if type(rest[0]) is not int or not 0 <= rest[0] < MAX_ITEMS:
                raise CodecError("bad reference")
            return ref(rest[0])
        if tag == "slice" and len(rest) == 3:
            return slice(*(from_wire(v, depth + 1, budget) for v in rest))
        if tag == "constant" and rest in (["Ellipsis"], ["NotImplemented"]):
            return Ellipsis if rest[0] == "Ellipsis" else NotImplemented
        if tag == "range" and len(rest) == 3:
            start, stop, step = (from_wire(v, depth + 1, budget) for v in rest)
            if not all(type(v) is int for v in (start, stop, step)) or step == 0:
                raise CodecError("bad range")
            return range(start, stop, step)
        if tag in _VALUE_TAGS:
            return _value_from_wire(tag, rest, depth, budget, handle, ref)
        if len(rest) == 1:
            if tag == "list":
                return _items(rest[0], depth, budget, handle, ref)
            if tag == "tuple":
                return tuple(_items(rest[0], depth, budget, handle, ref))
            if tag == "set":
                return set(_items(rest[0], depth, budget, handle, ref))
            if tag == "frozenset":
                return frozenset(_items(rest[0], depth, budget, handle, ref))
            if tag == "dict":
                pairs = rest[0]
                if type(pairs) is not list or not all(type(p) is list and len(p) == 2 for p in pairs):
                    raise CodecError("bad dict")
                return {from_wire(k, depth + 1, budget, handle, ref): from_wire(v, depth + 1, budget, handle, ref)
                        for k, v in pairs}
    except TypeError as e:  # an unhashable key or set member
        raise CodecError(str(e)) from None
    raise CodecError(f"unknown tag {tag[:20]!r}")


# ---- values of the standard library and of numpy, by exact type --------------------------------------------
# The sender never imports: a value of a library's type exists only where the library is loaded. The receiver
# imports the library when a value of it arrives, and says so (CodecUnavailable) when it cannot.

_VALUE_MODULES = frozenset(("collections", "datetime", "decimal", "fractions", "numpy", "pandas"))
_PANDAS_TAGS = frozenset(("pd_dataframe", "pd_series", "pd_index", "pd_rangeindex", "pd_multiindex", "pd_categorical",
                          "pd_timestamp", "pd_timedelta", "pd_nat", "pd_na"))
_VALUE_TAGS = frozenset(("ordereddict", "counter", "defaultdict", "deque", "decimal", "fraction", "date", "time",
                         "datetime", "timedelta", "ndarray", "ndarray_object", "npscalar")) | _PANDAS_TAGS
_ARRAY_KINDS = "biufcSUmM"  # bool, integers, floats, complex, bytes, str, timedelta64, datetime64
_MAX_DIMS = 32


class CodecUnavailable(CodecError):
    """A value of a library that this side cannot import: the harness's limit, not the sender's fault."""


def _library(name):
    try:
        return __import__(name)
    except ImportError:
        raise CodecUnavailable(f"{name} cannot be imported here") from None


def _offset(tz, when):
    """A tzinfo as [UTC offset in microseconds, name or None] (any tzinfo crosses as its fixed offset)."""
    if tz is None:
        return None
    delta = tz.utcoffset(when)
    if delta is None:
        return None
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    datetime = _library("datetime")
    name = tz.tzname(when) if type(tz) is datetime.timezone else None
    return [micros, None if name == datetime.timezone(delta).tzname(when) else name]


def _tzinfo(wire):
    if wire is None:
        return None
    if type(wire) is not list or len(wire) != 2 or type(wire[0]) is not int or type(wire[1]) not in (str, type(None)):
        raise CodecError("bad time zone")
    datetime = _library("datetime")
    delta = datetime.timedelta(microseconds=wire[0])
    return datetime.timezone(delta) if wire[1] is None else datetime.timezone(delta, wire[1])


def _array_wire(np, array):
    if array.dtype.kind == "O":
        return ["ndarray_object", list(array.shape), None]
    if array.dtype.kind not in _ARRAY_KINDS or array.dtype.fields is not None:
        return None
    raw = base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")
    return ["ndarray", array.dtype.str, list(array.shape), raw]


def _value_to_wire(value, kind, depth, budget, handle):
    """The wire form of a library value of exact type `kind`, or None when it has none (it is then a handle)."""
    module = kind.__module__.partition(".")[0]
    if module == "collections":
        collections = _library("collections")
        if kind in (collections.OrderedDict, collections.Counter) or kind is collections.defaultdict and (
                value.default_factory is None or value.default_factory in _TYPE_NAMES):
            pairs = [[to_wire(k, depth + 1, budget, handle), to_wire(v, depth + 1, budget, handle)]
                     for k, v in dict.items(value)]
            if kind is collections.defaultdict:
                factory = value.default_factory
                return ["defaultdict", None if factory is None else _TYPE_NAMES[factory], pairs]
            return ["ordereddict" if kind is collections.OrderedDict else "counter", pairs]
        if kind is collections.deque:
            return ["deque", [to_wire(v, depth + 1, budget, handle) for v in value], value.maxlen]
        return None
    if module == "decimal" and kind.__name__ == "Decimal":
        return ["decimal", str(value)]
    if module == "fractions" and kind.__name__ == "Fraction":
        return ["fraction", to_wire(value.numerator), to_wire(value.denominator)]
    if module == "datetime":
        datetime = _library("datetime")
        if kind is datetime.datetime:
            return ["datetime", [value.year, value.month, value.day, value.hour, value.minute, value.second,
                                 value.microsecond, value.fold], _offset(value.tzinfo, value)]
        if kind is datetime.date:
            return ["date", [value.year, value.month, value.day]]
        if kind is datetime.time:
            return ["time", [value.hour, value.minute, value.second, value.microsecond, value.fold],
                    _offset(value.tzinfo, None)]
        if kind is datetime.timedelta:
            return ["timedelta", [value.days, value.seconds, value.microseconds]]
        return None
    if module == "numpy":
        np = _library("numpy")
        if kind is np.ndarray:
            wire = _array_wire(np, value)
            if wire is not None and wire[0] == "ndarray_object":
                wire[2] = [to_wire(v, depth + 1, budget, handle) for v in value.ravel().tolist()]
            return wire
        if issubclass(kind, np.generic) and value.dtype.kind in _ARRAY_KINDS:
            return ["npscalar", value.dtype.str, base64.b64encode(value.tobytes()).decode("ascii")]
    if module == "pandas":
        return _pandas_to_wire(value, kind, depth, budget, handle)
    return None


def _ints(wire, count):
    if type(wire) is not list or len(wire) != count or not all(type(v) is int for v in wire):
        raise CodecError("bad value")
    return wire


def _dtype(np, text):
    if type(text) is not str or len(text) > 32 or text[:1] not in "<>|=" or text[1:2] not in _ARRAY_KINDS:
        raise CodecError("bad dtype")
    try:
        return np.dtype(text)
    except (TypeError, ValueError):
        raise CodecError("bad dtype") from None


def _shape(wire):
    if type(wire) is not list or len(wire) > _MAX_DIMS or not all(type(n) is int and 0 <= n <= MAX_BYTES for n in wire):
        raise CodecError("bad shape")
    count = 1
    for n in wire:
        count *= n
    if count > MAX_BYTES:
        raise CodecError("bad shape")
    return tuple(wire), count


def _collection(tag, rest, depth, budget, handle, ref):
    collections = _library("collections")
    if tag == "deque" and len(rest) == 2 and (rest[1] is None or type(rest[1]) is int and rest[1] >= 0):
        return collections.deque(_items(rest[0], depth, budget, handle, ref), rest[1])
    if tag == "defaultdict" and len(rest) == 2 and (rest[0] is None or rest[0] in _TYPES):
        pairs = from_wire(["dict", rest[1]], depth, budget, handle, ref)
        return collections.defaultdict(None if rest[0] is None else _TYPES[rest[0]], pairs)
    if tag in ("ordereddict", "counter") and len(rest) == 1:
        pairs = from_wire(["list", [["tuple", [k, v]] for k, v in _pairs(rest[0])]], depth, budget, handle, ref)
        return collections.OrderedDict(pairs) if tag == "ordereddict" else collections.Counter(dict(pairs))
    raise CodecError(f"bad {tag}")


def _pairs(wire):
    if type(wire) is not list or not all(type(p) is list and len(p) == 2 for p in wire):
        raise CodecError("bad pairs")
    return wire


def _value_from_wire(tag, rest, depth, budget, handle, ref):
    """Rebuild a library value (`_value_to_wire`) with this side's own library."""
    try:
        if tag in ("ordereddict", "counter", "defaultdict", "deque"):
            return _collection(tag, rest, depth, budget, handle, ref)
        if tag == "decimal" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) <= 1000:
            return _library("decimal").Decimal(rest[0])
        if tag == "fraction" and len(rest) == 2:
            numerator, denominator = (from_wire(v, depth + 1, budget) for v in rest)
            if type(numerator) is not int or type(denominator) is not int or denominator <= 0:
                raise CodecError("bad fraction")
            return _library("fractions").Fraction(numerator, denominator)
        if tag in ("date", "time", "datetime", "timedelta"):
            datetime = _library("datetime")
            if tag == "date" and len(rest) == 1:
                return datetime.date(*_ints(rest[0], 3))
            if tag == "timedelta" and len(rest) == 1:
                days, seconds, micros = _ints(rest[0], 3)
                return datetime.timedelta(days=days, seconds=seconds, microseconds=micros)
            if tag == "time" and len(rest) == 2:
                *fields, fold = _ints(rest[0], 5)
                return datetime.time(*fields, tzinfo=_tzinfo(rest[1]), fold=fold)
            if tag == "datetime" and len(rest) == 2:
                *fields, fold = _ints(rest[0], 8)
                return datetime.datetime(*fields, tzinfo=_tzinfo(rest[1]), fold=fold)
        if tag == "npscalar" and len(rest) == 2:
            np = _library("numpy")
            dtype = _dtype(np, rest[0])
            raw = _bytes(rest[1])
            if len(raw) != dtype.itemsize or dtype.itemsize == 0:
                raise CodecError("bad numpy scalar")
            return np.frombuffer(raw, dtype=dtype)[0]
        if tag == "ndarray" and len(rest) == 3:
            np = _library("numpy")
            dtype = _dtype(np, rest[0])
            shape, count = _shape(rest[1])
            raw = _bytes(rest[2])
            if len(raw) != count * dtype.itemsize:
                raise CodecError("bad array size")
            if dtype.itemsize == 0:
                return np.zeros(shape, dtype=dtype)
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if tag in _PANDAS_TAGS:
            return _pandas_from_wire(tag, rest, depth, budget, handle, ref)
        if tag == "ndarray_object" and len(rest) == 2:
            np = _library("numpy")
            shape, count = _shape(rest[0])
            items = _items(rest[1], depth, budget, handle, ref)
            if len(items) != count:
                raise CodecError("bad array size")
            array = np.empty(count, dtype=object)
            for i, item in enumerate(items):
                array[i] = item
            return array.reshape(shape)
    except CodecError:
        raise
    except Exception as e:  # whatever the library's constructor says about hostile input, it is malformed
        raise CodecError(f"bad {tag}: {type(e).__name__}: {str(e)[:100]}") from None
    raise CodecError(f"bad {tag}")


# pandas: a frame is its columns, each a column of values (`_column_wire`), with its index and column labels.
# Extension dtypes cross when they are one of `_PANDAS_DTYPES` (by name, values element-wise) or categorical.
_PANDAS_DTYPES = frozenset(("str", "string", "boolean", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16",
                            "UInt32", "UInt64", "Float32", "Float64"))


def _tz_wire(tz):
    """A time zone by its IANA name when it has one, else by its fixed UTC offset."""
    key = getattr(tz, "key", None) or getattr(tz, "zone", None)
    return ["name", key] if isinstance(key, str) else ["offset", _offset(tz, None)]


def _tz(wire):
    if type(wire) is list and len(wire) == 2 and wire[0] == "name" and type(wire[1]) is str and len(wire[1]) < 100:
        return wire[1]
    if type(wire) is list and len(wire) == 2 and wire[0] == "offset":
        return _tzinfo(wire[1])
    raise CodecError("bad time zone")


def _column_wire(pd, values, depth, budget, handle):
    """The values of a Series, an Index or a frame's column, with their dtype, or None (not a value)."""
    np = _library("numpy")
    if type(values) is pd.arrays.NumpyExtensionArray:  # not its subclasses (StringArray)
        values = values.to_numpy()
    dtype = values.dtype
    if isinstance(dtype, np.dtype):
        wire = _array_wire(np, np.asarray(values))
        if wire is not None and wire[0] == "ndarray_object":
            wire[2] = [to_wire(v, depth + 1, budget, handle) for v in np.asarray(values).ravel().tolist()]
        return wire
    if isinstance(dtype, pd.CategoricalDtype):
        categorical = pd.Categorical(values)
        return ["pd_categorical", _pandas_to_wire(dtype.categories, type(dtype.categories), depth + 1, budget,
                                                  handle), _array_wire(np, categorical.codes), dtype.ordered]
    if isinstance(dtype, pd.DatetimeTZDtype):
        utc = np.asarray(pd.Series(values).dt.tz_convert("UTC").dt.tz_localize(None))
        return ["datetime_tz", _array_wire(np, utc), _tz_wire(dtype.tz)]
    if str(dtype) in _PANDAS_DTYPES:
        return ["extension", str(dtype), [to_wire(v, depth + 1, budget, handle)
                                          for v in values.to_numpy(dtype=object).tolist()]]
    return None


def _column(pd, wire, depth, budget, handle, ref):
    """Values for a Series, an Index or a frame's column (a numpy array or a pandas extension array)."""
    if type(wire) is not list or not wire:
        raise CodecError("bad column")
    if wire[0] in ("ndarray", "ndarray_object"):
        return from_wire(wire, depth + 1, budget, handle, ref)
    if wire[0] == "pd_categorical":
        return from_wire(wire, depth + 1, budget, handle, ref)
    if wire[0] == "datetime_tz" and len(wire) == 3:
        utc = from_wire(wire[1], depth + 1, budget)
        if getattr(utc, "dtype", None) is None or utc.dtype.kind != "M":
            raise CodecError("bad column")
        return pd.Series(utc).dt.tz_localize("UTC").dt.tz_convert(_tz(wire[2])).array
    if wire[0] == "extension" and len(wire) == 3 and wire[1] in _PANDAS_DTYPES:
        return pd.array(_items(wire[2], depth, budget, handle, ref), dtype=wire[1])
    raise CodecError("bad column")


def _pandas_to_wire(value, kind, depth, budget, handle):
    pd = _library("pandas")
    d = depth + 1
    if kind is pd.DataFrame:
        columns = [_column_wire(pd, value.iloc[:, i].array, d, budget, handle) for i in range(value.shape[1])]
        labels = [_pandas_to_wire(i, type(i), d, budget, handle) for i in (value.columns, value.index)]
        if None in columns or None in labels:
            return None
        return ["pd_dataframe", columns, *labels]
    if kind is pd.Series:
        column = _column_wire(pd, value.array, d, budget, handle)
        index = _pandas_to_wire(value.index, type(value.index), d, budget, handle)
        return None if column is None or index is None else \
            ["pd_series", column, index, to_wire(value.name, d, budget, handle)]
    if kind is pd.RangeIndex:
        return ["pd_rangeindex", value.start, value.stop, value.step, to_wire(value.name, d, budget, handle)]
    if kind is pd.MultiIndex:
        levels = [_pandas_to_wire(level, type(level), d, budget, handle) for level in value.levels]
        if None in levels:
            return None
        return ["pd_multiindex", levels, [_array_wire(_library("numpy"), codes) for codes in value.codes],
                to_wire(list(value.names), d, budget, handle)]
    if kind in (pd.Index, pd.DatetimeIndex, pd.TimedeltaIndex, pd.CategoricalIndex):
        column = _column_wire(pd, value.array, d, budget, handle)
        freq = getattr(value, "freqstr", None)
        return None if column is None else ["pd_index", column, to_wire(value.name, d, budget, handle), freq]
    if kind is pd.Categorical:
        return _column_wire(pd, value, depth, budget, handle)
    if kind is pd.Timestamp:
        utc = value.tz_convert("UTC").tz_localize(None) if value.tz is not None else value
        return ["pd_timestamp", to_wire(utc.to_datetime64()), None if value.tz is None else _tz_wire(value.tz)]
    if kind is pd.Timedelta:
        return ["pd_timedelta", to_wire(value.to_timedelta64())]
    if value is pd.NaT:
        return ["pd_nat"]
    if value is pd.NA:
        return ["pd_na"]
    return None


def _numpy_scalar(wire, kind, depth, budget):
    value = from_wire(wire, depth, budget)
    if getattr(value, "dtype", None) is None or value.dtype.kind != kind or getattr(value, "shape", None) != ():
        raise CodecError("bad numpy scalar")
    return value


def _pandas_from_wire(tag, rest, depth, budget, handle, ref):
    pd = _library("pandas")
    d = depth + 1
    if tag == "pd_nat" and not rest:
        return pd.NaT
    if tag == "pd_na" and not rest:
        return pd.NA
    if tag == "pd_timestamp" and len(rest) == 2:
        stamp = pd.Timestamp(_numpy_scalar(rest[0], "M", d, budget))
        return stamp if rest[1] is None else stamp.tz_localize("UTC").tz_convert(_tz(rest[1]))
    if tag == "pd_timedelta" and len(rest) == 1:
        return pd.Timedelta(_numpy_scalar(rest[0], "m", d, budget))
    if tag == "pd_categorical" and len(rest) == 3 and type(rest[2]) is bool:
        categories = from_wire(rest[0], d, budget, handle, ref)
        return pd.Categorical.from_codes(from_wire(rest[1], d, budget),
                                         dtype=pd.CategoricalDtype(categories, ordered=rest[2]))
    if tag == "pd_rangeindex" and len(rest) == 4 and all(type(v) is int for v in rest[:3]):
        return pd.RangeIndex(rest[0], rest[1], rest[2], name=from_wire(rest[3], d, budget, handle, ref))
    if tag == "pd_multiindex" and len(rest) == 3 and type(rest[0]) is list and type(rest[1]) is list:
        levels, codes = _items(rest[0], depth, budget, handle, ref), _items(rest[1], depth, budget, None)
        return pd.MultiIndex(levels=levels, codes=codes, names=from_wire(rest[2], d, budget, handle, ref))
    if tag == "pd_index" and len(rest) == 3 and type(rest[2]) in (str, type(None)):
        values = _column(pd, rest[0], depth, budget, handle, ref)
        name = from_wire(rest[1], d, budget, handle, ref)
        if rest[2] is not None:
            maker = pd.DatetimeIndex if values.dtype.kind == "M" else pd.TimedeltaIndex
            return maker(values, freq=rest[2], name=name)
        return pd.Index(values, dtype=values.dtype, name=name, copy=True)
    if tag == "pd_series" and len(rest) == 3:
        values = _column(pd, rest[0], depth, budget, handle, ref)
        return pd.Series(values, index=from_wire(rest[1], d, budget, handle, ref), dtype=values.dtype,
                         name=from_wire(rest[2], d, budget, handle, ref), copy=True)
    if tag == "pd_dataframe" and len(rest) == 3 and type(rest[0]) is list:
        columns = [_column(pd, c, depth, budget, handle, ref) for c in rest[0]]
        labels, index = (from_wire(v, d, budget, handle, ref) for v in rest[1:])
        if len(labels) != len(columns) or any(len(c) != len(index) for c in columns):
            raise CodecError("bad data frame")
        frame = pd.concat([pd.Series(c, index=index, dtype=c.dtype, copy=True) for c in columns], axis=1) \
            if columns else pd.DataFrame(index=index)
        frame.columns = labels
        return frame
    raise CodecError(f"bad {tag}")


# ---- arguments a call mutated, copied back into the caller's objects (both directions) -----------------------

MUTABLE = (list, dict, set, bytearray)


def mutated(args, kwargs, encode, skip=0):
    """The wire forms of the mutable arguments of a call (from position `skip`), for the caller's `copy_back`."""
    return ([[i, encode(a)] for i, a in enumerate(args) if i >= skip and type(a) in MUTABLE],
            [[k, encode(v)] for k, v in kwargs.items() if type(v) in MUTABLE])


def copy_back(target, changes, keys, handle, ref=None):
    """Apply the other side's mutated copies of arguments to the originals, in place."""
    if not isinstance(changes, list):
        raise ValueError("bad copy-back list")
    allowed = set(keys)
    for item in changes:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) in (int, str) and item[0] in allowed):
            raise ValueError("bad copy-back entry")
        sync(target[item[0]], from_wire(item[1], handle=handle, ref=ref))


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
