"""Batches without data. With ``spark.sql.streaming.noDataMicroBatches.enabled=false`` Spark runs
none, so a window closed by the last batch's watermark is emitted with the next data, or never;
sparkstate does the same (its clock asks for nothing). With them on, the clock's request files
run the one Spark runs."""

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
from sparkstate.engine.clock import FileClock
from sparkstate.runtime.logs import CheckpointLog

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


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_clock_s_request_files_run_spark_s_batch_without_data(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    """Under the default trigger the clock is Spark's own file source over request files: the
    batch without data that closes the last window runs as Spark's does, the clock is not
    among the progress's sources, and Spark deletes the requests it has read."""

    def spark_query(c: Collector) -> Any:
        df: DataFrame = windowed_counts(source(spark, feed, SCHEMA), F)
        return start_spark(df, "append", tmp_path / "spark", c)

    progress: list[dict[str, Any]] = []

    def ours_query(c: Collector) -> Any:
        stream = windowed_counts(ss.stream(source(spark, feed, SCHEMA)), SF)
        query = start_ours(stream, "append", tmp_path / "ours", provider, c)
        progress.append(query)  # type: ignore[arg-type]
        return query

    theirs = _run(feed, spark_query)
    feed.reset()
    ours = _run(feed, ours_query)
    assert len(theirs.batches) > len(BATCHES)  # Spark's batches without data among them
    assert ours.batches == theirs.batches
    engine = tmp_path / "ours" / "sparkstate"
    metadata = CheckpointLog(str(engine)).read_metadata()
    assert metadata is not None
    assert metadata["clock"] == "files"
    sources = [s["description"] for p in progress[0].recentProgress for s in p["sources"]]
    assert sources
    assert all("clock-requests" not in s for s in sources)
    # Spark deletes a batch's files when it plans the next batch (on a thread of its own): the
    # newest request may stay until then.
    deadline = time.monotonic() + 10
    while len(list((engine / "clock-requests").iterdir())) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list((engine / "clock-requests").iterdir())) <= 1


def test_a_new_run_asks_again_for_what_no_batch_served(tmp_path: Path) -> None:
    """The request of the last batch before a stop is written again at the next start unless
    a batch started after it; a processing-time timeout's, once it comes due."""
    served = FileClock(str(tmp_path / "served"))
    served.resume({"requested_at_ms": 1_000, "due_ms": None}, last_batch_at_ms=1_001)
    assert not (tmp_path / "served").exists()
    pending = FileClock(str(tmp_path / "pending"))
    pending.resume({"requested_at_ms": 1_000, "due_ms": None}, last_batch_at_ms=900)
    assert [p.name for p in (tmp_path / "pending").iterdir()] == ["1000"]
    due = FileClock(str(tmp_path / "due"))
    due_ms = int(time.time() * 1000) + 300
    due.resume({"requested_at_ms": None, "due_ms": due_ms}, last_batch_at_ms=None)
    assert not (tmp_path / "due").exists()
    deadline = time.monotonic() + 10
    while not (tmp_path / "due").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.name for p in (tmp_path / "due").iterdir()] == [f"due-{due_ms}"]
    assert time.time() * 1000 > due_ms
    cancelled = FileClock(str(tmp_path / "cancelled"))
    cancelled.ask({"requested_at_ms": None, "due_ms": int(time.time() * 1000) + 200})
    cancelled.close()
    time.sleep(0.5)
    assert not (tmp_path / "cancelled").exists()
