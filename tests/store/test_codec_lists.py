"""List values (``list<T>``) and binary values in the value codec: round trips, the vectorized
encoding equal to the per-row one, the layout, errors, schema descriptions, and both providers
through commits and a reopen."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.store.codec import KeyCodec, ValueCodec, schema_from_json, schema_to_json
from sparkstate.testing.factory import ProviderFactory

UTC = dt.UTC
#: Element types and Python values of each (no None).
ELEMENTS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "float32": (pa.float32(), st.floats(width=32)),
    "float64": (pa.float64(), st.floats()),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), st.text(alphabet=st.sampled_from("\x00aé€\U0001f600"), max_size=5)),
    "binary": (pa.binary(), st.binary(max_size=5)),
    "ts_us_utc": (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=st.just(UTC)),
    ),
    "date32": (pa.date32(), st.dates()),
    "decimal": (
        pa.decimal128(12, 3),
        st.decimals(-(10**9) + 1, 10**9 - 1, places=3, allow_nan=False, allow_infinity=False),
    ),
}


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, lists and tuples element by element."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b) and type(a) is type(b)


def as_pylist(v: Any, t: pa.DataType) -> Any:
    return pa.array([v], t).to_pylist()[0]


@st.composite
def list_rows(draw: st.DrawFn) -> tuple[pa.Schema, list[tuple[Any, ...]]]:
    """A schema of a key-like int, a list column of any supported element type and a string,
    and rows with null lists, empty lists and null elements."""
    name = draw(st.sampled_from(sorted(ELEMENTS)))
    element_type, present = ELEMENTS[name]
    schema = pa.schema(
        [("n", pa.int64()), (f"l_{name}", pa.list_(element_type)), ("s", pa.string())]
    )
    element = st.none() | present
    row = st.tuples(
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | st.lists(element, max_size=6),
        st.none() | st.text(max_size=4),
    )
    return schema, draw(st.lists(row, min_size=0, max_size=40))


@settings(max_examples=200, deadline=None)
@given(list_rows())
def test_list_round_trip_and_batch_equals_per_row(
    case: tuple[pa.Schema, list[tuple[Any, ...]]],
) -> None:
    schema, rows = case
    codec = ValueCodec(schema)
    one = [codec.encode(r) for r in rows]
    t = schema.field(1).type
    expected = [(r[0], None if r[1] is None else as_pylist(r[1], t), r[2]) for r in rows]
    assert same([codec.decode(b) for b in one], expected)
    table = pa.Table.from_arrays(
        [pa.array([r[i] for r in rows], f.type) for i, f in enumerate(schema)], schema=schema
    )
    assert codec.encode_many(table) == one
    assert codec.encode_many(rows) == one  # tuples, the vectorized path past 32 rows
    decoded, found = codec.decode_many_arrow([*one, None])
    assert found.tolist() == [True] * len(one) + [False]
    assert same([tuple(r.values()) for r in decoded.to_pylist()], [*expected, (None,) * 3])


def test_list_layout() -> None:
    codec = ValueCodec(pa.schema([("l", pa.list_(pa.int16())), ("w", pa.list_(pa.string()))]))
    data = codec.encode(([7, None, -1], ["ab", None]))
    ints = struct.pack("<IIIhhh", 3, 1, 1, 7, 0, -1)
    strings = struct.pack("<III", 2, 1, 1) + b"\x02\x00\x00\x00ab" + b"\x00" * 4
    assert data == b"\x01\x00" + len(ints).to_bytes(4, "little") + ints + (
        len(strings).to_bytes(4, "little") + strings
    )


def test_sliced_and_chunked_lists_encode_as_their_rows() -> None:
    schema = pa.schema([("l", pa.list_(pa.float64()))])
    codec = ValueCodec(schema)
    rows = [([float(i), None, -0.0],) if i % 3 else (None,) for i in range(100)]
    full = pa.array([r[0] for r in rows], schema.field(0).type)
    part = pa.Table.from_arrays([full.slice(37, 40)], schema=schema)
    assert codec.encode_many(part) == [codec.encode(r) for r in rows[37:77]]
    chunked = pa.Table.from_arrays([pa.chunked_array([full[:50], full[50:]])], schema=schema)
    assert codec.encode_many(chunked) == [codec.encode(r) for r in rows]


def test_lists_of_wide_types_and_binary_values() -> None:
    utc = UTC
    schema = pa.schema(
        [
            ("d", pa.list_(pa.decimal128(38, 4))),
            ("t", pa.list_(pa.timestamp("us", tz="UTC"))),
            ("b", pa.binary()),
            ("lb", pa.list_(pa.binary())),
        ]
    )
    codec = ValueCodec(schema)
    big, small = decimal.Decimal("9" * 34 + ".9999"), decimal.Decimal("-" + "9" * 34 + ".9999")
    row = (
        [big, small, None, decimal.Decimal("0.0001")],
        [dt.datetime(2024, 5, 1, tzinfo=utc), None],
        b"\x00\xff",
        [b"", None, b"\x00\x00"],
    )
    assert same(codec.decode(codec.encode(row)), row)
    table = pa.Table.from_pylist([dict(zip(schema.names, row, strict=True))] * 40, schema=schema)
    assert codec.encode_many(table) == [codec.encode(row)] * 40


def test_list_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"key column 'l'.*list<item: map<"):
        KeyCodec(pa.schema([("l", pa.list_(pa.map_(pa.string(), pa.int64())))]))
    with pytest.raises(ConfigurationError, match=r"'item' has Arrow type halffloat"):
        ValueCodec(pa.schema([("l", pa.list_(pa.list_(pa.float16())))]))
    codec = ValueCodec(pa.schema([("l", pa.list_(pa.int8()))]))
    with pytest.raises(SchemaMismatchError, match=r"'l'.*expects a list"):
        codec.encode((5,))
    with pytest.raises(SchemaMismatchError, match=r"'item'.*int in \[-128, 127\]"):
        codec.encode(([1, 300],))
    strict = ValueCodec(pa.schema([("l", pa.list_(pa.field("e", pa.int8(), nullable=False)))]))
    with pytest.raises(SchemaMismatchError, match="does not take null elements"):
        strict.encode(([1, None],))
    with pytest.raises(SchemaMismatchError, match="does not take null elements"):
        strict.encode_many(pa.table({"l": pa.array([[1, None]], pa.list_(pa.int8()))}))
    good = codec.encode(([1, 2],))
    with pytest.raises(SchemaMismatchError, match="do not decode"):
        codec.decode(good[:-1])
    with pytest.raises(SchemaMismatchError, match="do not decode"):
        codec.decode(good + b"\x00")


def test_list_schemas_are_described_and_read_back() -> None:
    schema = pa.schema(
        [
            ("a", pa.list_(pa.int64())),
            ("b", pa.list_(pa.field("element", pa.timestamp("us", tz="UTC"), nullable=False))),
            ("c", pa.list_(pa.decimal128(10, 2))),
            ("d", pa.binary()),
        ]
    )
    assert schema_from_json(schema_to_json(schema)).equals(schema)


@pytest.mark.parametrize("provider", ["memory", "rocksdb"])
def test_list_values_through_both_providers(provider: str, tmp_path: Path) -> None:
    value_schema = pa.schema([("items", pa.list_(pa.string())), ("regs", pa.binary())])
    factory = ProviderFactory(provider, str(tmp_path / "chk"), str(tmp_path / "local"))
    try:
        rows = {
            ("k", i): ([f"v{j}" for j in range(i % 4)] or None, bytes([i]) * 8) for i in range(50)
        }
        p = factory.open(value_schema=value_schema)
        store = p.get_store(0)
        fam = store.column_family()
        keys = list(rows)
        table = pa.Table.from_pylist(
            [{"items": v[0], "regs": v[1]} for v in rows.values()], schema=value_schema
        )
        store.put_encoded_many(fam.key_codec.encode_many(keys), fam.value_codec.encode_many(table))
        store.commit()
        store = p.get_store(1)
        store.put(("k", 0), (["x", None, ""], b""))
        store.commit()
        rows[("k", 0)] = (["x", None, ""], b"")
        reopened = factory.reopen(value_schema=value_schema)
        read = reopened.get_read_store(2)
        try:
            assert dict(read.iterator()) == rows
        finally:
            read.abort()
    finally:
        factory.close_all()
