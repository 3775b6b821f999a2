"""Spark's ``FlatMapGroupsWithStateSuite`` (Scala), its ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/
FlatMapGroupsWithStateSuite.scala`` in Apache Spark (the stored version with the SPARK-49474
cases, Spark 4): the same inputs, steps and expected answers, the query's input wrapped
(``stream_test.py``), run on both providers. A Scala function given to ``flatMapGroupsWithState``
or ``mapGroupsWithState`` is the pandas function a PySpark user gives
``groupBy(...).applyInPandasWithState``: its values are the group's rows, its state a row
(``RunningCount(count)`` is ``count long``), an ``Iterator`` of tuples is the rows it yields
(``mapGroupsWithState``: exactly one), ``groupByKey(f)`` is ``groupBy`` of the key's column;
a typed ``.as[(String, Long)]`` over a timestamp is the function reading its seconds.
``UnsupportedOperationException`` from ``getCurrentWatermarkMs`` is PySpark's
``PySparkRuntimeError``.

The suite's ``testWithAllStateVersions`` runs a scenario under both of Spark's state formats
(``spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion``, an internal conf choosing
how Spark lays out its state rows; the answers are the same): each is ported once, under the
default format 2, with the correctness check off as that helper sets it.

=================================================================  ==========================
Spark's case                                                       here
=================================================================  ==========================
flatMapGroupsWithState - streaming (x2 state formats)              ported (format 2)
flatMapGroupsWithState - streaming + func returns iterator that    ported
updates state lazily
flatMapGroupsWithState - streaming + aggregation (x2)              ported (format 2)
flatMapGroupsWithState - streaming with processing time timeout    left out: manual clock,
(x2)                                                               processing-time timeout
flatMapGroupsWithState - streaming w/ event time timeout +         ported (format 2)
watermark (x2)
flatMapGroupsWithState - uses state format version 2 by default    left out: checks Spark's
                                                                   physical plan node
flatMapGroupsWithState - recovery from checkpoint uses state       left out: restarts from a
format version 1                                                   Spark 2.3.1 checkpoint of
                                                                   the Scala operator
[SPARK-49474] flatMapGroupsWithState - user NPE is classified      left out: the JVM class a
(x2)                                                               Scala function's
                                                                   NullPointerException is
                                                                   wrapped in
[SPARK-49474] flatMapGroupsWithState - NPE from user iterator is   left out: likewise (a
classified (x2)                                                    Scala function returning
                                                                   null)
mapGroupsWithState - streaming                                     ported
SPARK-35896: metrics in StateOperatorProgress are output           ported (the operator's
correctly                                                          name: applyInPandasWithState)
SPARK-29438: ensure UNION doesn't lead (flat)MapGroupsWithState    left out: varies
to use shifted partition IDs (x2)                                  ``MemoryStream[String](n)``'s
                                                                   partition count
StateStore.abort on task failure handling                          ported (the failure flag a
                                                                   file the worker reads; the
                                                                   failure matched by its
                                                                   Python message, not the JVM
                                                                   class)
output partitioning is unknown                                     left out: checks Spark's
                                                                   physical plan
SPARK-38320 - flatMapGroupsWithState state with data should not    left out: Spark's own
timeout                                                            applyInPandasWithState
                                                                   fails it (below)
SPARK-49070: flatMapGroupsWithStateExec - valid initial state      left out: checks Spark's
plan                                                               physical plan (its query
                                                                   is SPARK-38320's)
SPARK-20714: watermark does not fail query when timeout =          left out: manual clock,
NoTimeout / ProcessingTimeTimeout (2 cases)                        processing-time timeout
InputProcessor - process new data / timed out state (generated)    left out: unit tests of
                                                                   Spark's internal
                                                                   InputProcessor on a
                                                                   MemoryStateStore
flatMapGroupsWithState - batch, mapGroupsWithState - batch,        left out: no streaming
disallow complete mode                                             query (batch / API checks)
=================================================================  ==========================

SPARK-38320's scenario, ported (a key given data in both batches, its timeout set in the first),
fails under Spark's own ``applyInPandasWithState`` as under ours: PySpark's ``GroupState`` of a
key with data starts with no old timeout, so a function that neither updates the state nor sets
a timeout leaves the stored one, and the key times out in the batch that brought it data (the
fix of SPARK-38320 is in the Scala operator's write rule). Ours follows Spark's Python operator.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from .stream_test import (
    AddData,
    CheckNewAnswer,
    Execute,
    ExpectFailure,
    StartStream,
    StopStream,
    assertNumStateRows,
    assertStateOperatorProgressMetric,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

#: What ``testWithAllStateVersions`` sets besides the state format.
ALL_STATE_VERSIONS = {"spark.sql.streaming.statefulOperator.checkCorrectness.enabled": "false"}

COUNT_STATE = "count long"  # RunningCount(count: Long)


def _assert_cannot_get_watermark(state: GroupState) -> None:
    """The suite's ``assertCannotGetWatermark``: the query has no watermark."""
    try:
        state.getCurrentWatermarkMs()
    except PySparkRuntimeError:
        return
    msg = "Could get watermark when not expected"
    raise AssertionError(msg)


def _size(values: Iterator[pd.DataFrame]) -> int:
    return sum(len(pdf) for pdf in values)


def _count(state: GroupState) -> int:
    return int(state.get[0]) if state.exists else 0


def _one(**columns: Any) -> pd.DataFrame:
    return pd.DataFrame({name: [value] for name, value in columns.items()})


def _seconds(times: pd.Series) -> list[int]:
    """A timestamp column's values as the epoch seconds ``.as[(String, Long)]`` reads."""
    return [int(t.timestamp()) for t in times]


def _max_event_time(
    key: tuple[Any, ...], values: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """The suite's ``sampleTestFunction``: the max event time (seconds) seen as state, timing out
    5 seconds after it; -1 when the state times out."""
    assert state.getCurrentProcessingTimeMs() >= 0, "Could not get processing time"
    assert state.getCurrentWatermarkMs() >= -1, "Could not get processing time"
    timeout_delay_sec = 5
    if state.hasTimedOut:
        state.remove()
        yield _one(key=key[0], maxEventTime=-1)
    else:
        seconds = [s for pdf in values for s in _seconds(pdf["eventTime"])]
        max_event_time_sec = max(max(seconds), _count(state))
        state.update((max_event_time_sec,))
        state.setTimeoutTimestamp((max_event_time_sec + timeout_delay_sec) * 1000)
        yield _one(key=key[0], maxEventTime=max_event_time_sec)


def _event_time_query(input_data: Any) -> Any:
    return (
        input_data.toDF()
        .select(F.col("_1").alias("key"), F.timestamp_seconds(F.col("_2")).alias("eventTime"))
        .withWatermark("eventTime", "10 seconds")
        .groupBy("key")
        .applyInPandasWithState(
            _max_event_time,
            "key string, maxEventTime int",
            "maxEventTime long",
            "update",
            GroupStateTimeout.EventTimeTimeout,
        )
    )


def test_flat_map_groups_with_state_streaming(st) -> None:
    # Running count up to 2, then the count removed; the count only while the state is defined.
    def state_func(
        key: tuple[Any, ...], values: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        assert state.getCurrentProcessingTimeMs() >= 0, "Could not get processing time"
        _assert_cannot_get_watermark(state)
        count = _count(state) + _size(values)
        if count == 3:
            state.remove()
        else:
            state.update((count,))
            yield _one(key=key[0], count=str(count))

    input_data = st.memory_stream("value string")
    result = (
        input_data.toDF()
        .groupBy("value")
        .applyInPandasWithState(
            state_func,
            "key string, count string",
            COUNT_STATE,
            "update",
            GroupStateTimeout.NoTimeout,
        )
    )
    st.test_stream(
        result,
        "update",
        StartStream(confs=ALL_STATE_VERSIONS),
        AddData(input_data, "a"),
        CheckNewAnswer(("a", "1")),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0),
        AddData(input_data, "a", "b"),
        CheckNewAnswer(("a", "2"), ("b", "1")),
        assertNumStateRows(total=2, updated=2, droppedByWatermark=0),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "b"),  # removes the state of "a", nothing for "a"
        CheckNewAnswer(("b", "2")),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0, removed=1),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "c"),  # "a" counts from 1 again
        CheckNewAnswer(("a", "1"), ("c", "1")),
        assertNumStateRows(total=3, updated=2, droppedByWatermark=0),
    )


def test_flat_map_groups_with_state_updates_state_lazily(st) -> None:
    # As above, the state updated value by value as the returned rows are consumed.
    def state_func(
        key: tuple[Any, ...], values: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        for pdf in values:
            for _ in range(len(pdf)):
                count = _count(state) + 1
                if count == 3:
                    state.remove()
                else:
                    state.update((count,))
                    yield _one(key=key[0], count=str(count))

    input_data = st.memory_stream("value string")
    result = (
        input_data.toDF()
        .groupBy("value")
        .applyInPandasWithState(
            state_func,
            "key string, count string",
            COUNT_STATE,
            "update",
            GroupStateTimeout.NoTimeout,
        )
    )
    st.test_stream(
        result,
        "update",
        AddData(input_data, "a", "a", "b"),
        CheckNewAnswer(("a", "1"), ("a", "2"), ("b", "1")),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "b"),  # removes the state of "a", nothing for "a"
        CheckNewAnswer(("b", "2")),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "c"),  # "a" counts from 1 again
        CheckNewAnswer(("a", "1"), ("c", "1")),
    )


def test_flat_map_groups_with_state_and_aggregation(st) -> None:
    # Running count up to 2, then removed; -1 when removed. Its rows counted by key.
    def state_func(
        key: tuple[Any, ...], values: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        count = _count(state) + _size(values)
        if count == 3:
            state.remove()
            yield _one(key=key[0], count="-1")
        else:
            state.update((count,))
            yield _one(key=key[0], count=str(count))

    input_data = st.memory_stream("value string")
    result = (
        input_data.toDF()
        .groupBy("value")
        .applyInPandasWithState(
            state_func,
            "key string, count string",
            COUNT_STATE,
            "append",
            GroupStateTimeout.NoTimeout,
        )
        .groupBy("key")
        .count()
    )
    st.test_stream(
        result,
        "complete",
        StartStream(confs=ALL_STATE_VERSIONS),
        AddData(input_data, "a"),
        CheckNewAnswer(("a", 1)),
        AddData(input_data, "a", "b"),
        # ("a", "2"), ("b", "1"): the counts of a and b up by 1
        CheckNewAnswer(("a", 2), ("b", 1)),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "b"),
        # the state of "a" removed, ("a", "-1"), ("b", "2"): a and b up by 1
        CheckNewAnswer(("a", 3), ("b", 2)),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "c"),
        # "a" from 1 again, ("a", "1"), ("c", "1"): a and c up by 1
        CheckNewAnswer(("a", 4), ("b", 2), ("c", 1)),
    )


def test_event_time_timeout_and_watermark(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    st.test_stream(
        _event_time_query(input_data),
        "update",
        StartStream(confs=ALL_STATE_VERSIONS),
        AddData(input_data, ("a", 11), ("a", 13), ("a", 15)),
        # Max event time 15: "a" times out at 20; the watermark 15 - 10 = 5.
        CheckNewAnswer(("a", 15)),
        AddData(input_data, ("a", 4)),  # older than the watermark
        CheckNewAnswer(),  # filtered by the watermark
        AddData(input_data, ("a", 10)),  # newer than the watermark
        CheckNewAnswer(("a", 15)),  # the max event time unchanged (timeout 20, watermark 5)
        AddData(input_data, ("b", 31)),  # newer than the watermark, for "b"
        # The watermark 31 - 10 = 21: "a" (timeout 20) times out with -1.
        CheckNewAnswer(("a", -1), ("b", 31)),
    )


def test_map_groups_with_state_streaming(st) -> None:
    # Running count up to 2, then removed; -1 when removed. One row per group.
    def state_func(
        key: tuple[Any, ...], values: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        assert state.getCurrentProcessingTimeMs() >= 0, "Could not get processing time"
        _assert_cannot_get_watermark(state)
        count = _count(state) + _size(values)
        if count == 3:
            state.remove()
            yield _one(key=key[0], count="-1")
        else:
            state.update((count,))
            yield _one(key=key[0], count=str(count))

    input_data = st.memory_stream("value string")
    result = (
        input_data.toDF()
        .groupBy("value")
        .applyInPandasWithState(
            state_func,
            "key string, count string",
            COUNT_STATE,
            "update",
            GroupStateTimeout.NoTimeout,
        )
    )
    st.test_stream(
        result,
        "update",
        AddData(input_data, "a"),
        CheckNewAnswer(("a", "1")),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0),
        AddData(input_data, "a", "b"),
        CheckNewAnswer(("a", "2"), ("b", "1")),
        assertNumStateRows(total=2, updated=2, droppedByWatermark=0),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "b"),  # removes the state of "a", -1 for "a"
        CheckNewAnswer(("a", "-1"), ("b", "2")),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0),
        StopStream,
        StartStream(),
        AddData(input_data, "a", "c"),  # "a" counts from 1 again
        CheckNewAnswer(("a", "1"), ("c", "1")),
        assertNumStateRows(total=3, updated=2, droppedByWatermark=0),
    )


def test_metrics_in_state_operator_progress(st) -> None:
    input_data = st.memory_stream("_1 string, _2 int")
    st.test_stream(
        _event_time_query(input_data),
        "update",
        StartStream(confs={"spark.sql.shuffle.partitions": "3"}),
        AddData(input_data, ("a", 11), ("a", 13), ("a", 15)),
        # Max event time 15: "a" times out at 20; the watermark 15 - 10 = 5.
        CheckNewAnswer(("a", 15)),
        assertNumStateRows(total=1, updated=1, droppedByWatermark=0, removed=0),
        AddData(input_data, ("a", 4)),  # older than the watermark
        CheckNewAnswer(),  # filtered by the watermark
        assertStateOperatorProgressMetric(
            operatorName="applyInPandasWithState",
            numShufflePartitions=3,
            numStateStoreInstances=3,
        ),
        AddData(input_data, ("a", 10)),  # newer than the watermark
        CheckNewAnswer(("a", 15)),  # the max event time unchanged (timeout 20, watermark 5)
        AddData(input_data, ("b", 31)),  # newer than the watermark, for "b"
        # The watermark 31 - 10 = 21: "a" (timeout 20) times out with -1.
        CheckNewAnswer(("a", -1), ("b", 31)),
        assertNumStateRows(total=1, updated=2, droppedByWatermark=0, removed=1),
    )


def test_state_store_abort_on_task_failure(st, tmp_path: Path) -> None:
    # The suite's ``failInTask`` flag: a file the Python worker sees.
    fail_in_task = tmp_path / "fail-in-task"
    flag = str(fail_in_task)

    def state_func(
        key: tuple[Any, ...], values: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        if Path(flag).exists():
            msg = "expected failure"
            raise RuntimeError(msg)
        count = _count(state) + _size(values)
        state.update((count,))
        yield _one(key=key[0], count=count)

    def set_fail_in_task(value: bool) -> Execute:
        def run(_: Any) -> None:
            if value:
                fail_in_task.touch()
            else:
                fail_in_task.unlink(missing_ok=True)

        return Execute(run)

    input_data = st.memory_stream("value string")
    result = (
        input_data.toDF()
        .groupBy("value")
        .applyInPandasWithState(
            state_func, "key string, count long", COUNT_STATE, "update", GroupStateTimeout.NoTimeout
        )
    )
    st.test_stream(
        result,
        "update",
        set_fail_in_task(False),
        AddData(input_data, "a"),
        CheckNewAnswer(("a", 1)),
        AddData(input_data, "a"),
        CheckNewAnswer(("a", 2)),
        set_fail_in_task(True),
        AddData(input_data, "a"),
        ExpectFailure("expected failure"),  # the task fails, the count not incremented
        set_fail_in_task(False),
        StartStream(),
        CheckNewAnswer(("a", 3)),  # no failure, the right count
    )
