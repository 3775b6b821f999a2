"""Nested values (structs, maps, lists of nested types, any depth) in the value codec: round trips
with nulls at every level, the vectorized encoding equal to the per-row one, the list layout kept
inside nested values, errors, schema descriptions, and both providers through commits and a
reopen. Lists and structs (no maps) as key columns: the same round trips, and equal keys exactly
where the values are equal."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store.codec import KeyCodec, ValueCodec, schema_from_json, schema_to_json
from sparkstate.testing.factory import ProviderFactory

#: Scalar types inside nested values and Python values of each (no None).
SCALARS: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (pa.float64(), st.floats()),
    (pa.bool_(), st.booleans()),
    (pa.string(), st.text(alphabet=st.sampled_from("\x00aé€\U0001f600"), max_size=4)),
    (pa.binary(), st.binary(max_size=4)),
    (pa.date32(), st.dates()),
    (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)),
    ),
    (
        pa.decimal128(10, 2),
        st.decimals(-(10**7) + 1, 10**7 - 1, places=2, allow_nan=False, allow_infinity=False),
    ),
]
KEY_SCALARS = [pa.int32(), pa.string()]


def _nested(
    children: st.SearchStrategy[pa.DataType], maps: bool = True
) -> st.SearchStrategy[pa.DataType]:
    field = st.builds(
        lambda name, t, nullable: pa.field(name, t, nullable=nullable),
        st.sampled_from(["a", "b", "c", "element"]),
        children,
        st.booleans(),
    )
    lists = st.builds(pa.list_, field)
    structs = st.lists(field, max_size=3, unique_by=lambda f: f.name).map(pa.struct)
    map_types = st.builds(
        lambda k, v, nullable: pa.map_(k, pa.field("value", v, nullable=nullable)),
        st.sampled_from(KEY_SCALARS),
        children,
        st.booleans(),
    )
    return lists | structs | map_types if maps else lists | structs


NESTED_TYPES = st.recursive(st.sampled_from([t for t, _ in SCALARS]), _nested, max_leaves=6)
#: Types of nested key columns: lists and structs (maps are not keys), of scalars whose equal
#: values have one spelling (no floats: -0.0 and 0.0, NaNs).
NESTED_KEY_TYPES = st.recursive(
    st.sampled_from([t for t, _ in SCALARS if not pa.types.is_floating(t)]),
    lambda children: _nested(children, maps=False),
    max_leaves=6,
)


def values_of(t: pa.DataType, nullable: bool = True) -> st.SearchStrategy[Any]:
    """Python values of ``t`` as ``to_pylist()`` gives them, None wherever a null may be."""
    if pa.types.is_list(t):
        present: st.SearchStrategy[Any] = st.lists(
            values_of(t.value_type, t.value_field.nullable), max_size=4
        )
    elif pa.types.is_map(t):
        keys = (
            st.sampled_from(["k", "é", ""])
            if pa.types.is_string(t.key_type)
            else st.integers(-5, 5)
        )
        present = st.dictionaries(
            keys, values_of(t.item_type, t.item_field.nullable), max_size=3
        ).map(lambda d: list(d.items()))
    elif pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        present = st.fixed_dictionaries({f.name: values_of(f.type, f.nullable) for f in fields})
    else:
        present = next(s for scalar, s in SCALARS if scalar == t)
    return st.none() | present if nullable else present


@st.composite
def nested_rows(
    draw: st.DrawFn, types: st.SearchStrategy[pa.DataType] = NESTED_TYPES
) -> tuple[pa.Schema, list[tuple[Any, ...]]]:
    """A schema of an int, a nested column (nullable or not) and a string, and rows of it."""
    t = draw(types.filter(pa.types.is_nested))
    nullable = draw(st.booleans())
    schema = pa.schema([("n", pa.int64()), pa.field("v", t, nullable=nullable), ("s", pa.string())])
    row = st.tuples(
        st.none() | st.integers(-(2**63), 2**63 - 1),
        values_of(t, nullable),
        st.none() | st.text(max_size=3),
    )
    return schema, draw(st.lists(row, max_size=40))


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, containers element by element, types equal."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b) and type(a) is type(b)


def table_of(schema: pa.Schema, rows: list[tuple[Any, ...]]) -> pa.Table:
    arrays = [pa.array([r[i] for r in rows], f.type) for i, f in enumerate(schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


def encoded_both_ways(
    codec: Any, schema: pa.Schema, rows: list[tuple[Any, ...]]
) -> tuple[pa.Table, list[tuple[Any, ...]], list[bytes]]:
    """``rows`` encoded one by one: decoded as written, and equal to the vectorized encoding
    of their table and of the tuples (the vectorized path past 32 rows); the table, the rows
    as the table gives them back, and the encodings."""
    table = table_of(schema, rows)
    expected = [tuple(r.values()) for r in table.to_pylist()]
    one = [codec.encode(r) for r in rows]
    assert same([codec.decode(b) for b in one], expected)
    assert codec.encode_many(table) == one
    assert codec.encode_many(rows) == one
    return table, expected, one


@settings(max_examples=300, deadline=None)
@given(nested_rows())
def test_nested_round_trip_and_batch_equals_per_row(
    case: tuple[pa.Schema, list[tuple[Any, ...]]],
) -> None:
    schema, rows = case
    codec = ValueCodec(schema)
    table, expected, one = encoded_both_ways(codec, schema, rows)
    if len(rows) > 2:  # a slice of a column: offsets into its children
        assert codec.encode_many(table.slice(1, len(rows) - 2)) == one[1:-1]
    decoded, found = codec.decode_many_arrow([*one, None])
    assert found.tolist() == [True] * len(one) + [False]
    assert decoded.schema == schema
    assert same([tuple(r.values()) for r in decoded.to_pylist()], [*expected, (None,) * 3])


@settings(max_examples=200, deadline=None)
@given(nested_rows(NESTED_KEY_TYPES))
def test_nested_keys_round_trip_and_are_equal_exactly_when_their_values_are(
    case: tuple[pa.Schema, list[tuple[Any, ...]]],
) -> None:
    """A list or struct key column between two others: decoded as written, the vectorized
    encoding equal to the per-row one, and two keys' bytes equal exactly when their values are
    (the columns around it stay apart: a key is never read as another)."""
    schema, rows = case
    codec = KeyCodec(schema)
    _, expected, one = encoded_both_ways(codec, schema, rows)
    decoded = codec.decode_many_arrow(one)
    assert decoded.schema == schema
    assert same([tuple(r.values()) for r in decoded.to_pylist()], expected)
    shown = [repr(r) for r in expected]
    assert len(set(one)) == len(set(shown)) == len(set(zip(one, shown, strict=True)))


def test_a_key_codec_of_nested_and_float_columns_pickles() -> None:
    """An operator holding one is pickled to its tasks: the codec is built again there (its
    encoders close over ``struct.Struct`` objects, which no pickler takes)."""
    pair = pa.struct([("a", pa.string()), ("b", pa.float64())])
    schema = pa.schema(
        [("k", pa.struct([("p", pair), ("l", pa.list_(pa.int32()))])), ("f", pa.float32())]
    )
    codec = KeyCodec(schema)
    copy = pickle.loads(pickle.dumps(codec))
    row = ({"p": {"a": "x", "b": -0.5}, "l": [1, None]}, 1.5)
    assert copy == codec and copy.encode(row) == codec.encode(row)
    assert copy.decode(codec.encode(row)) == codec.decode(codec.encode(row))


def test_nulls_at_every_level() -> None:
    point = pa.struct([("x", pa.int32()), ("tags", pa.list_(pa.string()))])
    schema = pa.schema(
        [
            ("points", pa.list_(point)),
            ("by_name", pa.map_(pa.string(), pa.list_(point))),
            ("nest", pa.struct([("p", point), ("d", pa.decimal128(5, 1))])),
        ]
    )
    rows: list[tuple[Any, ...]] = [
        (None, None, None),
        ([], [], {"p": None, "d": None}),
        ([None], [("a", None)], {"p": {"x": None, "tags": None}, "d": decimal.Decimal("1.5")}),
        (
            [{"x": 1, "tags": [None, "t"]}, {"x": None, "tags": []}],
            [("a", [None, {"x": 2, "tags": None}]), ("b", [])],
            {"p": {"x": 3, "tags": [None]}, "d": None},
        ),
    ]
    codec = ValueCodec(schema)
    assert [codec.decode(codec.encode(r)) for r in rows] == rows
    assert codec.encode_many(table_of(schema, rows)) == [codec.encode(r) for r in rows]


def test_lists_inside_nested_values_keep_the_list_layout() -> None:
    """A list of scalars is laid out the same at the top of a value and inside a struct."""
    flat = ValueCodec(pa.schema([("l", pa.list_(pa.int16()))]))
    nested = ValueCodec(pa.schema([("s", pa.struct([("l", pa.list_(pa.int16()))]))]))
    inner = flat.encode(([7, None, -1],))[1 + 1 + 4 :]  # version, bitmap, length
    whole = nested.encode(({"l": [7, None, -1]},))
    # version, row bitmap, payload length, struct bitmap, framed list: its length then its bytes
    assert whole[1 + 1 + 4 + 1 :] == len(inner).to_bytes(4, "little") + inner


def test_python_forms_of_nested_values() -> None:
    """What users hand in: tuples or Rows for structs, dicts or pairs for maps, numpy arrays."""
    from pyspark.sql import Row

    schema = pa.schema(
        [
            ("s", pa.struct([("a", pa.int32()), ("b", pa.list_(pa.float64()))])),
            ("m", pa.map_(pa.string(), pa.int64())),
        ]
    )
    codec = ValueCodec(schema)
    want = codec.encode(({"a": 1, "b": [0.5, 2.0]}, [("x", 1), ("y", 2)]))
    assert codec.encode(((1, [0.5, 2.0]), {"x": 1, "y": 2})) == want
    assert codec.encode((Row(a=1, b=np.array([0.5, 2.0])), {"x": 1, "y": 2})) == want
    assert codec.encode_many([(Row(a=1, b=[0.5, 2.0]), [("x", 1), ("y", 2)])] * 40) == [want] * 40


def test_nested_errors_name_the_column() -> None:
    strict = pa.struct([pa.field("a", pa.int32(), nullable=False)])
    codec = ValueCodec(pa.schema([("s", strict), ("l", pa.list_(pa.int32()))]))
    with pytest.raises(SchemaMismatchError, match=r"column 's'.*cannot hold 'oops'"):
        codec.encode(("oops", None))
    with pytest.raises(SchemaMismatchError, match=r"column 's'.*field 'a' \(int32\).*nullable"):
        codec.encode(({"a": None}, None))
    table = pa.table({"s": pa.array([{"a": None}], pa.struct([("a", pa.int32())])), "l": [[1]]})
    with pytest.raises(SchemaMismatchError, match=r"column 's'.*field 'a'.*nulls"):
        codec.encode_many(table)
    good = codec.encode(({"a": 1}, [1]))
    with pytest.raises(SchemaMismatchError, match="do not decode"):
        codec.decode(good[:-1])


def test_nested_schemas_are_described_and_read_back() -> None:
    point = pa.struct([pa.field("x", pa.int32(), nullable=False), ("odd name, `q`", pa.string())])
    schema = pa.schema(
        [
            ("a", pa.list_(pa.field("element", point, nullable=False))),
            ("m", pa.map_(pa.string(), pa.field("value", pa.list_(point), nullable=False))),
            ("n", pa.map_(pa.int32(), pa.decimal128(10, 2))),
            ("s", pa.struct([("t", pa.timestamp("us", tz="UTC")), ("e", pa.struct([]))])),
        ]
    )
    assert schema_from_json(schema_to_json(schema)).equals(schema)
    # a map whose values may not be null is told from one whose values may
    loose = pa.schema([("m", pa.map_(pa.string(), pa.list_(point)))])
    assert schema_to_json(loose) != schema_to_json(pa.schema([schema.field("m")]))


@pytest.mark.parametrize("provider", ["memory", "rocksdb"])
def test_nested_values_through_both_providers(provider: str, tmp_path: Path) -> None:
    point = pa.struct([("x", pa.int32()), ("tags", pa.list_(pa.string()))])
    value_schema = pa.schema(
        [("points", pa.list_(point)), ("m", pa.map_(pa.string(), pa.int64())), ("n", pa.int64())]
    )
    factory = ProviderFactory(provider, str(tmp_path / "chk"), str(tmp_path / "local"))
    try:
        rows: dict[tuple[Any, ...], tuple[Any, ...]] = {
            ("k", i): (
                [{"x": j, "tags": [f"t{j}", None][: i % 3]} for j in range(i % 4)] or None,
                [(f"m{j}", j if j % 2 else None) for j in range(i % 3)],
                i,
            )
            for i in range(50)
        }
        p = factory.open(value_schema=value_schema)
        store = p.get_store(0)
        fam = store.column_family()
        table = table_of(value_schema, list(rows.values()))
        store.put_encoded_many(
            fam.key_codec.encode_many(list(rows)), fam.value_codec.encode_many(table)
        )
        store.commit()
        store = p.get_store(1)
        changed = ([None, {"x": None, "tags": [None]}], [], None)
        store.put(("k", 0), changed)
        store.commit()
        rows[("k", 0)] = changed
        reopened = factory.reopen(value_schema=value_schema)
        read = reopened.get_read_store(2)
        try:
            assert dict(read.iterator()) == rows
        finally:
            read.abort()
    finally:
        factory.close_all()
