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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

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
_SLOT = struct.Struct("<q")
#: Decimals Spark keeps in the slot, as their unscaled long.
_COMPACT_DECIMAL = 18

#: A column as the encoder takes it: each row's value as it goes into the row (an int, float
#: or bool for the slot, bytes for the variable-length part), or None.
_Encoded = tuple[list[Any], Callable[[bytearray, int, Any], None] | None]


def _fixed(fmt: str) -> Callable[[bytearray, int, Any], None]:
    packer = struct.Struct(fmt)

    def put(buf: bytearray, at: int, value: Any) -> None:
        packer.pack_into(buf, at, value)

    return put


def _column(values: pa.Array, what: str) -> _Encoded:
    """A column's values, each as it goes into a row."""
    t = values.type
    if pa.types.is_boolean(t):
        return values.to_pylist(), _fixed("<?")
    for test, fmt in (
        (pa.types.is_int8, "<b"),
        (pa.types.is_int16, "<h"),
        (pa.types.is_int32, "<i"),
        (pa.types.is_int64, "<q"),
        (pa.types.is_float32, "<f"),
        (pa.types.is_float64, "<d"),
    ):
        if test(t):
            return values.to_pylist(), _fixed(fmt)
    if pa.types.is_date32(t):
        return values.cast(pa.int32()).to_pylist(), _fixed("<i")
    if pa.types.is_timestamp(t):  # Spark's timestamps: microseconds since the epoch
        micros = values.cast(pa.timestamp("us", t.tz)).cast(pa.int64())
        return micros.to_pylist(), _fixed("<q")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [None if v is None else v.encode("utf-8") for v in values.to_pylist()], None
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return values.to_pylist(), None
    if pa.types.is_decimal(t) and t.precision <= _COMPACT_DECIMAL:
        unscaled = [None if v is None else int(v.scaleb(t.scale)) for v in values.to_pylist()]
        return unscaled, _fixed("<q")
    if pa.types.is_null(t):
        return [None] * len(values), _fixed("<q")
    if pa.types.is_struct(t):
        assert isinstance(values, pa.StructArray)
        fields = [values.field(i) for i in range(t.num_fields)]
        rows = unsafe_rows(fields, len(values), f"{what}.")
        valid = pc.is_valid(values).to_pylist()
        return [r if ok else None for r, ok in zip(rows, valid, strict=True)], None
    msg = (
        f"cannot write {what} ({t}) in Spark's state format: sparkstate exports state columns "
        "of boolean, integral, floating, date, timestamp, string, binary, decimal (precision "
        "up to 18) and struct types"
    )
    raise ConfigurationError(msg)


def unsafe_rows(columns: Sequence[pa.Array], num_rows: int, what: str = "") -> list[bytes]:
    """Each row of ``columns`` as Spark's ``UnsafeRow`` bytes."""
    encoded = [
        _column(c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c, f"{what}{i}")
        for i, c in enumerate(columns)
    ]
    n = len(encoded)
    bitset = (n + 63) // 64 * 8
    fixed = bitset + 8 * n
    rows = []
    for r in range(num_rows):
        buf = bytearray(fixed)
        for i, (values, put) in enumerate(encoded):
            v = values[r]
            if v is None:
                buf[i >> 3] |= 1 << (i & 7)
            elif put is not None:
                put(buf, bitset + 8 * i, v)
            else:
                _SLOT.pack_into(buf, bitset + 8 * i, (len(buf) << 32) | len(v))
                buf += v
                buf += bytes(-len(v) % 8)
        rows.append(bytes(buf))
    return rows


def snapshot_file(rows: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The HDFS-backed provider's snapshot file of ``rows`` (key and value ``UnsafeRow`` bytes),
    before compression."""
    parts = []
    for key, value in rows:
        parts += [_SIZE.pack(len(key)), key, _SIZE.pack(len(value)), value]
    parts.append(_END)
    return b"".join(parts)


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
