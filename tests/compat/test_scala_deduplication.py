"""Spark's ``StreamingDeduplicationSuite`` and ``StreamingDeduplicationWithinWatermarkSuite``
(Scala), their ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/
StreamingDeduplicationSuite.scala`` and ``StreamingDeduplicationWithinWatermarkSuite.scala`` in
Apache Spark: the same inputs, query and expected answers, the query's input wrapped
(``stream_test.py``), each scenario run on both providers at once (Spark runs the first suite
again as ``RocksDBStateStoreStreamingDeduplicationSuite``: our two stores). Spark's
``assertNumStateRows(total, updated)`` also checks that no row was dropped by the watermark;
``assertNumStateRows`` here does the same.

=========================================================  ====================================
Spark's test                                               here
=========================================================  ====================================
StreamingDeduplicationSuite:
deduplicate with all columns                               ported
deduplicate with some columns                              ported
multiple deduplicates                                      ported
SPARK-35896: metrics in StateOperatorProgress are output   ported
correctly
deduplicate with watermark                                 ported
deduplicate with aggregate - append mode                   ported
deduplicate with aggregate - update mode                   ported
deduplicate with aggregate - complete mode                 ported
deduplicate with file sink                                 left out: no ``testStream`` (a
                                                           parquet sink read back by hand)
SPARK-19841: watermarkPredicate should filter based on     ported
keys
SPARK-21546: dropDuplicates should ignore watermark when   ported
it's not a key
test no-data flag                                          ported once per flag value (2); its
                                                           last step, the memory sink's
                                                           ``numOutputRows`` of the last
                                                           progress, left out: a
                                                           ``foreachBatch`` sink, a V1 sink,
                                                           reports none (-1)
SPARK-29438: ensure UNION doesn't lead streaming           left out: MemoryStream-specific (a
deduplication to use shifted partition IDs                 restart with another partition
                                                           count of the MemoryStream)
SPARK-35880: custom metric numDroppedDuplicateRows in      ported
state operator progress
SPARK-39650: duplicate with specific keys should allow     ported (the new input type read
input to change schema                                     over the same files)
SPARK-39650: recovery from checkpoint having all columns   left out: a checkpoint written by
as value schema (sparkVersion 3.3.0, 3.5.1)                Spark 3.3/3.5, from Spark's test
                                                           resources
SPARK-39650: recovery from checkpoint with changes on key  left out: the same resources
schema are not allowed (sparkVersion 3.3.0, 3.5.1)
collation aware deduplication                              ported
non-binary collation aware deduplication not supported     ported (ours refuses at ``start()``,
                                                           Spark's in its first batch)
test that avro encoding is not supported                   left out: the encoding format of
                                                           Spark's own state stores
StreamingDeduplicationWithinWatermarkSuite:
deduplicate in batch DataFrame                             left out: a batch DataFrame, no
                                                           stream to wrap
deduplicate without event time column should result in     ported as two tests (refused at
error                                                      ``start()``, no ``testStream``): the
                                                           two single streams, and the third
                                                           query, joined
deduplicate with all columns with event time column in     ported
DataFrame
deduplicate with subset of columns which event time        ported
column is not in subset
incremental cleanup factor does not change                 ported (the conf set; the answers
dropDuplicatesWithinWatermark output                       are the previous scenario's)
SPARK-39650: duplicate with specific keys should allow     ported (as above)
input to change schema
SPARK-46676: canonicalization of                           left out: canonicalizes Spark's
StreamingDeduplicateWithinWatermarkExec should work        physical plan
SPARK-50492: drop event time column after                  ported
dropDuplicatesWithinWatermark
Partition key extraction - DedupeWithinWatermark           left out: Spark's internal state
                                                           store classes
=========================================================  ====================================
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from . import stream_test
from .stream_test import (
    Action,
    AddData,
    CheckAnswer,
    CheckLastBatch,
    CheckNewAnswer,
    StartStream,
    assertStateOperatorCustomMetric,
    assertStateOperatorProgressMetric,
)

pytestmark = pytest.mark.spark

#: ``(1 to 5).flatMap(_ => (10 to 15))``: 10 to 15, five times each.
TEN_TO_FIFTEEN_FIVE_TIMES = [v for _ in range(5) for v in range(10, 16)]


def assertNumStateRows(  # noqa: N802 - Spark's name
    total: int | Sequence[int],
    updated: int | Sequence[int],
    droppedByWatermark: int | Sequence[int] | None = None,  # noqa: N803 - Spark's name
    removed: Sequence[int] | None = None,
) -> Action:
    """Spark's ``StateStoreMetricsTest.assertNumStateRows``: rows dropped by the watermark are
    none unless given."""
    if droppedByWatermark is None:
        droppedByWatermark = 0 if isinstance(total, int) else [0] * len(total)  # noqa: N806
    return stream_test.assertNumStateRows(total, updated, droppedByWatermark, removed)


def _dedup_with_watermark(input_data):
    return (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .dropDuplicates()
        .select(F.col("eventTime").cast("long"))
    )


# --- StreamingDeduplicationSuite ---------------------------------------------------------


def test_deduplicate_with_all_columns(st) -> None:
    input_data = st.memory_stream("value string")
    result = input_data.toDF().dropDuplicates()
    st.test_stream(
        result,
        "append",
        AddData(input_data, "a"),
        CheckLastBatch("a"),
        assertNumStateRows(total=1, updated=1),
        AddData(input_data, "a"),
        CheckLastBatch(),
        assertNumStateRows(total=1, updated=0),
        AddData(input_data, "b"),
        CheckLastBatch("b"),
        assertNumStateRows(total=2, updated=1),
    )


def test_deduplicate_with_some_columns(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    result = input_data.toDF().dropDuplicates(["_1"])
    st.test_stream(
        result,
        "append",
        AddData(input_data, ("a", 1)),
        CheckLastBatch(("a", 1)),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0),
        AddData(input_data, ("a", 2)),  # Dropped
        CheckLastBatch(),
        assertNumStateRows(total=1, updated=0, droppedByWatermark=0),
        AddData(input_data, ("b", 1)),
        CheckLastBatch(("b", 1)),
        assertNumStateRows(total=2, updated=1, droppedByWatermark=0),
    )


def test_multiple_deduplicates(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    result = input_data.toDF().dropDuplicates().dropDuplicates(["_1"])
    st.test_stream(
        result,
        "append",
        AddData(input_data, ("a", 1)),
        CheckLastBatch(("a", 1)),
        assertNumStateRows(total=[1, 1], updated=[1, 1]),
        AddData(input_data, ("a", 2)),  # Dropped from the second `dropDuplicates`
        CheckLastBatch(),
        assertNumStateRows(total=[1, 2], updated=[0, 1]),
        AddData(input_data, ("b", 1)),
        CheckLastBatch(("b", 1)),
        assertNumStateRows(total=[2, 3], updated=[1, 1]),
    )


def test_spark_35896_metrics_in_state_operator_progress(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _dedup_with_watermark(input_data),
        "append",
        StartStream(confs={"spark.sql.shuffle.partitions": "2"}),
        AddData(input_data, *TEN_TO_FIFTEEN_FIVE_TIMES),
        CheckAnswer(*range(10, 16)),
        assertNumStateRows(total=[6], updated=[6], droppedByWatermark=[0], removed=[0]),
        AddData(input_data, 25),  # Advance watermark to 15 secs, no-data-batch drops rows <= 15
        CheckNewAnswer(25),
        assertNumStateRows(total=[1], updated=[1], droppedByWatermark=[0], removed=[6]),
        AddData(input_data, 10),  # Should not emit anything as data less than watermark
        CheckNewAnswer(),
        assertNumStateRows(total=[1], updated=[0], droppedByWatermark=[1], removed=[0]),
        AddData(input_data, 10),
        CheckNewAnswer(),
        assertStateOperatorProgressMetric(
            operatorName="dedupe", numShufflePartitions=2, numStateStoreInstances=2
        ),
    )


def test_deduplicate_with_watermark(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _dedup_with_watermark(input_data),
        "append",
        AddData(input_data, *TEN_TO_FIFTEEN_FIVE_TIMES),
        CheckAnswer(*range(10, 16)),
        assertNumStateRows(total=6, updated=6),
        AddData(input_data, 25),  # Advance watermark to 15 secs, no-data-batch drops rows <= 15
        CheckNewAnswer(25),
        assertNumStateRows(total=1, updated=1),
        AddData(input_data, 10),  # Should not emit anything as data less than watermark
        CheckNewAnswer(),
        assertNumStateRows(total=1, updated=0, droppedByWatermark=1),
        AddData(input_data, 45),  # Advance watermark to 35 seconds, no-data-batch drops row 25
        CheckNewAnswer(45),
        assertNumStateRows(total=1, updated=1),
    )


def test_deduplicate_with_aggregate_append_mode(st) -> None:
    input_data = st.memory_stream()
    windowed_aggregate = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .dropDuplicates()
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )
    st.test_stream(
        windowed_aggregate,
        "append",
        AddData(input_data, *TEN_TO_FIFTEEN_FIVE_TIMES),
        CheckLastBatch(),
        # states in aggregate in [10, 14), [15, 20) (2 windows)
        # states in deduplicate is 10 to 15
        assertNumStateRows(total=[2, 6], updated=[2, 6]),
        AddData(input_data, 25),  # Advance watermark to 15 seconds
        CheckLastBatch((10, 5)),  # 5 items (10 to 14) after deduplicate, emitted with no-data-batch
        # states in aggregate in [15, 20) and [25, 30); no-data-batch removed [10, 14)
        # states in deduplicate is 25, no-data-batch removed 10 to 14
        assertNumStateRows(total=[2, 1], updated=[1, 1]),
        AddData(input_data, 10),  # Should not emit anything as data less than watermark
        CheckLastBatch(),
        assertNumStateRows(total=[2, 1], updated=[0, 0], droppedByWatermark=[0, 1]),
        AddData(input_data, 40),  # Advance watermark to 30 seconds
        CheckLastBatch((15, 1), (25, 1)),
        # states in aggregate is [40, 45); no-data-batch removed [15, 20) and [25, 30)
        # states in deduplicate is 40; no-data-batch removed 25
        assertNumStateRows(total=[1, 1], updated=[1, 1]),
    )


def _dedup_then_sum(input_data):
    return (
        input_data.toDF()
        .select(F.col("_1").alias("str"), F.col("_2").alias("num"))
        .dropDuplicates()
        .groupBy("str")
        .agg(F.sum("num"))
    )


def test_deduplicate_with_aggregate_update_mode(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    st.test_stream(
        _dedup_then_sum(input_data),
        "update",
        AddData(input_data, ("a", 1)),
        CheckLastBatch(("a", 1)),
        assertNumStateRows(total=[1, 1], updated=[1, 1]),
        AddData(input_data, ("a", 1)),  # Dropped
        CheckLastBatch(),
        assertNumStateRows(total=[1, 1], updated=[0, 0]),
        AddData(input_data, ("a", 2)),
        CheckLastBatch(("a", 3)),
        assertNumStateRows(total=[1, 2], updated=[1, 1]),
        AddData(input_data, ("b", 1)),
        CheckLastBatch(("b", 1)),
        assertNumStateRows(total=[2, 3], updated=[1, 1]),
    )


def test_deduplicate_with_aggregate_complete_mode(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    st.test_stream(
        _dedup_then_sum(input_data),
        "complete",
        AddData(input_data, ("a", 1)),
        CheckLastBatch(("a", 1)),
        assertNumStateRows(total=[1, 1], updated=[1, 1]),
        AddData(input_data, ("a", 1)),  # Dropped
        CheckLastBatch(("a", 1)),
        assertNumStateRows(total=[1, 1], updated=[0, 0]),
        AddData(input_data, ("a", 2)),
        CheckLastBatch(("a", 3)),
        assertNumStateRows(total=[1, 2], updated=[1, 1]),
        AddData(input_data, ("b", 1)),
        CheckLastBatch(("a", 3), ("b", 1)),
        assertNumStateRows(total=[2, 3], updated=[1, 1]),
    )


def test_spark_19841_watermark_predicate_filters_on_keys(st) -> None:
    input_data = st.memory_stream("_1 int, _2 int")
    df = (
        input_data.toDF()
        .toDF("time", "id")
        .withColumn("time", F.timestamp_seconds(F.col("time")))
        .withWatermark("time", "1 second")
        .dropDuplicates(["id", "time"])  # Change the column positions
        .select(F.col("id"))
    )
    st.test_stream(
        df,
        "append",
        AddData(input_data, (1, 1), (1, 1), (1, 2)),
        CheckAnswer(1, 2),
        AddData(input_data, (1, 1), (2, 3), (2, 4)),
        CheckNewAnswer(3, 4),
        # Drop (1 -> 0, 1 -> 1) due to watermark
        AddData(input_data, (1, 0), (1, 1), (3, 5), (3, 6)),
        CheckNewAnswer(5, 6),
        AddData(input_data, (1, 0), (4, 7)),  # Drop (1 -> 0) due to watermark
        CheckNewAnswer(7),
    )


def test_spark_21546_drop_duplicates_ignores_watermark_not_a_key(st) -> None:
    input_data = st.memory_stream("_1 int, _2 int")
    df = (
        input_data.toDF()
        .toDF("id", "time")
        .withColumn("time", F.timestamp_seconds(F.col("time")))
        .withWatermark("time", "1 second")
        .dropDuplicates(["id"])
        .select(F.col("id"), F.col("time").cast("long"))
    )
    st.test_stream(
        df,
        "append",
        AddData(input_data, (1, 1), (1, 2), (2, 2)),
        CheckAnswer((1, 1), (2, 2)),
    )


@pytest.mark.parametrize("flag", [True, False])
def test_no_data_flag(st, flag: bool) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _dedup_with_watermark(input_data),
        "append",
        StartStream(confs={"spark.sql.streaming.noDataMicroBatches.enabled": str(flag).lower()}),
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckAnswer(10, 11, 12, 13, 14, 15),
        assertNumStateRows(total=6, updated=6),
        AddData(input_data, 25),  # Advance watermark to 15 seconds
        CheckNewAnswer(25),
        # State should have been cleaned if flag is set, otherwise should not have been cleaned
        assertNumStateRows(total=1, updated=1) if flag else assertNumStateRows(total=7, updated=1),
    )


def test_spark_35880_custom_metric_num_dropped_duplicate_rows(st) -> None:
    dedupe_input_data = st.memory_stream("_1 string, _2 int")
    dedupe = dedupe_input_data.toDF().dropDuplicates(["_1"])
    st.test_stream(
        dedupe,
        "append",
        AddData(dedupe_input_data, ("a", 1)),
        CheckLastBatch(("a", 1)),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=0),
        AddData(dedupe_input_data, ("a", 2), ("b", 3)),
        CheckLastBatch(("b", 3)),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=1),
        AddData(dedupe_input_data, ("a", 5), ("b", 2), ("c", 9)),
        CheckLastBatch(("c", 9)),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=2),
    )

    # with watermark
    dedupe_with_wm_input_data = st.memory_stream()
    st.test_stream(
        _dedup_with_watermark(dedupe_with_wm_input_data),
        "append",
        AddData(dedupe_with_wm_input_data, *TEN_TO_FIFTEEN_FIVE_TIMES),
        CheckAnswer(*range(10, 16)),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=24),
        AddData(dedupe_with_wm_input_data, 14),
        CheckNewAnswer(),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=1),
        # Advance watermark to 15 secs, no-data-batch drops rows <= 15
        AddData(dedupe_with_wm_input_data, 25),
        CheckNewAnswer(25),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=0),
        # Should not emit anything as data less than watermark
        AddData(dedupe_with_wm_input_data, 10),
        CheckNewAnswer(),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=0),
        AddData(dedupe_with_wm_input_data, 26, 26),
        CheckNewAnswer(26),
        assertStateOperatorCustomMetric("numDroppedDuplicateRows", expected=1),
    )


def test_spark_39650_specific_keys_allow_input_schema_change(st) -> None:
    dedupe_input_data = st.memory_stream("_1 string, _2 int")
    dedupe = dedupe_input_data.toDF().dropDuplicates(["_1"])
    st.test_stream(
        dedupe,
        "append",
        StartStream(checkpointLocation="checkpoint"),
        AddData(dedupe_input_data, ("a", 1)),
        CheckLastBatch(("a", 1)),
        AddData(dedupe_input_data, ("a", 2), ("b", 3)),
        CheckLastBatch(("b", 3)),
    )

    # the same input as (String, Int, String), its earlier batches already there
    dedupe_input_data2 = st.memory_stream("_1 string, _2 int, _3 string", over=dedupe_input_data)
    dedupe2 = dedupe_input_data2.toDF().dropDuplicates(["_1"])
    st.test_stream(
        dedupe2,
        "append",
        StartStream(checkpointLocation="checkpoint"),
        AddData(dedupe_input_data2, ("a", 5, "a"), ("b", 2, "b"), ("c", 9, "c")),
        CheckLastBatch(("c", 9, "c")),
    )


def test_collation_aware_deduplication(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    result = (
        input_data.toDF()
        .select(
            F.col("_1").try_cast(StringType("UTF8_BINARY")).alias("str"),
            F.col("_2").alias("int"),
        )
        .dropDuplicates(["str"])
    )
    st.test_stream(
        result,
        "append",
        AddData(input_data, ("a", 1)),
        CheckLastBatch(("a", 1)),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0),
        AddData(input_data, ("a", 2)),  # Dropped
        CheckLastBatch(),
        assertNumStateRows(total=1, updated=0, droppedByWatermark=0),
        AddData(input_data, ("ä", 1)),
        CheckLastBatch(("ä", 1)),
        assertNumStateRows(total=2, updated=1, droppedByWatermark=0),
    )


def test_non_binary_collation_aware_deduplication_not_supported(st) -> None:
    input_data = st.memory_stream("value string")
    result = (
        input_data.toDF()
        .select(F.col("value").try_cast(StringType("UTF8_LCASE")).alias("str"))
        .dropDuplicates(["str"])
    )
    # Spark's query fails in its first batch (a StreamingQueryException); ours is refused at
    # start(), with Spark's condition and parameter.
    with pytest.raises(Exception) as failure:  # noqa: PT011 - the two differ in type only
        st.test_stream(result, "append", AddData(input_data, "a"), CheckLastBatch("a"))
    message = str(failure.value)
    assert "STATE_STORE_UNSUPPORTED_OPERATION_BINARY_INEQUALITY" in message
    assert '"str":"spark.UTF8_LCASE"' in message


# --- StreamingDeduplicationWithinWatermarkSuite ------------------------------------------


def _refused_without_watermark(df) -> None:
    """The suite's ``testAndVerify``: ``start()`` refuses the query."""
    with pytest.raises(AnalysisException) as exc:
        df.writeStream.format("noop").start()
    assert "dropDuplicatesWithinWatermark is not supported" in str(exc.value)
    assert "streaming DataFrames/DataSets without watermark" in str(exc.value)


def test_within_watermark_without_event_time_column_is_an_error(st) -> None:
    input_data = st.memory_stream("value string")
    result = input_data.toDF().dropDuplicatesWithinWatermark()
    _refused_without_watermark(result)

    result2 = (
        input_data.toDF()
        .withColumn("newcol", F.col("value"))
        .dropDuplicatesWithinWatermark(["newcol"])
    )
    _refused_without_watermark(result2)


def test_within_watermark_without_event_time_column_is_an_error_joined(st) -> None:
    """The same test's third query: the watermark on the other side of a join."""
    input_data = st.memory_stream("value string")
    input_data2 = st.memory_stream("_1 string, _2 int")
    other_side_for_join = (
        input_data2.toDF()
        .select(F.col("_1").alias("key"), F.timestamp_seconds(F.col("_2")).alias("time"))
        .withWatermark("Time", "10 seconds")
    )
    result3 = (
        input_data.toDF()
        .select(F.col("value").alias("key"))
        # there are two streams which one stream only defines the watermark. the stream which
        # contains dropDuplicatesWithinWatermark does not define the watermark, which is not
        # supported.
        .dropDuplicatesWithinWatermark()
        .join(other_side_for_join, "key")
    )
    _refused_without_watermark(result3)


def test_within_watermark_all_columns_with_event_time_column(st) -> None:
    input_data = st.memory_stream()
    result = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .dropDuplicatesWithinWatermark()
        .select(F.col("eventTime").cast("long"))
    )
    st.test_stream(
        result,
        "append",
        # Advance watermark to 5 secs, no-data-batch does not drop state rows
        AddData(input_data, *TEN_TO_FIFTEEN_FIVE_TIMES),
        CheckAnswer(*range(10, 16)),
        assertNumStateRows(total=6, updated=6),
        # Advance watermark to 7 secs, no-data-batch does not drop state rows
        AddData(input_data, *range(13, 18)),
        # 13 to 15 are duplicated
        CheckNewAnswer(16, 17),
        assertNumStateRows(total=8, updated=2),
        AddData(input_data, 5),  # Should not emit anything as data less than watermark
        CheckNewAnswer(),
        assertNumStateRows(total=8, updated=0, droppedByWatermark=1),
        # Advance watermark to 25 secs, no-data-batch drops state rows having expired time <= 25
        AddData(input_data, 35),
        CheckNewAnswer(35),
        assertNumStateRows(total=3, updated=1),
        # Advance watermark to 45 seconds, no-data-batch drops state rows having expired time <= 45
        AddData(input_data, 55),
        CheckNewAnswer(55),
        assertNumStateRows(total=1, updated=1),
    )


def _within_watermark_of_first(input_data, delay: str):
    return (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("_2")))
        .withWatermark("eventTime", delay)
        .dropDuplicatesWithinWatermark(["_1"])
    )


def _subset_without_event_time_actions(input_data) -> list[Action]:
    return [
        # Advances watermark to 15
        AddData(input_data, ("a", 17)),
        CheckNewAnswer(("a", 17)),
        # expired time is set to 19
        assertNumStateRows(total=1, updated=1),
        # Watermark does not advance
        AddData(input_data, ("a", 16)),
        CheckNewAnswer(),
        assertNumStateRows(total=1, updated=0),
        # Watermark does not advance
        # Should not emit anything as data less than watermark
        AddData(input_data, ("a", 13)),
        CheckNewAnswer(),
        assertNumStateRows(total=1, updated=0, droppedByWatermark=1),
        # Advances watermark to 20. no-data batch drops state row ("a" -> 19)
        AddData(input_data, ("b", 22), ("c", 21)),
        CheckNewAnswer(("b", 22), ("c", 21)),
        # expired time is set to 24 and 23
        assertNumStateRows(total=2, updated=2),
        # Watermark does not advance
        AddData(input_data, ("a", 21)),
        # "a" is identified as new event since previous batch dropped state row ("a" -> 19)
        CheckNewAnswer(("a", 21)),
        # expired time is set to 23
        assertNumStateRows(total=3, updated=1),
        # Advances watermark to 23. no-data batch drops state row ("a" -> 23), ("c" -> 23)
        AddData(input_data, ("d", 25)),
        CheckNewAnswer(("d", 25)),
        assertNumStateRows(total=2, updated=1),
    ]


def test_within_watermark_subset_without_event_time_column(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    result = _within_watermark_of_first(input_data, "2 seconds").select(
        F.col("_1"), F.col("eventTime").cast("long")
    )
    st.test_stream(result, "append", *_subset_without_event_time_actions(input_data))


def test_within_watermark_incremental_cleanup_factor_does_not_change_output(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    result = _within_watermark_of_first(input_data, "2 seconds").select(
        F.col("_1"), F.col("eventTime").cast("long")
    )
    st.test_stream(
        result,
        "append",
        StartStream(confs={"spark.sql.streaming.statefulOperator.incrementalCleanupFactor": "10"}),
        *_subset_without_event_time_actions(input_data),
    )


def test_within_watermark_spark_39650_specific_keys_allow_input_schema_change(st) -> None:
    dedupe_input_data = st.memory_stream("_1 string, _2 int")
    dedupe = _within_watermark_of_first(dedupe_input_data, "10 second").select(
        F.col("_1"), F.col("eventTime").cast("long")
    )
    st.test_stream(
        dedupe,
        "append",
        StartStream(checkpointLocation="checkpoint"),
        AddData(dedupe_input_data, ("a", 1)),
        CheckNewAnswer(("a", 1)),
        AddData(dedupe_input_data, ("a", 2), ("b", 3)),
        CheckNewAnswer(("b", 3)),
    )

    # the same input as (String, Int, String), its earlier batches already there
    dedupe_input_data2 = st.memory_stream("_1 string, _2 int, _3 string", over=dedupe_input_data)
    dedupe2 = _within_watermark_of_first(dedupe_input_data2, "10 second").select(
        F.col("_1"), F.col("eventTime").cast("long"), F.col("_3")
    )
    st.test_stream(
        dedupe2,
        "append",
        StartStream(checkpointLocation="checkpoint"),
        AddData(dedupe_input_data2, ("a", 5, "a"), ("b", 2, "b"), ("c", 9, "c")),
        CheckNewAnswer(("c", 9, "c")),
    )


def test_within_watermark_spark_50492_drop_event_time_column(st) -> None:
    input_data = st.memory_stream("_1 int, _2 int")
    result = (
        input_data.toDF()
        .withColumn("first", F.timestamp_seconds(F.col("_1")))
        .withWatermark("first", "10 seconds")
        .dropDuplicatesWithinWatermark(["_2"])
        .select("_2")
    )
    st.test_stream(result, "append", AddData(input_data, (1, 2)), CheckAnswer(2))
