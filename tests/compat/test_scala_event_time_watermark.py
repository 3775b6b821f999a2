"""Spark's ``EventTimeWatermarkSuite`` (Scala), its ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/
EventTimeWatermarkSuite.scala`` in Apache Spark (commit 56ceeac25623 as stored): the same inputs,
query and expected answers, the query's input wrapped (``stream_test.py``), run on both
providers; where ours fails, the scenario is marked xfail (strict) with the cause, and passes
under ``SPARKSTATE_COMPAT_ORACLE=spark``. ``append mode - session`` is from the suite's earlier
version (Spark has since moved its session-window scenarios to a suite of their own). The
suite's helpers ``assertEventStats``, ``assertNumRowsDroppedByWatermark`` and
``checkWatermark`` are the harness's or this module's.

=============================================================  ================================
Spark's test                                                   here
=============================================================  ================================
EventTimeStats (and its four variants)                         left out: internal class
error on bad column                                            left out: no stream run (an
                                                               analysis error at definition)
error on wrong type                                            left out: same
event time and watermark metrics                               ported
event time and watermark metrics with Trigger.Once             ported
recovery from Spark ver 2.3.1 commit log without commit        left out: a checkpoint written
metadata                                                       by Spark 2.3.1 (test resource)
append mode                                                    ported
append mode - session (the suite's earlier version)            ported
update mode                                                    ported
delay in months and years handled correctly                    ported
recovery                                                       ported (the commit-log purge on
                                                               the checkpoint's files)
watermark with 2 streams                                       ported
complete mode                                                  ported
group by on raw timestamp                                      ported
delay threshold should not be negative.                        left out: no stream run
overriding watermark should not be allowed by default          ported
overriding watermark should not fail in compatibility mode     ported (the watermark read from
                                                               the progress, not from the
                                                               physical StateStoreSaveExec)
multiple event time columns in an input DataFrame for          ported
stateful operator is not allowed
stateful operator should pick the first occurrence of event    ported
time column ... in compatibility mode
EventTime watermark should be ignored in batch query.          left out: a batch query
SPARK-21565: watermark operator accepts attributes from        ported (foreachBatch for the
replacement                                                    console sink)
SPARK-27340 Alias on TimeWindow expression cause watermark     ported (its check of the logical
metadata lost                                                  plan's metadata left out)
test no-data flag                                              ported, once per flag value
MultipleWatermarkPolicy: max                                   ported
MultipleWatermarkPolicy: min                                   ported
MultipleWatermarkPolicy: recovery from checkpoints ignores     ported
session conf
MultipleWatermarkPolicy: recovery from Spark ver 2.3.1         left out: a checkpoint written
checkpoints ensures min policy                                 by Spark 2.3.1 (test resource)
MultipleWatermarkPolicy: fail on incorrect conf values         left out: no stream run
SPARK-35815: Support ANSI intervals for delay threshold        left out: no stream run (the
                                                               analyzed plan's metadata)
=============================================================  ================================
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from .stream_test import (
    AddData,
    AssertOnQuery,
    AwaitTermination,
    CheckAnswer,
    CheckLastBatch,
    CheckNewAnswer,
    Execute,
    ExpectFailure,
    MultiAddData,
    ProcessAllAvailable,
    StartStream,
    StopStream,
    assertEventStats,
    assertNumRowsDroppedByWatermark,
    assertNumStateRows,
    assertWatermark,
    format_timestamp,
)

pytestmark = pytest.mark.spark

POLICY = "spark.sql.streaming.multipleWatermarkPolicy"
ALLOW_MULTIPLE = "spark.sql.streaming.statefulOperator.allowMultiple"


def _windowed_count(input_data: Any) -> Any:
    return (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )


def test_event_time_and_watermark_metrics(st) -> None:
    # no event time metrics without a watermark
    input_data1 = st.memory_stream()
    agg_without_watermark = (
        input_data1.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )

    def no_stats(e: dict[str, str]) -> None:
        assert not e, e

    st.test_stream(
        agg_without_watermark,
        "complete",
        AddData(input_data1, 15),
        CheckAnswer((15, 1)),
        assertEventStats(no_stats),
        AddData(input_data1, 10, 12, 14),
        CheckAnswer((10, 3), (15, 1)),
        assertEventStats(no_stats),
    )

    # all of them with a watermark
    input_data2 = st.memory_stream()
    st.test_stream(
        _windowed_count(input_data2),
        "append",
        AddData(input_data2, 15),
        CheckAnswer(),
        assertEventStats(min=15, max=15, avg=15, wtrmark=0),
        AddData(input_data2, 10, 12, 14),
        CheckAnswer(),
        assertEventStats(min=10, max=14, avg=12, wtrmark=5),
        AddData(input_data2, 25),
        CheckAnswer((10, 3)),
        assertEventStats(min=25, max=25, avg=25, wtrmark=5),
    )


def test_event_time_and_watermark_metrics_with_trigger_once(st) -> None:
    # Trigger.Once runs one batch per start and no batch without data: the answer a moved
    # watermark calls for comes at the next start; the rows are added before each start.
    input_data = st.memory_stream()
    once = {"once": True}
    st.test_stream(
        _windowed_count(input_data),
        "append",
        StartStream(once),
        AwaitTermination(),
        AddData(input_data, 15),
        StartStream(once),
        AwaitTermination(),
        CheckNewAnswer(),
        assertEventStats(min=15, max=15, avg=15, wtrmark=0),
        AddData(input_data, 10, 12, 14),
        StartStream(once),
        AwaitTermination(),
        CheckNewAnswer(),
        assertEventStats(min=10, max=14, avg=12, wtrmark=5),
        AddData(input_data, 25),
        StartStream(once),
        AwaitTermination(),
        CheckNewAnswer(),
        assertEventStats(min=25, max=25, avg=25, wtrmark=5),
        AddData(input_data, 50),
        StartStream(once),
        AwaitTermination(),
        CheckNewAnswer((10, 3)),  # with the watermark at 15
        assertEventStats(min=50, max=50, avg=50, wtrmark=15),
        AddData(input_data, 50),
        StartStream(once),
        AwaitTermination(),
        CheckNewAnswer((15, 1), (25, 1)),  # with the watermark at 40
        assertEventStats(min=50, max=50, avg=50, wtrmark=40),
    )


def test_append_mode(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _windowed_count(input_data),
        "append",
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer(),
        AddData(input_data, 25),  # advance the watermark to 15 seconds
        CheckNewAnswer((10, 5)),
        assertNumStateRows(2),
        assertNumRowsDroppedByWatermark(0),
        AddData(input_data, 10),  # nothing: below the watermark
        CheckNewAnswer(),
        assertNumStateRows(2),
        assertNumRowsDroppedByWatermark(1),
    )


def test_append_mode_session(st) -> None:
    input_data = st.memory_stream()
    df = (
        input_data.toDF()
        .selectExpr("*", "CAST(value / 10 AS INT) AS valuegroup")
        .withColumn("eventTime", F.col("value").cast("timestamp"))
        .withWatermark("eventTime", "10 seconds")
        .groupBy(F.session_window(F.col("eventTime"), "5 seconds").alias("session"), "valuegroup")
        .agg(F.count("*").alias("count"), F.sum("value").alias("sum"))
        .select(
            "valuegroup",
            F.col("session").getField("start").cast("long"),
            F.col("session").getField("end").cast("long"),
            "count",
            "sum",
        )
    )
    st.test_stream(
        df,
        "append",
        AddData(input_data, 10, 11),
        CheckNewAnswer(),
        AddData(input_data, 17),
        CheckNewAnswer(),
        AddData(input_data, 25),
        CheckNewAnswer(),
        AddData(input_data, 35),
        CheckNewAnswer((1, 10, 16, 2, 21), (1, 17, 22, 1, 17)),
        AddData(input_data, 10),
        CheckNewAnswer(),
        AddData(input_data, 40),
        CheckNewAnswer((2, 25, 30, 1, 25)),
    )


def test_update_mode(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _windowed_count(input_data),
        "update",
        StartStream(confs={"spark.sql.shuffle.partitions": "10"}),
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer((10, 5), (15, 1)),
        AddData(input_data, 25),  # advance the watermark to 15 seconds
        CheckNewAnswer((25, 1)),
        assertNumStateRows(2),
        assertNumRowsDroppedByWatermark(0),
        AddData(input_data, 10, 25),  # 10 is below the watermark
        CheckNewAnswer((25, 2)),
        assertNumStateRows(2),
        assertNumRowsDroppedByWatermark(1),
        AddData(input_data, 10),
        CheckNewAnswer(),
        assertNumStateRows(2),
        assertNumRowsDroppedByWatermark(1),
    )


def test_delay_in_months_and_years_handled_correctly(st) -> None:
    now_s = int(time.time())
    now = dt.datetime.fromtimestamp(now_s, dt.UTC)
    input_data = st.memory_stream("value bigint")
    agg_with_watermark = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "2 years 5 months")
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )

    def months_since_epoch(when: dt.datetime) -> int:
        return when.year * 12 + when.month - 1

    def check(e: dict[str, str]) -> None:
        assert e["max"] == format_timestamp(now_s), e
        watermark = dt.datetime.fromisoformat(e["watermark"].replace("Z", "+00:00"))
        # like a floor: two values are possible
        assert months_since_epoch(now) - months_since_epoch(watermark) in (29, 30), e

    st.test_stream(
        agg_with_watermark,
        "append",
        AddData(input_data, now_s),
        CheckAnswer(),
        AddData(input_data, now_s),
        CheckAnswer(),
        assertEventStats(check),
    )


def _purge_commits_and_clear_sink(run: Any) -> None:
    """Spark's ``q.commitLog.purge(latest)`` (the commits before the latest deleted from the
    checkpoint) and ``MemorySink.clear()``."""
    commits = Path(run.checkpoint) / "commits"
    ids = [int(f.name) for f in commits.iterdir() if f.name.isdigit()]
    for batch_id in ids:
        if batch_id < max(ids):
            (commits / str(batch_id)).unlink()
            (commits / f".{batch_id}.crc").unlink(missing_ok=True)
    run.batches.clear()


def test_recovery(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _windowed_count(input_data),
        "append",
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckAnswer(),
        AddData(input_data, 25),  # advance the watermark to 15 seconds
        CheckAnswer((10, 5)),
        StopStream,
        AssertOnQuery(_purge_commits_and_clear_sink),
        StartStream(),
        AddData(input_data, 10, 27, 30),  # the watermark to 20 seconds, 10 ignored
        CheckAnswer((15, 1)),
        StopStream,
        StartStream(),
        AddData(input_data, 17),  # the watermark still 20 seconds, 17 ignored
        CheckAnswer((15, 1)),
        AddData(input_data, 40),  # the watermark to 30 seconds, 25 emitted
        CheckNewAnswer((25, 2)),
    )


def _watermark_after(first: Any, second: Any, first_rows=(), second_rows=(), ms: int = 0):
    """The scenario's ``getWatermarkAfterData``: the rows, then a dummy row in a batch of its
    own so that the last batch runs with the new watermark."""
    return [
        *([AddData(first, *first_rows)] if first_rows else []),
        *([AddData(second, *second_rows)] if second_rows else []),
        ProcessAllAvailable(),
        AddData(first, 0),
        assertWatermark(ms),
    ]


def test_watermark_with_2_streams(st) -> None:
    first = st.memory_stream()
    first_df = (
        first.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .select(F.col("value"))
    )
    second = st.memory_stream()
    second_df = (
        second.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "5 seconds")
        .select(F.col("value"))
    )
    union = first_df.union(second_df).agg(F.sum(F.col("value")))

    def after(first_rows=(), second_rows=(), ms: int = 0) -> list[Any]:
        return _watermark_after(first, second, first_rows, second_rows, ms)

    st.test_stream(
        union,
        "complete",
        # the global watermark is 0 until both sides have data
        *after(first_rows=[11], ms=0),
        *after(second_rows=[6], ms=1000),
        # it stays at the left's 1 when the right's moves to 2
        *after(second_rows=[8], ms=1000),
        # it takes the right's 2 when the left's goes higher
        *after(first_rows=[21], ms=3000),
        # back to the left
        *after(second_rows=[17, 28, 39], ms=11000),
        # on the left as long as it is below the right
        *after(first_rows=[31], ms=21000),
        *after(first_rows=[41], ms=31000),
        # the right again
        *after(first_rows=[51], ms=34000),
        # data on both sides at once
        *after(first_rows=[100], second_rows=[100], ms=90000),
        *after(first_rows=[120], second_rows=[110], ms=105000),
        *after(first_rows=[130], second_rows=[125], ms=120000),
        # never decreasing
        *after(first_rows=[100], second_rows=[100], ms=120000),
        *after(first_rows=[140], second_rows=[100], ms=120000),
        *after(first_rows=[100], second_rows=[135], ms=130000),
        # recovered after a restart; the left side's watermark ahead of it is not
        *after(first_rows=[200], second_rows=[190], ms=185000),
        StopStream,
        StartStream(),
        *after(ms=185000),
        *after(second_rows=[200], ms=185000),
        *after(first_rows=[200], ms=190000),
    )


def test_complete_mode(st) -> None:
    input_data = st.memory_stream()
    # no eviction when complete results are asked for
    st.test_stream(
        _windowed_count(input_data),
        "complete",
        AddData(input_data, 10, 11, 12),
        CheckAnswer((10, 3)),
        AddData(input_data, 25),
        CheckAnswer((10, 3), (25, 1)),
        AddData(input_data, 25),
        CheckAnswer((10, 3), (25, 2)),
        AddData(input_data, 10),
        CheckAnswer((10, 4), (25, 2)),
        AddData(input_data, 25),
        CheckAnswer((10, 4), (25, 3)),
    )


def test_group_by_on_raw_timestamp(st) -> None:
    input_data = st.memory_stream()
    df = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .groupBy(F.col("eventTime"))
        .agg(F.count("*").alias("count"))
        .select(F.col("eventTime").cast("long"), F.col("count"))
    )
    st.test_stream(
        df,
        "append",
        AddData(input_data, 10),
        CheckAnswer(),
        AddData(input_data, 25),  # advance the watermark to 15 seconds
        CheckAnswer((10, 1)),
    )


def _overriding_watermark(input_data: Any) -> Any:
    """The suite's ``buildTestQueryForOverridingWatermark``: a second watermark, on another
    column, over the first."""
    return (
        input_data.toDF()
        .withColumn("first", F.timestamp_seconds(F.col("_1")))
        .withColumn("second", F.timestamp_seconds(F.col("_2")))
        .withWatermark("first", "1 minute")
        .select("*")
        .withWatermark("second", "2 minutes")
        .groupBy(F.window(F.col("second"), "1 minute"))
        .count()
    )


def test_overriding_watermark_should_not_be_allowed_by_default(st) -> None:
    input_data = st.memory_stream("_1 bigint, _2 bigint")
    st.test_stream(
        _overriding_watermark(input_data),
        "append",
        AddData(input_data, (100, 200)),
        ExpectFailure(
            "Redefining watermark is disallowed.",
            ALLOW_MULTIPLE,
        ),
    )


def test_overriding_watermark_should_not_fail_in_compatibility_mode(st) -> None:
    input_data = st.memory_stream("_1 bigint, _2 bigint")
    st.test_stream(
        _overriding_watermark(input_data),
        "append",
        StartStream(confs={ALLOW_MULTIPLE: "false"}),
        AddData(input_data, (100, 200)),
        CheckAnswer(),
        # the first definition still counts: min(100 - 60, 200 - 120) = 40 seconds (Spark's
        # test reads it from the aggregation's physical operator, this one from the progress)
        assertWatermark(40_000),
    )


def _multi_event_time_columns(input1: Any, input2: Any) -> Any:
    """The suite's ``buildTestQueryForMultiEventTimeColumns``: a deduplication of a join's
    output, which carries both sides' event-time columns."""
    df1 = (
        input1.toDF()
        .selectExpr("_1 AS id1", "timestamp_seconds(_2) AS ts1")
        .withWatermark("ts1", "1 minute")
    )
    df2 = (
        input2.toDF()
        .selectExpr("_1 AS id2", "timestamp_seconds(_2) AS ts2")
        .withWatermark("ts2", "2 minutes")
    )
    joined = df1.join(df2, F.expr("id1 = id2 AND ts1 = ts2 + INTERVAL 10 SECONDS"), "inner")
    joined = joined.selectExpr("id1", "ts1", "ts2")
    # the join's output has both ts1 and ts2
    return joined.dropDuplicates().selectExpr(
        "id1", "CAST(ts1 AS LONG) AS ts1", "CAST(ts2 AS LONG) AS ts2"
    )


def test_multiple_event_time_columns_for_stateful_operator_not_allowed(st) -> None:
    input1 = st.memory_stream("_1 string, _2 bigint")
    input2 = st.memory_stream("_1 string, _2 bigint")
    st.test_stream(
        _multi_event_time_columns(input1, input2),
        "append",
        MultiAddData(
            AddData(input1, ("A", 200), ("B", 300)),
            AddData(input2, ("A", 190), ("C", 350)),
        ),
        ExpectFailure(
            "More than one event time columns are available.",
            "Please ensure there is at most one event time column per stream.",
        ),
    )


def test_stateful_operator_picks_the_first_event_time_column_in_compatibility_mode(st) -> None:
    input1 = st.memory_stream("_1 string, _2 bigint")
    input2 = st.memory_stream("_1 string, _2 bigint")
    st.test_stream(
        _multi_event_time_columns(input1, input2),
        "append",
        StartStream(confs={ALLOW_MULTIPLE: "false"}),
        MultiAddData(
            AddData(input1, ("A", 200), ("B", 300)),
            AddData(input2, ("A", 190), ("C", 350)),
        ),
        CheckAnswer(("A", 200, 190)),
    )


def test_watermark_operator_accepts_attributes_from_replacement(st) -> None:
    # SPARK-21565; Spark's test writes to the console sink, this one to the harness's
    input_data = st.memory_stream("symbol string, price double, eventTime timestamp")
    group_events = (
        input_data.toDF()
        .withWatermark("eventTime", "2 seconds")
        .groupBy("symbol", "eventTime")
        .agg(F.count("price").alias("count"))
        .select("symbol", "eventTime", "count")
    )
    st.test_stream(
        group_events,
        "append",
        AddData(input_data, ("a", 100.0, dt.datetime(1970, 1, 1, 0, 0, 0, 100_000))),
        ProcessAllAvailable(),
    )


def test_alias_on_time_window_keeps_watermark_metadata(st) -> None:
    # SPARK-27340
    input_data = st.memory_stream()
    alias_window = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .select(F.window(F.col("eventTime"), "5 seconds").alias("aliasWindow"))
    )
    windowed_aggregation = (
        alias_window.groupBy(F.col("aliasWindow"))
        .agg(F.count("*").alias("count"))
        .select(F.col("aliasWindow").getField("start").cast("long"), F.col("count"))
    )
    st.test_stream(
        windowed_aggregation,
        "append",
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer(),
        AddData(input_data, 25),  # advance the watermark to 15 seconds
        CheckNewAnswer((10, 5)),
        assertNumStateRows(2),
        AddData(input_data, 10),  # nothing: below the watermark
        CheckNewAnswer(),
        assertNumStateRows(2),
    )


@pytest.mark.parametrize("flag", [True, False])
def test_no_data_flag(st, flag: bool) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _windowed_count(input_data),
        "append",
        StartStream(confs={"spark.sql.streaming.noDataMicroBatches.enabled": str(flag).lower()}),
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer(),
        AddData(input_data, 25),  # advance the watermark to 15 seconds
        # a new answer with the flag set, none without
        CheckNewAnswer((10, 5)) if flag else CheckNewAnswer(),
    )


def _df_with_multiple_watermarks(input1: Any, input2: Any) -> Any:
    df1 = (
        input1.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
    )
    df2 = (
        input2.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "15 seconds")
    )
    return df1.union(df2).select(F.col("eventTime").cast("int"))


def _check_watermark(input_data: Any, watermark_s: int) -> list[Any]:
    """The suite's ``checkWatermark``: a row added, then the last progress's watermark."""

    def check(run: Any) -> None:
        run.process()
        got = (run.query.lastProgress["eventTime"] or {}).get("watermark")
        assert got == format_timestamp(watermark_s), f"watermark {got}, not {watermark_s} s"

    return [AddData(input_data, 1), Execute(check)]


def test_multiple_watermark_policy_max(st) -> None:
    input1, input2 = st.memory_stream(), st.memory_stream()
    st.test_stream(
        _df_with_multiple_watermarks(input1, input2),
        "append",
        StartStream(confs={POLICY: "max"}),
        MultiAddData(AddData(input1, 20), AddData(input2, 30)),
        CheckLastBatch(20, 30),
        *_check_watermark(input1, 15),  # max(20 - 10, 30 - 15) = 15
        StopStream,
        StartStream(),
        *_check_watermark(input1, 15),  # recovered
        MultiAddData(AddData(input1, 120), AddData(input2, 130)),
        CheckLastBatch(120, 130),
        *_check_watermark(input1, 115),  # max(120 - 10, 130 - 15) = 115, the policy recovered
        AddData(input1, 150),
        CheckLastBatch(150),
        *_check_watermark(input1, 140),  # moves with data on one input only
    )


def test_multiple_watermark_policy_min(st) -> None:
    input1, input2 = st.memory_stream(), st.memory_stream()
    st.test_stream(
        _df_with_multiple_watermarks(input1, input2),
        "append",
        StartStream(confs={POLICY: "min"}),
        MultiAddData(AddData(input1, 20), AddData(input2, 30)),
        CheckLastBatch(20, 30),
        *_check_watermark(input1, 10),  # min(20 - 10, 30 - 15) = 10
        StopStream,
        StartStream(),
        *_check_watermark(input1, 10),  # recovered
        MultiAddData(AddData(input1, 120), AddData(input2, 130)),
        CheckLastBatch(120, 130),
        *_check_watermark(input2, 110),  # min(120 - 10, 130 - 15) = 110, the policy recovered
        AddData(input2, 150),
        CheckLastBatch(150),
        *_check_watermark(input2, 110),  # does not move with data on one input only
    )


def test_multiple_watermark_policy_recovery_ignores_session_conf(st) -> None:
    input1, input2 = st.memory_stream(), st.memory_stream()
    st.test_stream(
        _df_with_multiple_watermarks(input1, input2),
        "append",
        StartStream(confs={POLICY: "max"}, checkpoint="shared"),
        MultiAddData(AddData(input1, 20), AddData(input2, 30)),
        CheckLastBatch(20, 30),
        *_check_watermark(input1, 15),  # max(20 - 10, 30 - 15) = 15
    )
    st.test_stream(
        _df_with_multiple_watermarks(input1, input2),
        "append",
        StartStream(confs={POLICY: "min"}, checkpoint="shared"),
        *_check_watermark(input1, 15),  # recovered
        MultiAddData(AddData(input1, 120), AddData(input2, 130)),
        CheckLastBatch(120, 130),
        *_check_watermark(input1, 115),  # max(120 - 10, 130 - 15) = 115, the policy recovered
        AddData(input1, 150),
        CheckLastBatch(150),
        *_check_watermark(input1, 140),  # moves with data on one input only
    )
