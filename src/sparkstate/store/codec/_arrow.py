"""Arrow columns in and out of the codecs: the batch paths work on whole columns with numpy and
Arrow compute instead of looping over rows in Python (byte views assume a little-endian host).

Input columns are conformed to the schema's types (a cast within a type family, nulls checked);
fixed-width values become ``(rows, width)`` byte matrices; pieces of rows are joined into one
``bytes`` per row; decoded byte matrices become Arrow arrays again.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store.codec._columns import Column, Row

__all__ = [
    "LB",
    "LB_EMPTY",
    "SMALL_BATCH",
    "Bytes2D",
    "Rows",
    "arrow_columns",
    "arrow_from_le",
    "assemble",
    "columns_from_rows",
    "fsb_to_large_binary",
    "le_bytes",
    "rows_of",
    "table_from_rows",
    "validity",
]

Rows: TypeAlias = Sequence[Row] | pa.Table | pa.RecordBatch
Bytes2D: TypeAlias = npt.NDArray[np.uint8]

SMALL_BATCH = 32  # below this many rows, encoding row by row is faster than going through Arrow
LB = pa.large_binary()
LB_EMPTY = pa.scalar(b"", LB)


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
        ("list", pa.types.is_list),
        ("list", pa.types.is_large_list),
        ("struct", pa.types.is_struct),
        ("map", pa.types.is_map),
    ]
    return next((kind for kind, check in checks if check(t)), str(t))


def _conform(col: Column, data: pa.Array | pa.ChunkedArray) -> pa.Array:
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


def arrow_columns(cols: list[Column], data: pa.Table | pa.RecordBatch) -> list[pa.Array]:
    if data.num_columns != len(cols):
        msg = (
            f"expected {len(cols)} columns {[c.name for c in cols]}, "
            f"got {data.num_columns}: {data.schema.names}"
        )
        raise SchemaMismatchError(msg)
    return [_conform(c, data.column(c.index)) for c in cols]


def columns_from_rows(cols: list[Column], rows: Sequence[Row]) -> list[pa.Array] | None:
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


def validity(arr: pa.Array) -> npt.NDArray[np.bool_] | None:
    """Validity as a numpy bool array, or None when there are no nulls."""
    return None if arr.null_count == 0 else np.asarray(arr.is_valid())


def le_bytes(arr: pa.Array, col: Column) -> Bytes2D:
    """(n, width) uint8 matrix of a fixed-width column's values (undefined under nulls)."""
    n, off, width = len(arr), arr.offset, col.width
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros((n, width), np.uint8)
    raw = np.frombuffer(buf, np.uint8)
    if col.phys == "bool":
        return np.unpackbits(raw, bitorder="little")[off : off + n].reshape(n, 1)
    return raw[off * width : (off + n) * width].reshape(n, width)


def fsb_to_large_binary(m: Bytes2D) -> pa.Array:
    m = np.ascontiguousarray(m)
    fsb = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(m.shape[1]), m.shape[0], [None, pa.py_buffer(m)]
    )
    return fsb.cast(LB)


def assemble_arrow(pieces: list[Bytes2D | pa.Array]) -> pa.Array:
    """:func:`assemble`'s rows as one Arrow array (``large_binary``), never Python objects."""
    arrays = [fsb_to_large_binary(p) if isinstance(p, np.ndarray) else p for p in pieces]
    return arrays[0] if len(arrays) == 1 else pc.binary_join_element_wise(*arrays, LB_EMPTY)


def assemble(pieces: list[Bytes2D | pa.Array]) -> list[bytes]:
    """Rows of concatenated pieces: uint8 matrices (one row per row) or null-free binary arrays."""
    if len(pieces) == 1 and isinstance(pieces[0], np.ndarray):
        m = np.ascontiguousarray(pieces[0])
        return cast(list[bytes], m.view(np.dtype((np.void, m.shape[1]))).ravel().tolist())
    arrays = [fsb_to_large_binary(p) if isinstance(p, np.ndarray) else p for p in pieces]
    joined = arrays[0] if len(arrays) == 1 else pc.binary_join_element_wise(*arrays, LB_EMPTY)
    out: list[bytes] = joined.to_pylist()
    return out


def arrow_from_le(col: Column, le: Bytes2D, valid: npt.NDArray[np.bool_] | None) -> pa.Array:
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


def table_from_rows(cols: list[Column], rows: list[Row | None], schema: pa.Schema) -> pa.Table:
    columns = [[None if r is None else r[c.index] for r in rows] for c in cols]
    arrays = [pa.array(values, type=c.type) for c, values in zip(cols, columns, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def rows_of(table: pa.Table) -> list[Row]:
    return list(zip(*[c.to_pylist() for c in table.columns], strict=True))
