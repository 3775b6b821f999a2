"""Spark's own state files, as its HDFS-backed provider reads them: the export of a checkpoint back
to Spark's operators (:mod:`sparkstate.engine.export_job`).

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
