"""The store layer's one schema JSON form, the legacy forms it still reads, and ``_schema.json``
files of earlier versions opened by both providers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.files.durable import DurableDir
from sparkstate.store.base import StateStoreProvider
from sparkstate.store.evolution import WHAT_TO_DO
from sparkstate.store.families import Row
from sparkstate.store.schema_json import (
    fields_from_json,
    fields_of,
    fields_to_json,
    schema_from_json,
    schema_to_json,
)
from sparkstate.testing.factory import KEY_SCHEMA, ProviderFactory, read_all

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("label", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("price", pa.decimal128(12, 3)),
    ]
)
V0 = pa.schema([("count", pa.int64()), ("label", pa.string())])
#: V0 reordered, with a nullable field added: a compatible change.
V1 = pa.schema([("label", pa.string()), ("extra", pa.float64()), ("count", pa.int64())])


def test_one_form_and_the_forms_of_earlier_versions() -> None:
    one = schema_to_json(SCHEMA)
    assert one["fields"][0] == {"name": "id", "type": "int64", "nullable": False}
    lists = [[f.name, str(f.type), f.nullable] for f in SCHEMA]  # _schema.json before
    dicts = [{"name": f.name, "type": str(f.type)} for f in SCHEMA]  # operators' metadata.json
    for described in (one, lists, dicts, json.loads(json.dumps(lists))):
        assert schema_from_json(described).names == SCHEMA.names
    assert schema_from_json(one).equals(SCHEMA) and schema_from_json(lists).equals(SCHEMA)
    assert fields_from_json(one) == fields_from_json(lists) == fields_of(SCHEMA)
    assert fields_from_json(dicts) == [(f.name, str(f.type), None) for f in SCHEMA]
    assert schema_from_json(dicts).field("id").nullable  # not recorded: Arrow's default
    assert fields_to_json(fields_from_json(lists)) == one
    assert fields_from_json(fields_to_json(fields_from_json(dicts))) == fields_from_json(dicts)


@pytest.mark.parametrize(
    "described",
    [
        {"columns": []},
        {"fields": {"name": "x"}},
        [["x"]],
        [["x", "int64", True, "extra"]],
        [{"name": "x"}],
        [{"name": 1, "type": "int64"}],
        [["x", "int64", "yes"]],
        "x: int64",
        None,
    ],
)
def test_malformed_descriptions_are_refused(described: Any) -> None:
    with pytest.raises(ConfigurationError, match="malformed state schema description"):
        fields_from_json(described)
    with pytest.raises(ConfigurationError, match="malformed state schema description"):
        schema_from_json(described)


# --- _schema.json written by an earlier version ---------------------------------------------------


@pytest.fixture(params=["memory", "rocksdb"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> ProviderFactory:
    f = ProviderFactory(request.param, str(tmp_path / "chk"), str(tmp_path / "local"))
    request.addfinalizer(f.close_all)
    return f


def _schema_path(factory: ProviderFactory) -> Path:
    return Path(factory.checkpoint_root) / factory.store_id.relative_dir / "_schema.json"


def _legacy(described: dict[str, Any]) -> list[list[Any]]:
    """A schema as ``_schema.json`` recorded it before: ``[[name, type, nullable], ...]``."""
    return [[f["name"], f["type"], f["nullable"]] for f in described["fields"]]


def _write_legacy_schema_file(factory: ProviderFactory) -> str:
    """Rewrite the store's ``_schema.json`` in the form of earlier versions; returns its text."""
    path = _schema_path(factory)
    recorded = json.loads(path.read_text())
    for family in recorded["column_families"].values():
        family["key"], family["value"] = _legacy(family["key"]), _legacy(family["value"])
        if "value_history" in family:
            family["value_history"] = [_legacy(v) for v in family["value_history"]]
    text = json.dumps(recorded, indent=2)
    path.write_text(text)
    return text


def _commit(provider: StateStoreProvider, version: int, rows: dict[Row, Row]) -> None:
    store = provider.get_store(version)
    for key, value in rows.items():
        store.put(key, value)
    store.commit()


def test_an_old_schema_file_opens_and_refuses_what_it_refused(factory: ProviderFactory) -> None:
    rows: dict[Row, Row] = {("a", i): (i, f"l{i}") for i in range(5)}
    _commit(factory.open(value_schema=V0), 0, rows)
    factory.close_all()
    old = _write_legacy_schema_file(factory)

    # the same schemas open and read the state; nothing to record, so the file stays as it was
    assert read_all(factory.open(value_schema=V0).get_read_store(1)) == {"default": rows}
    factory.close_all()
    assert _schema_path(factory).read_text() == old

    # incompatible schemas fail with the errors of before (messages included)
    where = str(factory.store_id)
    directory = DurableDir(factory.checkpoint_root).child(factory.store_id.relative_dir)
    file_uri = directory.where("_schema.json")
    key = pa.schema([("name", pa.string())])
    with pytest.raises(SchemaMismatchError) as info:
        factory.open(value_schema=V0, key_schema=key)
    assert str(info.value) == (
        f"[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] {where}: the key schema of column family "
        "'default' changed: checkpoint has "
        "[['name', 'string', True], ['n', 'int64', True]], query has [['name', 'string', True]] "
        f"({file_uri}); restore the original query, or start from a new checkpoint location"
    )
    assert info.value.condition == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
    changed = pa.schema([("count", pa.string()), ("label", pa.string())])
    with pytest.raises(SchemaMismatchError) as info:
        factory.open(value_schema=changed)
    assert str(info.value) == (
        "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] "
        f"{where}: column family 'default' ({file_uri}): the value schema cannot change from "
        "[count: int64, label: string] to [count: string, label: string]: field 'count' changed "
        f"type from int64 to string, so values stored before could not be read. {WHAT_TO_DO}"
    )
    assert info.value.condition == "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"
    assert _schema_path(factory).read_text() == old

    # a compatible change opens, reads the old values, and records the new schema
    provider = factory.open(value_schema=V1)
    assert read_all(provider.get_read_store(1)) == {
        "default": {k: (label, None, count) for k, (count, label) in rows.items()}
    }
    _commit(provider, 1, {("b", 1): ("m", 0.5, 1)})
    factory.close_all()
    family = json.loads(_schema_path(factory).read_text())["column_families"]["default"]
    assert family["key"] == schema_to_json(KEY_SCHEMA)  # the whole file in the one form now
    assert [schema_from_json(v) for v in family["value_history"]] == [V0, V1]
    reverted = read_all(factory.open(value_schema=V0).get_read_store(2))["default"]
    assert reverted[("a", 3)] == (3, "l3") and reverted[("b", 1)] == (1, "m")


def test_an_old_schema_file_with_a_value_history(factory: ProviderFactory) -> None:
    _commit(factory.open(value_schema=V0), 0, {("a", 1): (1, "x")})
    _commit(factory.reopen(value_schema=V1), 1, {("b", 2): ("y", 0.5, 2)})
    factory.close_all()
    old = _write_legacy_schema_file(factory)
    want = {("a", 1): ("x", None, 1), ("b", 2): ("y", 0.5, 2)}
    assert read_all(factory.open(value_schema=V1).get_read_store(2)) == {"default": want}
    factory.close_all()
    assert _schema_path(factory).read_text() == old  # the current schema, already recorded
    reverted = factory.open(value_schema=V0).get_read_store(2)  # reverting reuses id 0
    assert read_all(reverted) == {"default": {("a", 1): (1, "x"), ("b", 2): (2, "y")}}
    family = json.loads(_schema_path(factory).read_text())["column_families"]["default"]
    assert schema_from_json(family["value"]) == V0
    assert [schema_from_json(v) for v in family["value_history"]] == [V0, V1]
