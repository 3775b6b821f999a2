"""Spark's ``StreamingJoinSuite`` (Scala), its ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/StreamingJoinSuite.scala``
in Apache Spark (its inner, outer, full outer and left semi suites): the same inputs, query and
expected answers, each side's input wrapped (``stream_test.py``), run on both providers. A
``MemoryStream[Int]`` is ``value int``, a tuple stream ``_1 ..., _2 ...``; its file source makes
every column nullable, as Spark's ``MemoryStream[JInteger]`` is.

The left semi suite's answers are the suite's; its state row counts are those of the Spark these
tests run against (4.3), whose left semi join keeps a left row only until it has matched (a row
that matches as it arrives is not kept, a kept one leaves the state when a right row matches it).
The suite as stored predates that: its counts are noted beside each.

=========================================================  =========================================
Spark's test                                               here
=========================================================  =========================================
StreamingInnerJoinSuite:
stream stream inner join on non-time column                ported
stream stream inner join on windows - without watermark    ported
stream stream inner join on windows - with watermark       ported
... with time range - with watermark - one side condition  ported
... with time range - with watermark - two side conditions ported
stream stream inner join without equality predicate        left out: no ``testStream`` (the
                                                           refusal is tests/engine/test_join.py's)
stream stream self join                                    ported
locality preferences of StateStoreAwareZippedRDD           left out: internal RDD and
                                                           coordinator classes
join between three streams                                 ported
streaming join should require                              ported without its ``Execute``, which
StatefulOpClusteredDistribution from children              matches Spark's physical plan classes
SPARK-26187 restore the stream-stream inner join query     left out: a checkpoint written by
from Spark 2.4                                             Spark 2.4 (a test resource)
SPARK-48687 ... changing the join condition (key schema)   left out: a checkpoint written by
                                                           Spark 3.5 (a test resource)
SPARK-48687 ... changing the value schema                  left out: the same
SPARK-35896: metrics in StateOperatorProgress              ported
joining non-nullable left join key with nullable right     ported
joining nullable left join key with non-nullable right     ported
joining nullable left join key with nullable right         ported
StreamingOuterJoinSuite:
left outer early state exclusion on left                   ported
left outer early state exclusion on right                  ported
right outer early state exclusion on left                  ported
right outer early state exclusion on right                 ported
windowed left outer join                                   ported
windowed right outer join                                  ported
left outer with watermark range condition                  ported (its three ``testStream``
                                                           runs: seconds, and two spellings of
                                                           a minutes-and-seconds bound)
right outer with watermark range condition                 ported (the same three)
left outer join with non-key condition violated            ported
SPARK-26187 self left outer join should not return outer   ported
nulls for already matched rows
SPARK-26187 self right outer join should not return outer  ported
nulls for already matched rows
SPARK-26187 restore the stream-stream outer join query     left out: a checkpoint written by
from Spark 2.4                                             Spark 2.4 (a test resource)
SPARK-29438: ensure UNION doesn't lead stream-stream join  left out: ``MemoryStream``'s number
to use shifted partition IDs                               of partitions, changed on restart
SPARK-32148 stream-stream join regression on Spark 3.0.0   ported
left-outer: joining non-nullable left join key with        ported
nullable right join key
left-outer: joining nullable left join key with            ported
non-nullable right join key
left-outer: joining nullable left join key with nullable   ported
right join key
SPARK-38684: outer join works correctly even if            ported (no-data batches off; Spark's
processing input rows and evicting state rows for same     own operator on RocksDB, as the test
grouping key happens in the same micro-batch               sets)
StreamingFullOuterJoinSuite:
windowed full outer join                                   ported
full outer early state exclusion on left                   ported
full outer early state exclusion on right                  ported
full outer join with watermark range condition             ported
self full outer join                                       ported
StreamingLeftSemiJoinSuite:
windowed left semi join                                    ported
left semi early state exclusion on left                    ported
left semi early state exclusion on right                   ported
left semi join with watermark range condition              ported
self left semi join                                        ported
=========================================================  =========================================
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
    StartStream,
    StopStream,
    assertNumStateRows,
    assertStateOperatorProgressMetric,
)

pytestmark = pytest.mark.spark

Ts = dt.datetime


# --- the suite's query builders (StreamingJoinSuite's setup methods) ------------------------


def setup_stream(st: Any, prefix: str, multiplier: int) -> tuple[Any, Any]:
    input_data = st.memory_stream("value int")
    df = (
        input_data.toDF()
        .select(
            F.col("value").alias("key"),
            F.timestamp_seconds(F.col("value")).alias(f"{prefix}Time"),
            (F.col("value") * multiplier).alias(f"{prefix}Value"),
        )
        .withWatermark(f"{prefix}Time", "10 seconds")
    )
    return input_data, df


def setup_windowed_join(st: Any, join_type: str) -> tuple[Any, Any, Any]:
    input1, df1 = setup_stream(st, "left", 2)
    input2, df2 = setup_stream(st, "right", 3)
    windowed1 = df1.select("key", F.window(F.col("leftTime"), "10 second"), "leftValue")
    windowed2 = df2.select("key", F.window(F.col("rightTime"), "10 second"), "rightValue")
    joined = windowed1.join(windowed2, ["key", "window"], join_type)
    end = F.col("window.end").cast("long")
    if join_type == "left_semi":
        select = joined.select("key", end, "leftValue")
    else:
        select = joined.select("key", end, "leftValue", "rightValue")
    return input1, input2, select


def _windowed_sides(st: Any) -> tuple[Any, Any, Any, Any]:
    left_input, df1 = setup_stream(st, "left", 2)
    right_input, df2 = setup_stream(st, "right", 3)
    # Different schemas, so that a null row is seen to come from the right side.
    left = df1.select("key", F.window(F.col("leftTime"), "10 second"), "leftValue")
    right = df2.select(
        "key", F.window(F.col("rightTime"), "10 second"), F.col("rightValue").cast("string")
    )
    return left_input, right_input, left, right


def _select_by_join_type(joined: Any, left: Any, right: Any, join_type: str) -> Any:
    if join_type == "left_semi":
        return joined.select(left["key"], left["window.end"].cast("long"), "leftValue")
    if join_type == "left_outer":
        return joined.select(
            left["key"], left["window.end"].cast("long"), "leftValue", "rightValue"
        )
    if join_type == "right_outer":
        return joined.select(
            right["key"], right["window.end"].cast("long"), "leftValue", "rightValue"
        )
    return joined.select(
        left["key"],
        left["window.end"].cast("long"),
        "leftValue",
        right["key"],
        right["window.end"].cast("long"),
        "rightValue",
    )


def setup_windowed_join_with_left_condition(st: Any, join_type: str) -> tuple[Any, Any, Any]:
    left_input, right_input, left, right = _windowed_sides(st)
    joined = left.join(
        right,
        (left["key"] == right["key"])
        & (left["window"] == right["window"])
        & (F.col("leftValue") > 4),
        join_type,
    )
    return left_input, right_input, _select_by_join_type(joined, left, right, join_type)


def setup_windowed_join_with_right_condition(st: Any, join_type: str) -> tuple[Any, Any, Any]:
    left_input, right_input, left, right = _windowed_sides(st)
    joined = left.join(
        right,
        (left["key"] == right["key"])
        & (left["window"] == right["window"])
        & (F.col("rightValue").cast("int") > 7),
        join_type,
    )
    return left_input, right_input, _select_by_join_type(joined, left, right, join_type)


def setup_join_with_range_condition(
    st: Any,
    join_type: str,
    watermark: str = "10 seconds",
    lower_bound: str = "interval 5 seconds",
    upper_bound: str = "interval 5 seconds",
) -> tuple[Any, Any, Any]:
    left_input = st.memory_stream("_1 int, _2 int")
    right_input = st.memory_stream("_1 int, _2 int")
    df1 = (
        left_input.toDF()
        .toDF("leftKey", "time")
        .select(
            "leftKey",
            F.timestamp_seconds(F.col("time")).alias("leftTime"),
            (F.col("leftKey") * 2).alias("leftValue"),
        )
        .withWatermark("leftTime", watermark)
    )
    df2 = (
        right_input.toDF()
        .toDF("rightKey", "time")
        .select(
            "rightKey",
            F.timestamp_seconds(F.col("time")).alias("rightTime"),
            (F.col("rightKey") * 3).alias("rightValue"),
        )
        .withWatermark("rightTime", watermark)
    )
    joined = df1.join(
        df2,
        F.expr(
            "leftKey = rightKey AND "
            f"leftTime BETWEEN rightTime - {lower_bound} AND rightTime + {upper_bound}"
        ),
        join_type,
    )
    if join_type == "left_semi":
        select = joined.select("leftKey", F.col("leftTime").cast("int"))
    else:
        select = joined.select(
            "leftKey", "rightKey", F.col("leftTime").cast("int"), F.col("rightTime").cast("int")
        )
    return left_input, right_input, select


def setup_self_join(st: Any, join_type: str) -> tuple[Any, Any]:
    input_stream = st.memory_stream("_1 int, _2 long")
    df = input_stream.toDF().select(
        F.col("_1").alias("value"), F.timestamp_seconds(F.col("_2")).alias("timestamp")
    )
    left_stream = df.select(F.col("value").alias("leftId"), F.col("timestamp").alias("leftTime"))
    right_stream = df.where(F.col("value") % 2 == 0).select(  # misses, for ease of debugging
        F.col("value").alias("rightId"), F.col("timestamp").alias("rightTime")
    )
    joined = left_stream.withWatermark("leftTime", "5 seconds").join(
        right_stream.withWatermark("rightTime", "5 seconds"),
        F.expr(
            "leftId = rightId AND rightTime >= leftTime AND "
            "rightTime <= leftTime + interval 5 seconds"
        ),
        join_type,
    )
    if join_type == "left_semi":
        select = joined.select(F.col("leftId"), F.col("leftTime").cast("int"))
    else:
        select = joined.select(
            F.col("leftId"),
            F.col("leftTime").cast("int"),
            F.col("rightId"),
            F.col("rightTime").cast("int"),
        )
    return input_stream, select


# --- StreamingInnerJoinSuite --------------------------------------------------------------


def test_inner_join_on_non_time_column(st) -> None:
    input1 = st.memory_stream("value int")
    input2 = st.memory_stream("value int")
    df1 = input1.toDF().select(F.col("value").alias("key"), (F.col("value") * 2).alias("leftValue"))
    df2 = input2.toDF().select(
        F.col("value").alias("key"), (F.col("value") * 3).alias("rightValue")
    )
    joined = df1.join(df2, "key")
    st.test_stream(
        joined,
        "append",
        AddData(input1, 1),
        CheckAnswer(),
        AddData(input2, 1, 10),  # 1 arrived on input1 first, then input2: joins
        CheckNewAnswer((1, 2, 3)),
        AddData(input1, 10),  # 10 arrived on input2 first, then input1: joins
        CheckNewAnswer((10, 20, 30)),
        AddData(input2, 1),  # another 1 in input2 joins the 1 of input1
        CheckNewAnswer((1, 2, 3)),
        StopStream,
        StartStream(),
        AddData(input1, 1),  # both 1s of input2 kept in state: two rows
        CheckNewAnswer((1, 2, 3), (1, 2, 3)),
        StopStream,
        StartStream(),
        AddData(input1, 100),
        AddData(input2, 100),
        CheckNewAnswer((100, 200, 300)),
    )


def _windowed_inner(st: Any, left_watermark: bool) -> tuple[Any, Any, Any]:
    input1 = st.memory_stream("value int")
    input2 = st.memory_stream("value int")
    df1 = input1.toDF().select(
        F.col("value").alias("key"),
        F.timestamp_seconds(F.col("value")).alias("timestamp"),
        (F.col("value") * 2).alias("leftValue"),
    )
    if left_watermark:
        df1 = df1.withWatermark("timestamp", "10 seconds")
    df1 = df1.select("key", F.window(F.col("timestamp"), "10 second"), "leftValue")
    df2 = (
        input2.toDF()
        .select(
            F.col("value").alias("key"),
            F.timestamp_seconds(F.col("value")).alias("timestamp"),
            (F.col("value") * 3).alias("rightValue"),
        )
        .select("key", F.window(F.col("timestamp"), "10 second"), "rightValue")
    )
    joined = df1.join(df2, ["key", "window"]).select(
        "key", F.col("window.end").cast("long"), "leftValue", "rightValue"
    )
    return input1, input2, joined


def test_inner_join_on_windows_without_watermark(st) -> None:
    input1, input2, joined = _windowed_inner(st, left_watermark=False)
    st.test_stream(
        joined,
        "append",
        AddData(input1, 1),
        CheckNewAnswer(),
        AddData(input2, 1),
        CheckNewAnswer((1, 10, 2, 3)),
        StopStream,
        StartStream(),
        AddData(input1, 25),
        CheckNewAnswer(),
        StopStream,
        StartStream(),
        AddData(input2, 25),
        CheckNewAnswer((25, 30, 50, 75)),
        AddData(input1, 1),
        CheckNewAnswer((1, 10, 2, 3)),  # the state of 1 kept: there is no watermark
        StopStream,
        StartStream(),
        AddData(input1, 5),
        CheckNewAnswer(),
        AddData(input2, 5),
        CheckNewAnswer((5, 10, 10, 15)),  # nothing filtered by a watermark
    )


def test_inner_join_on_windows_with_watermark(st) -> None:
    input1, input2, joined = _windowed_inner(st, left_watermark=True)
    st.test_stream(
        joined,
        "append",
        AddData(input1, 1),
        CheckAnswer(),
        assertNumStateRows(total=1, updated=1),
        AddData(input2, 1),
        CheckAnswer((1, 10, 2, 3)),
        assertNumStateRows(total=2, updated=1),
        StopStream,
        StartStream(),
        AddData(input1, 25),
        CheckNewAnswer(),  # watermark 15: the no-data batch removes the 2 rows of [0, 10]
        assertNumStateRows(total=1, updated=1),
        AddData(input2, 25),
        CheckNewAnswer((25, 30, 50, 75)),
        assertNumStateRows(total=2, updated=1),
        StopStream,
        StartStream(),
        AddData(input2, 1),
        CheckNewAnswer(),  # no join: below 15, removed
        assertNumStateRows(total=2, updated=0),  # not added: 1 < the state key watermark 15
        AddData(input1, 5),
        CheckNewAnswer(),  # the same
        assertNumStateRows(total=2, updated=0, droppedByWatermark=1),
    )


def _range_sides(st: Any, left_delay: str, right_delay: str) -> tuple[Any, Any, Any, Any]:
    left_input = st.memory_stream("_1 int, _2 int")
    right_input = st.memory_stream("_1 int, _2 int")
    df1 = (
        left_input.toDF()
        .toDF("leftKey", "time")
        .select(
            "leftKey",
            F.timestamp_seconds(F.col("time")).alias("leftTime"),
            (F.col("leftKey") * 2).alias("leftValue"),
        )
        .withWatermark("leftTime", left_delay)
    )
    df2 = (
        right_input.toDF()
        .toDF("rightKey", "time")
        .select(
            "rightKey",
            F.timestamp_seconds(F.col("time")).alias("rightTime"),
            (F.col("rightKey") * 3).alias("rightValue"),
        )
        .withWatermark("rightTime", right_delay)
    )
    return left_input, right_input, df1, df2


def test_inner_join_time_range_one_side_condition(st) -> None:
    left_input, right_input, df1, df2 = _range_sides(st, "10 seconds", "10 seconds")
    joined = df1.join(
        df2, F.expr("leftKey = rightKey AND leftTime < rightTime - interval 5 seconds")
    ).select("leftKey", F.col("leftTime").cast("int"), F.col("rightTime").cast("int"))
    st.test_stream(
        joined,
        "append",
        AddData(left_input, (1, 5)),
        CheckAnswer(),
        AddData(right_input, (1, 11)),
        CheckNewAnswer((1, 5, 11)),
        AddData(right_input, (1, 10)),
        CheckNewAnswer(),  # no match: leftTime 5 is not < rightTime 10 - 5
        assertNumStateRows(total=3, updated=3),
        # The watermark to 20 s: time 30 on both inputs.
        AddData(left_input, (1, 3), (1, 30)),
        CheckNewAnswer((1, 3, 10), (1, 3, 11)),
        assertNumStateRows(total=5, updated=2),
        AddData(right_input, (0, 30)),
        CheckNewAnswer(),
        # Watermark 20: the right state keeps rightTime > 25; (1, 11) and (1, 10) removed.
        assertNumStateRows(total=4, updated=1),
        # (1, 20) dropped by the watermark; (1, 21) matches, not kept (21 < 25); (1, 28) kept.
        AddData(right_input, (1, 20), (1, 21), (1, 28)),
        CheckNewAnswer((1, 3, 21), (1, 5, 21), (1, 3, 28), (1, 5, 28)),
        assertNumStateRows(total=5, updated=1, droppedByWatermark=1),
        # leftTime <= 20 dropped by the watermark.
        AddData(left_input, (1, 20), (1, 21)),
        CheckNewAnswer((1, 21, 28)),
        assertNumStateRows(total=6, updated=1, droppedByWatermark=1),
    )


def test_inner_join_time_range_two_side_conditions(st) -> None:
    left_input, right_input, df1, df2 = _range_sides(st, "20 seconds", "30 seconds")
    condition = F.expr(
        "leftKey = rightKey AND "
        "leftTime BETWEEN rightTime - interval 10 seconds AND rightTime + interval 5 seconds"
    )
    joined = df1.join(df2, condition).select(
        "leftKey", F.col("leftTime").cast("int"), F.col("rightTime").cast("int")
    )
    st.test_stream(
        joined,
        "append",
        # leftTime 20 matches rightTime in [15, 30] only.
        AddData(left_input, (1, 20)),
        CheckAnswer(),
        AddData(right_input, (1, 14), (1, 15), (1, 25), (1, 26), (1, 30), (1, 31)),
        CheckNewAnswer((1, 20, 15), (1, 20, 25), (1, 20, 26), (1, 20, 30)),
        assertNumStateRows(total=7, updated=7),
        # rightTime 60 matches leftTime in [50, 65] only.
        AddData(right_input, (1, 60)),
        CheckNewAnswer(),
        AddData(left_input, (1, 49), (1, 50), (1, 65), (1, 66)),
        CheckNewAnswer((1, 50, 60), (1, 65, 60)),
        # Watermark min(46, 30) = 30: the right state drops < 25 (14 and 15).
        assertNumStateRows(total=10, updated=5),
        AddData(left_input, (1, 30), (1, 31)),  # 30 dropped by the watermark
        CheckNewAnswer((1, 31, 26), (1, 31, 30), (1, 31, 31)),
        assertNumStateRows(total=11, updated=1, droppedByWatermark=1),
        AddData(right_input, (1, 80)),
        CheckNewAnswer(),
        # Watermark min(46, 50) = 46: left drops < 36, right drops < 41.
        assertNumStateRows(total=6, updated=1),
        AddData(right_input, (1, 46), (1, 50)),  # 46 dropped by the watermark
        CheckNewAnswer((1, 49, 50), (1, 50, 50)),
        assertNumStateRows(total=7, updated=1, droppedByWatermark=1),
    )


def test_self_join(st) -> None:
    input_data = st.memory_stream("value int")
    df = input_data.toDF()
    join = df.select((F.col("value") % 5).alias("key"), "value").join(
        df.select((F.col("value") % 5).alias("key"), "value"), "key"
    )
    st.test_stream(
        join,
        "append",
        AddData(input_data, 1, 2),
        CheckAnswer((1, 1, 1), (2, 2, 2)),
        StopStream,
        StartStream(),
        AddData(input_data, 3, 6),
        CheckAnswer((3, 3, 3), (1, 1, 1), (1, 1, 6), (2, 2, 2), (1, 6, 1), (1, 6, 6)),
    )


def test_join_between_three_streams(st) -> None:
    input1 = st.memory_stream("value int")
    input2 = st.memory_stream("value int")
    input3 = st.memory_stream("value int")
    df1 = input1.toDF().select(
        F.col("value").alias("leftKey"), (F.col("value") * 2).alias("leftValue")
    )
    df2 = input2.toDF().select(
        F.col("value").alias("middleKey"), (F.col("value") * 3).alias("middleValue")
    )
    df3 = input3.toDF().select(
        F.col("value").alias("rightKey"), (F.col("value") * 5).alias("rightValue")
    )
    joined = df1.join(df2, F.expr("leftKey = middleKey")).join(df3, F.expr("rightKey = middleKey"))
    st.test_stream(
        joined,
        "append",
        AddData(input1, 1, 5),
        AddData(input2, 1, 5, 10),
        AddData(input3, 5, 10),
        CheckNewAnswer((5, 10, 5, 15, 5, 25)),
    )


def test_join_of_a_repartitioned_side(st) -> None:
    """``streaming join should require StatefulOpClusteredDistribution from children``."""
    input1 = st.memory_stream("value int")
    input2 = st.memory_stream("value int")
    df1 = input1.toDF().select(F.col("value").alias("a"), (F.col("value") * 2).alias("b"))
    df2 = (
        input2.toDF()
        .select(F.col("value").alias("a"), (F.col("value") * 2).alias("b"))
        .repartition(F.col("b"))
    )
    joined = df1.join(df2, ["a", "b"]).select("a")
    st.test_stream(
        joined,
        "append",
        AddData(input1, *range(1, 1001)),
        AddData(input2, *range(1, 1001)),
        CheckAnswer(*range(1, 1001)),
    )


def test_metrics_in_state_operator_progress(st) -> None:
    """SPARK-35896: metrics in StateOperatorProgress are output correctly."""
    input1, input2, joined = _windowed_inner(st, left_watermark=True)
    st.test_stream(
        joined,
        "append",
        StartStream(confs={"spark.sql.shuffle.partitions": "3"}),
        AddData(input1, 1),
        CheckAnswer(),
        assertStateOperatorProgressMetric(
            operatorName="symmetricHashJoin", numShufflePartitions=3, numStateStoreInstances=12
        ),
        AddData(input2, 1),
        CheckAnswer((1, 10, 2, 3)),
        assertNumStateRows(total=[2], updated=[1], droppedByWatermark=[0], removed=[0]),
        AddData(input1, 25),
        CheckNewAnswer(),  # watermark 15: the no-data batch removes the 2 rows of [0, 10]
        assertNumStateRows(total=[1], updated=[1], droppedByWatermark=[0], removed=[2]),
        AddData(input2, 25),
        CheckNewAnswer((25, 30, 50, 75)),
        assertNumStateRows(total=[2], updated=[1], droppedByWatermark=[0], removed=[0]),
    )


def _join_key_nullability(left: Any, right: Any) -> Any:
    df1 = left.selectExpr("value as leftKey", "value * 2 as leftValue")
    df2 = right.selectExpr("value as rightKey", "value * 3 as rightValue")
    return df1.join(df2, F.expr("leftKey <=> rightKey")).select(
        "leftKey", "rightKey", "leftValue", "rightValue"
    )


def test_non_nullable_left_key_with_nullable_right_key(st) -> None:
    input1 = st.memory_stream("value int")
    input2 = st.memory_stream("value int")
    joined = _join_key_nullability(input1.toDF(), input2.toDF())
    st.test_stream(
        joined,
        "append",
        AddData(input1, 1, 5),
        AddData(input2, 1, 5, 10, None),
        CheckNewAnswer((1, 1, 2, 3), (5, 5, 10, 15)),
    )


def test_nullable_left_key_with_non_nullable_right_key(st) -> None:
    input1 = st.memory_stream("value int")
    input2 = st.memory_stream("value int")
    joined = _join_key_nullability(input1.toDF(), input2.toDF())
    st.test_stream(
        joined,
        "append",
        AddData(input1, 1, 5, 10, None),
        AddData(input2, 1, 5),
        CheckNewAnswer((1, 1, 2, 3), (5, 5, 10, 15)),
    )


def test_nullable_left_key_with_nullable_right_key(st) -> None:
    input1 = st.memory_stream("value int")
    input2 = st.memory_stream("value int")
    joined = _join_key_nullability(input1.toDF(), input2.toDF())
    st.test_stream(
        joined,
        "append",
        AddData(input1, 1, 5, 10, None),
        AddData(input2, 1, 5, None),
        CheckNewAnswer((1, 1, 2, 3), (5, 5, 10, 15), (None, None, None, None)),
    )


# --- StreamingOuterJoinSuite --------------------------------------------------------------


def test_left_outer_early_state_exclusion_on_left(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_left_condition(st, "left_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 1, 2, 3), AddData(right_input, 3, 4, 5)),
        # Left rows with leftValue <= 4 come out with nulls now, not kept in state.
        CheckNewAnswer((3, 10, 6, "9"), (1, 10, 2, None), (2, 10, 4, None)),
        assertNumStateRows(total=4, updated=4),
        # No more outer rows when the watermark moves.
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer(),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40, "60")),
    )


def test_left_outer_early_state_exclusion_on_right(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_right_condition(st, "left_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 3, 4, 5), AddData(right_input, 1, 2, 3)),
        # Right rows with rightValue <= 7 never kept; 9 > 7 joins and is kept.
        CheckNewAnswer((3, 10, 6, "9")),
        assertNumStateRows(total=4, updated=4),
        # Watermark 10: the no-data batch gives the outer rows.
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer((4, 10, 8, None), (5, 10, 10, None)),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40, "60")),
    )


def test_right_outer_early_state_exclusion_on_left(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_left_condition(st, "right_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 1, 2, 3), AddData(right_input, 3, 4, 5)),
        # Left rows with leftValue <= 4 never kept; 6 > 4 joins and is kept.
        CheckNewAnswer((3, 10, 6, "9")),
        assertNumStateRows(total=4, updated=4),
        # Watermark 10: the no-data batch gives the outer rows.
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer((4, 10, None, "12"), (5, 10, None, "15")),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40, "60")),
    )


def test_right_outer_early_state_exclusion_on_right(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_right_condition(st, "right_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 3, 4, 5), AddData(right_input, 1, 2, 3)),
        # Right rows with rightValue <= 7 come out with nulls now, not kept in state.
        CheckNewAnswer((3, 10, 6, "9"), (1, 10, None, "3"), (2, 10, None, "6")),
        assertNumStateRows(total=4, updated=4),
        # No more outer rows when the watermark moves.
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer(),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40, "60")),
    )


def test_windowed_left_outer_join(st) -> None:
    left_input, right_input, joined = setup_windowed_join(st, "left_outer")
    st.test_stream(
        joined,
        "append",
        # The inner part of the join.
        MultiAddData(AddData(left_input, 1, 2, 3, 4, 5), AddData(right_input, 3, 4, 5, 6, 7)),
        CheckNewAnswer((3, 10, 6, 9), (4, 10, 8, 12), (5, 10, 10, 15)),
        # Watermark 11: the no-data batch gives the outer rows.
        MultiAddData(AddData(left_input, 21), AddData(right_input, 22)),
        CheckNewAnswer((1, 10, 2, None), (2, 10, 4, None)),
        assertNumStateRows(total=2, updated=12),
        AddData(left_input, 22),
        CheckNewAnswer((22, 30, 44, 66)),
        assertNumStateRows(total=3, updated=1),
    )


def test_windowed_right_outer_join(st) -> None:
    left_input, right_input, joined = setup_windowed_join(st, "right_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 1, 2, 3, 4, 5), AddData(right_input, 3, 4, 5, 6, 7)),
        CheckNewAnswer((3, 10, 6, 9), (4, 10, 8, 12), (5, 10, 10, 15)),
        MultiAddData(AddData(left_input, 21), AddData(right_input, 22)),
        CheckNewAnswer((6, 10, None, 18), (7, 10, None, 21)),
        assertNumStateRows(total=2, updated=12),
        AddData(left_input, 22),
        CheckNewAnswer((22, 30, 44, 66)),
        assertNumStateRows(total=3, updated=1),
    )


OUTER_RESULTS = {"left_outer": (3, None, 5, None), "right_outer": (None, 2, None, 5)}


@pytest.mark.parametrize("join_type", list(OUTER_RESULTS))
def test_outer_with_watermark_range_condition(st, join_type: str) -> None:
    outer_result = OUTER_RESULTS[join_type]
    left_input, right_input, joined = setup_join_with_range_condition(st, join_type)
    st.test_stream(
        joined,
        "append",
        AddData(left_input, (1, 5), (3, 5)),
        CheckAnswer(),
        AddData(right_input, (1, 10), (2, 5)),
        CheckNewAnswer((1, 1, 5, 10)),
        AddData(right_input, (1, 11)),
        CheckNewAnswer(),  # no match: the left time is too low
        assertNumStateRows(total=5, updated=5),
        # The watermark to 20 s: time 30 on both inputs.
        AddData(left_input, (1, 7), (1, 30)),
        CheckNewAnswer((1, 1, 7, 10), (1, 1, 7, 11)),
        assertNumStateRows(total=7, updated=2),
        AddData(right_input, (0, 30)),  # watermark 20: the no-data batch gives the nulls
        CheckNewAnswer(outer_result),
        assertNumStateRows(total=2, updated=1),
    )


@pytest.mark.parametrize(
    "bound", ["interval 3 minutes 30 seconds", "interval '3:30' minute to second"]
)
@pytest.mark.parametrize("join_type", list(OUTER_RESULTS))
def test_outer_with_watermark_range_condition_in_minutes(st, join_type: str, bound: str) -> None:
    """The same Scala test's two other runs: a 10-minute watermark, bounds of 3 min 30 s."""
    outer_result = OUTER_RESULTS[join_type]
    left_input, right_input, joined = setup_join_with_range_condition(
        st, join_type, "10 minutes", bound, bound
    )
    st.test_stream(
        joined,
        "append",
        AddData(left_input, (1, 210), (3, 5)),
        CheckAnswer(),
        AddData(right_input, (1, 300), (2, 5)),
        CheckNewAnswer((1, 1, 210, 300)),
        AddData(right_input, (1, 450)),
        CheckNewAnswer(),
        assertNumStateRows(total=5, updated=5),
        AddData(left_input, (1, 260), (1, 1800)),
        CheckNewAnswer((1, 1, 260, 300), (1, 1, 260, 450)),
        assertNumStateRows(total=7, updated=2),
        AddData(right_input, (0, 1800)),
        CheckNewAnswer(outer_result),
        assertNumStateRows(total=2, updated=1),
    )


def test_left_outer_join_with_non_key_condition_violated(st) -> None:
    """Where the condition is false, the outer row comes out even though the keys match."""
    left_input, simple_left = setup_stream(st, "left", 2)
    right_input, simple_right = setup_stream(st, "right", 3)
    left = simple_left.select("key", F.window(F.col("leftTime"), "10 second"), "leftValue")
    right = simple_right.select("key", F.window(F.col("rightTime"), "10 second"), "rightValue")
    joined = left.join(
        right,
        (left["key"] == right["key"])
        & (left["window"] == right["window"])
        & (F.col("leftValue") > 10)
        & ((F.col("rightValue") < 300) | (F.col("rightValue") > 1000)),
        "left_outer",
    ).select(left["key"], left["window.end"].cast("long"), "leftValue", "rightValue")
    st.test_stream(
        joined,
        "append",
        # leftValue <= 10: outer rows though the right keys match.
        MultiAddData(AddData(left_input, 1, 2, 3), AddData(right_input, 1, 2, 3)),
        CheckNewAnswer((1, 10, 2, None), (2, 10, 4, None), (3, 10, 6, None)),
        assertNumStateRows(total=3, updated=3),  # only the right 1, 2, 3 kept
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),  # watermark 10
        CheckNewAnswer(),
        assertNumStateRows(total=2, updated=2),  # only 20 and 21 left
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40, 60)),
        assertNumStateRows(total=3, updated=1),
        # Both values meeting the condition: no outer rows.
        MultiAddData(AddData(left_input, 40, 41), AddData(right_input, 40, 41)),  # watermark 31
        CheckNewAnswer((40, 50, 80, 120), (41, 50, 82, 123)),
        assertNumStateRows(total=4, updated=4),
        MultiAddData(AddData(left_input, 70), AddData(right_input, 71)),  # watermark 60
        CheckNewAnswer(),
        assertNumStateRows(total=2, updated=2),  # only 70 and 71 left
        AddData(right_input, 70),
        CheckNewAnswer((70, 80, 140, 210)),
        assertNumStateRows(total=3, updated=1),
        # rightValue between 300 and 1000: outer rows though the left keys match.
        MultiAddData(
            AddData(left_input, 101, 102, 103), AddData(right_input, 101, 102, 103)
        ),  # watermark 91
        CheckNewAnswer(),
        assertNumStateRows(total=6, updated=3),
        MultiAddData(AddData(left_input, 1000), AddData(right_input, 1001)),
        CheckNewAnswer((101, 110, 202, None), (102, 110, 204, None), (103, 110, 206, None)),
        assertNumStateRows(total=2, updated=2),
    )


def test_self_left_outer_join_no_outer_nulls_for_matched_rows(st) -> None:
    """SPARK-26187: a self left outer join gives no outer nulls for rows already matched."""
    input_stream, query = setup_self_join(st, "left_outer")
    st.test_stream(
        query,
        "append",
        AddData(input_stream, (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)),
        CheckNewAnswer((2, 2, 2, 2), (4, 4, 4, 4)),
        assertNumStateRows(7, 7),
        AddData(input_stream, (6, 6), (7, 7), (8, 8), (9, 9), (10, 10)),
        CheckNewAnswer((6, 6, 6, 6), (8, 8, 8, 8), (10, 10, 10, 10)),
        assertNumStateRows(13, 8),
        AddData(input_stream, (11, 11), (12, 12), (13, 13), (14, 14), (15, 15)),
        CheckNewAnswer((12, 12, 12, 12), (14, 14, 14, 14), (1, 1, None, None), (3, 3, None, None)),
        assertNumStateRows(15, 7),
    )


def test_self_right_outer_join_no_outer_nulls_for_matched_rows(st) -> None:
    """SPARK-26187: the same, left and right swapped, as a right outer join."""
    input_stream = st.memory_stream("_1 int, _2 long")
    df = input_stream.toDF().select(
        F.col("_1").alias("value"), F.timestamp_seconds(F.col("_2")).alias("timestamp")
    )
    left_stream = df.where(F.col("value") % 2 == 0).select(
        F.col("value").alias("leftId"), F.col("timestamp").alias("leftTime")
    )
    right_stream = df.select(F.col("value").alias("rightId"), F.col("timestamp").alias("rightTime"))
    query = (
        left_stream.withWatermark("leftTime", "5 seconds")
        .join(
            right_stream.withWatermark("rightTime", "5 seconds"),
            F.expr(
                "leftId = rightId AND leftTime >= rightTime AND "
                "leftTime <= rightTime + interval 5 seconds"
            ),
            "rightOuter",
        )
        .select(
            F.col("leftId"),
            F.col("leftTime").cast("int"),
            F.col("rightId"),
            F.col("rightTime").cast("int"),
        )
    )
    st.test_stream(
        query,
        "append",
        AddData(input_stream, (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)),
        CheckNewAnswer((2, 2, 2, 2), (4, 4, 4, 4)),
        assertNumStateRows(7, 7),
        AddData(input_stream, (6, 6), (7, 7), (8, 8), (9, 9), (10, 10)),
        CheckNewAnswer((6, 6, 6, 6), (8, 8, 8, 8), (10, 10, 10, 10)),
        assertNumStateRows(13, 8),
        AddData(input_stream, (11, 11), (12, 12), (13, 13), (14, 14), (15, 15)),
        CheckNewAnswer((12, 12, 12, 12), (14, 14, 14, 14), (None, None, 1, 1), (None, None, 3, 3)),
        assertNumStateRows(15, 7),
    )


def _event_streams(st: Any, left_delay: str, right_delay: str, right_name: str) -> Any:
    input1 = st.memory_stream("_1 timestamp, _2 string, _3 string")
    df1 = (
        input1.toDF()
        .selectExpr("_1 as eventTime", "_2 as id", "_3 as comment")
        .withWatermark("eventTime", left_delay)
    )
    input2 = st.memory_stream("_1 timestamp, _2 string, _3 string")
    df2 = (
        input2.toDF()
        .selectExpr("_1 as eventTime", "_2 as id", f"_3 as {right_name}")
        .withWatermark("eventTime", right_delay)
    )
    joined = df1.alias("left").join(
        df2.alias("right"),
        F.expr(
            """
            left.id = right.id AND left.eventTime BETWEEN
              right.eventTime - INTERVAL 30 seconds AND
              right.eventTime + INTERVAL 30 seconds
            """
        ),
        "leftOuter",
    )
    return input1, input2, joined


def test_stream_stream_join_regression_on_spark_3_0_0(st) -> None:
    """SPARK-32148."""
    input1, input2, joined = _event_streams(st, "2 minutes", "4 minutes", "name")
    st.test_stream(
        joined,
        "append",
        MultiAddData(
            AddData(
                input1,
                (Ts(2020, 1, 1, 0, 0, 0), "abc", "has no join partner"),
                (Ts(2020, 1, 2, 0, 0, 0), "abc", "joined with A"),
                (Ts(2020, 1, 2, 1, 0, 0), "abc", "joined with B"),
            ),
            AddData(
                input2,
                (Ts(2020, 1, 2, 0, 0, 10), "abc", "A"),
                (Ts(2020, 1, 2, 0, 59, 59), "abc", "B"),
                (Ts(2020, 1, 2, 2, 0, 0), "abc", "C"),
            ),
        ),
        CheckNewAnswer(
            (Ts(2020, 1, 1, 0, 0, 0), "abc", "has no join partner", None, None, None),
            (Ts(2020, 1, 2, 0, 0, 0), "abc", "joined with A", Ts(2020, 1, 2, 0, 0, 10), "abc", "A"),
            (
                Ts(2020, 1, 2, 1, 0, 0),
                "abc",
                "joined with B",
                Ts(2020, 1, 2, 0, 59, 59),
                "abc",
                "B",
            ),
        ),
    )


def _left_outer_key_nullability(left: Any, right: Any) -> Any:
    df1 = left.selectExpr(
        "_1 as leftKey1",
        "_2 as leftKey2",
        "timestamp_seconds(_2) as leftTime",
        "_2 * 2 as leftValue",
    ).withWatermark("leftTime", "10 seconds")
    df2 = right.selectExpr(
        "_1 as rightKey1",
        "_2 as rightKey2",
        "timestamp_seconds(_2) as rightTime",
        "_2 * 3 as rightValue",
    ).withWatermark("rightTime", "10 seconds")
    windowed1 = df1.select(
        "leftKey1",
        "leftKey2",
        F.window(F.col("leftTime"), "10 second").alias("leftWindow"),
        "leftValue",
    )
    windowed2 = df2.select(
        "rightKey1",
        "rightKey2",
        F.window(F.col("rightTime"), "10 second").alias("rightWindow"),
        "rightValue",
    )
    return windowed1.join(
        windowed2,
        F.expr("leftKey1 <=> rightKey1 AND leftKey2 = rightKey2 AND leftWindow = rightWindow"),
        "left_outer",
    ).select(
        "leftKey1",
        "rightKey1",
        "leftKey2",
        "rightKey2",
        F.col("leftWindow.end").cast("long"),
        "leftValue",
        "rightValue",
    )


def test_left_outer_non_nullable_left_key_with_nullable_right_key(st) -> None:
    input1 = st.memory_stream("_1 int, _2 int")
    input2 = st.memory_stream("_1 int, _2 int")
    joined = _left_outer_key_nullability(input1.toDF(), input2.toDF())
    st.test_stream(
        joined,
        "append",
        AddData(input1, (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)),
        AddData(input2, (1, 3), (1, 4), (1, 5), (1, 6)),
        CheckNewAnswer((1, 1, 3, 3, 10, 6, 9), (1, 1, 4, 4, 10, 8, 12), (1, 1, 5, 5, 10, 10, 15)),
        AddData(input1, (1, 21)),
        AddData(input2, (1, 22)),  # watermark 11: the no-data batch gives the nulls
        CheckNewAnswer((1, None, 1, None, 10, 2, None), (1, None, 2, None, 10, 4, None)),
    )


def test_left_outer_nullable_left_key_with_non_nullable_right_key(st) -> None:
    input1 = st.memory_stream("_1 int, _2 int")
    input2 = st.memory_stream("_1 int, _2 int")
    joined = _left_outer_key_nullability(input1.toDF(), input2.toDF())
    st.test_stream(
        joined,
        "append",
        AddData(input1, (1, 1), (None, 2), (1, 3), (1, 4), (1, 5)),
        AddData(input2, (1, 3), (1, 4), (1, 5), (1, 6)),
        CheckNewAnswer((1, 1, 3, 3, 10, 6, 9), (1, 1, 4, 4, 10, 8, 12), (1, 1, 5, 5, 10, 10, 15)),
        AddData(input1, (1, 21)),
        AddData(input2, (1, 22)),  # watermark 11: the no-data batch gives the nulls
        CheckNewAnswer((1, None, 1, None, 10, 2, None), (None, None, 2, None, 10, 4, None)),
    )


def test_left_outer_nullable_left_key_with_nullable_right_key(st) -> None:
    input1 = st.memory_stream("_1 int, _2 int")
    input2 = st.memory_stream("_1 int, _2 int")
    joined = _left_outer_key_nullability(input1.toDF(), input2.toDF())
    st.test_stream(
        joined,
        "append",
        AddData(input1, (1, 1), (None, 2), (1, 3), (None, 4), (1, 5)),
        AddData(input2, (1, 3), (None, 4), (1, 5), (1, 6)),
        CheckNewAnswer(
            (1, 1, 3, 3, 10, 6, 9), (None, None, 4, 4, 10, 8, 12), (1, 1, 5, 5, 10, 10, 15)
        ),
        AddData(input1, (1, 21)),
        AddData(input2, (1, 22)),  # watermark 11: the no-data batch gives the nulls
        CheckNewAnswer((1, None, 1, None, 10, 2, None), (None, None, 2, None, 10, 4, None)),
    )


def test_outer_join_evicting_and_processing_the_same_key_in_one_batch(st) -> None:
    """SPARK-38684: outer join works correctly even if processing input rows and evicting
    state rows for the same grouping key happens in the same micro-batch."""
    input1, input2, joined = _event_streams(st, "0 second", "0 second", "comment")
    confs = {
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
    }
    st.test_stream(
        joined,
        "append",
        StartStream(confs=confs),
        MultiAddData(
            AddData(input1, (Ts(2020, 1, 2, 0, 0, 0), "abc", "left in batch 1")),
            AddData(input2, (Ts(2020, 1, 2, 0, 1, 0), "abc", "right in batch 1")),
        ),
        CheckNewAnswer(),
        MultiAddData(
            AddData(input1, (Ts(2020, 1, 2, 1, 0, 0), "abc", "left in batch 2")),
            AddData(input2, (Ts(2020, 1, 2, 1, 1, 0), "abc", "right in batch 2")),
        ),
        CheckNewAnswer(),  # watermark 2020-01-02 00:00:00
        AddData(input1, (Ts(2020, 1, 2, 1, 30, 0), "abc", "left in batch 3")),
        # watermark 2020-01-02 01:00:00
        CheckNewAnswer((Ts(2020, 1, 2, 0, 0, 0), "abc", "left in batch 1", None, None, None)),
        # "left in batch 2" evicted in this batch, "left in batch 3" matched by the new row.
        AddData(input2, (Ts(2020, 1, 2, 1, 30, 10), "abc", "match with left in batch 3")),
        # watermark 2020-01-02 01:01:00
        CheckNewAnswer(
            (Ts(2020, 1, 2, 1, 0, 0), "abc", "left in batch 2", None, None, None),
            (
                Ts(2020, 1, 2, 1, 30, 0),
                "abc",
                "left in batch 3",
                Ts(2020, 1, 2, 1, 30, 10),
                "abc",
                "match with left in batch 3",
            ),
        ),
    )


# --- StreamingFullOuterJoinSuite ----------------------------------------------------------


def test_windowed_full_outer_join(st) -> None:
    left_input, right_input, joined = setup_windowed_join(st, "full_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 1, 2, 3, 4, 5), AddData(right_input, 3, 4, 5, 6, 7)),
        CheckNewAnswer((3, 10, 6, 9), (4, 10, 8, 12), (5, 10, 10, 15)),
        assertNumStateRows(total=10, updated=10),
        MultiAddData(AddData(left_input, 21), AddData(right_input, 22)),
        # Watermark 11: the rows of [0, 10] removed.
        CheckNewAnswer((1, 10, 2, None), (2, 10, 4, None), (6, 10, None, 18), (7, 10, None, 21)),
        assertNumStateRows(total=2, updated=2),
        AddData(left_input, 22),
        CheckNewAnswer((22, 30, 44, 66)),
        assertNumStateRows(total=3, updated=1),
        StopStream,
        StartStream(),
        AddData(left_input, 1),
        CheckNewAnswer(),  # not added: 1 < the state key watermark 12
        assertNumStateRows(total=3, updated=0, droppedByWatermark=1),
        AddData(right_input, 5),
        CheckNewAnswer(),  # not added: 5 < the state key watermark 12
        assertNumStateRows(total=3, updated=0, droppedByWatermark=1),
    )


def test_full_outer_early_state_exclusion_on_left(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_left_condition(st, "full_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 1, 2, 3), AddData(right_input, 3, 4, 5)),
        # Left rows with leftValue <= 4 come out with nulls now, not kept in state.
        CheckNewAnswer(
            (1, 10, 2, None, None, None), (2, 10, 4, None, None, None), (3, 10, 6, 3, 10, "9")
        ),
        assertNumStateRows(total=4, updated=4),
        # The outer rows of every row not matched when the watermark moves.
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer((None, None, None, 4, 10, "12"), (None, None, None, 5, 10, "15")),
        assertNumStateRows(total=2, updated=2),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40, 20, 30, "60")),
        assertNumStateRows(total=3, updated=1),
    )


def test_full_outer_early_state_exclusion_on_right(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_right_condition(st, "full_outer")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 3, 4, 5), AddData(right_input, 1, 2, 3)),
        # Right rows with rightValue <= 7 come out with nulls now, never kept; 9 > 7 is kept.
        CheckNewAnswer(
            (None, None, None, 1, 10, "3"), (None, None, None, 2, 10, "6"), (3, 10, 6, 3, 10, "9")
        ),
        assertNumStateRows(total=4, updated=4),
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer((4, 10, 8, None, None, None), (5, 10, 10, None, None, None)),
        assertNumStateRows(total=2, updated=2),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40, 20, 30, "60")),
        assertNumStateRows(total=3, updated=1),
    )


def test_full_outer_join_with_watermark_range_condition(st) -> None:
    left_input, right_input, joined = setup_join_with_range_condition(st, "full_outer")
    st.test_stream(
        joined,
        "append",
        AddData(left_input, (1, 5), (3, 5)),
        CheckNewAnswer(),
        assertNumStateRows(total=2, updated=2),
        AddData(right_input, (1, 10), (2, 5)),
        CheckNewAnswer((1, 1, 5, 10)),  # matches the left row in state
        assertNumStateRows(total=4, updated=2),
        AddData(right_input, (1, 9)),
        CheckNewAnswer((1, 1, 5, 9)),
        assertNumStateRows(total=5, updated=1),
        # The watermark to 20 s: time 30 on both inputs.
        AddData(left_input, (1, 7), (1, 30)),
        CheckNewAnswer((1, 1, 7, 9), (1, 1, 7, 10)),
        assertNumStateRows(total=7, updated=2),
        # Watermark 20: the outer rows of every row not matched.
        AddData(right_input, (0, 30)),
        CheckNewAnswer((3, None, 5, None), (None, 2, None, 5)),
        assertNumStateRows(total=2, updated=1),
    )


def test_self_full_outer_join(st) -> None:
    input_stream, query = setup_self_join(st, "full_outer")
    st.test_stream(
        query,
        "append",
        AddData(input_stream, (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)),
        CheckNewAnswer((2, 2, 2, 2), (4, 4, 4, 4)),
        assertNumStateRows(total=7, updated=7),
        AddData(input_stream, (6, 6), (7, 7), (8, 8), (9, 9), (10, 10)),
        CheckNewAnswer((6, 6, 6, 6), (8, 8, 8, 8), (10, 10, 10, 10)),
        assertNumStateRows(total=13, updated=8),
        AddData(input_stream, (11, 11), (12, 12), (13, 13), (14, 14), (15, 15)),
        CheckNewAnswer((12, 12, 12, 12), (14, 14, 14, 14), (1, 1, None, None), (3, 3, None, None)),
        assertNumStateRows(total=15, updated=7),
    )


# --- StreamingLeftSemiJoinSuite -----------------------------------------------------------


def test_windowed_left_semi_join(st) -> None:
    left_input, right_input, joined = setup_windowed_join(st, "left_semi")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 1, 2, 3, 4, 5), AddData(right_input, 3, 4, 5, 6, 7)),
        CheckNewAnswer((3, 10, 6), (4, 10, 8), (5, 10, 10)),
        assertNumStateRows(total=7, updated=7),  # the suite: 10, 10 (left 3, 4, 5 kept)
        MultiAddData(AddData(left_input, 21), AddData(right_input, 22)),
        CheckNewAnswer(),  # watermark 11: the rows of [0, 10] removed
        assertNumStateRows(total=2, updated=2),
        AddData(left_input, 22),
        CheckNewAnswer((22, 30, 44)),
        # A left row that matches is not kept in state.
        assertNumStateRows(total=2, updated=0),
        StopStream,
        StartStream(),
        AddData(left_input, 1),
        CheckNewAnswer(),  # not added: 1 < the state key watermark 12
        assertNumStateRows(total=2, updated=0, droppedByWatermark=1),
        AddData(right_input, 5),
        CheckNewAnswer(),  # not added: 5 < the state key watermark 12
        assertNumStateRows(total=2, updated=0, droppedByWatermark=1),
    )


def test_left_semi_early_state_exclusion_on_left(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_left_condition(st, "left_semi")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 1, 2, 3), AddData(right_input, 3, 4, 5)),
        # Left rows with leftValue <= 4 give no row and are not kept.
        CheckNewAnswer((3, 10, 6)),
        assertNumStateRows(total=3, updated=3),  # the suite: 4, 4 (left 3 kept)
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer(),
        assertNumStateRows(total=2, updated=2),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40)),
        assertNumStateRows(total=2, updated=1),  # the suite: 3, 1 (left 20 kept)
    )


def test_left_semi_early_state_exclusion_on_right(st) -> None:
    left_input, right_input, joined = setup_windowed_join_with_right_condition(st, "left_semi")
    st.test_stream(
        joined,
        "append",
        MultiAddData(AddData(left_input, 3, 4, 5), AddData(right_input, 1, 2, 3)),
        # Right rows with rightValue <= 7 never kept; 9 > 7 joins and is kept.
        CheckNewAnswer((3, 10, 6)),
        assertNumStateRows(total=3, updated=3),  # the suite: 4, 4 (left 3 kept)
        MultiAddData(AddData(left_input, 20), AddData(right_input, 21)),
        CheckNewAnswer(),
        assertNumStateRows(total=2, updated=2),
        AddData(right_input, 20),
        CheckNewAnswer((20, 30, 40)),
        assertNumStateRows(total=2, updated=1),  # the suite: 3, 1 (left 20 kept)
    )


def test_left_semi_join_with_watermark_range_condition(st) -> None:
    left_input, right_input, joined = setup_join_with_range_condition(st, "left_semi")
    st.test_stream(
        joined,
        "append",
        AddData(left_input, (1, 5), (3, 5)),
        CheckNewAnswer(),
        assertNumStateRows(total=2, updated=2),
        AddData(right_input, (1, 10), (2, 5)),
        CheckNewAnswer((1, 5)),  # matches the left row in state
        assertNumStateRows(total=3, updated=2),  # the suite: 4, 2 (left (1, 5) kept)
        AddData(right_input, (1, 9)),
        CheckNewAnswer(),  # no row: the left row matched already
        assertNumStateRows(total=4, updated=1),  # the suite: 5, 1
        # The watermark to 20 s: time 30 on both inputs.
        AddData(left_input, (1, 7), (1, 30)),
        CheckNewAnswer((1, 7)),
        assertNumStateRows(total=5, updated=1),  # the suite: 6, 1
        AddData(right_input, (0, 30)),  # watermark 20, no row matches
        CheckNewAnswer(),
        assertNumStateRows(total=2, updated=1),
    )


def test_self_left_semi_join(st) -> None:
    input_stream, query = setup_self_join(st, "left_semi")
    st.test_stream(
        query,
        "append",
        AddData(input_stream, (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)),
        CheckNewAnswer((2, 2), (4, 4)),
        # The left rows of odd values are filtered before the join (predicate pushdown).
        assertNumStateRows(total=2, updated=2),  # the suite: 4, 4 (left 2, 4 kept)
        AddData(input_stream, (6, 6), (7, 7), (8, 8), (9, 9), (10, 10)),
        CheckNewAnswer((6, 6), (8, 8), (10, 10)),
        assertNumStateRows(total=3, updated=3),  # the suite: 8, 6 (left 2 to 10 kept)
        AddData(input_stream, (11, 11), (12, 12), (13, 13), (14, 14), (15, 15)),
        CheckNewAnswer((12, 12), (14, 14)),
        assertNumStateRows(total=3, updated=2),  # the suite: 9, 4 (left 4 to 14 kept)
    )
