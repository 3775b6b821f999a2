"""Row codecs: an order-preserving key encoding and a compact, versioned value encoding.

Keys are compared as bytes by RocksDB and by the scans of every provider, so ``KeyCodec`` maps a row
to bytes whose bytewise order is the row's value order (columns left to right, nulls first, as in
Spark's ascending sort). Per column: a marker byte (``0x00`` null, ``0x01`` present), then

* integers, timestamps, dates, decimals: big-endian at the type's width, sign bit flipped if signed;
* floats: IEEE bits big-endian, all bits flipped if negative else the sign bit; ``-0.0`` is stored
  as ``0.0`` and every NaN as one NaN that sorts after ``+inf`` (Spark's float normalisation);
* bool: one byte; strings (UTF-8) and binary: ``0x00`` escaped as ``0x00 0xFF``, ended by
  ``0x00 0x00``, so that a prefix sorts first and composite keys stay unambiguous.

A null fixed-width column is its marker and zeros, so fixed-width schemas have fixed-width keys.

``ValueCodec`` is not ordered: ``[version][null bitmap, bit i = column i][fixed-width columns,
little-endian, zeros when null][per variable column: uint32 LE length, bytes]``; values of a
column family whose schema evolved start with a header naming their schema instead of the version
byte (:mod:`.evolution`).

The batch methods (``encode_many``, ``decode_many_arrow``) work on whole Arrow columns with numpy
and Arrow compute; only the per-row methods loop in Python (byte views assume a little-endian host).
"""

from __future__ import annotations

import datetime
import decimal
import re
import struct
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError

__all__ = [
    "KEY_FORMAT_VERSION",
    "VALUE_FORMAT_VERSION",
    "KeyCodec",
    "ValueCodec",
    "schema_from_json",
    "schema_to_json",
]

KEY_FORMAT_VERSION = 1
VALUE_FORMAT_VERSION = 1

Row: TypeAlias = tuple[Any, ...]
Rows: TypeAlias = Sequence[Row] | pa.Table | pa.RecordBatch
Bytes2D: TypeAlias = npt.NDArray[np.uint8]

_SMALL_BATCH = 32  # below this many rows, encoding row by row is faster than going through Arrow
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_MS_PER_DAY = 86_400_000
_DECIMAL_CTX = decimal.Context(prec=100, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
_LB = pa.large_binary()
_LB_EMPTY = pa.scalar(b"", _LB)
_LB_PRESENT = pa.scalar(b"\x01", _LB)
_LB_NULL = pa.scalar(b"\x00", _LB)
_LB_END = pa.scalar(b"\x00\x00", _LB)
_INTS = (int, np.integer)
_NP_INTS = frozenset(
    {np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64}
)
_NP_FLOATS = frozenset({np.float32, np.float64})
_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_NONE = type(None)


# --- columns --------------------------------------------------------------------------------------


class _Column:
    """One field of a schema: how its Python values become physical values and back.

    ``phys`` is the physical kind: ``int``/``uint`` (a Python int of ``width`` bytes), ``float``,
    ``bool`` or ``var`` (bytes). ``to_phys`` validates a Python value; ``from_phys`` (None for the
    identity) gives the value as pyarrow's ``to_pylist()`` does.
    """

    phys: str
    width: int
    struct_code: str
    to_phys: Callable[[Any], Any]
    py_types: frozenset[type]

    def __init__(self, index: int, field: pa.Field, role: str) -> None:
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
        else:
            msg = (
                f"{role} column {self.name!r} has Arrow type {t}, which the {role} codec does not "
                "support (supported: integers, float32/64, bool, string, binary, timestamp, "
                "date32/64, decimal128 with a scale >= 0)"
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
            except OverflowError:  # outside datetime's range: whatever pyarrow does
                return pa.scalar(i, typ).as_py()

        return decode


_F32 = struct.Struct("<f")


def _utf8(b: bytes) -> str:
    return b.decode("utf-8")


def _date32_from_days(days: int) -> datetime.date:
    return datetime.date.fromordinal(_EPOCH_ORDINAL + days)


def _date64_from_ms(ms: int) -> datetime.date:
    return datetime.date.fromordinal(_EPOCH_ORDINAL + ms // _MS_PER_DAY)


def _columns(schema: pa.Schema, role: str) -> list[_Column]:
    if not isinstance(schema, pa.Schema):
        msg = f"{role} codec needs a pyarrow.Schema, got {schema!r}"
        raise ConfigurationError(msg)
    return [_Column(i, schema.field(i), role) for i in range(len(schema))]


def _check_arity(row: Any, cols: list[_Column], role: str, exact: bool = True) -> None:
    if isinstance(row, tuple | list):
        n = len(row)
        if n == len(cols) or (not exact and 0 < n <= len(cols)):
            return
    names = [c.name for c in cols]
    want = f"{len(cols)}" if exact else f"1 to {len(cols)}"
    msg = f"{role} row must be a tuple of {want} values for columns {names}, got {row!r}"
    raise SchemaMismatchError(msg)


# --- Arrow input ----------------------------------------------------------------------------------


def _kind(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return _kind(t.value_type)
    checks = [
        ("int", pa.types.is_integer),
        ("float", pa.types.is_floating),
        ("bool", pa.types.is_boolean),
        ("str", pa.types.is_string),
        ("str", pa.types.is_large_string),
        ("str", pa.types.is_string_view),
        ("bin", pa.types.is_binary),
        ("bin", pa.types.is_large_binary),
        ("bin", pa.types.is_binary_view),
        ("bin", pa.types.is_fixed_size_binary),
        ("ts", pa.types.is_timestamp),
        ("date", pa.types.is_date),
        ("dec", pa.types.is_decimal),
        ("null", pa.types.is_null),
    ]
    return next((kind for kind, check in checks if check(t)), str(t))


def _conform(col: _Column, data: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The column as one Array of the schema's type (cast within a type family), nulls checked."""
    arr = data.combine_chunks() if isinstance(data, pa.ChunkedArray) else data
    if arr.type != col.type:
        if _kind(arr.type) not in (_kind(col.type), "null"):
            msg = f"column {col.name!r} must be {col.type}, got an Arrow column of type {arr.type}"
            raise SchemaMismatchError(msg)
        try:
            arr = arr.cast(col.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            msg = f"column {col.name!r}: cannot cast Arrow {arr.type} to {col.type}: {exc}"
            raise SchemaMismatchError(msg) from exc
    if not col.nullable and arr.null_count:
        first = int(np.argmin(np.asarray(arr.is_valid())))
        msg = f"column {col.name!r} ({col.type}) is not nullable, got a null at row {first}"
        raise SchemaMismatchError(msg)
    return arr


def _arrow_columns(cols: list[_Column], data: pa.Table | pa.RecordBatch) -> list[pa.Array]:
    if data.num_columns != len(cols):
        msg = (
            f"expected {len(cols)} columns {[c.name for c in cols]}, "
            f"got {data.num_columns}: {data.schema.names}"
        )
        raise SchemaMismatchError(msg)
    return [_conform(c, data.column(c.index)) for c in cols]


def _columns_from_rows(cols: list[_Column], rows: Sequence[Row]) -> list[pa.Array] | None:
    """Rows transposed into Arrow columns; None when a row needs the per-row path (which either
    encodes it or raises the precise error)."""
    try:
        if set(map(len, rows)) != {len(cols)}:
            return None
    except TypeError:  # a row that is not a sequence
        return None
    out = []
    for col in cols:
        values = list(map(itemgetter(col.index), rows))
        if not set(map(type, values)) <= col.py_types:
            return None
        try:
            out.append(pa.array(values, type=col.type))
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            return None
    return out


def _validity(arr: pa.Array) -> npt.NDArray[np.bool_] | None:
    """Validity as a numpy bool array, or None when there are no nulls."""
    return None if arr.null_count == 0 else np.asarray(arr.is_valid())


def _le_bytes(arr: pa.Array, col: _Column) -> Bytes2D:
    """(n, width) uint8 matrix of a fixed-width column's values (undefined under nulls)."""
    n, off, width = len(arr), arr.offset, col.width
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros((n, width), np.uint8)
    raw = np.frombuffer(buf, np.uint8)
    if col.phys == "bool":
        return np.unpackbits(raw, bitorder="little")[off : off + n].reshape(n, 1)
    return raw[off * width : (off + n) * width].reshape(n, width)


def _fsb_to_large_binary(m: Bytes2D) -> pa.Array:
    m = np.ascontiguousarray(m)
    fsb = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(m.shape[1]), m.shape[0], [None, pa.py_buffer(m)]
    )
    return fsb.cast(_LB)


def _assemble(pieces: list[Bytes2D | pa.Array]) -> list[bytes]:
    """Rows of concatenated pieces: uint8 matrices (one row per row) or null-free binary arrays."""
    if len(pieces) == 1 and isinstance(pieces[0], np.ndarray):
        m = np.ascontiguousarray(pieces[0])
        return cast(list[bytes], m.view(np.dtype((np.void, m.shape[1]))).ravel().tolist())
    arrays = [_fsb_to_large_binary(p) if isinstance(p, np.ndarray) else p for p in pieces]
    joined = arrays[0] if len(arrays) == 1 else pc.binary_join_element_wise(*arrays, _LB_EMPTY)
    out: list[bytes] = joined.to_pylist()
    return out


def _arrow_from_le(col: _Column, le: Bytes2D, valid: npt.NDArray[np.bool_] | None) -> pa.Array:
    """An Arrow array of ``col.type`` from (n, width) little-endian value bytes and validity."""
    n = le.shape[0]
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if col.phys == "bool":
        data = pa.py_buffer(np.packbits(le[:, 0] != 0, bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(le))
    return pa.Array.from_buffers(col.type, n, [bitmap, data])


def _table_from_rows(cols: list[_Column], rows: list[Row | None], schema: pa.Schema) -> pa.Table:
    columns = [[None if r is None else r[c.index] for r in rows] for c in cols]
    arrays = [pa.array(values, type=c.type) for c, values in zip(cols, columns, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def _rows_of(table: pa.Table) -> list[Row]:
    return list(zip(*[c.to_pylist() for c in table.columns], strict=True))


# --- key codec ------------------------------------------------------------------------------------


def _key_payload(col: _Column) -> tuple[Callable[[Any], bytes], Callable[[bytes, int], Any]]:
    """(encode, decode) of a present fixed-width key value (physical value <-> payload bytes)."""
    width = col.width
    if col.phys in ("int", "uint"):
        bias = 1 << (8 * width - 1) if col.phys == "int" else 0

        def enc_int(v: int) -> bytes:
            return (v + bias).to_bytes(width, "big")

        def dec_int(data: bytes, pos: int) -> int:
            return int.from_bytes(data[pos : pos + width], "big") - bias

        return enc_int, dec_int
    if col.phys == "bool":
        return (lambda v: b"\x01" if v else b"\x00"), (lambda data, pos: data[pos] != 0)
    fmt = struct.Struct(">d" if width == 8 else ">f")
    sign, full = 1 << (8 * width - 1), (1 << (8 * width)) - 1
    nan_key = ((0x7FF8 << 48 if width == 8 else 0x7FC0_0000) | sign).to_bytes(width, "big")

    def enc_float(x: float) -> bytes:
        if x != x:
            return nan_key
        bits = int.from_bytes(fmt.pack(x + 0.0), "big")  # + 0.0 turns -0.0 into 0.0
        return (bits ^ full if bits & sign else bits | sign).to_bytes(width, "big")

    def dec_float(data: bytes, pos: int) -> float:
        bits = int.from_bytes(data[pos : pos + width], "big")
        bits = bits ^ sign if bits & sign else bits ^ full
        return float(fmt.unpack(bits.to_bytes(width, "big"))[0])

    return enc_float, dec_float


def _read_escaped(data: bytes, pos: int) -> tuple[bytes, int]:
    """The unescaped bytes of a string/binary key column at ``pos`` and the position after it."""
    start = pos
    while True:
        zero = data.index(b"\x00", pos)
        follow = data[zero + 1]
        if follow == 0:
            raw = data[start:zero]
            return (raw.replace(b"\x00\xff", b"\x00") if b"\x00" in raw else raw), zero + 2
        if follow != 0xFF:
            msg = f"bad escape byte {follow:#x} at offset {zero + 1}"
            raise ValueError(msg)
        pos = zero + 2


class _KeyColumn:
    """Per-row encoder and decoder of one key column (marker byte included)."""

    def __init__(self, col: _Column) -> None:
        self.col = col
        self.null = b"\x00" * (1 + col.width)
        if col.phys != "var":
            self.payload, self.read_payload = _key_payload(col)

    def fast_encoder(self) -> Callable[[Any], bytes]:
        """``encode`` with an inlined path for the common cases (exact ints, str)."""
        t, slow = self.col.type, self.encode
        if pa.types.is_integer(t):
            bits, width = t.bit_width, t.bit_width // 8
            bias = 1 << (bits - 1) if pa.types.is_signed_integer(t) else 0
            lo, hi = -bias, (1 << bits) - 1 - bias

            def encode_int(v: Any) -> bytes:
                if type(v) is int and lo <= v <= hi:
                    return b"\x01" + (v + bias).to_bytes(width, "big")
                return slow(v)

            return encode_int
        if pa.types.is_string(t) or pa.types.is_large_string(t):

            def encode_str(v: Any) -> bytes:
                if type(v) is str and v.isascii():
                    return b"\x01" + v.encode().replace(b"\x00", b"\x00\xff") + b"\x00\x00"
                return slow(v)

            return encode_str
        return slow

    def encode(self, v: Any) -> bytes:
        col = self.col
        if v is None:
            if col.nullable:
                return self.null
            raise col.null_error()
        p = col.to_phys(v)
        if col.phys == "var":
            raw: bytes = p
            return b"\x01" + raw.replace(b"\x00", b"\x00\xff") + b"\x00\x00"
        return b"\x01" + self.payload(p)

    def decode(self, data: bytes, pos: int) -> tuple[Any, int]:
        marker = data[pos]
        if marker == 0:
            return None, pos + len(self.null)
        if marker != 1:
            msg = f"bad null marker {marker:#x} at offset {pos}"
            raise ValueError(msg)
        col = self.col
        if col.phys == "var":
            value, pos = _read_escaped(data, pos + 1)
        else:
            value, pos = self.read_payload(data, pos + 1), pos + 1 + col.width
        return (value if col.from_phys is None else col.from_phys(value)), pos


def _key_fixed_into(m: Bytes2D, start: int, col: _Column, arr: pa.Array) -> None:
    """Write marker and ordered big-endian payload of a fixed-width column into m[:, start:]."""
    n, width = len(arr), col.width
    valid = _validity(arr)
    le = _le_bytes(arr, col)
    seg = m[:, start + 1 : start + 1 + width]
    if col.phys == "float":
        utype = np.uint64 if width == 8 else np.uint32
        bits = le.copy().view(np.dtype(f"<u{width}")).ravel()
        sign = utype(1 << (8 * width - 1))
        exp = utype(0x7FF0 << 48 if width == 8 else 0x7F80_0000)
        nan = ((bits & exp) == exp) & ((bits & ~(exp | sign)) != 0)
        bits[nan] = utype(0x7FF8 << 48 if width == 8 else 0x7FC0_0000)
        bits[bits == sign] = 0  # -0.0
        bits ^= np.where((bits & sign) != 0, ~utype(0), sign)
        seg[:] = bits.astype(f">u{width}").view(np.uint8).reshape(n, width)
    else:
        seg[:] = le[:, ::-1]
        if col.phys == "int":
            seg[:, 0] ^= 0x80
    if valid is None:
        m[:, start] = 1
    else:
        m[:, start] = valid
        m[~valid, start : start + 1 + width] = 0


def _key_var_piece(arr: pa.Array) -> pa.Array:
    """Escaped, terminated, marked key bytes of a string/binary column (null: one zero byte)."""
    escaped = pc.replace_substring(arr.cast(_LB), b"\x00", b"\x00\xff")
    out = pc.binary_join_element_wise(_LB_PRESENT, escaped, _LB_END, _LB_EMPTY)
    return out.fill_null(_LB_NULL) if arr.null_count else out


class KeyCodec:
    """Order-preserving encoding of key rows: bytewise order of encodings == value order of rows."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._cols = _columns(schema, "key")
        self._enc = [_KeyColumn(c) for c in self._cols]
        self._encoders = [e.fast_encoder() for e in self._enc]
        self._fixed = all(c.phys != "var" for c in self._cols)
        #: Byte width of every key when all columns are fixed-width, else None.
        self.fixed_width: int | None = sum(1 + c.width for c in self._cols) if self._fixed else None

    def __repr__(self) -> str:
        return f"KeyCodec({self.schema.names}, version={KEY_FORMAT_VERSION})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyCodec) and self.schema.equals(other.schema)

    def __hash__(self) -> int:
        return hash(("key", str(self.schema)))

    def to_json(self) -> dict[str, Any]:
        """What ``_schema.json`` records about this codec."""
        return {"codec": "key", "format_version": KEY_FORMAT_VERSION, **schema_to_json(self.schema)}

    def encode(self, row: Row) -> bytes:
        encoders = self._encoders
        if type(row) is not tuple or len(row) != len(encoders):
            _check_arity(row, self._cols, "key")
        if len(encoders) == 1:
            return encoders[0](row[0])
        return b"".join([f(v) for f, v in zip(encoders, row, strict=True)])

    def encode_prefix(self, row: Row) -> bytes:
        """Encoding of the first ``len(row)`` columns: a bytewise prefix of every full key with
        those values, for prefix and range scans."""
        _check_arity(row, self._cols, "key prefix", exact=False)
        return b"".join([f(v) for f, v in zip(self._encoders, row, strict=False)])

    def decode(self, data: bytes) -> Row:
        pos, out = 0, []
        try:
            for e in self._enc:
                value, pos = e.decode(data, pos)
                out.append(value)
            if pos != len(data):
                msg = f"{len(data) - pos} trailing bytes"
                raise ValueError(msg)
        except (IndexError, ValueError, struct.error) as exc:
            msg = f"key bytes {bytes(data[:64])!r} do not decode with key schema {self.schema}"
            raise SchemaMismatchError(msg) from exc
        return tuple(out)

    def encode_many(self, rows: Rows) -> list[bytes]:
        """Encodings of many rows: Arrow columns by position, or tuples. The hot path."""
        if isinstance(rows, pa.Table | pa.RecordBatch):
            arrays = _arrow_columns(self._cols, rows)
            n = rows.num_rows
        elif len(rows) < _SMALL_BATCH:
            return [self.encode(r) for r in rows]
        else:
            maybe = _columns_from_rows(self._cols, rows)
            if maybe is None:
                return [self.encode(r) for r in rows]
            arrays, n = maybe, len(rows)
        if n == 0 or not self._cols:
            return [b""] * n
        pieces: list[Bytes2D | pa.Array] = []
        run: list[tuple[_Column, pa.Array]] = []
        for col, arr in zip(self._cols, arrays, strict=True):
            if col.phys != "var":
                run.append((col, arr))
                continue
            if run:
                pieces.append(self._fixed_matrix(run, n))
                run = []
            pieces.append(_key_var_piece(arr))
        if run:
            pieces.append(self._fixed_matrix(run, n))
        return _assemble(pieces)

    @staticmethod
    def _fixed_matrix(run: list[tuple[_Column, pa.Array]], n: int) -> Bytes2D:
        m = np.empty((n, sum(1 + c.width for c, _ in run)), np.uint8)
        start = 0
        for col, arr in run:
            _key_fixed_into(m, start, col, arr)
            start += 1 + col.width
        return m

    def decode_many(self, data: Sequence[bytes]) -> list[Row]:
        if self.fixed_width is None or len(data) < _SMALL_BATCH or not self._cols:
            return [self.decode(d) for d in data]
        return _rows_of(self.decode_many_arrow(data))

    def decode_many_arrow(self, data: Sequence[bytes]) -> pa.Table:
        """Keys as an Arrow table of the key schema; vectorized when all columns are fixed-width."""
        width = self.fixed_width
        n = len(data)
        buf = b"".join(data) if width is not None else b""
        if width is None or not n or not self._cols or len(buf) != n * width:
            return _table_from_rows(self._cols, [self.decode(d) for d in data], self.schema)
        m = np.frombuffer(buf, np.uint8).reshape(n, width)
        arrays, start = [], 0
        for col in self._cols:
            markers = m[:, start]
            if (markers > 1).any():  # let the per-row decoder name the bad key
                for d in data:
                    self.decode(d)
            seg = m[:, start + 1 : start + 1 + col.width].copy()
            if col.phys == "int":
                seg[:, 0] ^= 0x80
            elif col.phys == "float":
                negative = (seg[:, 0] & 0x80) == 0
                seg[negative] ^= 0xFF
                seg[~negative, 0] ^= 0x80
            arrays.append(_arrow_from_le(col, seg[:, ::-1], markers == 1))
            start += 1 + col.width
        return pa.Table.from_arrays(arrays, schema=self.schema)


# --- value codec ----------------------------------------------------------------------------------


class ValueCodec:
    """Compact value rows: a header (the version byte), a null bitmap, fixed-width fields, then
    variable ones. ``header`` is what every value starts with: :mod:`.evolution` gives values of a
    later schema of a column family a header that names the schema."""

    def __init__(self, schema: pa.Schema, header: bytes = bytes([VALUE_FORMAT_VERSION])) -> None:
        self.schema = schema
        self.header = header
        self._cols = _columns(schema, "value")
        self._fixed_cols = [c for c in self._cols if c.phys != "var"]
        self._var_cols = [c for c in self._cols if c.phys == "var"]
        self._bitmap_len = (len(self._cols) + 7) // 8
        codes = "".join(c.struct_code for c in self._fixed_cols)
        self._head = struct.Struct(f"<{len(header)}s{self._bitmap_len}s{codes}")
        self._zero_bitmap = bytes(self._bitmap_len)
        self._offsets: list[int] = []  # byte offset of each fixed column in a value
        offset = len(header) + self._bitmap_len
        for c in self._fixed_cols:
            self._offsets.append(offset)
            offset += c.width
        #: Byte width of every value when all columns are fixed-width, else None.
        self.fixed_width: int | None = None if self._var_cols else self._head.size
        # Per column: (slot in the unpacked header or -1 for a variable column, post-converter).
        self._slots: list[tuple[int, Callable[[Any], Any] | None]] = []
        slot = 2
        for c in self._cols:
            self._slots.append((slot if c.phys != "var" else -1, self._unpacker(c)))
            slot += c.phys != "var"
        self._plain = not self._var_cols and all(conv is None for _, conv in self._slots)
        # Exact Python type per column when a row of such values can go straight to struct.pack.
        exact = {"int": int, "uint": int, "float": float, "bool": bool}
        self._exact_types: tuple[type, ...] | None = None
        if not self._var_cols and all(c.struct_code != "16s" for c in self._cols):
            self._exact_types = tuple(exact[c.phys] for c in self._cols)

    def __repr__(self) -> str:
        return f"ValueCodec({self.schema.names}, version={VALUE_FORMAT_VERSION})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueCodec) and self.schema.equals(other.schema)

    def __hash__(self) -> int:
        return hash(("value", str(self.schema)))

    def to_json(self) -> dict[str, Any]:
        """What ``_schema.json`` records about this codec."""
        return {
            "codec": "value",
            "format_version": VALUE_FORMAT_VERSION,
            **schema_to_json(self.schema),
        }

    @staticmethod
    def _unpacker(col: _Column) -> Callable[[Any], Any] | None:
        if col.struct_code != "16s":
            return col.from_phys
        from_phys = col._decimal_from_unscaled
        return lambda b: from_phys(int.from_bytes(b, "little", signed=True))

    def header_error(self, data: bytes) -> SchemaMismatchError:
        """The error for a value that does not start with this codec's header."""
        if len(self.header) == 1:
            version = data[0] if data else "missing"
            msg = (
                f"value format version {version} is not {self.header[0]}, the version this "
                f"sparkstate writes and reads (value schema {self.schema.names})"
            )
        else:
            msg = (
                f"value header {bytes(data[: len(self.header)])!r} is not {self.header!r} "
                f"(value schema {self.schema.names})"
            )
        return SchemaMismatchError(msg)

    def encode(self, row: Row) -> bytes:
        if type(row) is tuple and tuple(map(type, row)) == self._exact_types:
            try:
                return self._head.pack(self.header, self._zero_bitmap, *row)
            except (struct.error, OverflowError):
                pass  # out of range: the checked path below says which column
        _check_arity(row, self._cols, "value")
        nulls, fixed, tail = 0, [], []
        for col, v in zip(self._cols, row, strict=True):
            var = col.phys == "var"
            if v is None:
                if not col.nullable:
                    raise col.null_error()
                nulls |= 1 << col.index
                if var:
                    tail.append(b"\x00\x00\x00\x00")
                else:
                    fixed.append(b"\x00" * 16 if col.width == 16 else 0)
                continue
            p = col.to_phys(v)
            if var:
                if len(p) >= 1 << 32:
                    raise col.mismatch(v, "a value shorter than 4 GiB")
                tail += (len(p).to_bytes(4, "little"), p)
            else:
                fixed.append(p.to_bytes(16, "little", signed=True) if col.width == 16 else p)
        bitmap = nulls.to_bytes(self._bitmap_len, "little") if nulls else self._zero_bitmap
        head = self._head.pack(self.header, bitmap, *fixed)
        return head + b"".join(tail) if tail else head

    def decode(self, data: bytes) -> Row:
        if not data.startswith(self.header):
            raise self.header_error(data)
        try:
            head: tuple[Any, ...] = self._head.unpack_from(data, 0)
            nulls = int.from_bytes(head[1], "little")
            if self._plain and not nulls and len(data) == self._head.size:
                return head[2:]
            return self._decode_slow(data, head, nulls)
        except (IndexError, ValueError, struct.error) as exc:
            msg = (
                f"value bytes {bytes(data[:64])!r} do not decode with value schema "
                f"{self.schema.names}"
            )
            raise SchemaMismatchError(msg) from exc

    def _decode_slow(self, data: bytes, head: tuple[Any, ...], nulls: int) -> Row:
        pos, out = self._head.size, list[Any]()
        for (slot, convert), col in zip(self._slots, self._cols, strict=True):
            if slot < 0:
                size = int.from_bytes(data[pos : pos + 4], "little")
                if pos + 4 + size > len(data):
                    msg = "truncated variable-width field"
                    raise ValueError(msg)
                value, pos = data[pos + 4 : pos + 4 + size], pos + 4 + size
            else:
                value = head[slot]
            if nulls >> col.index & 1:
                out.append(None)
            else:
                out.append(value if convert is None else convert(value))
        if pos != len(data):
            msg = f"{len(data) - pos} trailing bytes"
            raise ValueError(msg)
        return tuple(out)

    def encode_many(self, rows: Rows) -> list[bytes]:
        """Encodings of many rows: Arrow columns by position, or tuples (vectorized)."""
        if isinstance(rows, pa.Table | pa.RecordBatch):
            arrays = _arrow_columns(self._cols, rows)
            n = rows.num_rows
        elif len(rows) < _SMALL_BATCH:
            return [self.encode(r) for r in rows]
        else:
            maybe = _columns_from_rows(self._cols, rows)
            if maybe is None:
                return [self.encode(r) for r in rows]
            arrays, n = maybe, len(rows)
        if n == 0:
            return []
        head = np.zeros((n, self._head.size), np.uint8)
        h = len(self.header)
        head[:, :h] = np.frombuffer(self.header, np.uint8)
        nulls = np.zeros((n, len(self._cols)), np.bool_)
        pieces: list[Bytes2D | pa.Array] = [head]
        fixed_at = dict(zip((c.index for c in self._fixed_cols), self._offsets, strict=True))
        for col, arr in zip(self._cols, arrays, strict=True):
            valid = _validity(arr)
            if valid is not None:
                nulls[:, col.index] = ~valid
            if col.phys == "var":
                pieces += self._var_pieces(col, arr)
                continue
            start = fixed_at[col.index]
            seg = head[:, start : start + col.width]
            seg[:] = _le_bytes(arr, col)
            if valid is not None:
                seg[~valid] = 0
        if nulls.any():
            head[:, h : h + self._bitmap_len] = np.packbits(nulls, axis=1, bitorder="little")
        return _assemble(pieces)

    @staticmethod
    def _var_pieces(col: _Column, arr: pa.Array) -> list[Bytes2D | pa.Array]:
        lengths = np.asarray(pc.binary_length(arr).fill_null(0), dtype=np.int64)
        if len(lengths) and lengths.max() >= 1 << 32:
            msg = f"column {col.name!r} has a value of 4 GiB or more"
            raise SchemaMismatchError(msg)
        prefix = lengths.astype("<u4").view(np.uint8).reshape(-1, 4)
        data = arr.cast(_LB)
        return [prefix, data.fill_null(_LB_EMPTY) if arr.null_count else data]

    def decode_many(self, data: Sequence[bytes | None]) -> list[Row | None]:
        if self.fixed_width is None or len(data) < _SMALL_BATCH or not self._cols:
            return self._decode_each(data)
        table, found = self.decode_many_arrow(data)
        rows: list[Row | None] = list(_rows_of(table))
        for i in np.flatnonzero(~found).tolist():
            rows[i] = None
        return rows

    def _decode_each(self, data: Sequence[bytes | None]) -> list[Row | None]:
        decode = self.decode
        return [None if d is None else decode(d) for d in data]

    def decode_many_arrow(
        self, data: Sequence[bytes | None]
    ) -> tuple[pa.Table, npt.NDArray[np.bool_]]:
        """Values as an Arrow table of the value schema, and the mask of inputs that were not None
        (their rows are all null in the table). Vectorized for fixed-width schemas."""
        n = len(data)
        found = np.fromiter((d is not None for d in data), np.bool_, n)
        width = self.fixed_width
        present = [d for d in data if d is not None]
        buf = b"".join(present)
        if width is None or not self._cols or len(buf) != len(present) * width:
            return _table_from_rows(self._cols, self._decode_each(data), self.schema), found
        m = np.frombuffer(buf, np.uint8).reshape(-1, width)
        h = len(self.header)
        if (m[:, :h] != np.frombuffer(self.header, np.uint8)).any():  # the per-row decoder says
            self._decode_each(data)
        if len(present) < n:  # absent rows: all null
            m, rows = np.zeros((n, width), np.uint8), m
            m[found] = rows
            m[~found, h : h + self._bitmap_len] = 0xFF
        bitmap = m[:, h : h + self._bitmap_len]
        nulls = np.unpackbits(bitmap, axis=1, count=len(self._cols), bitorder="little")
        arrays = [
            _arrow_from_le(col, m[:, start : start + col.width], nulls[:, col.index] == 0)
            for col, start in zip(self._fixed_cols, self._offsets, strict=True)
        ]
        return pa.Table.from_arrays(arrays, schema=self.schema), found


# --- schema JSON ----------------------------------------------------------------------------------

_TIMESTAMP_RE = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]")
_DECIMAL_RE = re.compile(r"decimal128\((\d+), (-?\d+)\)")


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A human-readable description of a schema: field names, Arrow type strings, nullability."""
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]
    }


def _parse_type(text: str) -> pa.DataType:
    if m := _TIMESTAMP_RE.fullmatch(text):
        return pa.timestamp(m.group(1), tz=m.group(2))
    if m := _DECIMAL_RE.fullmatch(text):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    try:
        return pa.type_for_alias(text)
    except ValueError:
        msg = f"unknown Arrow type {text!r} in a state schema description"
        raise ConfigurationError(msg) from None


def schema_from_json(description: dict[str, Any]) -> pa.Schema:
    """The schema that :func:`schema_to_json` described."""
    try:
        fields = [
            pa.field(f["name"], _parse_type(f["type"]), nullable=bool(f["nullable"]))
            for f in description["fields"]
        ]
    except (KeyError, TypeError) as exc:
        msg = f"malformed state schema description {description!r}"
        raise ConfigurationError(msg) from exc
    return pa.schema(fields)
