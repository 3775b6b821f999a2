"""Value schemas evolving across restarts: the codec of a schema history and both providers."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store.base import StateStoreProvider
from sparkstate.store.codec import ValueCodec
from sparkstate.store.evolution import (
    PICKLED_FIELD,
    EvolvingValueCodec,
    evolve,
    fields_of,
    incompatibility,
    value_header,
    widens,
)
from sparkstate.store.schema_json import fields_from_json
from sparkstate.testing.factory import KEY_SCHEMA, ProviderFactory

V0 = pa.schema([("count", pa.int64()), ("label", pa.string())])
#: V0 reordered, with a nullable field added.
V1 = pa.schema([("label", pa.string()), ("extra", pa.float64()), ("count", pa.int64())])
#: V1 without ``label``.
V2 = pa.schema([("extra", pa.float64()), ("count", pa.int64())])
FIXED0 = pa.schema([("a", pa.int64()), ("b", pa.int32())])
FIXED1 = pa.schema([("b", pa.int32()), ("c", pa.float64())])


def test_headers() -> None:
    assert value_header(0) == b"\x01"
    assert value_header(1) == b"\x02\x01\x00"
    assert value_header(258) == b"\x02\x02\x01"
    assert ValueCodec(V0).encode((1, "x"))[:1] == b"\x01"
    assert EvolvingValueCodec([V0, V1], 1).encode(("x", None, 1))[:3] == b"\x02\x01\x00"
    assert EvolvingValueCodec([V0, V1], 0).encode((1, "x"))[:1] == b"\x01"


def test_old_values_read_under_the_new_schema() -> None:
    old = [ValueCodec(V0).encode((i, f"l{i}" if i % 3 else None)) for i in range(50)]
    codec = EvolvingValueCodec([V0, V1], 1)
    new = codec.encode_many([(f"n{i}", i / 2, 100 + i) for i in range(50)])
    mixed: list[bytes | None] = [v for pair in zip(old, new, strict=True) for v in pair]
    mixed[7] = None
    expected = [
        (f"l{i}" if i % 3 else None, None, i) if j == 0 else (f"n{i}", i / 2, 100 + i)
        for i in range(50)
        for j in range(2)
    ]
    expected[7] = None  # type: ignore[call-overload]
    assert codec.decode(old[1]) == ("l1", None, 1)
    assert codec.decode(new[1]) == ("n1", 0.5, 101)
    assert codec.decode_many(mixed) == expected
    assert codec.decode_many(mixed[:5]) == expected[:5]
    assert codec.decode_many(old) == [e for e in expected[0::2]]
    table, found = codec.decode_many_arrow(mixed)
    assert table.schema == V1
    assert found.tolist() == [v is not None for v in mixed]
    rows = [tuple(r.values()) for r in table.to_pylist()]
    assert [r if f else None for r, f in zip(rows, found.tolist(), strict=True)] == expected


def test_fixed_width_values_of_mixed_schemas_decode_vectorized() -> None:
    old = ValueCodec(FIXED0).encode_many([(i, -i) for i in range(40)])
    codec = EvolvingValueCodec([FIXED0, FIXED1], 1)
    assert codec.fixed_width is not None
    new = codec.encode_many([(i, i * 1.5) for i in range(40)])
    table, found = codec.decode_many_arrow([*new, None, *old])
    assert found.tolist() == [True] * 40 + [False] + [True] * 40
    assert table.column("b").to_pylist() == [*range(40), None, *(-i for i in range(40))]
    assert table.column("c").to_pylist() == [i * 1.5 for i in range(40)] + [None] * 41
    assert codec.decode_many(new) == [(i, i * 1.5) for i in range(40)]


def test_reverting_reads_values_of_the_later_schema() -> None:
    later = EvolvingValueCodec([V0, V1, V2], 2).encode((0.5, 7))
    middle = EvolvingValueCodec([V0, V1, V2], 1).encode(("m", 1.5, 8))
    reverted = EvolvingValueCodec([V0, V1, V2], 0)
    assert reverted.decode(later) == (7, None)
    assert reverted.decode(middle) == (8, "m")
    assert reverted.decode_many([later, middle, reverted.encode((9, "z"))]) == [
        (7, None),
        (8, "m"),
        (9, "z"),
    ]


def test_values_of_unknown_schemas_fail_clearly() -> None:
    codec = EvolvingValueCodec([V0, V1], 1)
    with pytest.raises(SchemaMismatchError, match="schema id 5.*records 2 value schemas"):
        codec.decode(b"\x02\x05\x00" + codec.encode(("x", None, 1))[3:])
    with pytest.raises(SchemaMismatchError, match="value header"):
        codec.decode(b"\x09" + codec.encode(("x", None, 1))[1:])


@pytest.mark.parametrize(
    ("new", "reason"),
    [
        (pa.schema([("count", pa.string()), ("label", pa.string())]), "'count' changed type"),
        (
            pa.schema([*V0, pa.field("x", pa.int8(), nullable=False)]),
            "'x' \\(int8\\) is added but not nullable",
        ),
        (
            pa.schema([pa.field("count", pa.int64(), nullable=False), ("label", pa.string())]),
            "'count' \\(int64\\) became non-nullable",
        ),
        (pa.schema([(PICKLED_FIELD, pa.binary())]), "from schema-encoded values to pickled"),
        (pa.schema([("total", pa.string())]), "keeps none of the stored fields"),
        (pa.schema([("total", pa.int64())]), "keeps none of the stored fields"),
    ],
)
def test_incompatible_changes_are_refused(new: pa.Schema, reason: str) -> None:
    pattern = f"STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE.*cf 'x'.*{reason}.*new checkpoint location"
    with pytest.raises(SchemaMismatchError, match=pattern):
        evolve([V0], 0, new, "cf 'x'")


def test_compatible_changes_and_the_history() -> None:
    history, sid = evolve([V0], 0, V1, "x")
    assert (history, sid) == ([V0, V1], 1)
    history, sid = evolve(history, 1, V2, "x")
    assert (history, sid) == ([V0, V1, V2], 2)
    assert evolve(history, 2, V0, "x") == (history, 0)  # a revert reuses the id
    # a dropped field cannot come back with another type
    back = pa.schema([("count", pa.int64()), ("label", pa.int32())])
    with pytest.raises(SchemaMismatchError, match="'label' changed type from string to int32"):
        evolve(history, 2, back, "x")
    nullable = pa.schema([("count", pa.int64())])
    required = pa.schema([pa.field("count", pa.int64(), nullable=False)])
    assert incompatibility([fields_of(required)], fields_of(nullable)) is None
    assert incompatibility([[("count", "int64", None)]], fields_of(required)) is None


#: A schema of narrow types, and the same fields widened as Spark's Avro encoding reads them.
NARROW = pa.schema(
    [("id", pa.int32()), ("small", pa.int8()), ("f", pa.float32()), ("s", pa.string())]
)
WIDE = pa.schema(
    [("id", pa.int64()), ("small", pa.float64()), ("f", pa.float64()), ("s", pa.binary())]
)


def test_widening_is_allowed_only_where_avro_promotes() -> None:
    with pytest.raises(SchemaMismatchError, match="STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"):
        evolve([NARROW], 0, WIDE, "x")  # without widening (Spark's default encoding)
    assert evolve([NARROW], 0, WIDE, "x", widening=True) == ([NARROW, WIDE], 1)
    assert widens("int32", "int64") and widens("int8", "int16") and widens("int64", "double")
    assert widens("string", "binary") and widens("binary", "string")
    for stored, wanted in [
        ("int64", "int32"),
        ("int32", "int8"),  # both Avro ints: Spark takes it and truncates; refused here
        ("double", "float"),
        ("int32", "string"),
        ("date32[day]", "int64"),
        ("bool", "int32"),
    ]:
        assert not widens(stored, wanted)
    narrowed = pa.schema([("id", pa.int32()), ("s", pa.binary())])
    pattern = (
        r"\[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION\] Schema evolution is not possible: "
        r"x: the value schema cannot change .*'id' changed type from int64 to int32"
    )
    with pytest.raises(SchemaMismatchError, match=pattern):  # every schema of the history
        evolve([NARROW, WIDE], 1, narrowed, "x", widening=True)


def test_widened_fields_read_old_values_widened() -> None:
    old = [ValueCodec(NARROW).encode((i, -i, i / 4, f"s{i}")) for i in range(6)]
    old[2] = ValueCodec(NARROW).encode((2, None, None, None))
    codec = EvolvingValueCodec([NARROW, WIDE], 1)
    new = codec.encode((2**40, 1.5, 0.1, b"new"))
    expected = [(i, float(-i), i / 4, f"s{i}".encode()) for i in range(6)]
    expected[2] = (2, None, None, None)
    assert codec.decode(old[1]) == expected[1]
    assert type(codec.decode(old[1])[1]) is float
    assert codec.decode_many([*old, new, None]) == [*expected, (2**40, 1.5, 0.1, b"new"), None]
    table, found = codec.decode_many_arrow([*old, new, None])
    assert table.schema == WIDE
    assert found.tolist() == [True] * 7 + [False]
    assert table.to_pylist()[:7] == [
        dict(zip(WIDE.names, row, strict=True)) for row in [*expected, (2**40, 1.5, 0.1, b"new")]
    ]


# --- providers ------------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "rocksdb"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> ProviderFactory:
    f = ProviderFactory(request.param, str(tmp_path / "chk"), str(tmp_path / "local"))
    request.addfinalizer(f.close_all)
    return f


def _commit(provider: StateStoreProvider, version: int, rows: dict[tuple, tuple]) -> None:  # type: ignore[type-arg]
    store = provider.get_store(version)
    keys = list(rows)
    store.put_many(keys[: len(keys) // 2], [rows[k] for k in keys[: len(keys) // 2]])
    for k in keys[len(keys) // 2 :]:
        store.put(k, rows[k])
    store.commit()


def _schema_file(factory: ProviderFactory) -> dict:  # type: ignore[type-arg]
    return json.loads((Path(factory.checkpoint_root) / "state/0/0/_schema.json").read_text())


def _read(provider: StateStoreProvider, version: int) -> dict[tuple, tuple]:  # type: ignore[type-arg]
    store = provider.get_read_store(version)
    try:
        rows = dict(store.iterator())
        keys = sorted(rows)
        assert store.get_many(keys) == [rows[k] for k in keys]
        assert [store.get(k) for k in keys] == [rows[k] for k in keys]
        return rows
    finally:
        store.abort()


def test_a_store_reads_old_values_after_its_schema_evolves(factory: ProviderFactory) -> None:
    v0 = {("a", i): (i, f"l{i}") for i in range(40)}
    _commit(factory.open(value_schema=V0), 0, v0)
    before = _schema_file(factory)
    assert "value_history" not in before["column_families"]["default"]
    _commit(factory.reopen(value_schema=V0), 1, {("a", 0): (0, "again")})
    assert _schema_file(factory) == before  # unchanged schema: the file and format as before

    provider = factory.reopen(value_schema=V1)
    assert _read(provider, 2) == {k: (lbl, None, c) for k, (c, lbl) in v0.items()} | {
        ("a", 0): ("again", None, 0)
    }
    v1 = {("b", i): (f"m{i}", i + 0.5, i) for i in range(40)}
    _commit(provider, 2, v1)
    family = _schema_file(factory)["column_families"]["default"]
    assert len(family["value_history"]) == 2
    assert [f[0] for f in fields_from_json(family["value"])] == ["label", "extra", "count"]

    provider = factory.reopen(value_schema=V2)
    rows = _read(provider, 3)
    assert rows[("a", 5)] == (None, 5)
    assert rows[("b", 5)] == (5.5, 5)
    _commit(provider, 3, {("c", 1): (9.0, 1)})

    reverted = factory.reopen(value_schema=V0)
    rows = _read(reverted, 4)
    assert rows[("a", 5)] == (5, "l5")
    assert rows[("b", 5)] == (5, "m5")
    assert rows[("c", 1)] == (1, None)
    assert len(_schema_file(factory)["column_families"]["default"]["value_history"]) == 3


def test_evolution_survives_snapshots_and_maintenance(factory: ProviderFactory) -> None:
    provider = factory.open(value_schema=V0, min_deltas_for_snapshot=1, min_versions_to_retain=1)
    for v in range(3):
        _commit(provider, v, {("a", v): (v, f"l{v}")})
        provider.do_maintenance()
    factory.close_all()
    provider = factory.open(value_schema=V1, min_deltas_for_snapshot=1, min_versions_to_retain=1)
    for v in range(3, 6):
        _commit(provider, v, {("b", v): (f"m{v}", None, v)})
        provider.do_maintenance()
    factory.close_all()
    # a worker on another executor: restores from the snapshot, not from a local copy
    fresh = factory.open(value_schema=V2, local_dir=factory.fresh_local_dir())
    assert _read(fresh, 6) == {("a", v): (None, v) for v in range(3)} | {
        ("b", v): (None, v) for v in range(3, 6)
    }


def test_incompatible_changes_fail_when_the_store_opens(factory: ProviderFactory) -> None:
    _commit(factory.open(value_schema=V0), 0, {("a", 1): (1, "x")})
    factory.close_all()
    changed = pa.schema([("count", pa.string()), ("label", pa.string())])
    pattern = (
        r"column family 'default'.*_schema.json.*\[count: int64, label: string\] to "
        r"\[count: string, label: string\].*'count' changed type from int64 to string"
    )
    with pytest.raises(SchemaMismatchError, match=pattern):
        factory.open(value_schema=changed)
    with pytest.raises(SchemaMismatchError, match="key schema of column family 'default'"):
        factory.open(value_schema=V1, key_schema=pa.schema([("name", pa.string())]))
    cf = {"extra": (KEY_SCHEMA, V0)}
    _commit(factory.reopen(value_schema=V0, column_families=cf), 1, {("a", 1): (1, "x")})
    factory.close_all()
    required = pa.schema([*V0, pa.field("n", pa.int8(), nullable=False)])
    with pytest.raises(SchemaMismatchError, match="'extra'.*'n' \\(int8\\) is added but not null"):
        factory.open(value_schema=V0, column_families={"extra": (KEY_SCHEMA, required)})
    assert _read(factory.open(value_schema=V0), 2) == {("a", 1): (1, "x")}


def test_a_registered_family_evolves(factory: ProviderFactory) -> None:
    provider = factory.open(value_schema=V0)
    provider.register_column_family("cf", KEY_SCHEMA, V0)  # type: ignore[attr-defined]
    store = provider.get_store(0)
    store.put(("a", 1), (1, "x"), "cf")
    store.commit()
    provider = factory.reopen(value_schema=V0)
    provider.register_column_family("cf", KEY_SCHEMA, V2)  # type: ignore[attr-defined]
    assert provider.get_read_store(1).get(("a", 1), "cf") == (None, 1)


def test_a_store_with_value_widening_reads_old_values_widened(factory: ProviderFactory) -> None:
    _commit(factory.open(value_schema=NARROW), 0, {("a", i): (i, i, 0.5, "x") for i in range(4)})
    factory.close_all()
    with pytest.raises(SchemaMismatchError, match="'id' changed type from int32 to int64"):
        factory.open(value_schema=WIDE)
    provider = factory.open(value_schema=WIDE, value_widening=True)
    assert _read(provider, 1) == {("a", i): (i, float(i), 0.5, b"x") for i in range(4)}
    _commit(provider, 1, {("b", 1): (2**40, 0.25, 1.0, b"y")})
    factory.close_all()
    with pytest.raises(SchemaMismatchError, match="INVALID_VALUE_SCHEMA_EVOLUTION.*'id'"):
        factory.open(value_schema=NARROW, value_widening=True)
    rows = _read(factory.open(value_schema=WIDE, value_widening=True), 2)
    assert rows[("b", 1)] == (2**40, 0.25, 1.0, b"y")
    assert rows[("a", 3)] == (3, 3.0, 0.5, b"x")
