"""Spark's own state files, as its HDFS-backed provider reads them: the export of a checkpoint back
to Spark's operators (:mod:`sparkstate.engine.jobs.export`).

A state row is an ``UnsafeRow`` (Spark's ``UnsafeRow.java``): a null bit per field, rounded up
to 64-bit words; an 8-byte slot per field, holding a fixed-width value (little-endian, the rest
of the slot zero) or, for a string, binary or nested struct, its offset from the row's start
and its size (``offset << 32 | size``); then the variable-length values, each padded to 8
bytes. A snapshot file of the HDFS-backed provider (``HDFSBackedStateStoreProvider.scala``,
``writeSnapshotFile``) is, for each row, its key's size (a big-endian int), the key, its
value's size, the value; then ``-1``; all of it through Spark's state compression codec, LZ4
by default: lz4-java's ``LZ4BlockOutputStream``, blocks of at most 32 KiB each behind a header
(``LZ4Block``, a token, the block's stored and original sizes, and the XXHash32 of its bytes,
seed ``0x9747b28c``, masked to 28 bits), closed by an empty block. The blocks here are stored
raw, which lz4-java reads as it reads compressed ones.

The state's schema (``state/<operator>/0/_metadata/schema``, ``StateSchemaCompatibilityChecker
.scala``, its version 2) is Java's ``writeUTF`` of ``v2``, then the key's schema as JSON and the
value's, each as a count (an int) of ``writeUTF`` chunks.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from sparkstate.exceptions import ConfigurationError

__all__ = [
    "lz4_block_stream",
    "read_lz4_block_stream",
    "schema_file",
    "snapshot_file",
    "unsafe_rows",
]

_MAGIC = b"LZ4Block"
#: lz4-java's block size as Spark sets it (``spark.io.compression.lz4.blockSize``, 32k), and
#: the token of a raw block of that size: RAW (0x10) | log2(size) - 10.
_BLOCK = 32 * 1024
_RAW_TOKEN = 0x10 | 5
_SEED = 0x9747B28C
_HEADER = struct.Struct("<8sBiii")
_SIZE = struct.Struct(">i")
_END = _SIZE.pack(-1)
#: Decimals Spark keeps in the slot, as their unscaled long.
_COMPACT_DECIMAL = 18

#: The zero bytes that pad a variable-length value to 8 bytes, by how many.
_PADS = pa.array([bytes(i) for i in range(8)], pa.binary())


def _fixed_slots(values: pa.Array) -> np.ndarray | None:
    """A fixed-width column's slots (int64, its bytes little-endian, the rest zero; 0 where
    null); None for a variable-length column."""
    t = values.type
    n = len(values)
    if pa.types.is_null(t):
        return np.zeros(n, np.int64)
    if pa.types.is_decimal(t) and t.precision <= _COMPACT_DECIMAL:
        unscaled = [0 if v is None else int(v.scaleb(t.scale)) for v in values.to_pylist()]
        return np.array(unscaled, np.int64)
    if pa.types.is_timestamp(t):  # Spark's timestamps: microseconds since the epoch
        values = values.cast(pa.timestamp("us", t.tz)).cast(pa.int64())
    elif pa.types.is_date32(t):
        values = values.cast(pa.int32())
    elif pa.types.is_boolean(t):
        values = values.cast(pa.uint8())
    kinds = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return None
    filled = values.fill_null(0).to_numpy(zero_copy_only=False)
    unsigned = filled.view(kinds[values.type.bit_width])  # its bytes, zero-extended below
    slots: np.ndarray = unsigned.astype(np.uint64).view(np.int64)
    return slots


def _variable(values: pa.Array, what: str) -> pa.Array:
    """A variable-length column's bytes per row (empty where null)."""
    t = values.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return values.cast(pa.binary()).fill_null(b"")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return values.cast(pa.binary()).fill_null(b"")
    if pa.types.is_struct(t):
        assert isinstance(values, pa.StructArray)
        fields = [values.field(i) for i in range(t.num_fields)]
        nested = unsafe_rows(fields, len(values), f"{what}.")
        return pc.if_else(pc.is_valid(values), nested, pa.scalar(b"", pa.binary()))
    msg = (
        f"cannot write {what} ({t}) in Spark's state format: sparkstate exports state columns "
        "of boolean, integral, floating, date, timestamp, string, binary, decimal (precision "
        "up to 18) and struct types"
    )
    raise ConfigurationError(msg)


def unsafe_rows(columns: Sequence[pa.Array], num_rows: int, what: str = "") -> pa.BinaryArray:
    """Each row of ``columns`` as Spark's ``UnsafeRow`` bytes."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    words = (len(arrays) + 63) // 64
    fixed = np.zeros((num_rows, words + len(arrays)), np.int64)
    row_size = np.full(num_rows, 8 * fixed.shape[1], np.int64)
    tails: list[pa.Array] = []
    for i, values in enumerate(arrays):
        nulls = np.asarray(pc.is_null(values).to_numpy(zero_copy_only=False), bool)
        fixed[:, i // 64] |= nulls.astype(np.int64) << (i % 64)
        slots = _fixed_slots(values)
        if slots is not None:
            fixed[:, words + i] = np.where(nulls, 0, slots)
            continue
        data = _variable(values, f"{what}{i}")
        sizes = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(np.int64)
        fixed[:, words + i] = np.where(nulls, 0, (row_size << 32) | sizes)
        pad = -sizes % 8
        tails.append(data)
        tails.append(pa.DictionaryArray.from_arrays(pa.array(pad), _PADS).dictionary_decode())
        row_size += sizes + pad
    width = 8 * fixed.shape[1]
    if width == 0:  # a row of no fields (a global aggregation's key): no bytes
        return pa.array([b""] * num_rows, pa.binary())
    head = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), num_rows, [None, pa.py_buffer(fixed.tobytes())]
    ).cast(pa.binary())
    if not tails:
        return head
    return pc.binary_join_element_wise(head, *tails, b"")


def snapshot_file(keys: pa.BinaryArray, values: pa.BinaryArray) -> bytes:
    """The HDFS-backed provider's snapshot file of these rows (``UnsafeRow`` bytes of each key
    and its value), before compression."""
    if len(keys) == 0:
        return _END
    sizes = [
        pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(4),
            len(rows),
            [None, pa.py_buffer(pc.binary_length(rows).to_numpy().astype(">i4").tobytes())],
        ).cast(pa.binary())
        for rows in (keys, values)
    ]
    entries = pc.binary_join_element_wise(sizes[0], keys, sizes[1], values, b"")
    _, offset_buffer, data = entries.buffers()
    assert offset_buffer is not None and data is not None
    offsets = np.frombuffer(offset_buffer, np.int32, len(entries) + 1, 4 * entries.offset)
    body: bytes = data.to_pybytes()[offsets[0] : offsets[-1]]
    return body + _END


def lz4_block_stream(data: bytes) -> bytes:
    """``data`` as lz4-java's ``LZ4BlockOutputStream`` writes it with Spark's settings, its
    blocks stored raw."""
    out = []
    for start in range(0, len(data), _BLOCK):
        block = data[start : start + _BLOCK]
        check = xxhash.xxh32_intdigest(block, _SEED) & 0xFFFFFFF
        out += [_HEADER.pack(_MAGIC, _RAW_TOKEN, len(block), len(block), check), block]
    out.append(_HEADER.pack(_MAGIC, _RAW_TOKEN, 0, 0, 0))
    return b"".join(out)


def read_lz4_block_stream(data: bytes) -> bytes:
    """What :func:`lz4_block_stream` wrote (raw blocks only), its checksums checked."""
    out, at = [], 0
    while at < len(data):
        magic, token, stored, size, check = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        if magic != _MAGIC or token & 0xF0 != 0x10 or stored != size:
            msg = "not an lz4-java block stream of raw blocks"
            raise ConfigurationError(msg)
        if size == 0:
            break
        block = data[at : at + size]
        if xxhash.xxh32_intdigest(block, _SEED) & 0xFFFFFFF != check:
            msg = "an lz4-java block's checksum does not match"
            raise ConfigurationError(msg)
        out.append(block)
        at += size
    return b"".join(out)


def _write_utf(text: str) -> bytes:
    """Java's ``DataOutputStream.writeUTF``: the size (an unsigned short), then the text as
    modified UTF-8 (a NUL in two bytes, a character beyond the BMP as its two surrogates)."""
    out = bytearray()
    units = text.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(units), 2):
        c = units[i] | units[i + 1] << 8
        if 0 < c < 0x80:
            out.append(c)
        elif c < 0x800:
            out += bytes([0xC0 | c >> 6, 0x80 | c & 0x3F])
        else:
            out += bytes([0xE0 | c >> 12, 0x80 | c >> 6 & 0x3F, 0x80 | c & 0x3F])
    return struct.pack(">H", len(out)) + bytes(out)


#: Characters per ``writeUTF`` chunk: each at most three bytes, a chunk at most 65535.
_UTF_CHUNK = 65535 // 3


def schema_file(key_json: str, value_json: str) -> bytes:
    """The state schema file (version 2) of a store whose key and value have these Spark
    schemas (``StructType.json()``)."""
    parts = [_write_utf("v2")]
    for text in (key_json, value_json):
        chunks = [text[i : i + _UTF_CHUNK] for i in range(0, len(text), _UTF_CHUNK)] or [""]
        parts.append(struct.pack(">i", len(chunks)))
        parts += [_write_utf(c) for c in chunks]
    return b"".join(parts)


class UnreadableRows(ValueError):
    """Rows that are not ``UnsafeRow`` bytes of the schema asked for, or of a type
    :func:`arrow_of_unsafe_rows` does not read (Spark's state data source reads them)."""


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _gather_i64(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian 64-bit words of ``data`` at the byte positions ``at``: a strided
    view where they are evenly spaced (rows of one size), else gathered per alignment."""
    n = len(at)
    if n == 0:
        return np.zeros(0, np.int64)
    step = int(at[1] - at[0]) if n > 1 else 8
    if step > 0 and int(at[-1]) == int(at[0]) + step * (n - 1) and (np.diff(at) == step).all():
        view = np.ndarray((n,), "<i8", data, int(at[0]), (step,))
        return view.astype(np.int64)
    out = np.empty(n, np.int64)
    shift = at % 8
    for k in np.unique(shift):
        chosen = shift == k
        words = np.frombuffer(data, "<i8", (len(data) - int(k)) // 8, int(k))
        out[chosen] = words[at[chosen] // 8]
    return out


def _bytes_at(
    data: np.ndarray, starts: np.ndarray, slots: np.ndarray, valid: np.ndarray
) -> tuple[pa.Buffer, pa.Buffer]:
    """The offsets and bytes of a variable-length column whose slots (``offset << 32 |
    size`` from each row's start) are ``slots``."""
    sizes = np.where(valid, slots & 0xFFFFFFFF, 0)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] >= 2**31:
        msg = "a variable-length state column of 2 GiB or more in one partition"
        raise UnreadableRows(msg)
    first = np.where(valid, starts + (slots >> 32), 0)
    at = np.repeat(first - offsets[:-1], sizes) + np.arange(offsets[-1])
    if len(at) and (at.max() >= len(data)):
        msg = "a variable-length value beyond its row"
        raise UnreadableRows(msg)
    return pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data[at].tobytes())


def _column(
    data: np.ndarray, starts: np.ndarray, slots: np.ndarray, valid: np.ndarray, t: pa.DataType
) -> pa.Array:
    n = len(starts)
    validity = _validity(valid)
    if pa.types.is_null(t):
        return pa.nulls(n)
    if pa.types.is_struct(t):
        nested = np.where(valid, starts + (slots >> 32), starts)
        fields = _struct_fields(data, nested, t, valid)
        return pa.StructArray.from_arrays(fields, fields=list(t), mask=pa.array(~valid))
    if pa.types.is_string(t) or pa.types.is_binary(t):
        offsets, values = _bytes_at(data, starts, slots, valid)
        return pa.Array.from_buffers(t, n, [validity, offsets, values])
    if pa.types.is_decimal128(t) and t.precision <= _COMPACT_DECIMAL:
        unscaled = np.where(valid, slots, 0)
        wide = np.stack([unscaled, unscaled >> 63], axis=1)
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(wide.tobytes())])
    if pa.types.is_boolean(t):
        return pa.array((slots & 0xFF) != 0, pa.bool_(), mask=~valid)
    if pa.types.is_float32(t):
        values = (slots & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    elif pa.types.is_floating(t):
        values = slots.view(np.float64)
    elif pa.types.is_integer(t):
        values = slots.astype(np.dtype(f"int{t.bit_width}"))
    elif pa.types.is_date32(t):
        values = slots.astype(np.int32)
    elif pa.types.is_timestamp(t) and t.unit == "us":
        values = slots
    else:
        msg = f"state of type {t}"
        raise UnreadableRows(msg)
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(np.ascontiguousarray(values))])


def _struct_fields(
    data: np.ndarray, starts: np.ndarray, t: pa.StructType, present: np.ndarray
) -> list[pa.Array]:
    words = (t.num_fields + 63) // 64
    out = []
    for i, field in enumerate(t):
        bits = data[np.where(present, starts + i // 8, 0)]
        valid = present & ((bits >> (i % 8)) & 1 == 0)
        slots = _gather_i64(data, np.where(present, starts + 8 * (words + i), 0))
        out.append(_column(data, starts, slots, valid, field.type))
    return out


def arrow_of_unsafe_rows(rows: pa.BinaryArray, t: pa.StructType, skip: int = 0) -> pa.StructArray:
    """The inverse of :func:`unsafe_rows`: each row's ``UnsafeRow`` bytes (after ``skip``
    bytes of its own) as a struct of type ``t``, its fields read column-wise. Raises
    :class:`UnreadableRows` for a type it does not read (lists, maps, wide decimals) or rows
    shorter than the schema's fixed part."""
    _, offset_buffer, data_buffer = rows.buffers()
    assert offset_buffer is not None
    bounds = np.frombuffer(offset_buffer, np.int32, len(rows) + 1, 4 * rows.offset)
    bounds = bounds.astype(np.int64)
    data = (
        np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    )
    starts = bounds[:-1] + skip
    fixed = 8 * ((t.num_fields + 63) // 64 + t.num_fields) if t.num_fields else 0
    if len(rows) and int((bounds[1:] - starts).min()) < fixed:
        msg = f"a row shorter than the {fixed} bytes of its schema's fixed part"
        raise UnreadableRows(msg)
    present = np.ones(len(rows), bool)
    fields = _struct_fields(data, starts, t, present)
    return pa.StructArray.from_arrays(fields, fields=list(t)) if fields else _no_fields(len(rows))


def _no_fields(n: int) -> pa.StructArray:
    return pa.StructArray.from_arrays([pa.nulls(n)], ["_"]).cast(pa.struct([]))
