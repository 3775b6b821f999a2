"""Watermarks against Spark: late rows dropped and counted, old keys evicted, per Spark's rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime.watermark import WatermarkTracker, parse_delay_ms

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, normalize, run_batches, source

SCHEMA = "k string, ts timestamp, v int"


def at(seconds: int) -> str:
    return f"2024-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}Z"


BATCHES: list[list[dict[str, Any]]] = [
    [{"k": "a", "ts": at(100), "v": 1}, {"k": "b", "ts": at(105), "v": 2}],
    [
        {"k": "a", "ts": at(90), "v": 3},  # late: the watermark is now 105 - 10 = 95 s
        {"k": "a", "ts": at(96), "v": 4},
        {"k": "c", "ts": at(120), "v": 5},
    ],
    [{"k": "b", "ts": at(105), "v": 6}, {"k": "d", "ts": at(111), "v": 7}],  # 105 is late now
    [{"k": "e", "ts": at(130), "v": None}],
]


def non_empty(c: Collector) -> list[list[tuple[Any, ...]]]:
    return [rows for _, rows in sorted(c.batches.items()) if rows]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_event_time_key_drops_late_rows_like_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    ours, theirs = Collector(), Collector()
    q = (
        ss.stream(source(spark, feed, SCHEMA))
        .withWatermark("ts", "10 seconds")
        .groupBy("ts", "k")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(ours)
        .option("checkpointLocation", str(tmp_path / "a"))
        .option("stateStore", provider)
        .start()
    )
    run_batches(feed, q, BATCHES)
    progress = q.recentProgress
    feed.reset()
    spark_q = (
        source(spark, feed, SCHEMA)
        .withWatermark("ts", "10 seconds")
        .groupBy("ts", "k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(theirs)
        .option("checkpointLocation", str(tmp_path / "b"))
        .start()
    )
    run_batches(feed, spark_q, BATCHES)
    # batch by batch, with the no-data batches Spark runs after each watermark move
    assert ours.batches == theirs.batches
    assert len(ours.batches) > len(BATCHES)
    dropped = sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in progress)
    assert dropped == 2
    # the last batch is the no-data batch after 130 s was seen: 130 - 10 = 120 s
    assert progress[-1]["eventTime"]["watermark"] == "2024-01-01T00:02:00.000Z"
    # keys at or below the watermark left the state: all but (130 s, "e") by the end
    assert sum(p["stateOperators"][0]["numRowsRemoved"] for p in progress) == 5
    assert progress[-1]["stateOperators"][0]["numRowsTotal"] == 1


def test_watermark_tracker_follows_spark_rules() -> None:
    t = WatermarkTracker({"a": 10_000, "b": 0})
    t.observe("a", 50_000)
    assert not t.advance() and t.watermark_ms == 0  # b has seen nothing: it counts as 0
    t.observe("b", 20_000)
    assert t.advance() and t.watermark_ms == 20_000
    t.observe("a", 40_000)  # an older event time never moves anything back
    assert not t.advance() and t.watermark_ms == 20_000
    m = WatermarkTracker({"a": 10_000, "b": 0}, policy="max")
    m.observe("a", 50_000)
    assert m.advance() and m.watermark_ms == 40_000


def test_watermark_tracker_resumes_as_spark_restarts() -> None:
    """A new run keeps the watermark and the policy the checkpoint ran with, and forgets what
    each input saw (Spark's tracker starts each run with every input at 0)."""
    t = WatermarkTracker({"a": 10_000, "b": 0}, policy="max")
    t.observe("a", 50_000)
    t.advance()
    saved = t.to_dict()
    resumed = WatermarkTracker({"a": 10_000, "b": 0}, policy="min")
    resumed.resume(saved)
    assert (resumed.watermark_ms, resumed.policy, resumed.max_event_time_ms) == (40_000, "max", {})
    restored = WatermarkTracker({"a": 10_000, "b": 0})
    restored.restore(saved)  # within a run (a batch run again): what each input saw, too
    assert restored.max_event_time_ms == {"a": 50_000}
    older = WatermarkTracker({"a": 10_000}, policy="max")
    older.resume({"watermark_ms": 5})  # a checkpoint that recorded no policy: the session's
    assert older.policy == "max"


def test_delay_strings() -> None:
    assert parse_delay_ms("10 minutes") == 600_000
    assert parse_delay_ms("interval 1 hour 30 seconds") == 3_630_000
    assert parse_delay_ms("2 days") == 172_800_000
    assert parse_delay_ms("500 milliseconds") == 500
    with pytest.raises(ConfigurationError, match="10 minutes"):
        parse_delay_ms("soon")


def run_both(  # noqa: PLR0913 - the two runs' shared settings
    spark: SparkSession,
    feed: FileFeed,
    tmp_path: Path,
    query: Any,
    delay: str,
    provider: str,
    collectors: tuple[Collector, Collector],
    batches: list[list[dict[str, Any]]],
) -> tuple[list[Any], list[Any]]:
    """``query(df, fns)`` over ``batches`` in append mode with a watermark of ``delay``:
    sparkstate's (``SF``, wrapped, on ``provider``) into the first collector, then Spark's
    (``F``) into the second; each run's progress."""
    progress = []
    for ours, collector in zip((True, False), collectors, strict=True):
        df = source(spark, feed, SCHEMA).withWatermark("ts", delay)
        writer = query(ss.stream(df) if ours else df, SF if ours else F).writeStream
        writer = writer.outputMode("append").foreachBatch(collector)
        writer = writer.option("checkpointLocation", str(tmp_path / ("a" if ours else "b")))
        if ours:
            writer = writer.option("stateStore", provider)
        q = writer.start()
        run_batches(feed, q, batches)
        progress.append(q.recentProgress)
        feed.reset()
    return progress[0], progress[1]


BEFORE_EPOCH: list[list[dict[str, Any]]] = [
    # Spark's watermark is 0 from the first batch: a window ending at the epoch is late at once
    [
        {"k": "a", "ts": "1969-12-31T23:59:00Z", "v": 1},
        {"k": "a", "ts": "2100-01-01T00:00:00Z", "v": 2},
    ],
    [{"k": "b", "ts": "2100-01-01T00:20:00Z", "v": 3}],
]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_row_before_the_epoch_is_late_in_the_first_batch_like_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    def query(df: Any, fns: Any) -> Any:
        return df.groupBy(fns.window("ts", "1 minute"), "k").agg(fns.count("*").alias("n"))

    ours, theirs = Collector(), Collector()
    progress, _ = run_both(
        spark, feed, tmp_path, query, "1 minute", provider, (ours, theirs), BEFORE_EPOCH
    )
    assert ours.batches == theirs.batches
    assert [p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in progress][0] == 1


#: Event times past 9999, where Python's datetime ends and Spark's timestamps go on.
PAST_9999: list[list[dict[str, Any]]] = [
    [{"k": "a", "ts": "9999-12-31T23:59:30Z", "v": 1}],
    [
        {"k": "a", "ts": "10000-01-01T00:00:30Z", "v": 2},
        {"k": "b", "ts": "12345-06-07T08:09:10.123Z", "v": 3},
    ],
]


class AsText(Collector):
    """A ``foreachBatch`` function that reads its rows as text, as it must here: PySpark's rows
    cannot hold a time past 9999."""

    def __call__(self, df: Any, batch_id: int) -> None:
        self.schema = df.schema
        text = df.select([F.col(c).cast("string") for c in df.columns])
        self.batches[batch_id] = normalize(text.collect())


def test_event_times_past_9999_run_and_show_in_progress_as_in_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def query(df: Any, fns: Any) -> Any:
        return df.groupBy(fns.window("ts", "1 minute"), "k").agg(fns.count("*").alias("n"))

    def event_times(progress: list[Any]) -> list[dict[str, str]]:
        times = [(p if isinstance(p, dict) else json.loads(p.json))["eventTime"] for p in progress]
        return [{k: t[k] for k in ("watermark", "max") if k in t} for t in times]

    ours, theirs = AsText(), AsText()
    mine, spark_progress = run_both(
        spark, feed, tmp_path, query, "10 seconds", PROVIDERS[-1], (ours, theirs), PAST_9999
    )
    progress = event_times(mine)
    assert ours.batches == theirs.batches
    assert any(rows for rows in theirs.batches.values())
    assert progress == event_times(spark_progress)
    assert progress[-1]["watermark"].startswith("+")  # Spark writes a year past 9999 so


def test_watermark_column_is_found_case_aside_as_spark_resolves_it(
    spark: SparkSession, feed: FileFeed
) -> None:
    stream = ss.stream(source(spark, feed, SCHEMA))
    assert [w.column for w in stream.withWatermark("TS", "10 seconds").watermarks] == ["ts"]
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        with pytest.raises(ConfigurationError, match="no column 'TS'"):
            stream.withWatermark("TS", "10 seconds")
    finally:
        spark.conf.unset("spark.sql.caseSensitive")
