"""Spark's ``MultiStatefulOperatorsSuite`` (Scala), its ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/
MultiStatefulOperatorsSuite.scala`` in Apache Spark (commit 3c39c48239d9 as stored): chains of
stateful operators (aggregations, deduplication, stream-stream joins) on one watermark, with the
same inputs, queries and expected answers, the query's input wrapped (``stream_test.py``), run
on both providers. The suite's ``assertNumStateRows`` and ``assertNumRowsDroppedByWatermark``
name each state operator's count, the last operator of the query first, as Spark's progress
lists them.

=============================================================  ================================
Spark's test                                                   here
=============================================================  ================================
window agg -> window agg, append mode                          ported
agg -> agg -> agg, append mode                                 ported
stream deduplication -> aggregation, append mode               ported
join -> window agg, append mode                                ported
aggregation -> stream deduplication, append mode               ported (its second query reads
                                                               a stream of its own with the
                                                               same rows: the answers Spark's
                                                               test expects are of those rows
                                                               alone)
join with range join on non-time intervals -> window agg,      ported
append mode, shouldn't fail
stream-stream time interval left outer join -> aggregation,    ported (its checks of the
append mode                                                    physical plan's operators'
                                                               watermarks left out)
stream-stream time interval right outer join -> aggregation,   ported (same)
append mode
stream-stream time interval join - output watermark for        left out: it checks only the
various intervals                                              physical join operator's
                                                               produceOutputWatermark
SPARK-49829 time window agg per each source followed by        ported
stream-stream join
=============================================================  ================================
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import functions as F

from .stream_test import (
    AddData,
    CheckAnswer,
    CheckNewAnswer,
    MultiAddData,
    assertNumRowsDroppedByWatermark,
    assertNumStateRows,
)

pytestmark = pytest.mark.spark


def test_window_agg_then_window_agg_append_mode(st) -> None:
    input_data = st.memory_stream()
    stream = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "0 seconds")
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .groupBy(F.window(F.col("window"), "10 seconds"))
        .agg(F.count("*").alias("count"), F.sum("count").alias("sum"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"), F.col("sum"))
    )
    st.test_stream(
        stream,
        "append",
        AddData(input_data, *range(10, 22)),
        # the no-data batch: op1 emits [10, 15) 5 and [15, 20) 5, op2 emits [10, 20) (2, 10)
        CheckNewAnswer((10, 2, 10)),
        assertNumStateRows([0, 1]),
        assertNumRowsDroppedByWatermark([0, 0]),
        AddData(input_data, *range(10, 30)),
        # op1 drops [10, 20) as late; op2 keeps [20, 30) (1, 7)
        CheckNewAnswer(),
        assertNumStateRows([1, 1]),
        assertNumRowsDroppedByWatermark([0, 2]),
        AddData(input_data, 30, 31),  # moves the watermark
        CheckNewAnswer((20, 2, 12)),
        assertNumStateRows([0, 1]),
        assertNumRowsDroppedByWatermark([0, 0]),
    )


def test_agg_then_agg_then_agg_append_mode(st) -> None:
    input_data = st.memory_stream()
    stream = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "0 seconds")
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .groupBy(F.window(F.window_time(F.col("window")), "10 seconds"))
        .agg(F.count("*").alias("count"), F.sum("count").alias("sum"))
        .groupBy(F.window(F.window_time(F.col("window")), "20 seconds"))
        .agg(F.count("*").alias("count"), F.sum("sum").alias("sum"))
        .select(
            F.col("window").getField("start").cast("long"),
            F.col("window").getField("end").cast("long"),
            F.col("count"),
            F.col("sum"),
        )
    )
    st.test_stream(
        stream,
        "append",
        AddData(input_data, *range(0, 38)),
        CheckNewAnswer((0, 20, 2, 20)),
        assertNumStateRows([1, 1, 1]),
        assertNumRowsDroppedByWatermark([0, 0, 0]),
        AddData(input_data, *range(30, 61)),
        # op1 drops [30, 35) as late (35, 36 and 37 are still in)
        CheckNewAnswer((20, 40, 2, 23), (40, 60, 2, 20)),
        assertNumStateRows([0, 0, 1]),
        assertNumRowsDroppedByWatermark([0, 0, 1]),
    )


def test_stream_deduplication_then_aggregation_append_mode(st) -> None:
    input_data = st.memory_stream()
    deduplication = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .dropDuplicates(["value", "eventTime"])
    )
    windowed_aggregation = (
        deduplication.groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"), F.sum("value").alias("sum"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )
    st.test_stream(
        windowed_aggregation,
        "append",
        AddData(input_data, *range(1, 16)),
        # the no-data batch: op1 keeps 6..15, op2 emits [0, 5) 4
        CheckNewAnswer((0, 4)),
        assertNumStateRows([3, 10]),
        assertNumRowsDroppedByWatermark([0, 0]),
    )


def test_join_then_window_agg_append_mode(st) -> None:
    input1 = st.memory_stream()
    input_df1 = (
        input1.toDF()
        .withColumnRenamed("value", "value1")
        .withColumn("eventTime1", F.timestamp_seconds(F.col("value1")))
        .withWatermark("eventTime1", "0 seconds")
    )
    input2 = st.memory_stream()
    input_df2 = (
        input2.toDF()
        .withColumnRenamed("value", "value2")
        .withColumn("eventTime2", F.timestamp_seconds(F.col("value2")))
        .withWatermark("eventTime2", "0 seconds")
    )
    stream = (
        input_df1.join(input_df2, F.expr("eventTime1 = eventTime2"), "inner")
        .groupBy(F.window(F.col("eventTime1"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )
    st.test_stream(
        stream,
        "append",
        MultiAddData(AddData(input1, 1, 2, 3, 4), AddData(input2, 1, 2, 3, 4)),
        CheckNewAnswer(),
        assertNumStateRows([1, 0]),
        assertNumRowsDroppedByWatermark([0, 0]),
        MultiAddData(AddData(input1, 5), AddData(input2, 5)),  # moves the watermark
        CheckNewAnswer((0, 4)),
        assertNumStateRows([1, 0]),
        assertNumRowsDroppedByWatermark([0, 0]),
    )


def _agg_stream(input_data: Any) -> Any:
    return (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "0 seconds")
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .withColumn("windowEnd", F.expr("window.end"))
    )


def test_aggregation_then_stream_deduplication_append_mode(st) -> None:
    # no event time column in dropDuplicates: its state is not evicted by the watermark
    input_data = st.memory_stream()
    dedup_no_event_time = (
        _agg_stream(input_data)
        .dropDuplicates(["count", "windowEnd"])
        .select(F.col("windowEnd").cast("long"), F.col("count"))
    )
    st.test_stream(
        dedup_no_event_time,
        "append",
        AddData(input_data, 1, 5, 10, 15),
        CheckNewAnswer((5, 1), (10, 1), (15, 1)),
        assertNumStateRows([3, 1]),
        assertNumRowsDroppedByWatermark([0, 0]),
    )

    # with the event time: the deduplication's state is evicted
    input_data = st.memory_stream()
    dedup_with_event_time = (
        _agg_stream(input_data)
        .withColumn("windowTime", F.expr("window_time(window)"))
        .withColumn("windowTimeMicros", F.expr("unix_micros(windowTime)"))
        .dropDuplicates(["count", "windowEnd", "windowTime"])
        .select(
            F.col("windowEnd").cast("long"),
            F.col("windowTimeMicros").cast("long"),
            F.col("count"),
        )
    )
    st.test_stream(
        dedup_with_event_time,
        "append",
        AddData(input_data, 1, 5, 10, 15),
        CheckNewAnswer((5, 4999999, 1), (10, 9999999, 1), (15, 14999999, 1)),
        assertNumStateRows([0, 1]),
        assertNumRowsDroppedByWatermark([0, 0]),
    )


def test_join_with_range_join_on_non_time_intervals_then_window_agg(st) -> None:
    input1 = st.memory_stream()
    input_df1 = (
        input1.toDF()
        .withColumnRenamed("value", "value1")
        .withColumn("eventTime1", F.timestamp_seconds(F.col("value1")))
        .withColumn("v1", F.timestamp_seconds(F.col("value1")))
        .withWatermark("eventTime1", "0 seconds")
    )
    input2 = st.memory_stream("_1 int, _2 int")
    input_df2 = (
        input2.toDF()
        .toDF("start", "end")
        .withColumn("eventTime2Start", F.timestamp_seconds(F.col("start")))
        .withColumn("start2", F.timestamp_seconds(F.col("start")))
        .withColumn("end2", F.timestamp_seconds(F.col("end")))
        .withWatermark("eventTime2Start", "0 seconds")
    )
    stream = (
        input_df1.join(
            input_df2, F.expr("v1 >= start2 AND v1 < end2 AND eventTime1 = start2"), "inner"
        )
        .groupBy(F.window(F.col("eventTime1"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )
    st.test_stream(
        stream,
        "append",
        AddData(input1, 1, 2, 3, 4),
        AddData(input2, (1, 2), (2, 3), (3, 4), (4, 5)),
        CheckNewAnswer(),
        assertNumStateRows([1, 0]),
        assertNumRowsDroppedByWatermark([0, 0]),
    )


def _at(text: str) -> dt.datetime:
    """Spark's test's ``Timestamp.valueOf``, in the session's time zone (UTC)."""
    return dt.datetime.fromisoformat(text)


def _time_interval_outer_join_then_agg(st, how: str) -> tuple[Any, Any, Any]:
    input1 = st.memory_stream("_1 string, _2 timestamp")
    input2 = st.memory_stream("_1 string, _2 timestamp")
    s1 = (
        input1.toDF().toDF("id1", "timestamp1").withWatermark("timestamp1", "0 seconds").alias("s1")
    )
    s2 = (
        input2.toDF().toDF("id2", "timestamp2").withWatermark("timestamp2", "0 seconds").alias("s2")
    )
    s3 = s1.join(
        s2,
        F.expr(
            "s1.id1 = s2.id2 AND (s1.timestamp1 BETWEEN "
            "s2.timestamp2 - INTERVAL 1 hour AND s2.timestamp2 + INTERVAL 1 hour)"
        ),
        how,
    )
    column = "timestamp1" if how == "leftOuter" else "timestamp2"
    agg = (
        s3.groupBy(F.window(F.col(column), "10 minutes"))
        .agg(F.count("*").alias("cnt"))
        .selectExpr(
            "CAST(window.start AS STRING) AS window_start",
            "CAST(window.end AS STRING) AS window_end",
            "cnt",
        )
    )
    return input1, input2, agg


def test_stream_stream_time_interval_left_outer_join_then_aggregation(st) -> None:
    input1, input2, agg = _time_interval_outer_join_then_agg(st, "leftOuter")
    st.test_stream(
        agg,
        "append",
        MultiAddData(
            AddData(input1, ("1", _at("2023-01-01 01:00:10")), ("2", _at("2023-01-01 01:00:30"))),
            AddData(input2, ("1", _at("2023-01-01 01:00:20"))),
        ),
        CheckAnswer(),
        MultiAddData(
            AddData(input1, ("5", _at("2023-01-01 01:15:00"))),
            AddData(input2, ("6", _at("2023-01-01 01:15:00"))),
        ),
        CheckAnswer(),
        MultiAddData(
            AddData(input1, ("5", _at("2023-01-01 02:16:00"))),
            AddData(input2, ("6", _at("2023-01-01 02:16:00"))),
        ),
        # the join emits ("1", 01:00:30) and ("5", 01:15:00) unmatched, the aggregation
        # [01:00, 01:10) 2
        CheckAnswer(("2023-01-01 01:00:00", "2023-01-01 01:10:00", 2)),
    )


def test_stream_stream_time_interval_right_outer_join_then_aggregation(st) -> None:
    # the left outer case with its sides swapped: both event times are usable after the join
    input1, input2, agg = _time_interval_outer_join_then_agg(st, "rightOuter")
    st.test_stream(
        agg,
        "append",
        MultiAddData(
            AddData(input2, ("1", _at("2023-01-01 01:00:10")), ("2", _at("2023-01-01 01:00:30"))),
            AddData(input1, ("1", _at("2023-01-01 01:00:20"))),
        ),
        CheckAnswer(),
        MultiAddData(
            AddData(input2, ("5", _at("2023-01-01 01:15:00"))),
            AddData(input1, ("6", _at("2023-01-01 01:15:00"))),
        ),
        CheckAnswer(),
        MultiAddData(
            AddData(input2, ("5", _at("2023-01-01 02:16:00"))),
            AddData(input1, ("6", _at("2023-01-01 02:16:00"))),
        ),
        CheckAnswer(("2023-01-01 01:00:00", "2023-01-01 01:10:00", 2)),
    )


def test_time_window_agg_per_source_then_stream_stream_join(st) -> None:
    # SPARK-49829: both sides emit their windows in the batch that also evicts them from the
    # join's state; the join still matches them in that batch
    input_stream1 = st.memory_stream("value bigint")
    input_stream2 = st.memory_stream("value bigint")
    df1 = (
        input_stream1.toDF()
        .selectExpr("value", "timestamp_seconds(value) AS ts")
        .withWatermark("ts", "5 seconds")
    )
    df2 = (
        input_stream2.toDF()
        .selectExpr("value", "timestamp_seconds(value) AS ts")
        .withWatermark("ts", "5 seconds")
    )
    df1_window = df1.groupBy(F.window(F.col("ts"), "10 seconds")).agg(
        F.sum("value").alias("sum_df1")
    )
    df2_window = df2.groupBy(F.window(F.col("ts"), "10 seconds")).agg(
        F.sum("value").alias("sum_df2")
    )
    joined = df1_window.join(df2_window, "window", "inner").selectExpr(
        "CAST(window.end AS long) AS window_end", "sum_df1", "sum_df2"
    )
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(input_stream1, 1, 2, 3, 4, 5), AddData(input_stream2, 5, 6, 7, 8, 9)),
        CheckNewAnswer(),  # watermark 5 - 5 = 0
        MultiAddData(
            AddData(input_stream1, 11, 12, 13, 14, 15),
            AddData(input_stream2, 15, 16, 17, 18, 19),
        ),
        CheckNewAnswer((10, 15, 35)),  # watermark 15 - 5 = 10: [0, 10) complete
        MultiAddData(AddData(input_stream1, 100), AddData(input_stream2, 101)),
        CheckNewAnswer((20, 65, 85)),  # watermark 100 - 5 = 95: [0, 20) complete
    )
