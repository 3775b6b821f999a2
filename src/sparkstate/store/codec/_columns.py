"""One column of a key or value schema: how its Python values become physical values and back.

Physical values are what both codecs lay out in bytes: Python ints of a type's width (timestamps,
dates and decimals as their integer counts), floats, bools and bytes (UTF-8 for strings).
Validation happens here, so both codecs fail with the same message naming the column.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError

__all__ = ["Column", "Row", "ValueLayout", "check_arity", "takes_nested_layout"]

Row: TypeAlias = tuple[Any, ...]

_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_MS_PER_DAY = 86_400_000
_DECIMAL_CTX = decimal.Context(prec=100, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
_INTS = (int, np.integer)
_NP_INTS = frozenset(
    {np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64}
)
_NP_FLOATS = frozenset({np.float32, np.float64})
_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_NONE = type(None)


class ValueLayout(Protocol):
    """How the bytes of a nested column's values are laid out (:class:`._nested.NestedLayout`)."""

    def encode(self, v: Any) -> bytes: ...
    def decode(self, payload: bytes) -> Any: ...


class Column:
    """One field of a schema: how its Python values become physical values and back.

    ``phys`` is the physical kind: ``int``/``uint`` (a Python int of ``width`` bytes), ``float``,
    ``bool`` or ``var`` (bytes). ``to_phys`` validates a Python value; ``from_phys`` (None for the
    identity) gives the value as pyarrow's ``to_pylist()`` does (a timestamp outside datetime's
    years 1..9999, which pyarrow cannot give, as its count). A list column (values only) is a
    ``var`` column whose bytes are laid out by :class:`ListLayout`; a nested column (a struct, a
    map, a list of those) one whose bytes are laid out by ``layout``
    (:class:`._nested.NestedLayout`, which builds on this class: :func:`._nested.columns_of`
    gives it).
    """

    phys: str
    width: int
    struct_code: str
    to_phys: Callable[[Any], Any]
    py_types: frozenset[type]
    #: The element column of a list column (values only).
    element: Column

    def __init__(
        self, index: int, field: pa.Field, role: str, layout: ValueLayout | None = None
    ) -> None:
        self.index = index
        self.name: str = field.name
        self.type: pa.DataType = field.type
        self.nullable: bool = field.nullable
        self.from_phys: Callable[[Any], Any] | None = None
        t = field.type
        if pa.types.is_boolean(t):
            self._set("bool", 1, "?", self._to_bool, {bool, np.bool_})
        elif pa.types.is_integer(t):
            width, bits = t.bit_width // 8, t.bit_width
            if pa.types.is_signed_integer(t):
                checker = self._int_checker(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
                self._set("int", width, _INT_CODES[width], checker, {int, *_NP_INTS})
            else:
                checker = self._int_checker(0, (1 << bits) - 1)
                self._set("uint", width, _INT_CODES[width].upper(), checker, {int, *_NP_INTS})
        elif pa.types.is_float32(t):
            self._set("float", 4, "f", self._to_float32, {float, int, *_NP_FLOATS, *_NP_INTS})
        elif pa.types.is_float64(t):
            self._set("float", 8, "d", self._to_float, {float, int, *_NP_FLOATS, *_NP_INTS})
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            self._set("var", 0, "", self._to_utf8, {str})
            self.from_phys = _utf8
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            self._set("var", 0, "", self._to_bytes, {bytes})
        elif pa.types.is_timestamp(t):
            self._set("int", 8, "q", self._to_timestamp, {int, datetime.datetime})
            self.from_phys = self._timestamp_decoder()
        elif pa.types.is_date32(t):
            self._set("int", 4, "i", self._to_date32, {int, datetime.date})
            self.from_phys = _date32_from_days
        elif pa.types.is_date64(t):
            self._set("int", 8, "q", self._to_date64, {int, datetime.date})
            self.from_phys = _date64_from_ms
        elif pa.types.is_decimal128(t) and t.scale >= 0:
            self._set("int", 16, "16s", self._to_decimal, {decimal.Decimal, int})
            self.from_phys = self._decimal_from_unscaled
        elif pa.types.is_list(t) and role == "value" and not pa.types.is_nested(t.value_type):
            self.element = Column(0, t.value_field, "list element")
            layout = ListLayout(self)
            self._set("var", 0, "", layout.encode, {list, tuple, np.ndarray})
            self.from_phys = layout.decode
        elif layout is not None and takes_nested_layout(t, role):
            self._set("var", 0, "", layout.encode, {list, tuple, dict, np.ndarray})
            self.from_phys = layout.decode
        else:
            lists = ", and in values lists, structs and maps of those" if role == "value" else ""
            if role == "key":
                lists = ", and lists and structs of those"
            nested = ""
            if pa.types.is_nested(t) and role == "key":
                nested = "; keys holding a map are not supported (as in Spark)"
            msg = (
                f"{role} column {self.name!r} has Arrow type {t}, which the {role} codec does not "
                "support (supported: integers, float32/64, bool, string, binary, timestamp, "
                f"date32/64, decimal128 with a scale >= 0{lists}){nested}"
            )
            raise ConfigurationError(msg)
        if self.nullable:
            self.py_types = self.py_types | {_NONE}

    def _set(
        self, phys: str, width: int, code: str, to_phys: Callable[[Any], Any], py: set[type]
    ) -> None:
        self.phys, self.width, self.struct_code, self.to_phys = phys, width, code, to_phys
        self.py_types = frozenset(py)

    def mismatch(self, value: Any, expected: str) -> SchemaMismatchError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        msg = (
            f"column {self.name!r} ({self.type}) expects {expected}, "
            f"got {shown} of type {type(value).__name__}"
        )
        return SchemaMismatchError(msg)

    def null_error(self) -> SchemaMismatchError:
        msg = f"column {self.name!r} ({self.type}) is not nullable, got None"
        return SchemaMismatchError(msg)

    # to_phys for each type family

    def _int_checker(self, lo: int, hi: int) -> Callable[[Any], int]:
        def to_int(v: Any) -> int:
            if type(v) is int:
                i: int = v
            elif isinstance(v, bool) or not isinstance(v, _INTS):
                raise self.mismatch(v, "an int")
            else:
                i = int(v)
            if not lo <= i <= hi:
                raise self.mismatch(v, f"an int in [{lo}, {hi}]")
            return i

        return to_int

    def _to_bool(self, v: Any) -> bool:
        if isinstance(v, bool | np.bool_):
            return bool(v)
        raise self.mismatch(v, "a bool")

    def _to_float(self, v: Any) -> float:
        if type(v) is float:
            return v
        if isinstance(v, bool) or not isinstance(v, float | int | np.floating | np.integer):
            raise self.mismatch(v, "a float")
        try:
            return float(v)
        except OverflowError:
            raise self.mismatch(v, "a float in the float64 range") from None

    def _to_float32(self, v: Any) -> float:
        x = self._to_float(v)
        try:
            return float(_F32.unpack(_F32.pack(x))[0])
        except OverflowError:  # rounds to infinity, as numpy and Arrow casts do
            return float("inf") if x > 0 else float("-inf")

    def _to_utf8(self, v: Any) -> bytes:
        if not isinstance(v, str):
            raise self.mismatch(v, "a str")
        try:
            return v.encode("utf-8")
        except UnicodeEncodeError:
            raise self.mismatch(v, "a str encodable as UTF-8") from None

    def _to_bytes(self, v: Any) -> bytes:
        if isinstance(v, bytes):
            return v
        if isinstance(v, bytearray | memoryview):
            return bytes(v)
        raise self.mismatch(v, "bytes")

    def _checked_i64(self, v: int, expected: str) -> int:
        if not -(1 << 63) <= v < (1 << 63):
            raise self.mismatch(v, expected)
        return v

    def _to_timestamp(self, v: Any) -> int:
        unit = self.type.unit
        expected = f"a datetime or an int64 count of {unit}"
        if isinstance(v, datetime.datetime):
            us = (v.toordinal() - _EPOCH_ORDINAL) * 86_400 + v.hour * 3600 + v.minute * 60
            us = (us + v.second) * 1_000_000 + v.microsecond
            offset = v.utcoffset()
            if offset is not None:  # aware: to UTC; naive values are taken as UTC, as Arrow does
                us -= (offset.days * 86_400 + offset.seconds) * 1_000_000 + offset.microseconds
            if unit == "ns":
                return self._checked_i64(us * 1000 + getattr(v, "nanosecond", 0), expected)
            return self._checked_i64(us // (1_000_000 // _PER_SECOND[unit]), expected)
        if isinstance(v, bool) or not isinstance(v, _INTS):
            raise self.mismatch(v, expected)
        return self._checked_i64(int(v), expected)

    def _to_date32(self, v: Any) -> int:
        if isinstance(v, datetime.date):
            return v.toordinal() - _EPOCH_ORDINAL
        if isinstance(v, bool) or not isinstance(v, _INTS) or not -(1 << 31) <= v < (1 << 31):
            raise self.mismatch(v, "a date or an int32 count of days")
        return int(v)

    def _to_date64(self, v: Any) -> int:
        if isinstance(v, datetime.date):
            return (v.toordinal() - _EPOCH_ORDINAL) * _MS_PER_DAY
        if isinstance(v, bool) or not isinstance(v, _INTS):
            raise self.mismatch(v, "a date or an int64 count of milliseconds")
        return self._checked_i64(int(v), "a date or an int64 count of milliseconds")

    def _to_decimal(self, v: Any) -> int:
        precision, scale = self.type.precision, self.type.scale
        expected = f"a Decimal or int with at most {precision} digits, {scale} after the point"
        if isinstance(v, decimal.Decimal):
            if not v.is_finite() or (v and v.adjusted() >= precision - scale):
                raise self.mismatch(v, expected)
            scaled = v.scaleb(scale, _DECIMAL_CTX)
            unscaled = int(scaled)
            if scaled != unscaled:
                raise self.mismatch(v, expected)
        elif isinstance(v, int) and not isinstance(v, bool):
            unscaled = v * 10**scale
        else:
            raise self.mismatch(v, expected)
        if abs(unscaled) >= 10**precision:
            raise self.mismatch(v, expected)
        return unscaled

    # from_phys needing the type

    def _decimal_from_unscaled(self, unscaled: int) -> decimal.Decimal:
        return decimal.Decimal(unscaled).scaleb(-self.type.scale, _DECIMAL_CTX)

    def _timestamp_decoder(self) -> Callable[[int], Any]:
        typ: pa.DataType = self.type
        if typ.unit == "ns":  # pyarrow gives pandas Timestamps (or ints) here: ask it
            return lambda i: pa.scalar(i, typ).as_py()
        step = 1_000_000 // _PER_SECOND[typ.unit]
        if typ.tz is None:
            base, tz = _EPOCH, None
        else:
            base = _EPOCH_UTC
            try:
                tz = pa.scalar(0, typ).as_py().tzinfo
            except Exception as exc:
                msg = f"column {self.name!r} has time zone {typ.tz!r}, which is not known here"
                raise ConfigurationError(msg) from exc

        def decode(i: int) -> Any:
            try:
                value = base + datetime.timedelta(microseconds=i * step)
                return value if tz is None else value.astimezone(tz)
            except OverflowError:  # outside datetime's range (past 9999): the count, which
                return i  # Arrow and to_phys take back as the same time

        return decode


class ListLayout:
    """The bytes of one list value: ``[uint32 count][uint32 k][k x uint32: positions of the null
    elements][elements]``, all little-endian; fixed-width elements take their width each (zeros
    when null), variable ones a ``uint32`` length and their bytes (length 0 when null).
    :func:`sparkstate.store.codec._lists.list_payloads` lays out whole Arrow columns the same way.
    """

    def __init__(self, col: Column) -> None:
        self.col = col
        self.element = el = col.element
        self.fixed = el.phys != "var"
        self.wide = el.struct_code == "16s"
        self.convert = el.from_phys if not self.wide else el._decimal_from_unscaled

    def encode(self, v: Any) -> bytes:
        if isinstance(v, np.ndarray) and v.ndim == 1:  # a cell of a pandas frame
            v = v.tolist()
        if not isinstance(v, list | tuple):
            raise self.col.mismatch(v, "a list")
        el = self.element
        nulls = [i for i, x in enumerate(v) if x is None]
        if nulls and not el.nullable:
            msg = f"column {self.col.name!r} ({self.col.type}) does not take null elements"
            raise SchemaMismatchError(msg)
        head = struct.pack(f"<II{len(nulls)}I", len(v), len(nulls), *nulls)
        phys = [None if x is None else el.to_phys(x) for x in v]
        if self.wide:
            body = b"".join(
                bytes(16) if p is None else p.to_bytes(16, "little", signed=True) for p in phys
            )
        elif self.fixed:
            zero = False if el.phys == "bool" else 0
            body = struct.pack(
                f"<{len(v)}{el.struct_code}", *(zero if p is None else p for p in phys)
            )
        else:
            parts: list[bytes] = []
            for p in phys:
                if p is None:
                    parts.append(bytes(4))
                elif len(p) >= 1 << 32:
                    raise el.mismatch(p, "a value shorter than 4 GiB")
                else:
                    parts += (len(p).to_bytes(4, "little"), p)
            body = b"".join(parts)
        return head + body

    def decode(self, data: bytes) -> list[Any]:
        count, k = struct.unpack_from("<II", data, 0)
        nulls = struct.unpack_from(f"<{k}I", data, 8)
        pos, el = 8 + 4 * k, self.element
        if self.wide:
            end = pos + 16 * count
            out: list[Any] = [
                int.from_bytes(data[i : i + 16], "little", signed=True) for i in range(pos, end, 16)
            ]
        elif self.fixed:
            end = pos + el.width * count
            out = list(struct.unpack_from(f"<{count}{el.struct_code}", data, pos))
        else:
            out = []
            for _ in range(count):
                size = int.from_bytes(data[pos : pos + 4], "little")
                out.append(data[pos + 4 : pos + 4 + size])
                pos += 4 + size
            end = pos
        if end != len(data):
            msg = f"list of {count} elements does not fill its {len(data)} bytes"
            raise ValueError(msg)
        if self.convert is not None:
            convert = self.convert
            out = [convert(x) for x in out]
        for i in nulls:
            out[i] = None
        return out


_F32 = struct.Struct("<f")


def _is_nested_value_type(t: pa.DataType) -> bool:
    """A struct, a map, or a list of a nested type (:mod:`._nested` lays those out)."""
    return bool(
        pa.types.is_struct(t)
        or pa.types.is_map(t)
        or (pa.types.is_list(t) and pa.types.is_nested(t.value_type))
    )


def takes_nested_layout(t: pa.DataType, role: str) -> bool:
    """Whether a ``role`` column of type ``t`` is laid out by :class:`._nested.NestedLayout`: a
    value's struct, map or list of those; a key's struct or list that holds no map."""
    if role == "value":
        return _is_nested_value_type(t)
    return role == "key" and pa.types.is_nested(t) and not _has_map(t)


def _has_map(t: pa.DataType) -> bool:
    """Whether ``t`` is or holds a map."""
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    return bool(pa.types.is_list(t) and _has_map(t.value_type))


def _utf8(b: bytes) -> str:
    return b.decode("utf-8")


def _date32_from_days(days: int) -> datetime.date:
    return datetime.date.fromordinal(_EPOCH_ORDINAL + days)


def _date64_from_ms(ms: int) -> datetime.date:
    return datetime.date.fromordinal(_EPOCH_ORDINAL + ms // _MS_PER_DAY)


def check_arity(row: Any, cols: list[Column], role: str, exact: bool = True) -> None:
    if isinstance(row, tuple | list):
        n = len(row)
        if n == len(cols) or (not exact and 0 < n <= len(cols)):
            return
    names = [c.name for c in cols]
    want = f"{len(cols)}" if exact else f"1 to {len(cols)}"
    msg = f"{role} row must be a tuple of {want} values for columns {names}, got {row!r}"
    raise SchemaMismatchError(msg)
