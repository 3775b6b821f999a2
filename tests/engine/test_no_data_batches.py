"""``spark.sql.streaming.noDataMicroBatches.enabled=false``: Spark runs no batch without data, so
a window closed by the last batch's watermark is emitted with the next data, or never; sparkstate
does the same (its clock source asks for nothing)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, source, start_ours, start_spark

NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
SCHEMA = "k string, ts timestamp"


def at(seconds: int) -> str:
    return f"2024-01-01T00:00:{seconds:02d}Z"


#: The watermark (10 s delay) moves to 15 s after the second file and to 30 s after the third:
#: window [0, 10) closes after the second, [20, 30) after the third.
BATCHES = [
    [{"k": "a", "ts": at(0)}, {"k": "a", "ts": at(5)}],
    [{"k": "a", "ts": at(25)}],
    [{"k": "b", "ts": at(40)}],
]
#: Time for a batch the query would run without data after the last file.
SETTLE_S = 2.0


@pytest.fixture
def no_data_batches_off(spark: SparkSession) -> Iterator[None]:
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        yield
    finally:
        spark.conf.unset(NO_DATA_BATCHES)


def windowed_counts(df: Any, fn: Any) -> Any:
    return (
        df.withWatermark("ts", "10 seconds")
        .groupBy(fn.window("ts", "10 seconds"), "k")
        .agg(fn.count("*").alias("n"))
    )


def _run(feed: FileFeed, start: Callable[[Collector], Any]) -> Collector:
    collector = Collector()
    query = start(collector)
    try:
        for rows in BATCHES:
            feed.add(rows)
            query.processAllAvailable()
        time.sleep(SETTLE_S)
        query.processAllAvailable()
    finally:
        query.stop()
    return collector


@pytest.mark.usefixtures("no_data_batches_off")
@pytest.mark.parametrize("provider", PROVIDERS)
def test_no_data_batches_off_emits_windows_with_the_next_data_as_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    def spark_query(c: Collector) -> Any:
        df: DataFrame = windowed_counts(source(spark, feed, SCHEMA), F)
        return start_spark(df, "append", tmp_path / "spark", c)

    def ours_query(c: Collector) -> Any:
        stream = windowed_counts(ss.stream(source(spark, feed, SCHEMA)), SF)
        return start_ours(stream, "append", tmp_path / "ours", provider, c)

    theirs = _run(feed, spark_query)
    feed.reset()
    ours = _run(feed, ours_query)
    assert sorted(theirs.batches) == [0, 1, 2]  # no batch without data
    assert [len(theirs.batches[b]) for b in range(3)] == [0, 0, 1]
    assert ours.schema == theirs.schema
    assert ours.batches == theirs.batches
