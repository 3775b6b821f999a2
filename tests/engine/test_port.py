"""Port by wrapping: a query written for PySpark, with only its input wrapped in ``ss.stream``.

Each case is the PySpark query as a Spark user writes it: the watermark declared on the input
DataFrame, ``trigger(availableNow=True)`` over a file source with ``maxFilesPerTrigger``, stateless
steps after the stateful one. Spark runs it as written; sparkstate runs it with ``ss.stream(...)``
around the input and nothing else changed. Both go through the same two runs on one checkpoint
(half of the files, then the rest), and their outputs must match batch by batch, the no-data
batches Spark runs included.

Spark runs each query once for the module. What a case checks is the porting (the query as
written, the steps around the stateful one), not the provider, which tests/store/ holds to one
contract: each case runs on one provider, and each operator on both somewhere in the module.
``event-time-column`` (transformWithState's timers) runs on rocksdb here, and on memory in the
stale-rows test until the batch whose rows fall behind the watermark fails; ``timeout``
(applyInPandasWithState) on rocksdb here and on memory in the two-watermarks test; the
aggregation on memory (``steps-after-count``) and on rocksdb (``sorted-complete``); ``dedup``
on memory (test_dedup.py runs it on both).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .helpers import runs, spark_rocksdb

# The user function is shipped to the Python workers by value (they cannot import this module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, ts timestamp, v long"
FILES = 4


def rows(i: int) -> list[dict[str, Any]]:
    """File ``i``, a minute of event time: each key is in two files of four, so keys go idle
    for two minutes and event-time timeouts fire between batches, one of them (k1's) after the
    restart in the middle."""
    return [
        {"k": f"k{j}", "ts": f"2024-01-01 00:{i:02d}:{j * 7:02d}", "v": i * 10 + j}
        for j in range(4)
        if (i + j) % 4 in (0, 1)
    ]


def count_until_idle(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Counts a key's rows; emits the count when the watermark passes its last row by 30 s."""
    if state.hasTimedOut:
        (count,) = state.get
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "count": [count], "final": [True]})
        return
    count = state.get[0] if state.exists else 0
    last = 0
    for pdf in pdfs:
        count += len(pdf)
        last = max(last, pd.Timestamp(pdf["ts"].max()).value // 1_000_000)
    state.update((count,))
    state.setTimeoutTimestamp(max(last + 30_000, state.getCurrentWatermarkMs() + 1))
    yield pd.DataFrame({"k": [key[0]], "count": [count], "final": [False]})


class LatestProcessor(StatefulProcessor):  # type: ignore[misc]
    """A count per key with the key's latest event time, in ``eventTimeColumnName``'s column;
    an event-time timer 30 s after it clears the count."""

    def __init__(self, emit_stale: bool = False) -> None:
        self.emit_stale = emit_stale  # emit a row one hour behind the data: Spark fails the batch

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        current = self.count.get()
        n = int(current[0]) if current is not None else 0
        latest = None
        for pdf in rows:
            n += len(pdf)
            latest = pdf["ts"].max() if latest is None else max(latest, pdf["ts"].max())
        self.count.update((n,))
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.handle.registerTimer(pd.Timestamp(latest).value // 1_000_000 + 30_000)
        if self.emit_stale:
            latest = latest - pd.Timedelta(hours=1)
        yield pd.DataFrame({"k": [key[0]], "count": [n], "ts": [latest]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:  # noqa: N802,N803
        self.count.clear()
        yield from ()

    def close(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class Case:
    """A query over the input stream, the same function for both systems."""

    name: str
    query: Callable[[Any], Any]
    mode: str = "update"
    #: Whether the order of each batch's rows is part of the result (a sorted query).
    ordered: bool = False
    #: Whether Spark runs it on its RocksDB provider (its transformWithState needs it); the
    #: others run on its default one, which costs less CPU a batch.
    spark_rocksdb: bool = False


def with_watermark(df: DataFrame) -> DataFrame:
    return df.withWatermark("ts", "1 minute")


CASES = [
    Case(
        "timeout",
        lambda df: (
            with_watermark(df)
            .groupBy("k")
            .applyInPandasWithState(
                count_until_idle,
                "k string, count long, final boolean",
                "count long",
                "update",
                GroupStateTimeout.EventTimeTimeout,
            )
        ),
    ),
    Case(
        "event-time-column",
        lambda df: (
            with_watermark(df)
            .groupBy("k")
            .transformWithStateInPandas(
                LatestProcessor(),
                "k string, count long, ts timestamp",
                "Update",
                "EventTime",
                eventTimeColumnName="ts",
            )
        ),
        spark_rocksdb=True,
    ),
    Case(
        "steps-after-count",
        lambda df: (
            with_watermark(df)
            .groupBy("k")
            .count()
            .where(F.col("count") > 1)
            .withColumn("twice", F.col("count") * 2)
            .withColumnRenamed("k", "key")
            .selectExpr("key", "twice", "count + 1 AS next")
            .drop("next")
        ),
    ),
    Case(
        "dedup",
        lambda df: with_watermark(df).dropDuplicates(["k"]).select("k", "v"),
    ),
    Case(
        "sorted-complete",
        lambda df: (
            with_watermark(df)
            .groupBy("k")
            .agg(F.count("*").alias("count"), (F.max("v") - F.min("v")).alias("spread"))
            .filter("k != 'k3'")
            .select("k", F.col("count").alias("n"), "spread")
            .orderBy(F.col("n").desc(), "k")
        ),
        mode="complete",
    ),
]


class OrderedCollector(Collector):
    """Keeps each batch's rows in the order the query produced them."""

    def __call__(self, df: Any, batch_id: int) -> None:
        self.schema = df.schema
        self.batches[batch_id] = [tuple(r) for r in df.collect()]


def run_twice(
    spark: SparkSession,
    tmp: Path,
    build: Callable[[DataFrame], Any],
    case: Case,
    provider: str | None,
    collector: Any = None,
) -> Any:
    """``build(input)``'s query over half of the files until it ends, then over all of them
    again on the same checkpoint; ``provider`` None runs it on Spark alone. The ``foreachBatch``
    function is ``collector`` (by default a :class:`Collector`, ordered if the case is)."""
    feed = FileFeed(tmp / "input")
    if collector is None:
        collector = OrderedCollector() if case.ordered else Collector()
    for i in range(FILES // 2):
        feed.add(rows(i))
    for run in range(2):
        if run == 1:
            for i in range(FILES // 2, FILES):
                feed.add(rows(i))
        writer = build(feed.stream(spark, SCHEMA)).writeStream.outputMode(case.mode)
        writer = writer.foreachBatch(collector)
        writer = writer.option("checkpointLocation", str(tmp / "checkpoint"))
        if provider is not None:
            writer = writer.option("stateStore", provider)
        with spark_rocksdb(spark, provider is None and case.spark_rocksdb):
            handle = writer.trigger(availableNow=True).start()
            assert handle.awaitTermination(180), f"{case.name}: run {run} did not end"
    return collector


@pytest.fixture(scope="module")
def spark_results(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Collector]:
    return {
        case.name: run_twice(spark, tmp_path_factory.mktemp(case.name), case.query, case, None)
        for case in CASES
    }


@pytest.mark.parametrize(
    ("case", "provider"),
    runs(CASES, on_memory=("steps-after-count", "dedup")),
)
def test_wrapped_query_matches_spark(
    spark: SparkSession,
    spark_results: dict[str, Collector],
    tmp_path: Path,
    case: Case,
    provider: str,
) -> None:
    theirs = spark_results[case.name]

    def wrapped(df: DataFrame) -> Any:
        return case.query(ss.stream(df))

    ours = run_twice(spark, tmp_path, wrapped, case, provider)
    assert len(theirs.batches) >= FILES  # a batch per file at least: the read limit is kept
    if case.name == "timeout":  # keys go idle within the files: their timeouts fire
        assert any(final for rows in theirs.batches.values() for *_, final in rows)
    assert ours.batches == theirs.batches
    assert ours.schema == theirs.schema


def test_watermarks_both_ways_fail_as_in_spark(spark: SparkSession, tmp_path: Path) -> None:
    """A watermark on the DataFrame and one on the wrapped stream (same column) are two
    ``withWatermark`` calls in a row: the wrapped stream's is Spark's own on the input, and Spark
    (``statefulOperator.allowMultiple`` on, its default) fails the query's first batch."""
    case = CASES[0]

    def spark_query(df: DataFrame) -> Any:
        return case.query(df.withWatermark("ts", "3 minutes").withWatermark("ts", "1 minute"))

    def our_query(df: DataFrame) -> Any:
        stream = ss.stream(df.withWatermark("ts", "3 minutes")).withWatermark("ts", "1 minute")
        return stream.groupBy("k").applyInPandasWithState(
            count_until_idle,
            "k string, count long, final boolean",
            "count long",
            "update",
            GroupStateTimeout.EventTimeTimeout,
        )

    for name, query, store in (("spark", spark_query, None), ("ours", our_query, "memory")):
        with pytest.raises(StreamingQueryException, match="Redefining watermark is disallowed"):
            run_twice(spark, tmp_path / name, query, case, store)


def test_bad_steps_fail_at_start(spark: SparkSession, tmp_path: Path) -> None:
    feed = FileFeed(tmp_path / "input")
    counted = ss.stream(feed.stream(spark, SCHEMA)).groupBy("k").count()
    writer = counted.orderBy("count").writeStream.outputMode("update").format("memory")
    with pytest.raises(ConfigurationError, match="complete output mode"):
        writer.option("checkpointLocation", str(tmp_path / "a")).start()
    writer = counted.select("nope").writeStream.outputMode("update").format("memory")
    with pytest.raises(ConfigurationError, match="nope"):
        writer.option("checkpointLocation", str(tmp_path / "b")).start()


def test_rows_older_than_the_watermark_fail_as_in_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``eventTimeColumnName``: a processor that emits a row older than the watermark fails the
    query in both systems, with Spark's error name."""
    case = CASES[1]

    def stale(df: Any) -> Any:
        return (
            with_watermark(df)
            .groupBy("k")
            .transformWithStateInPandas(
                LatestProcessor(emit_stale=True),
                "k string, count long, ts timestamp",
                "Update",
                "EventTime",
                eventTimeColumnName="ts",
            )
        )

    for name, build, provider in (
        ("spark", stale, None),
        ("ours", lambda df: stale(ss.stream(df)), "memory"),
    ):
        with pytest.raises(Exception, match="EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED"):
            run_twice(spark, tmp_path / name, build, case, provider)
