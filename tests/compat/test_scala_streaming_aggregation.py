"""Spark's ``StreamingAggregationSuite`` (Scala), its ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/
StreamingAggregationSuite.scala`` in Apache Spark (its 3.5 form, with ``SPARK-35896``; the older
forms add ``typed aggregators`` only): the same inputs, query and expected answers, the query's
input wrapped (``stream_test.py``), each scenario on both providers at once. Spark runs every
scenario under each of its two aggregation state formats (``spark.sql.streaming.aggregation.
stateFormatVersion``, an internal setting of its own state layout, no answer changes): each is
ported once. ``MemoryStream.reset()`` between two ``testStream`` of one scenario is a new
``st.memory_stream``.

==========================================================  ===================================
Spark's scenario                                            here
==========================================================  ===================================
simple count, update mode                                   ported
count distinct                                              ported
simple count, complete mode                                 ported
simple count, append mode                                   ported
sort after aggregate in complete mode                       ported
state metrics - append mode                                 left out: a manual clock steps the
                                                            no-data batches one by one, and it
                                                            reads the physical plan's SQL
                                                            metrics
state metrics - update/complete mode                        ported (``flatMap`` as ``explode``;
                                                            the save node's SQL metrics read
                                                            from the progress, the same counts)
multiple keys                                               ported
SPARK-29438: ensure UNION doesn't lead streaming            ported (``MemoryStream(n)``: n files
aggregation to use shifted partition IDs                    a batch; the restart's new streams
                                                            the same ones, their first batch
                                                            read)
midbatch failure                                            ported (the failing ``map`` a Python
                                                            UDF; Spark's singleton flag a file
                                                            the scenario removes)
prune results by current_time or localtimestamp,            left out: a manual clock, and a
complete mode                                               commit log purged by hand
prune results by current_date, complete mode                left out: the same
SPARK-19690: do not convert batch aggregation in            ported
streaming query to streaming
SPARK-21977: coalesce(1) with 0 partition RDD should be     ported (an empty file is a batch of
repartitioned to 1                                          no partitions; the plan checks left
                                                            out: physical plan internals)
SPARK-21977: coalesce(1) with aggregation should still be   ported (the plan checks left out)
repartitioned when it has non-empty grouping keys
SPARK-22230: last should change with new batches            ported
SPARK-23004: Ensure that TypedImperativeAggregate           ported
functions do not throw errors
simple count, update mode - recovery from checkpoint uses   left out: a checkpoint Spark 2.3.1
state format version 1                                      wrote, in Spark's state format 1
changing schema of state when restarting query              ported
changing schema of state when restarting query - schema     left out: Spark's internal switch
check off                                                   off (``stateSchemaCheck``); it
                                                            expects some other failure
SPARK-35896: metrics in StateOperatorProgress are output    ported
correctly
typed aggregators (older forms of the suite)                left out: Scala's typed
                                                            ``groupByKey`` and ``typed.sumLong``
==========================================================  ===================================
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from .stream_test import (
    AddData,
    CheckLastBatch,
    CheckNewAnswer,
    Execute,
    ExpectFailure,
    MultiAddData,
    ProcessAllAvailable,
    StartStream,
    StopStream,
    assertNumStateRows,
    assertStateOperatorProgressMetric,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark


def _count_by_value(input_data):
    return input_data.toDF().groupBy(F.col("value")).agg(F.count("*"))


def test_simple_count_update_mode(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _count_by_value(input_data),
        "update",
        AddData(input_data, 3),
        CheckLastBatch((3, 1)),
        AddData(input_data, 3, 2),
        CheckLastBatch((3, 2), (2, 1)),
        StopStream,
        StartStream(),
        AddData(input_data, 3, 2, 1),
        CheckLastBatch((3, 3), (2, 2), (1, 1)),
        AddData(input_data, 4, 4, 4, 4),
        CheckLastBatch((4, 4)),
    )


def test_count_distinct(st) -> None:
    input_data = st.memory_stream("_1 int, _2 array<int>")
    aggregated = (
        input_data.toDF()
        .select(F.col("*"), F.explode(F.col("_2")).alias("value"))
        .groupBy(F.col("_1"))
        .agg(F.size(F.collect_set(F.col("value"))))
    )
    st.test_stream(
        aggregated,
        "update",
        AddData(input_data, (1, [1, 2])),
        CheckLastBatch((1, 2)),
    )


def test_simple_count_complete_mode(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _count_by_value(input_data),
        "complete",
        AddData(input_data, 3),
        CheckLastBatch((3, 1)),
        AddData(input_data, 2),
        CheckLastBatch((3, 1), (2, 1)),
        StopStream,
        StartStream(),
        AddData(input_data, 3, 2, 1),
        CheckLastBatch((3, 2), (2, 2), (1, 1)),
        AddData(input_data, 4, 4, 4, 4),
        CheckLastBatch((4, 4), (3, 2), (2, 2), (1, 1)),
    )


def test_simple_count_append_mode(st) -> None:
    input_data = st.memory_stream()
    with pytest.raises(AnalysisException) as e:
        st.test_stream(_count_by_value(input_data), "append")
    for m in ("append", "not supported"):
        assert m in str(e.value).lower()


def test_sort_after_aggregate_in_complete_mode(st) -> None:
    input_data = st.memory_stream()
    aggregated = (
        input_data.toDF()
        .groupBy(F.col("value"))
        .agg(F.count("*"))
        .toDF("value", "count")
        .orderBy(F.col("count").desc())
    )
    st.test_stream(
        aggregated,
        "complete",
        AddData(input_data, 3),
        CheckLastBatch((3, 1), isSorted=True),
        AddData(input_data, 2, 3),
        CheckLastBatch((3, 2), (2, 1), isSorted=True),
        StopStream,
        StartStream(),
        AddData(input_data, 3, 2, 1),
        CheckLastBatch((3, 3), (2, 2), (1, 1), isSorted=True),
        AddData(input_data, 4, 4, 4, 4),
        CheckLastBatch((4, 4), (3, 3), (2, 2), (1, 1), isSorted=True),
    )


def test_state_metrics_update_complete_mode(st) -> None:
    def aggregated(input_data):
        return (
            input_data.toDF()
            .select(F.explode(F.array(F.col("value"), F.col("value") + 1)))
            .toDF("value")
            .groupBy(F.col("value"))
            .agg(F.count("*"))
        )

    input_data = st.memory_stream()
    st.test_stream(
        aggregated(input_data),
        "update",
        AddData(input_data, 1),
        CheckLastBatch((1, 1), (2, 1)),
        assertNumStateRows(total=2, updated=2),
        AddData(input_data, 2, 3),
        CheckLastBatch((2, 2), (3, 2), (4, 1)),
        assertNumStateRows(total=4, updated=3),
    )
    input_data = st.memory_stream()
    st.test_stream(
        aggregated(input_data),
        "complete",
        AddData(input_data, 1),
        CheckLastBatch((1, 1), (2, 1)),
        assertNumStateRows(total=2, updated=2),
        AddData(input_data, 2, 3),
        CheckLastBatch((1, 1), (2, 2), (3, 2), (4, 1)),
        assertNumStateRows(total=4, updated=3),
    )


def test_multiple_keys(st) -> None:
    input_data = st.memory_stream()
    aggregated = input_data.toDF().groupBy(F.col("value"), F.col("value") + 1).agg(F.count("*"))
    st.test_stream(
        aggregated,
        "update",
        AddData(input_data, 1, 2),
        CheckLastBatch((1, 2, 1), (2, 3, 1)),
        AddData(input_data, 1, 2),
        CheckLastBatch((1, 2, 2), (2, 3, 2)),
    )


def test_spark_29438_union_does_not_shift_aggregation_partition_ids(st) -> None:
    input1 = st.memory_stream(partitions=2)
    input2 = st.memory_stream()

    def construct_union_df():
        df1 = input1.toDF().select(F.col("value"), F.col("value") + 1)
        df2 = input2.toDF().groupBy(F.col("value")).agg(F.count("*"))
        return df1.union(df2)

    st.test_stream(
        construct_union_df(),
        "update",
        MultiAddData(AddData(input1, 11, 12), AddData(input2, 21, 22)),
        CheckNewAnswer((11, 12), (12, 13), (21, 1), (22, 1)),
        StopStream,
        checkpoint="union",
    )
    # The restart's left input comes in 3 partitions: the aggregation's state must still be
    # found by its own partition ids, not the union's shifted ones.
    input1.partitions = 3
    st.test_stream(
        construct_union_df(),
        "update",
        MultiAddData(AddData(input1, 13, 14), AddData(input2, 22, 23)),
        CheckNewAnswer((13, 14), (14, 15), (22, 2), (23, 1)),
        checkpoint="union",
    )


def test_midbatch_failure(st, tmp_path: Path) -> None:
    # Spark's FailureSingleton.firstTime: while the flag is there, the row 4 fails its batch.
    first_time = tmp_path / "first-time"
    first_time.touch()
    flag = str(first_time)

    @F.udf("int")
    def fail_first_time(i):
        if i == 4 and os.path.exists(flag):
            msg = "injected failure"
            raise RuntimeError(msg)
        return i

    input_data = st.memory_stream()
    aggregated = (
        input_data.toDF()
        .select(fail_first_time(F.col("value")).alias("value"))
        .groupBy(F.col("value"))
        .agg(F.count("*"))
    )
    st.test_stream(
        aggregated,
        "update",
        StartStream(),
        AddData(input_data, 1, 2, 3, 4),
        ExpectFailure("injected failure"),
        Execute(lambda run: first_time.unlink(missing_ok=True)),
        StartStream(),
        CheckLastBatch((1, 1), (2, 1), (3, 1), (4, 1)),
    )


def test_spark_19690_batch_aggregation_in_streaming_query(st, spark) -> None:
    stream_input = st.memory_stream()
    batch_df = (
        spark.createDataFrame([(v,) for v in (1, 2, 3, 4, 5)], "value int")
        .withColumn("parity", F.col("value") % 2)
        .groupBy(F.col("parity"))
        .agg(F.count("*").alias("joinValue"))
    )
    join_df = stream_input.toDF().join(batch_df, F.col("value") == F.col("parity"))
    st.test_stream(
        join_df,
        "append",
        AddData(stream_input, 0, 1, 2, 3),
        CheckLastBatch((0, 0, 2), (1, 1, 3)),
        AddData(stream_input, 0, 1, 2, 3),
        CheckLastBatch((0, 0, 2), (1, 1, 3)),
    )


def test_spark_21977_coalesce_1_with_0_partition_batch(st) -> None:
    input_source = st.memory_stream("a int")
    aggregated = input_source.toDF().coalesce(1).groupBy().count()
    st.test_stream(
        aggregated,
        "complete",
        AddData(input_source, 1),
        CheckLastBatch(1),
        AddData(input_source),  # an empty trigger
        CheckLastBatch(1),
        AddData(input_source, 2, 3),
        CheckLastBatch(3),
        AddData(input_source),
        CheckLastBatch(3),
        StopStream,
    )


def test_spark_21977_coalesce_1_with_grouping_keys(st) -> None:
    input_source = st.memory_stream("a int")

    def create_df(partitions):
        return input_source.toDF().coalesce(partitions).groupBy(F.col("a") % 1).count()

    st.test_stream(
        create_df(1),
        "complete",
        AddData(input_source, 1),
        CheckLastBatch((0, 1)),
        StopStream,
        checkpoint="coalesce",
    )
    st.test_stream(
        create_df(2),
        "complete",
        ProcessAllAvailable(),
        AddData(input_source, 2, 3, 4),
        CheckLastBatch((0, 4)),
        AddData(input_source),
        CheckLastBatch((0, 4)),
        StopStream,
        checkpoint="coalesce",
    )


def test_spark_22230_last_should_change_with_new_batches(st) -> None:
    input_data = st.memory_stream()
    aggregated = input_data.toDF().agg(F.last(F.col("value")))
    st.test_stream(
        aggregated,
        "complete",
        AddData(input_data, 1, 2, 3),
        CheckLastBatch(3),
        AddData(input_data, 4, 5, 6),
        CheckLastBatch(6),
        AddData(input_data),
        CheckLastBatch(6),
        AddData(input_data, 0),
        CheckLastBatch(0),
    )


def test_spark_23004_typed_imperative_aggregate_functions(st, spark) -> None:
    threshold = int(spark.conf.get("spark.sql.objectHashAggregate.sortBased.fallbackThreshold"))
    input_data = st.memory_stream()
    df = (
        input_data.toDF()
        .toDF("value")
        .selectExpr("value as group", "value")
        .groupBy("group")
        .agg(F.collect_list("value"))
    )
    st.test_stream(
        df,
        "update",
        StartStream(confs={"spark.sql.shuffle.partitions": "1"}),
        AddData(input_data, *range(1, threshold + 1)),
        ProcessAllAvailable(),
    )


def _changing_schema_of_state(st):
    """Spark's ``prepareTestForChangingSchemaOfState``: a query of ``max`` runs a batch, the
    query then restarts from its checkpoint with ``collect_list`` in its place."""
    input_data = st.memory_stream()

    def aggregated(last):
        return (
            input_data.toDF()
            .selectExpr("value % 10 AS id", "value")
            .groupBy(F.col("id"))
            .agg(
                F.sum("value").alias("sum_value"),
                F.avg("value").alias("avg_value"),
                last,
            )
        )

    confs = {
        "spark.sql.streaming.stateStore.formatValidation.enabled": "false",
        "spark.sql.shuffle.partitions": "1",
    }
    st.test_stream(
        aggregated(F.max("value").alias("max_value")),
        "update",
        StartStream(confs=confs),
        AddData(input_data, 1, 11),
        CheckLastBatch((1, 12, 6.0, 11)),
        StopStream,
        checkpoint="schema",
    )
    return input_data, aggregated(F.collect_list("value").alias("values")), confs


def test_changing_schema_of_state_when_restarting_query(st) -> None:
    input_data, aggregated, confs = _changing_schema_of_state(st)
    st.test_stream(
        aggregated,
        "update",
        StartStream(confs=confs),
        AddData(input_data, 21),
        ExpectFailure("STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"),
        checkpoint="schema",
    )


def test_spark_35896_metrics_in_state_operator_progress(st) -> None:
    shuffle_3 = StartStream(confs={"spark.sql.shuffle.partitions": "3"})
    input_data = st.memory_stream()
    st.test_stream(
        _count_by_value(input_data),
        "update",
        shuffle_3,
        AddData(input_data, 3, 2, 1, 3),
        CheckLastBatch((3, 2), (2, 1), (1, 1)),
        assertNumStateRows(total=3, updated=3, droppedByWatermark=0, removed=0),
        AddData(input_data, 1, 4),
        CheckLastBatch((1, 2), (4, 1)),
        assertStateOperatorProgressMetric(
            operatorName="stateStoreSave", numShufflePartitions=3, numStateStoreInstances=3
        ),
    )

    input_data = st.memory_stream()
    st.test_stream(
        _count_by_value(input_data),
        "complete",
        shuffle_3,
        AddData(input_data, 3, 2, 1, 3),
        CheckLastBatch((3, 2), (2, 1), (1, 1)),
        assertNumStateRows(total=3, updated=3, droppedByWatermark=0, removed=0),
        AddData(input_data, 1, 4),
        CheckLastBatch((3, 2), (2, 1), (1, 2), (4, 1)),
        assertStateOperatorProgressMetric(
            operatorName="stateStoreSave", numShufflePartitions=3, numStateStoreInstances=3
        ),
    )

    input_data = st.memory_stream()
    agg_with_watermark = (
        input_data.toDF()
        .withColumn("eventTime", F.timestamp_seconds(F.col("value")))
        .withWatermark("eventTime", "10 seconds")
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )
    st.test_stream(
        agg_with_watermark,
        "append",
        shuffle_3,
        AddData(input_data, 3, 2, 1, 9),
        CheckLastBatch(),
        assertStateOperatorProgressMetric(
            operatorName="stateStoreSave", numShufflePartitions=3, numStateStoreInstances=3
        ),
        AddData(input_data, 25),  # the watermark moves to 15 s: the no-data batch drops <= 15
        CheckLastBatch((0, 3), (5, 1)),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0, removed=2),
    )
