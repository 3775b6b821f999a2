"""The key codec: rows to bytes whose bytewise order is the rows' value order.

Keys are compared as bytes by RocksDB and by the scans of every provider, so ``KeyCodec`` maps a row
to bytes whose bytewise order is the row's value order (columns left to right, nulls first, as in
Spark's ascending sort). Per column: a marker byte (``0x00`` null, ``0x01`` present), then

* integers, timestamps, dates, decimals: big-endian at the type's width, sign bit flipped if signed;
* floats: IEEE bits big-endian, all bits flipped if negative else the sign bit; ``-0.0`` is stored
  as ``0.0`` and every NaN as one NaN that sorts after ``+inf`` (Spark's float normalisation);
* bool: one byte; strings (UTF-8) and binary: ``0x00`` escaped as ``0x00 0xFF``, ended by
  ``0x00 0x00``, so that a prefix sorts first and composite keys stay unambiguous;
* lists and structs (of any depth, no maps): their payload as the value codec lays it out
  (:mod:`._nested`), escaped and ended as a string. Equal values have equal bytes and the key
  stays unambiguous, but such a column orders by those bytes, not by its values: it is a key
  compared for equality (a grouping key), never the leading column a range scan orders by.

A null fixed-width column is its marker and zeros, so fixed-width schemas have fixed-width keys.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store.codec._arrow import (
    LB,
    LB_EMPTY,
    SMALL_BATCH,
    Bytes2D,
    Rows,
    arrow_columns,
    arrow_from_le,
    assemble,
    assemble_arrow,
    columns_from_rows,
    le_bytes,
    rows_of,
    table_from_rows,
    validity,
)
from sparkstate.store.codec._columns import Column, Row, check_arity
from sparkstate.store.codec._nested import columns_of, nested_payloads
from sparkstate.store.schema_json import schema_to_json

__all__ = ["KEY_FORMAT_VERSION", "KeyCodec"]

KEY_FORMAT_VERSION = 1

_LB_PRESENT = pa.scalar(b"\x01", LB)
_LB_NULL = pa.scalar(b"\x00", LB)
_LB_END = pa.scalar(b"\x00\x00", LB)


def _key_payload(col: Column) -> tuple[Callable[[Any], bytes], Callable[[bytes, int], Any]]:
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

    def __init__(self, col: Column) -> None:
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


def _key_fixed_into(m: Bytes2D, start: int, col: Column, arr: pa.Array) -> None:
    """Write marker and ordered big-endian payload of a fixed-width column into m[:, start:]."""
    n, width = len(arr), col.width
    valid = validity(arr)
    le = le_bytes(arr, col)
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


def _key_nested_piece(col: Column, arr: pa.Array) -> pa.Array:
    """:func:`_key_var_piece` of a nested column's payloads (null where the value is)."""
    payloads = nested_payloads(col.type, arr, col.name)
    if arr.null_count:
        payloads = pc.if_else(arr.is_valid(), payloads, pa.scalar(None, LB))
    return _key_var_piece(payloads)


def _key_var_piece(arr: pa.Array) -> pa.Array:
    """Escaped, terminated, marked key bytes of a string/binary column (null: one zero byte)."""
    escaped = pc.replace_substring(arr.cast(LB), b"\x00", b"\x00\xff")
    out = pc.binary_join_element_wise(_LB_PRESENT, escaped, _LB_END, LB_EMPTY)
    return out.fill_null(_LB_NULL) if arr.null_count else out


class KeyCodec:
    """Order-preserving encoding of key rows: bytewise order of encodings == value order of rows."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._cols = columns_of(schema, "key")
        self._enc = [_KeyColumn(c) for c in self._cols]
        self._encoders = [e.fast_encoder() for e in self._enc]
        self._fixed = all(c.phys != "var" for c in self._cols)
        #: Byte width of every key when all columns are fixed-width, else None.
        self.fixed_width: int | None = sum(1 + c.width for c in self._cols) if self._fixed else None

    def __repr__(self) -> str:
        return f"KeyCodec({self.schema.names}, version={KEY_FORMAT_VERSION})"

    def __reduce__(self) -> tuple[type[KeyCodec], tuple[pa.Schema]]:
        """Built again from its schema where it is unpickled: its encoders are closures, some
        over a ``struct.Struct`` (float and nested columns), which no pickler takes."""
        return KeyCodec, (self.schema,)

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
            check_arity(row, self._cols, "key")
        if len(encoders) == 1:
            return encoders[0](row[0])
        return b"".join([f(v) for f, v in zip(encoders, row, strict=True)])

    def encode_prefix(self, row: Row) -> bytes:
        """Encoding of the first ``len(row)`` columns: a bytewise prefix of every full key with
        those values, for prefix and range scans."""
        check_arity(row, self._cols, "key prefix", exact=False)
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

    def encode_many_arrow(self, rows: pa.Table | pa.RecordBatch, prefix: bytes = b"") -> pa.Array:
        """:meth:`encode_many` of Arrow columns as one Arrow array (``large_binary``): for
        callers that hand the keys on to Arrow, without a Python object per key."""
        pieces = self._pieces(arrow_columns(self._cols, rows), rows.num_rows, prefix)
        if pieces is None:
            return pa.array([prefix] * rows.num_rows, LB)
        return assemble_arrow(pieces)

    def encode_many(self, rows: Rows, prefix: bytes = b"") -> list[bytes]:
        """Encodings of many rows: Arrow columns by position, or tuples. The hot path.
        ``prefix`` (a column family's) is put before every key in the same pass."""
        if isinstance(rows, pa.Table | pa.RecordBatch):
            arrays = arrow_columns(self._cols, rows)
            n = rows.num_rows
        elif len(rows) < SMALL_BATCH:
            return [prefix + self.encode(r) for r in rows]
        else:
            maybe = columns_from_rows(self._cols, rows)
            if maybe is None:
                return [prefix + self.encode(r) for r in rows]
            arrays, n = maybe, len(rows)
        pieces = self._pieces(arrays, n, prefix)
        return [prefix] * n if pieces is None else assemble(pieces)

    def _pieces(
        self, arrays: Sequence[pa.Array], n: int, prefix: bytes
    ) -> list[Bytes2D | pa.Array] | None:
        """The pieces :func:`assemble` joins into each row's key; None where every key is the
        prefix alone (no rows, or a key schema without columns)."""
        if n == 0 or not self._cols:
            return None
        pieces: list[Bytes2D | pa.Array] = []
        run: list[tuple[Column, pa.Array]] = []
        lead = prefix
        for col, arr in zip(self._cols, arrays, strict=True):
            if col.phys != "var":
                run.append((col, arr))
                continue
            if run or lead:
                pieces.append(self._fixed_matrix(run, n, lead))
                run, lead = [], b""
            nested = pa.types.is_nested(col.type)
            pieces.append(_key_nested_piece(col, arr) if nested else _key_var_piece(arr))
        if run or lead:
            pieces.append(self._fixed_matrix(run, n, lead))
        return pieces

    @staticmethod
    def _fixed_matrix(run: list[tuple[Column, pa.Array]], n: int, lead: bytes = b"") -> Bytes2D:
        """(n, width) bytes of a run of fixed-width columns, after the bytes ``lead``."""
        start = len(lead)
        m = np.empty((n, start + sum(1 + c.width for c, _ in run)), np.uint8)
        m[:, :start] = np.frombuffer(lead, np.uint8)
        for col, arr in run:
            _key_fixed_into(m, start, col, arr)
            start += 1 + col.width
        return m

    def decode_many(self, data: Sequence[bytes]) -> list[Row]:
        if self.fixed_width is None or len(data) < SMALL_BATCH or not self._cols:
            return [self.decode(d) for d in data]
        return rows_of(self.decode_many_arrow(data))

    def decode_many_arrow(self, data: Sequence[bytes]) -> pa.Table:
        """Keys as an Arrow table of the key schema; vectorized when all columns are fixed-width."""
        width = self.fixed_width
        n = len(data)
        buf = b"".join(data) if width is not None else b""
        if width is None or not n or not self._cols or len(buf) != n * width:
            return table_from_rows(self._cols, [self.decode(d) for d in data], self.schema)
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
            arrays.append(arrow_from_le(col, seg[:, ::-1], markers == 1))
            start += 1 + col.width
        return pa.Table.from_arrays(arrays, schema=self.schema)
