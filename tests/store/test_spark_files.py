"""Spark's state file formats as ``sparkstate export`` writes them, byte for byte (Spark reading
them back is tests/engine/test_export.py's)."""

from __future__ import annotations

import datetime
import struct

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.store.spark_files import (
    lz4_block_stream,
    read_lz4_block_stream,
    schema_file,
    snapshot_file,
    unsafe_rows,
)

UTC = datetime.UTC


def _row(bitset: int, slots: list[int], tail: bytes = b"") -> bytes:
    return struct.pack("<q", bitset) + b"".join(struct.pack("<q", s) for s in slots) + tail


def test_an_unsafe_row_is_sparks_layout() -> None:
    """A null bit per field, an 8-byte slot each (fixed-width values zero-extended, a string's
    offset and size), the variable-length part padded to 8 bytes; a struct nested as a row."""
    start = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    window = pa.array(
        [{"start": start, "end": start + datetime.timedelta(seconds=5)}, None],
        pa.struct([("start", pa.timestamp("us", "UTC")), ("end", pa.timestamp("us", "UTC"))]),
    )
    columns = [
        pa.array([1, -1], pa.int64()),
        pa.array(["ab", None], pa.string()),
        pa.array([None, 7], pa.int32()),
        pa.array([True, False]),
        window,
        pa.array([-1.5, 0.25], pa.float32()),
    ]
    rows = unsafe_rows(columns, 2).to_pylist()
    micros = int(start.timestamp() * 1_000_000)
    nested = _row(0, [micros, micros + 5_000_000])
    fixed = 8 + 8 * 6
    float_bits = struct.unpack("<I", struct.pack("<f", -1.5))[0]
    assert rows[0] == _row(
        0b000100,
        [1, fixed << 32 | 2, 0, 1, (fixed + 8) << 32 | len(nested), float_bits],
        b"ab" + bytes(6) + nested,
    )
    float_bits = struct.unpack("<I", struct.pack("<f", 0.25))[0]
    assert rows[1] == _row(0b010010, [-1, 0, 7, 0, 0, float_bits])


def test_rows_of_no_fields_and_types_spark_keeps_otherwise() -> None:
    assert unsafe_rows([], 3).to_pylist() == [b"", b"", b""]  # a global aggregation's key
    with pytest.raises(ConfigurationError, match=r"list<item: int64>.*struct types"):
        unsafe_rows([pa.array([[1]], pa.list_(pa.int64()))], 1)


def test_a_snapshot_is_sized_rows_then_minus_one_in_lz4_java_blocks() -> None:
    keys = pa.array([b"k" * 8, b"q" * 16], pa.binary())
    values = pa.array([b"v" * 8, b""], pa.binary())
    body = snapshot_file(keys, values)
    assert body == (
        struct.pack(">i", 8)
        + b"k" * 8
        + struct.pack(">i", 8)
        + b"v" * 8
        + struct.pack(">i", 16)
        + b"q" * 16
        + struct.pack(">i", 0)
        + struct.pack(">i", -1)
    )
    assert snapshot_file(pa.array([], pa.binary()), pa.array([], pa.binary())) == b"\xff" * 4
    big = bytes(range(256)) * 300  # three blocks of 32 KiB
    framed = lz4_block_stream(big)
    assert framed[:8] == b"LZ4Block" and framed[8] == 0x15  # raw, 32 KiB blocks
    assert framed.count(b"LZ4Block") == 4  # and the empty block that ends the stream
    assert read_lz4_block_stream(framed) == big
    damaged = bytearray(framed)
    damaged[100] ^= 1
    with pytest.raises(ConfigurationError, match="checksum"):
        read_lz4_block_stream(bytes(damaged))


def test_the_schema_file_is_javas_write_utf() -> None:
    """``writeUTF``: an unsigned short of the size, then modified UTF-8 (a NUL in two bytes, a
    character beyond the BMP as its two surrogates of three bytes each)."""
    data = schema_file('{"a":"é\x00😀"}', "{}")
    assert data[:4] == b"\x00\x02v2"
    assert data[4:8] == struct.pack(">i", 1)
    encoded = b'{"a":"' + b"\xc3\xa9" + b"\xc0\x80" + b"\xed\xa0\xbd\xed\xb8\x80" + b'"}'
    assert data[8:10] == struct.pack(">H", len(encoded))
    assert data[10 : 10 + len(encoded)] == encoded
    assert data[10 + len(encoded) :] == struct.pack(">i", 1) + b"\x00\x02{}"
