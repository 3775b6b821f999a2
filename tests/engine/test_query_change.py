"""A query changed between two runs on one checkpoint: what Spark's own restart keeps, ours keeps,
with Spark's output; what it refuses, ours refuses with Spark's condition."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long"
FILES = [
    [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}],
    [{"k": "a", "v": 4}, {"k": "c", "v": 5}],
    [{"k": "b", "v": 6}, {"k": "c", "v": 7}, {"k": "d", "v": 8}],
]


def counted(df: DataFrame) -> DataFrame:
    return df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))


def counted_renamed(df: DataFrame) -> DataFrame:
    """The same aggregation, its grouping column and its aliases renamed."""
    renamed = df.withColumnRenamed("k", "key")
    return renamed.groupBy("key").agg(F.count("*").alias("rows"), F.sum("v").alias("amount"))


def deduplicated(df: DataFrame) -> DataFrame:
    return df.dropDuplicates(["k"])


def deduplicated_renamed(df: DataFrame) -> DataFrame:
    return df.withColumnRenamed("k", "key").dropDuplicates(["key"])


@pytest.mark.parametrize(
    ("first", "second", "mode"),
    [
        pytest.param(counted, counted_renamed, "update", id="aggregation"),
        pytest.param(deduplicated, deduplicated_renamed, "append", id="deduplication"),
    ],
)
def test_a_restart_that_renames_columns_keeps_the_state_as_sparks_does(
    spark: SparkSession,
    tmp_path: Path,
    first: Callable[[Any], Any],
    second: Callable[[Any], Any],
    mode: str,
) -> None:
    """Spark compares state schemas without names: a grouping column or an alias renamed
    between two runs goes on with the counts so far."""
    out = {name: Collector() for name in ("spark", "ours")}
    feeds = {name: FileFeed(tmp_path / f"input-{name}") for name in out}
    for query, files in ((first, FILES[:2]), (second, FILES[2:])):
        for name in out:
            for rows in files:
                feeds[name].add(rows)
            df = feeds[name].stream(spark, SCHEMA)
            writer = query(ss.stream(df) if name == "ours" else df).writeStream
            writer = writer.outputMode(mode).foreachBatch(out[name])
            if name == "ours":
                writer = writer.option("stateStore", PROVIDERS[-1])
            handle = writer.option("checkpointLocation", str(tmp_path / name)).start()
            handle.processAllAvailable()
            handle.stop()
    assert out["ours"].batches == out["spark"].batches
    assert len(out["spark"].batches) == 3  # the run after the rename ran its batch
