"""A query restarted on its checkpoint with an evolved state schema continues from the old state;
an incompatible state schema fails the first batch, as Spark's check does, with a message that
says what to do."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

import sparkstate as ss
from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store.schema_json import fields_from_json

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, run_batches, source, start_ours

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long"
OUTPUT = "k string, count long, seen string"


def count_v1(key: tuple[Any, ...], rows: list[Any], state: Any) -> Any:
    n = (state.get[0] if state.exists else 0) + len(rows)
    state.update((n,))
    yield (key[0], n, "")


def count_v2(key: tuple[Any, ...], rows: list[Any], state: Any) -> Any:
    """The same count, and the last value seen: a nullable field the old states do not have."""
    count, last = state.get if state.exists else (0, None)
    state.update((count + len(rows), rows[-1][1]))
    yield (key[0], count + len(rows), f"last={last}")


def _start(spark: SparkSession, feed: FileFeed, chk: Path, func: Any, state: str, c: Any) -> Any:
    grouped = ss.stream(source(spark, feed, SCHEMA)).groupBy("k")
    planned = grouped.flatMapGroupsWithState(func, OUTPUT, state, "update", "NoTimeout")
    return start_ours(planned, "update", chk, PROVIDERS[-1], c)


def test_restart_with_an_added_nullable_state_field_continues(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    chk, collector = tmp_path / "chk", Collector()
    query = _start(spark, feed, chk, count_v1, "count long", collector)
    run_batches(feed, query, [[{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}]])
    query = _start(spark, feed, chk, count_v2, "count long, last long", collector)
    run_batches(feed, query, [[{"k": "a", "v": 4}, {"k": "c", "v": 5}], [{"k": "a", "v": 6}]])
    assert collector.batches == {
        0: [("a", 2, ""), ("b", 1, "")],
        1: [("a", 3, "last=None"), ("c", 1, "last=None")],
        2: [("a", 4, "last=4")],
    }
    metadata = json.loads((chk / "sparkstate" / "metadata.json").read_text())
    recorded = fields_from_json(metadata["operators"][0]["state_schema"])
    assert [name for name, _, _ in recorded] == ["count", "last"]


def test_restart_with_an_incompatible_state_schema_is_refused(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    chk, collector = tmp_path / "chk", Collector()
    _start(spark, feed, chk, count_v1, "count long", collector).stop()
    pattern = (
        r"^\[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE\] operator 0 \(flatMapGroupsWithState\): "
        r"the state schema cannot change from \[count: int64\] to \[count: string\].*field "
        r"'count' changed type from int64 to string.*restore the original schema, or start from "
        r"a new checkpoint location"
    )
    feed.add([{"k": "a", "v": 1}])
    for state, refused in [("count string", pattern), (ss.PICKLED, "to pickled Python objects")]:
        query = _start(spark, feed, chk, count_v1, state, Collector())
        with pytest.raises(SchemaMismatchError, match=refused):
            query.processAllAvailable()
        query.stop()
    query = _start(spark, feed, chk, count_v1, "count long", collector)
    query.processAllAvailable()  # the original runs the batch
    query.stop()
    assert collector.batches == {0: [("a", 1, "")]}
