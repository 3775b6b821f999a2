"""Descriptions recorded by earlier versions (other schema JSON shapes) still match the same
operator's description now, and a real change is still refused."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.operators.flat_map_groups import FlatMapGroupsWithState
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
