"""Key and value codecs: order preservation, round trips, batch == per-row, prefixes, errors."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.store.codec import (
    VALUE_FORMAT_VERSION,
    KeyCodec,
    ValueCodec,
    schema_from_json,
    schema_to_json,
)

PLUS_0530 = dt.timezone(dt.timedelta(hours=5, minutes=30))

TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "large_string": pa.large_string(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "ts_s": pa.timestamp("s"),
    "ts_ms_utc": pa.timestamp("ms", tz="UTC"),
    "ts_us": pa.timestamp("us"),
    "ts_us_0530": pa.timestamp("us", tz="+05:30"),
    "ts_ns": pa.timestamp("ns"),
    "date32": pa.date32(),
    "date64": pa.date64(),
    "decimal": pa.decimal128(12, 3),
}
FIXED_WIDTH = [n for n in TYPES if "string" not in n and "binary" not in n]

_SECONDS_RANGE = (-62_135_596_800, 253_402_300_799)  # datetime's years 1..9999
_DAYS_RANGE = (-719_162, 2_932_896)


def _timestamps(t: pa.TimestampType) -> st.SearchStrategy[Any]:
    if t.unit == "ns":  # pandas Timestamp range
        lo, hi = dt.datetime(1700, 1, 1), dt.datetime(2200, 1, 1)
        raw = st.integers(-(2**62), 2**62)
    else:
        lo, hi = dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)
        scale = {"s": 1, "ms": 1_000, "us": 1_000_000}[t.unit]
        # a day inside datetime's range, so that the value can be shown in any time zone
        raw = st.integers(
            (_SECONDS_RANGE[0] + 86_400) * scale, (_SECONDS_RANGE[1] - 86_400) * scale
        )
    zones = st.none() if t.tz is None else st.sampled_from([dt.UTC, PLUS_0530])
    return st.one_of(raw, st.datetimes(min_value=lo, max_value=hi, timezones=zones))


def values(t: pa.DataType) -> st.SearchStrategy[Any]:
    """Python values of an Arrow type, in every form the codecs accept (no None)."""
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        return st.integers(int(info.min), int(info.max))
    if pa.types.is_floating(t):
        return st.floats(width=t.bit_width)
    if pa.types.is_boolean(t):
        return st.booleans()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return st.text(
            alphabet=st.sampled_from("\x00\x01a\xffé€\U0001f600") | st.characters(codec="utf-8")
        )
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return st.binary() | st.lists(st.sampled_from([b"\x00", b"\xff", b"a"])).map(b"".join)
    if pa.types.is_timestamp(t):
        return _timestamps(t)
    if pa.types.is_date32(t):
        return st.dates() | st.integers(*_DAYS_RANGE)
    if pa.types.is_date64(t):
        return st.dates() | st.integers(*_DAYS_RANGE).map(lambda d: d * 86_400_000)
    assert pa.types.is_decimal(t)
    bound = decimal.Decimal(10**9) - decimal.Decimal("0.001")
    decimals = st.decimals(-bound, bound, places=3, allow_nan=False, allow_infinity=False)
    return decimals | st.integers(-(10**8), 10**8)


def _schema(names: list[str]) -> pa.Schema:
    return pa.schema([pa.field(f"c{i}_{n}", TYPES[n]) for i, n in enumerate(names)])


@st.composite
def schema_and_rows(
    draw: st.DrawFn, min_rows: int = 1, max_rows: int = 8, names: list[str] | None = None
) -> tuple[pa.Schema, list[tuple[Any, ...]]]:
    if names is None:
        names = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3))
    schema = _schema(names)
    row = st.tuples(*(st.none() | values(f.type) for f in schema))
    return schema, draw(st.lists(row, min_size=min_rows, max_size=max_rows))


# --- oracles --------------------------------------------------------------------------------------


def _physical(v: Any, t: pa.DataType) -> Any:
    """Spark-order sort key of one present value, computed with pyarrow, not the codec."""
    if pa.types.is_floating(t):
        return (1, 0.0) if math.isnan(v) else (0, v)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return v.encode("utf-8")
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        return pa.array([v], t).cast(pa.int64())[0].as_py()
    if pa.types.is_date32(t):
        return pa.array([v], t).cast(pa.int32())[0].as_py()
    return v


def spark_key(row: tuple[Any, ...], schema: pa.Schema) -> tuple[Any, ...]:
    pairs = zip(row, schema, strict=False)  # row may be a key prefix
    return tuple((0,) if v is None else (1, _physical(v, f.type)) for v, f in pairs)


def as_pylist(row: tuple[Any, ...], schema: pa.Schema) -> tuple[Any, ...]:
    """The row as pyarrow's to_pylist() gives it back."""
    return tuple(pa.array([v], f.type).to_pylist()[0] for v, f in zip(row, schema, strict=True))


def same(a: Any, b: Any, *, zero_sign: bool = False) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(
            same(x, y, zero_sign=zero_sign) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and (not zero_sign or math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def normalized_key(row: tuple[Any, ...], schema: pa.Schema) -> tuple[Any, ...]:
    """What the key codec gives back: the to_pylist() value, -0.0 stored as 0.0."""
    return tuple(v + 0.0 if isinstance(v, float) else v for v in as_pylist(row, schema))


def table_rows(table: pa.Table) -> tuple[tuple[Any, ...], ...]:
    return tuple(zip(*(c.to_pylist() for c in table.columns), strict=True))


def cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def arrow_table(schema: pa.Schema, rows: list[tuple[Any, ...]]) -> pa.Table:
    """Rows as a table, built value by value so that a column may mix accepted Python forms."""
    columns = [
        pa.concat_arrays([pa.array([r[i]], f.type) for r in rows]) if rows else pa.array([], f.type)
        for i, f in enumerate(schema)
    ]
    return pa.Table.from_arrays(columns, schema=schema)


# --- key codec: order -----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(schema_and_rows(min_rows=2, max_rows=6))
def test_key_order_matches_spark_order(case: tuple[pa.Schema, list[tuple[Any, ...]]]) -> None:
    schema, rows = case
    codec = KeyCodec(schema)
    encoded = [codec.encode(r) for r in rows]
    keys = [spark_key(r, schema) for r in rows]
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert cmp(encoded[i], encoded[j]) == cmp(keys[i], keys[j]), (rows[i], rows[j])


@pytest.mark.parametrize("name", sorted(TYPES))
def test_key_order_per_type(name: str) -> None:
    schema = _schema([name])
    codec = KeyCodec(schema)

    @settings(max_examples=60, deadline=None)
    @given(st.none() | values(TYPES[name]), st.none() | values(TYPES[name]))
    def check(a: Any, b: Any) -> None:
        ka, kb = spark_key((a,), schema), spark_key((b,), schema)
        assert cmp(codec.encode((a,)), codec.encode((b,))) == cmp(ka, kb)

    check()


def test_key_float_order_examples() -> None:
    ordered64 = [
        None,
        -math.inf,
        -1e308,
        -1.5,
        -5e-324,
        0.0,
        5e-324,
        1.0,
        1e308,
        math.inf,
        math.nan,
    ]
    ordered32 = [None, -math.inf, -3e38, -1.5, -1e-45, 0.0, 1e-45, 1.0, 3e38, math.inf, math.nan]
    for t, ordered in ((pa.float64(), ordered64), (pa.float32(), ordered32)):
        codec = KeyCodec(pa.schema([("x", t)]))
        enc = [codec.encode((v,)) for v in ordered]
        assert enc == sorted(enc)
        assert len(set(enc)) == len(enc)
        assert codec.encode((-0.0,)) == codec.encode((0.0,))
        neg_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0001))[0]
        assert codec.encode((neg_nan,)) == codec.encode((math.nan,))
        assert math.isnan(codec.decode(codec.encode((neg_nan,)))[0])


def test_key_string_order_examples() -> None:
    ordered = [
        None,
        "",
        "\x00",
        "\x00\x00",
        "\x00\x01",
        "\x01",
        "a",
        "a\x00",
        "a\x00b",
        "a\x01",
        "ab",
    ]
    ordered += ["b", "\x7f", "é", "\uffff", "\U0001f600"]
    codec = KeyCodec(pa.schema([("s", pa.string())]))
    enc = [codec.encode((v,)) for v in ordered]
    assert enc == sorted(enc)
    assert [codec.decode(e)[0] for e in enc] == ordered


def test_key_composite_is_unambiguous() -> None:
    codec = KeyCodec(pa.schema([("a", pa.string()), ("b", pa.string())]))
    pairs = [
        ("a", "b\x00"),
        ("a\x00", "b"),
        ("a\x00b", ""),
        ("", "a\x00b"),
        (None, "a"),
        ("", None),
    ]
    encoded = [codec.encode(p) for p in pairs]
    assert len(set(encoded)) == len(pairs)
    assert [codec.decode(e) for e in encoded] == pairs
    assert codec.encode(("a", "z")) < codec.encode(("ab", ""))


# --- round trips ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(schema_and_rows(max_rows=4))
def test_key_round_trip(case: tuple[pa.Schema, list[tuple[Any, ...]]]) -> None:
    schema, rows = case
    codec = KeyCodec(schema)
    for row in rows:
        encoded = codec.encode(row)
        decoded = codec.decode(encoded)
        assert same(decoded, normalized_key(row, schema))
        assert codec.encode(decoded) == encoded  # decoded values (datetimes, ...) encode back


@settings(max_examples=300, deadline=None)
@given(schema_and_rows(max_rows=4))
def test_value_round_trip(case: tuple[pa.Schema, list[tuple[Any, ...]]]) -> None:
    schema, rows = case
    codec = ValueCodec(schema)
    for row in rows:
        encoded = codec.encode(row)
        assert encoded[0] == VALUE_FORMAT_VERSION
        decoded = codec.decode(encoded)
        assert same(decoded, as_pylist(row, schema), zero_sign=True)
        assert same(codec.decode(codec.encode(decoded)), decoded, zero_sign=True)


def test_timestamps_past_datetimes_range_round_trip_as_arrow() -> None:
    # Spark's timestamps reach year 294247; Python's datetime ends at 9999. Such times come back
    # as their counts, which Arrow and the codecs take as the same times.
    past_9999 = [253_402_300_800_000_000, 2**63 - 1, -(2**63) + 1, 0]
    schema = pa.schema([("t", pa.timestamp("us")), ("z", pa.timestamp("us", tz="+05:30"))])
    table = pa.table([pa.array(past_9999, t) for t in schema.types], schema=schema)
    keys = KeyCodec(pa.schema([*schema, ("s", pa.string())]))
    keyed = table.append_column("s", pa.array(["a", "b", "c", "d"]))
    encoded = keys.encode_many(keyed)
    assert keys.decode_many_arrow(encoded).equals(keyed)
    assert [keys.encode(keys.decode(e)) for e in encoded] == encoded
    values = ValueCodec(schema)
    back, found = values.decode_many_arrow(values.encode_many(table))
    assert back.equals(table) and found.tolist() == [True] * 4


def test_value_layout() -> None:
    schema = pa.schema([("n", pa.int32()), ("s", pa.string()), ("x", pa.float64())])
    encoded = ValueCodec(schema).encode((None, "hé", 1.5))
    assert encoded == (
        b"\x01"
        + b"\x01"
        + b"\x00" * 4
        + struct.pack("<d", 1.5)
        + struct.pack("<I", 3)
        + "hé".encode()
    )


def test_empty_value_schema() -> None:
    codec = ValueCodec(pa.schema([]))
    assert codec.encode(()) == bytes([VALUE_FORMAT_VERSION])
    assert codec.decode(codec.encode(())) == ()
    assert codec.decode_many([codec.encode(()), None] * 40) == [(), None] * 40
    assert codec.encode_many([()] * 40) == [bytes([VALUE_FORMAT_VERSION])] * 40


# --- batch methods == per-row methods -------------------------------------------------------------


def _many_rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """At least 40 rows, so that list input takes the vectorized path."""
    return (rows * (40 // len(rows) + 1))[:40] if rows else rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema_and_rows(min_rows=1, max_rows=10))
def test_encode_many_equals_encode(case: tuple[pa.Schema, list[tuple[Any, ...]]]) -> None:
    schema, rows = case
    many = _many_rows(rows)
    table = arrow_table(schema, many)
    chunked = pa.concat_tables([table.slice(0, 7), table.slice(7)])
    for codec in (KeyCodec(schema), ValueCodec(schema)):
        expected = [codec.encode(r) for r in many]
        assert codec.encode_many(many) == expected
        assert codec.encode_many(rows) == expected[: len(rows)]
        assert codec.encode_many(table) == expected
        assert codec.encode_many(chunked) == expected
        assert codec.encode_many(table.to_batches()[0]) == expected
        assert codec.encode_many(table.slice(3, 30)) == expected[3:33]
        # As one Arrow array, for a caller that hands the encodings on to Arrow.
        assert codec.encode_many_arrow(table).to_pylist() == expected
        assert codec.encode_many_arrow(chunked).to_pylist() == expected
        assert codec.encode_many_arrow(table.slice(0, 0)).to_pylist() == []
    # A column family's prefix, put before every key in the same pass.
    keys = KeyCodec(schema)
    for prefix in (b"\x00", b"\x05names"):
        expected = [prefix + keys.encode(r) for r in many]
        assert keys.encode_many(many, prefix) == expected
        assert keys.encode_many(rows, prefix) == expected[: len(rows)]
        assert keys.encode_many(table, prefix) == expected
        assert keys.encode_many_arrow(table, prefix).to_pylist() == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema_and_rows(min_rows=1, max_rows=10))
def test_decode_many_equals_decode(case: tuple[pa.Schema, list[tuple[Any, ...]]]) -> None:
    schema, rows = case
    many = _many_rows(rows)
    keys = KeyCodec(schema)
    encoded = [keys.encode(r) for r in many]
    decoded = [keys.decode(e) for e in encoded]
    assert same(tuple(keys.decode_many(encoded)), tuple(decoded))
    assert same(table_rows(keys.decode_many_arrow(encoded)), tuple(decoded))

    vals = ValueCodec(schema)
    stored: list[bytes | None] = [vals.encode(r) for r in many]
    stored[::3] = [None] * len(stored[::3])
    expected = [None if s is None else vals.decode(s) for s in stored]
    assert same(tuple(map(_absent, vals.decode_many(stored))), tuple(map(_absent, expected)))
    table, found = vals.decode_many_arrow(stored)
    assert found.tolist() == [s is not None for s in stored]
    all_null = (None,) * len(schema)
    assert same(table_rows(table), tuple(all_null if r is None else r for r in expected))


def _absent(r: tuple[Any, ...] | None) -> tuple[Any, ...]:
    return ("<absent>",) if r is None else r


def test_vectorized_float_normalisation() -> None:
    bits = np.array(
        [0x8000_0000_0000_0000, 0x7FF8_0000_0000_0000, 0xFFF8_0000_0000_0001, 0x7FF0_0000_0000_0001]
        + [0xFFF0_0000_0000_0000, 0x3FF0_0000_0000_0000],
        dtype=np.uint64,
    )
    column = pa.array(bits.view(np.float64))
    codec = KeyCodec(pa.schema([("x", pa.float64())]))
    expected = [codec.encode((v,)) for v in column.to_pylist()]
    assert codec.encode_many(pa.table({"x": column})) == expected
    assert expected[0] == codec.encode((0.0,))
    assert expected[1] == expected[2] == expected[3] == codec.encode((math.nan,))
    f32 = pa.array(np.array([0x8000_0000, 0xFFC0_0001, 0x7F80_0001], np.uint32).view(np.float32))
    codec32 = KeyCodec(pa.schema([("x", pa.float32())]))
    assert codec32.encode_many(pa.table({"x": f32})) == [
        codec32.encode((0.0,)),
        codec32.encode((math.nan,)),
        codec32.encode((math.nan,)),
    ]


def test_list_input_with_numpy_scalars_and_exact_float_checks() -> None:
    codec = KeyCodec(pa.schema([("a", pa.int32()), ("x", pa.float64())]))
    rows = [(np.int32(i), np.float64(i / 3)) for i in range(50)] + [(1, 2**60 + 1)]
    assert codec.encode_many(rows) == [codec.encode(r) for r in rows]


# --- prefixes -------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(schema_and_rows(min_rows=2, max_rows=4))
def test_prefix_property(case: tuple[pa.Schema, list[tuple[Any, ...]]]) -> None:
    schema, rows = case
    codec = KeyCodec(schema)
    for k in range(1, len(schema) + 1):
        prefix = codec.encode_prefix(rows[0][:k])
        assert codec.encode(rows[0]).startswith(prefix)
        for other in rows[1:]:
            same_prefix = spark_key(other[:k], schema) == spark_key(rows[0][:k], schema)
            assert codec.encode(other).startswith(prefix) == same_prefix


def test_prefix_of_strings_is_not_a_string_prefix() -> None:
    codec = KeyCodec(pa.schema([("s", pa.string()), ("n", pa.int64())]))
    prefix = codec.encode_prefix(("ab",))
    assert codec.encode(("ab", 1)).startswith(prefix)
    assert not codec.encode(("abc", 1)).startswith(prefix)
    assert not codec.encode(("ab\x00", 1)).startswith(prefix)


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.float16(),
        pa.decimal256(40, 2),
        pa.decimal128(5, -2),
        pa.time64("us"),
    ],
)
def test_unsupported_type_is_a_configuration_error(arrow_type: pa.DataType) -> None:
    for codec in (KeyCodec, ValueCodec):
        with pytest.raises(ConfigurationError, match=rf"'weird'.*{re.escape(str(arrow_type))}"):
            codec(pa.schema([("ok", pa.int64()), ("weird", arrow_type)]))


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.map_(pa.string(), pa.int64()),
        pa.list_(pa.map_(pa.string(), pa.int64())),
        pa.struct([("a", pa.map_(pa.string(), pa.int64()))]),
    ],
)
def test_map_key_types_are_refused_by_name(arrow_type: pa.DataType) -> None:
    """Lists and structs may be keys (test_codec_nested.py); a key holding a map is refused,
    saying so."""
    pattern = rf"'weird'.*{re.escape(str(arrow_type))}.*keys holding a map"
    with pytest.raises(ConfigurationError, match=pattern):
        KeyCodec(pa.schema([("ok", pa.int64()), ("weird", arrow_type)]))


@pytest.mark.parametrize("codec_class", [KeyCodec, ValueCodec])
def test_wrong_arity(codec_class: type[KeyCodec] | type[ValueCodec]) -> None:
    codec = codec_class(pa.schema([("a", pa.int64()), ("b", pa.string())]))
    for bad in [(1,), (1, "x", 2), 5, "ab", None]:
        with pytest.raises(SchemaMismatchError, match=r"2 values .*\['a', 'b'\]"):
            codec.encode(bad)  # type: ignore[arg-type]
        with pytest.raises(SchemaMismatchError, match=r"2 values"):
            codec.encode_many([(1, "x")] * 40 + [bad])  # type: ignore[list-item]


@pytest.mark.parametrize("codec_class", [KeyCodec, ValueCodec])
@pytest.mark.parametrize(
    ("arrow_type", "bad"),
    [
        (pa.int64(), "7"),
        (pa.int64(), True),
        (pa.int64(), 1.0),
        (pa.int8(), 128),
        (pa.uint32(), -1),
        (pa.uint64(), 2**64),
        (pa.float64(), "1.5"),
        (pa.float64(), 10**400),
        (pa.bool_(), 1),
        (pa.string(), b"bytes"),
        (pa.string(), "\ud800"),
        (pa.binary(), "text"),
        (pa.timestamp("us"), dt.date(2020, 1, 1)),
        (pa.timestamp("us"), 2**63),
        (pa.date32(), "2020-01-01"),
        (pa.decimal128(5, 2), decimal.Decimal("1.234")),
        (pa.decimal128(5, 2), decimal.Decimal("1000")),
        (pa.decimal128(5, 2), decimal.Decimal("NaN")),
        (pa.decimal128(5, 2), 1.5),
    ],
)
def test_wrong_python_type_names_column_and_value(
    codec_class: type[KeyCodec] | type[ValueCodec], arrow_type: pa.DataType, bad: Any
) -> None:
    codec = codec_class(pa.schema([("good", pa.int64()), ("target", arrow_type)]))
    pattern = rf"'target'.*{re.escape(repr(bad)[:20])}"
    with pytest.raises(SchemaMismatchError, match=pattern):
        codec.encode((1, bad))
    with pytest.raises(SchemaMismatchError, match=pattern):
        codec.encode_many([(1, None)] * 40 + [(1, bad)])


def test_null_in_non_nullable_column() -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False)])
    for codec in (KeyCodec(schema), ValueCodec(schema)):
        with pytest.raises(SchemaMismatchError, match="'k'.*not nullable"):
            codec.encode((None,))
        with pytest.raises(SchemaMismatchError, match="'k'.*not nullable.*row 2"):
            codec.encode_many(pa.table({"k": pa.array([1, 2, None])}))


def test_arrow_input_checks_columns() -> None:
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    codec = KeyCodec(schema)
    with pytest.raises(SchemaMismatchError, match="expected 2 columns"):
        codec.encode_many(pa.table({"k": [1]}))
    with pytest.raises(SchemaMismatchError, match="'k' must be int64.*string"):
        codec.encode_many(pa.table({"k": ["1"], "s": ["a"]}))
    with pytest.raises(SchemaMismatchError, match="'k'.*cannot cast"):
        codec.encode_many(pa.table({"k": pa.array([2**63], pa.uint64()), "s": ["a"]}))
    # compatible types are cast: narrower ints, large strings, dictionaries, all-null columns
    cast = pa.table(
        {"k": pa.array([1, 2], pa.int8()), "s": pa.array(["a", "b"]).dictionary_encode()}
    )
    assert codec.encode_many(cast) == [codec.encode((1, "a")), codec.encode((2, "b"))]
    nulls = pa.table({"k": pa.array([None, None]), "s": pa.array(["a", "b"], pa.large_string())})
    assert codec.encode_many(nulls) == [codec.encode((None, "a")), codec.encode((None, "b"))]


def test_encode_prefix_bounds() -> None:
    codec = KeyCodec(pa.schema([("a", pa.int64()), ("b", pa.int64())]))
    for bad in [(), (1, 2, 3)]:
        with pytest.raises(SchemaMismatchError, match="1 to 2 values"):
            codec.encode_prefix(bad)


def test_corrupt_bytes() -> None:
    keys = KeyCodec(pa.schema([("a", pa.int64()), ("s", pa.string())]))
    good = keys.encode((1, "x"))
    for bad in [good[:-1], good + b"\x00", b"\x02" + good[1:], good[:9] + b"\x01x\x00\x01"]:
        with pytest.raises(SchemaMismatchError, match="do not decode with key schema"):
            keys.decode(bad)
    values = ValueCodec(pa.schema([("a", pa.int64()), ("s", pa.string())]))
    encoded = values.encode((1, "x"))
    with pytest.raises(SchemaMismatchError, match="format version 2 is not 1"):
        values.decode(b"\x02" + encoded[1:])
    with pytest.raises(SchemaMismatchError, match="do not decode"):
        values.decode(encoded[:-1])
    fixed = ValueCodec(pa.schema([("a", pa.int64())]))
    rows = [fixed.encode((i,)) for i in range(40)]
    with pytest.raises(SchemaMismatchError, match="format version 7"):
        fixed.decode_many(rows + [b"\x07" + rows[0][1:]])
    fixed_keys = KeyCodec(pa.schema([("a", pa.int64())]))
    with pytest.raises(SchemaMismatchError, match="do not decode"):
        fixed_keys.decode_many([fixed_keys.encode((i,)) for i in range(40)] + [b"\x05" * 9])


# --- schema descriptions --------------------------------------------------------------------------


def test_schema_json_round_trip() -> None:
    fields = [pa.field(name, t, nullable=i % 2 == 0) for i, (name, t) in enumerate(TYPES.items())]
    fields += [
        pa.field("ts_paris", pa.timestamp("ns", tz="Europe/Paris")),
        pa.field("big_decimal", pa.decimal128(38, 10), nullable=False),
    ]
    schema = pa.schema(fields)
    description = json.loads(json.dumps(schema_to_json(schema)))
    assert description["fields"][0] == {"name": "int8", "type": "int8", "nullable": True}
    assert schema_from_json(description).equals(schema)
    assert KeyCodec(schema).to_json()["fields"] == description["fields"]
    assert ValueCodec(schema).to_json()["format_version"] == VALUE_FORMAT_VERSION
    assert KeyCodec(schema) == KeyCodec(schema_from_json(description))
    with pytest.raises(ConfigurationError, match="unknown Arrow type 'int65'"):
        schema_from_json({"fields": [{"name": "x", "type": "int65", "nullable": True}]})
    with pytest.raises(ConfigurationError, match="malformed"):
        schema_from_json({"columns": []})
