"""The value codec: compact, versioned value rows, not ordered.

A value is ``[version][null bitmap, bit i = column i][fixed-width columns, little-endian, zeros
when null][per variable column: uint32 LE length, bytes]``; a list is a variable column whose
bytes hold its elements (:class:`._columns.ListLayout`); values of a column family whose
schema evolved start with a header naming their schema instead of the version byte
(:mod:`sparkstate.store.evolution`).
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Callable, Sequence
from itertools import compress
from typing import Any, cast

import numpy as np
import numpy.typing as npt
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
from sparkstate.store.codec._lists import list_payloads
from sparkstate.store.codec._nested import columns_of, is_nested_value_type, nested_payloads
from sparkstate.store.schema_json import schema_to_json

__all__ = ["VALUE_FORMAT_VERSION", "ValueCodec"]

VALUE_FORMAT_VERSION = 1


class ValueCodec:
    """Compact value rows: a header (the version byte), a null bitmap, fixed-width fields, then
    variable ones. ``header`` is what every value starts with: :mod:`sparkstate.store.evolution`
    gives values of a later schema of a column family a header that names the schema."""

    def __init__(self, schema: pa.Schema, header: bytes = bytes([VALUE_FORMAT_VERSION])) -> None:
        self.schema = schema
        self.header = header
        self._cols = columns_of(schema, "value")
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
    def _unpacker(col: Column) -> Callable[[Any], Any] | None:
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
        check_arity(row, self._cols, "value")
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
            arrays = arrow_columns(self._cols, rows)
            n = rows.num_rows
        elif len(rows) < SMALL_BATCH:
            return [self.encode(r) for r in rows]
        else:
            maybe = columns_from_rows(self._cols, rows)
            if maybe is None:
                return [self.encode(r) for r in rows]
            arrays, n = maybe, len(rows)
        return [] if n == 0 else assemble(self._pieces(arrays, n))

    def encode_many_arrow(self, rows: pa.Table | pa.RecordBatch) -> pa.Array:
        """:meth:`encode_many` of Arrow columns as one Arrow array (``large_binary``): for
        callers that hand the values on to Arrow, without a Python object per value."""
        n = rows.num_rows
        if n == 0:
            return pa.array([], LB)
        return assemble_arrow(self._pieces(arrow_columns(self._cols, rows), n))

    def _pieces(self, arrays: Sequence[pa.Array], n: int) -> list[Bytes2D | pa.Array]:
        """The pieces :func:`assemble` joins into each row's value (``n`` > 0)."""
        head = np.zeros((n, self._head.size), np.uint8)
        h = len(self.header)
        head[:, :h] = np.frombuffer(self.header, np.uint8)
        nulls = np.zeros((n, len(self._cols)), np.bool_)
        pieces: list[Bytes2D | pa.Array] = [head]
        fixed_at = dict(zip((c.index for c in self._fixed_cols), self._offsets, strict=True))
        for col, arr in zip(self._cols, arrays, strict=True):
            valid = validity(arr)
            if valid is not None:
                nulls[:, col.index] = ~valid
            if col.phys == "var":
                pieces += self._var_pieces(col, arr)
                continue
            start = fixed_at[col.index]
            seg = head[:, start : start + col.width]
            seg[:] = le_bytes(arr, col)
            if valid is not None:
                seg[~valid] = 0
        if nulls.any():
            head[:, h : h + self._bitmap_len] = np.packbits(nulls, axis=1, bitorder="little")
        return pieces

    @staticmethod
    def _var_pieces(col: Column, arr: pa.Array) -> list[Bytes2D | pa.Array]:
        if is_nested_value_type(col.type):
            arr = nested_payloads(col.type, arr, col.name)
        elif pa.types.is_list(col.type):
            arr = list_payloads(col, arr)
        lengths = np.asarray(pc.binary_length(arr).fill_null(0), dtype=np.int64)
        if len(lengths) and lengths.max() >= 1 << 32:
            msg = f"column {col.name!r} has a value of 4 GiB or more"
            raise SchemaMismatchError(msg)
        prefix = lengths.astype("<u4").view(np.uint8).reshape(-1, 4)
        data = arr.cast(LB)
        return [prefix, data.fill_null(LB_EMPTY) if arr.null_count else data]

    def decode_many(self, data: Sequence[bytes | None]) -> list[Row | None]:
        if self.fixed_width is None or len(data) < SMALL_BATCH or not self._cols:
            return self._decode_each(data)
        table, found = self.decode_many_arrow(data)
        rows: list[Row | None] = list(rows_of(table))
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
        found = np.fromiter(map(operator.is_not, data, itertools.repeat(None)), np.bool_, n)
        n_found = int(np.count_nonzero(found))
        if n_found == 0:  # keys seen for the first time: no value to decode
            absent = [pa.nulls(n, f.type) for f in self.schema]
            return pa.Table.from_arrays(absent, schema=self.schema), found
        present = cast("list[bytes]", list(data) if n_found == n else list(compress(data, found)))
        table = self._decode_present(present) if self._cols else None
        if table is None:
            return table_from_rows(self._cols, self._decode_each(data), self.schema), found
        if n_found < n:  # absent rows: all null
            at = np.cumsum(found) - 1
            table = table.take(pa.array(at, mask=~found))
        return table, found

    def _decode_present(self, present: list[bytes]) -> pa.Table | None:
        """Values (none missing) as a table, vectorized: fixed-width schemas, and schemas with one
        variable column that is not a list. None: decode row by row (which also names what is
        wrong with a value that does not decode)."""
        width, head_size = self.fixed_width, self._head.size
        tail: pa.Array | None = None
        if width is not None:
            buf = b"".join(present)
            if len(buf) != len(present) * width:
                return None
            m = np.frombuffer(buf, np.uint8).reshape(-1, width)
        elif len(self._var_cols) == 1 and not pa.types.is_nested(self._var_cols[0].type):
            raw = pa.array(present, pa.binary())
            sizes = np.asarray(pc.binary_length(raw), np.int64)
            if int(sizes.min()) < head_size + 4:
                return None
            heads = pc.binary_slice(raw, 0, head_size + 4).cast(pa.binary(head_size + 4))
            m = np.frombuffer(heads.buffers()[1], np.uint8).reshape(-1, head_size + 4)
            declared = m[:, head_size:].copy().view("<u4").ravel()
            if (declared != sizes - head_size - 4).any():
                return None
            # (an explicit stop: binary_slice without one fails on some arrays in pyarrow 26)
            tail = pc.binary_slice(raw, head_size + 4, int(sizes.max()))
        else:
            return None
        h = len(self.header)
        if (m[:, :h] != np.frombuffer(self.header, np.uint8)).any():
            return None
        bitmap = m[:, h : h + self._bitmap_len]
        nulls = np.unpackbits(bitmap, axis=1, count=len(self._cols), bitorder="little")
        fixed = iter(zip(self._fixed_cols, self._offsets, strict=True))
        arrays = []
        for col in self._cols:
            valid = nulls[:, col.index] == 0
            if col.phys != "var":
                _, start = next(fixed)
                arrays.append(arrow_from_le(col, m[:, start : start + col.width], valid))
                continue
            assert tail is not None
            values = tail.cast(col.type)  # a string column: checked to be UTF-8 here
            if not valid.all():
                values = pc.if_else(pa.array(valid), values, pa.scalar(None, col.type))
            arrays.append(values)
        return pa.Table.from_arrays(arrays, schema=self.schema)
