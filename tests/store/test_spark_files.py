"""Spark's state file formats as ``sparkstate export`` writes them, byte for byte (Spark reading
them back is tests/engine/test_export.py's)."""

from __future__ import annotations

import datetime
import decimal
import struct

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.store.spark_files import (
    UnreadableRows,
    arrow_of_unsafe_rows,
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


ALL_TYPES = pa.struct(
    [
        ("long", pa.int64()),
        ("text", pa.string()),
        (
            "window",
            pa.struct([("start", pa.timestamp("us", "UTC")), ("end", pa.timestamp("us", "UTC"))]),
        ),
        ("int", pa.int32()),
        ("short", pa.int16()),
        ("byte", pa.int8()),
        ("double", pa.float64()),
        ("float", pa.float32()),
        ("flag", pa.bool_()),
        ("price", pa.decimal128(10, 2)),
        ("day", pa.date32()),
        ("local", pa.timestamp("us")),
        ("blob", pa.binary()),
        ("nothing", pa.null()),
    ]
)


def test_unsafe_rows_read_back_column_wise_as_they_were_written() -> None:
    """Spark's rows read as Arrow columns (the take-over's read of Spark's RocksDB files) give
    back what was written, for every type the export writes, nulls and extremes included, after
    the byte Spark's RocksDB provider puts before each row; rows of one size and of several."""
    start = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        {
            "long": 1,
            "text": "héllo wörld, longer than one slot",
            "window": {"start": start, "end": None},
            "int": -5,
            "short": -3,
            "byte": 7,
            "double": 1.5,
            "float": -2.25,
            "flag": True,
            "price": decimal.Decimal("-12.34"),
            "day": datetime.date(2021, 3, 4),
            "local": datetime.datetime(2020, 2, 29, 12),
            "blob": b"\x00\x01",
            "nothing": None,
        },
        dict.fromkeys(ALL_TYPES.names, None) | {"flag": False, "byte": -128},
        {
            "long": -(2**63),
            "text": "",
            "window": {"start": None, "end": start},
            "int": 2**31 - 1,
            "short": 32767,
            "byte": None,
            "double": float("inf"),
            "float": 0.0,
            "flag": None,
            "price": decimal.Decimal("99999999.99"),
            "day": datetime.date(1900, 1, 1),
            "local": None,
            "blob": b"",
            "nothing": None,
        },
    ]
    written = pa.array(rows, ALL_TYPES)
    encoded = unsafe_rows([written.field(i) for i in range(ALL_TYPES.num_fields)], len(rows))
    versioned = pa.array([b"\x00" + r for r in encoded.to_pylist()], pa.binary())
    assert arrow_of_unsafe_rows(versioned, ALL_TYPES, skip=1).to_pylist() == rows
    fixed = pa.struct([("k", pa.int64()), ("n", pa.int32())])
    same_size = unsafe_rows([pa.array([3, None, -9]), pa.array([None, 1, 2], pa.int32())], 3)
    assert arrow_of_unsafe_rows(same_size, fixed).to_pylist() == [
        {"k": 3, "n": None},
        {"k": None, "n": 1},
        {"k": -9, "n": 2},
    ]
    assert len(arrow_of_unsafe_rows(pa.array([b"", b""], pa.binary()), pa.struct([]))) == 2


@pytest.mark.parametrize(
    "t",
    [
        pa.struct([("xs", pa.list_(pa.int64()))]),
        pa.struct([("wide", pa.decimal128(38, 2))]),
        pa.struct([("nested", pa.struct([("m", pa.map_(pa.string(), pa.int64()))]))]),
    ],
    ids=["list", "wide-decimal", "nested-map"],
)
def test_types_the_column_wise_read_does_not_read_are_refused(t: pa.StructType) -> None:
    """Lists, maps and decimals wider than a slot are left to Spark's state reader."""
    with pytest.raises(UnreadableRows, match="state of type"):
        arrow_of_unsafe_rows(pa.array([], pa.binary()), t)


def test_rows_shorter_than_their_schema_are_refused() -> None:
    short = pa.array([bytes(16)], pa.binary())  # a bitset and one slot, for two fields
    with pytest.raises(UnreadableRows, match="shorter than the 24 bytes"):
        arrow_of_unsafe_rows(short, pa.struct([("a", pa.int64()), ("b", pa.int64())]))
