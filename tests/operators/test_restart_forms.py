"""Descriptions recorded by earlier versions (other schema JSON shapes) still match the same
operator's description now, and a real change is still refused."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.operators.arbitrary.flat_map_groups import FlatMapGroupsWithState
from sparkstate.operators.arbitrary.transform_with_state import TransformWithState
from sparkstate.operators.restart import check_state_change, same_schema
from sparkstate.testing.harness import processor_harness

from .test_processor import INPUT, Collections

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
PARTS = ("key_schema", "value_schema", "output_schema")


def _earlier(described: dict[str, Any]) -> dict[str, Any]:
    """``described`` in the shapes earlier versions wrote to ``metadata.json``."""
    out = dict(described)
    for part in PARTS:
        out[part] = [{"name": f["name"], "type": f["type"]} for f in described[part]["fields"]]
    if "state_schema" in described:
        out["state_schema"] = list(described["state_schema"]["fields"])
    if "state" in described:
        out["state"] = {}
        for name, var in described["state"].items():
            was = dict(var)
            was["schema"] = [[f["name"], f["type"], f["nullable"]] for f in var["schema"]["fields"]]
            if "key_schema" in var:
                was["key_schema"] = [[f["name"], f["type"]] for f in var["key_schema"]["fields"]]
            out["state"][name] = was
    return out


def _counter(key: Any, rows: Any, state: Any) -> Any:
    return []


def test_an_earlier_description_of_the_same_operator_matches() -> None:
    group_state = FlatMapGroupsWithState(_counter, SCHEMA, ["k"], "k string, n long", "n long")
    with processor_harness(
        Collections(), key_columns=["k"], output_schema="k string", input_schema=INPUT
    ) as h:
        processor = h.operator
    assert processor is not None
    for op in (group_state, processor):
        now = op.describe()
        before = _earlier(now)
        assert before != now  # the shapes differ ...
        checked = check_state_change(before, now, "metadata.json")  # ... the content does not
        assert all(same_schema(before[p], now[p]) for p in PARTS if p not in checked)


def test_an_incompatible_change_against_an_earlier_description_is_refused() -> None:
    old = FlatMapGroupsWithState(_counter, SCHEMA, ["k"], "k string, n long", "n long")
    new = FlatMapGroupsWithState(_counter, SCHEMA, ["k"], "k string, n long", "n string")
    with pytest.raises(SchemaMismatchError, match="state schema cannot change"):
        check_state_change(_earlier(old.describe()), new.describe(), "metadata.json")
    assert not same_schema(_earlier(old.describe())["key_schema"], {"fields": []})


class _Counted:
    """A processor whose one value state has the schema it is given."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def init(self, handle: Any) -> None:
        handle.getValueState("state", self.schema)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        return iter(())

    def close(self) -> None:
        pass


def _described(schema: str, encoding: str = "unsaferow") -> dict[str, Any]:
    op = TransformWithState(_Counted(schema), SCHEMA, ["k"], "k string", state_encoding=encoding)
    return {"id": 0, **op.describe()}


def test_a_state_field_widens_under_avro_only() -> None:
    narrow, wide = "id int, name string", "id long, name string"
    with pytest.raises(SchemaMismatchError, match="VALUE_SCHEMA_NOT_COMPATIBLE.*'id' changed"):
        check_state_change(_described(narrow), _described(wide), "here")
    assert "state" in check_state_change(
        _described(narrow, "avro"), _described(wide, "avro"), "here"
    )
    pattern = r"INVALID_VALUE_SCHEMA_EVOLUTION\] Schema evolution is not possible.*'id' changed"
    with pytest.raises(SchemaMismatchError, match=pattern):
        check_state_change(_described(wide, "avro"), _described(narrow, "avro"), "here")
    # the encoding is the checkpoint's: a restart under another is refused
    with pytest.raises(ConfigurationError, match="encodingFormat changed from 'unsaferow' to"):
        check_state_change(_described(narrow), _described(narrow, "avro"), "here")
    assert _described(narrow).get("state_encoding") is None  # as earlier versions recorded it


def test_avro_encoding_refuses_a_non_nullable_state_field() -> None:
    schema = "id int not null, name string"
    _described(schema)  # Spark's default encoding takes it
    pattern = (
        r"\[TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE\] .* column family state must be "
        r"nullable .* Current schema: \[id: int32 not null, name: string\]"
    )
    with pytest.raises(ConfigurationError, match=pattern):
        _described(schema, "avro")
