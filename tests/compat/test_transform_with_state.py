"""Spark's transformWithState tests, ported with only the query's input wrapped.

Source: ``python/pyspark/sql/tests/pandas/streaming/test_pandas_transform_with_state.py``
(apache/spark, stored version 0215fb8d), whose ``TransformWithStateTestsMixin`` Spark runs in
pandas mode (``transformWithStateInPandas``) and, through ``test_transform_with_state.py``, in
row mode (``transformWithState``); its processors are in
``python/pyspark/sql/tests/pandas/helper/helper_pandas_transform_with_state.py`` (008cbc1f),
re-stated in ``tws_processors.py``. Every case runs in both modes and on both providers (once
in each mode, on the two providers: ``conftest.py``), with
Spark's suite conf (``SUITE_CONF``) and Spark's inputs, processors, output schemas and modes
and per-batch assertions; the only change is ``ss.stream(df)`` around the input, a checkpoint
where Spark's case has none, file times set instead of sleeps, and ``availableNow`` triggers.
The batches each case sees are collected by ``foreachBatch`` and checked as Spark's
``check_results`` checks them, after the query ends (every batch the input makes must be there).

``SPARKSTATE_COMPAT_SPARK=1`` runs the module against Spark's own operator instead (the input
not wrapped, the xfail marks off): the check that a port is right.

Left out, with the reason:

===========================================================  ==================================
Spark's case                                                 why
===========================================================  ==================================
test_transform_with_state_batch_query                        a batch query (nothing to wrap)
test_transform_with_state_batch_query_initial_state          a batch query
test_transform_with_state_int_to_decimal_coercion            a batch query (pandas only)
test_transform_with_state_with_bytes_limit, row mode         pandas only: Spark's returns early
test_transform_with_state_with_records_limit, row mode       pandas only: Spark's returns early
test_transform_with_state_int_to_decimal_coercion, row mode  pandas only
===========================================================  ==================================
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from tests.module_session import session_conf as sql_conf  # Spark's tests' name

from . import tws_processors as P
from .tws_support import (
    CHUNK_OUTPUT,
    COUNT_OUTPUT,
    SUITE_CONF,
    Batches,
    TextFeed,
    basic_run,
    check_each,
    event_time_input,
    input_df,
    input_df_3_cols,
    run_batches,
    schema,
    start,
    transform,
)

cloudpickle.register_pickle_by_value(P)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", autouse=True)
def suite_conf(spark: Any) -> Iterator[None]:
    with sql_conf(spark, SUITE_CONF):
        yield


# ---------------------------------------------------------------------------------------------
# The cases, in the order of Spark's file.


def test_transform_with_state_basic(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == {Row(id="0", countAsString="2"), Row(id="1", countAsString="2")}
        else:
            assert set(rows) == {Row(id="0", countAsString="3"), Row(id="1", countAsString="2")}

    batches = basic_run(spark, tmp_path, provider, P.ViolationsCount(mode == "pandas"))
    check_each(batches, 2, check)


def test_transform_with_state_query_restarts(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    feed = TextFeed(tmp_path / "input")
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
    feed.resource1()
    df = input_df(spark, feed.path)
    assert df.isStreaming
    planned = transform(df, mode, P.ViolationsCount(mode == "pandas"), COUNT_OUTPUT)

    def run() -> Any:
        q = (
            start(planned, "this_query", checkpoint, provider)
            .format("parquet")
            .outputMode("append")
            .option("path", str(output))
            .trigger(availableNow=True)
            .start()
        )
        assert q.name == "this_query"
        q.awaitTermination()
        assert q.exception() is None
        return q

    q = run()
    metrics = q.lastProgress.stateOperators[0].customMetrics
    assert metrics["numValueStateVars"] > 0
    assert metrics["numDeletedStateVars"] > 0

    feed.resource2()
    run()
    assert sorted(spark.read.parquet(str(output)).collect()) == sorted(
        [
            Row(id="0", countAsString="2"),
            Row(id="0", countAsString="3"),
            Row(id="1", countAsString="2"),
            Row(id="1", countAsString="2"),
        ]
    )


PROC_TIMER_OUTPUT = schema(
    ("id", StringType()), ("countAsString", StringType()), ("timeValues", StringType())
)


def proc_timer_run(spark: Any, tmp_path: Path, provider: str, mode: str) -> None:
    """Spark's ``_test_transform_with_state_proc_timer`` with its ``check_results``."""
    feed = TextFeed(tmp_path / "input")
    feed.resource3()
    feed.resource1()
    feed.resource2()
    df = input_df(spark, feed.path)
    planned = transform(
        df,
        mode,
        P.CountWithProcessingTimer(mode == "pandas"),
        PROC_TIMER_OUTPUT,
        time_mode="processingtime",
    )
    batches = run_batches(planned, "processing_time_test_query", tmp_path / "chk", provider)

    def counts(rows: list[Any]) -> set[Row]:
        return {Row(id=r.id, countAsString=r.countAsString) for r in rows}

    def expired_before_count(rows: list[Any]) -> None:
        expired = [r for r in rows if r.countAsString == "-1"]
        counted = [r for r in rows if r.countAsString != "-1"]
        for e in expired:
            for c in counted:
                if c.id == e.id:
                    assert e.timeValues < c.timeValues

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert counts(rows) == {
                Row(id="0", countAsString="1"),
                Row(id="1", countAsString="1"),
            }
        elif batch_id == 1:
            # key 0's count is emitted before the timer clears it
            assert counts(rows) == {
                Row(id="0", countAsString="3"),
                Row(id="0", countAsString="-1"),
                Row(id="1", countAsString="3"),
            }
            expired_before_count(rows)
        else:
            assert counts(rows) == {
                Row(id="0", countAsString="3"),
                Row(id="0", countAsString="-1"),
                Row(id="1", countAsString="5"),
            }

    check_each(batches, 3, check)


def test_transform_with_state_proc_timer(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    proc_timer_run(spark, tmp_path, provider, mode)


EVENT_TIME_OUTPUT = schema(("id", StringType()), ("timestamp", StringType()))


def event_time_batches(
    spark: Any, tmp_path: Path, provider: str, mode: str, processor: Any, time_mode: str
) -> Batches:
    """Spark's ``_test_transform_with_state_event_time``: three files of event times (seconds)."""
    feed = TextFeed(tmp_path / "input")
    feed.write("text-test3.txt", ["a, 20"])
    feed.write("text-test1.txt", ["a, 4"])
    feed.write("text-test2.txt", ["a, 2", "a, 11", "a, 13", "a, 15"])
    df = event_time_input(spark, feed.path, "10 seconds")
    assert df.isStreaming
    planned = transform(df, mode, processor, EVENT_TIME_OUTPUT, time_mode=time_mode)
    return run_batches(planned, "event_time_test_query", tmp_path / "chk", provider)


def event_time_run(spark: Any, tmp_path: Path, provider: str, mode: str) -> None:
    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            # late-event and eviction watermarks 0: the timer at 0 fires in the same batch
            assert set(rows) == {Row(id="a", timestamp="20"), Row(id="a-expired", timestamp="0")}
        elif batch_id == 1:
            # eviction watermark 10 (20 - 10): the timer at 10 s fires in the same batch
            assert set(rows) == {
                Row(id="a", timestamp="4"),
                Row(id="a-expired", timestamp="10000"),
            }
        else:
            # late-event watermark 10 drops 2; eviction watermark stays 10
            assert set(rows) == {
                Row(id="a", timestamp="15"),
                Row(id="a-expired", timestamp="10000"),
            }

    processor = P.MaxEventTime(mode == "pandas")
    batches = event_time_batches(spark, tmp_path, provider, mode, processor, "eventtime")
    check_each(batches, 3, check)


def test_transform_with_state_event_time(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    event_time_run(spark, tmp_path, provider, mode)


def test_transform_with_state_with_wmark_and_non_event_time(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:

    def check(batch_id: int, rows: list[Any]) -> None:
        # min event time; the watermark filters nothing in these time modes
        if batch_id == 0:
            assert set(rows) == {Row(id="a", timestamp="20")}
        elif batch_id == 1:
            assert set(rows) == {Row(id="a", timestamp="4")}
        elif batch_id == 2:
            assert set(rows) == {Row(id="a", timestamp="2")}
        # Spark's check stops the query at any later batch

    for time_mode in ("None", "ProcessingTime"):
        processor = P.MinEventTime(mode == "pandas")
        path = tmp_path / time_mode
        batches = event_time_batches(spark, path, provider, mode, processor, time_mode)
        check_each(batches, 3, check)


THREE_COL_OUTPUT = schema(("id1", StringType()), ("id2", StringType()), ("value", StringType()))


def non_contiguous_batches(
    spark: Any, tmp_path: Path, provider: str, mode: str, initial_state: Any = None
) -> Batches:
    feed = TextFeed(tmp_path / "input")
    feed.write("text-test1.txt", ["0,123,1", "0,46,1", "1,146,2", "1,346,2"])
    df = input_df_3_cols(spark, feed.path)
    assert df.isStreaming
    planned = transform(
        df,
        mode,
        P.SumWithInitialState(mode == "pandas"),
        THREE_COL_OUTPUT,
        group=("id1", "id2"),
        initial_state=initial_state,
    )
    return run_batches(planned, "this_query", tmp_path / "chk", provider)


def test_transform_with_state_non_contiguous_grouping_cols(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    def check(batch_id: int, rows: list[Any]) -> None:
        assert set(rows) == {
            Row(id1="0", id2="1", value=str(123 + 46)),
            Row(id1="1", id2="2", value=str(146 + 346)),
        }

    check_each(non_contiguous_batches(spark, tmp_path, provider, mode), 1, check)


def test_transform_with_state_non_contiguous_grouping_cols_with_init_state(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    def check(batch_id: int, rows: list[Any]) -> None:
        # the initial state of key (0, 1) is taken; (3, 2) has no input, so no output
        assert set(rows) == {
            Row(id1="0", id2="1", value=str(789 + 123 + 46)),
            Row(id1="1", id2="2", value=str(146 + 346)),
        }

    # the initial state's grouping columns do not lead its columns either
    initial = spark.createDataFrame(
        [(789, "0", "1"), (987, "3", "2")], "initVal int, id1 string, id2 string"
    ).groupBy("id1", "id2")
    check_each(non_contiguous_batches(spark, tmp_path, provider, mode, initial), 1, check)


def test_transform_with_state_chaining_ops(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    output = StructType(
        [
            StructField("id", StringType(), True),
            StructField("outputTimestamp", TimestampType(), True),
        ]
    )

    def check(batch_id: int, rows: list[Any]) -> None:
        got = {Row(outputTimestamp=r.outputTimestamp, count=r["count"]) for r in rows}
        if batch_id == 0:
            assert rows == []
        elif batch_id == 1:
            # eviction watermark 15 - 5 = 10, late-event watermark 0
            assert got == {Row(outputTimestamp=datetime.datetime(1970, 1, 1, 0, 0, 10), count=1)}
        elif batch_id == 2:
            # eviction watermark 25 - 5 = 20, late-event watermark 10: the row at 5 is dropped,
            # rows at or before 20 are final
            assert got == {
                Row(outputTimestamp=datetime.datetime(1970, 1, 1, 0, 0, 11), count=1),
                Row(outputTimestamp=datetime.datetime(1970, 1, 1, 0, 0, 15), count=1),
            }

    for i, grouping in enumerate((["outputTimestamp"], ["outputTimestamp", "id"])):
        feed = TextFeed(tmp_path / f"input{i}")
        feed.pairs("text-test3.txt", ["a", "b"], [10, 15])
        feed.pairs("text-test4.txt", ["a", "c"], [11, 25])
        feed.pairs("text-test1.txt", ["a"], [5])
        df = event_time_input(spark, feed.path, "5 seconds")
        assert df.isStreaming
        planned = transform(
            df,
            mode,
            P.FirstEventTime(mode == "pandas"),
            output,
            output_mode="Append",
            time_mode="eventTime",
            event_time_column="outputTimestamp",
        )
        batches: Batches = {}

        def collect(batch_df: Any, batch_id: int, into: Batches = batches) -> None:
            into[batch_id] = batch_df.collect()

        q = (
            start(
                planned.groupBy(grouping).count(),
                "chaining_ops_query",
                tmp_path / f"c{i}",
                provider,
            )
            .foreachBatch(collect)
            .outputMode("append")
            .trigger(availableNow=True)
            .start()
        )
        assert q.name == "chaining_ops_query"
        q.awaitTermination()
        assert q.exception() is None
        check_each(batches, 3, check)


COMPOSITE_STATE_OUTPUT = schema(
    ("id", StringType()),
    ("value_arr", StringType()),
    ("list_state_arr", StringType()),
    ("map_state_arr", StringType()),
    ("nested_map_state_arr", StringType()),
)


def test_transform_with_state_in_pandas_composite_type(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:

    def dumps(value: Any) -> str:
        return json.dumps(value, sort_keys=True)

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            maps = (dumps({"key1": [1], "key2": [10]}), dumps({"e1": {"e2": 5, "e3": 10}}))
            assert {tuple(r) for r in rows} == {(k, "0", "0", *maps) for k in ("0", "1")}, rows
        else:
            assert {tuple(r) for r in rows} == {
                (
                    "0",
                    "669",
                    "0,669",
                    dumps({"key1": [1], "key2": [10], "0": [669]}),
                    dumps({"e1": {"e2": 5, "e3": 10, "0": 669}}),
                ),
                (
                    "1",
                    "252",
                    "0,252",
                    dumps({"key1": [1], "key2": [10], "1": [252]}),
                    dumps({"e1": {"e2": 5, "e3": 10, "1": 252}}),
                ),
            }, rows

    processor = P.CompositeState(mode == "pandas")
    batches = basic_run(spark, tmp_path, provider, processor, COMPOSITE_STATE_OUTPUT)
    check_each(batches, 2, check)


INNER = StructType(
    [
        StructField("intValue", IntegerType(), True),
        StructField("doubleValue", DoubleType(), True),
        StructField("arrayValue", ArrayType(StringType()), True),
        StructField("mapValue", MapType(StringType(), StringType()), True),
    ]
)
COMPOSITE_OUTPUT = StructType(
    [
        StructField("primitiveValue", StringType(), True),
        StructField("listOfPrimitive", ArrayType(StringType()), True),
        StructField("mapOfPrimitive", MapType(StringType(), StringType()), True),
        StructField("listOfComposite", ArrayType(INNER), True),
        StructField("mapOfComposite", MapType(StringType(), INNER), True),
    ]
)


def _inner(i: int, int_value: int, double_value: float) -> Row:
    return Row(
        intValue=int_value,
        doubleValue=double_value,
        arrayValue=[f"elem_{i}_{j}" for j in range(i + 1)],
        mapValue={f"map_{i}_{j}": f"val_{i}_{j}" for j in range(i + 1)},
    )


#: Spark's expected composite rows: list element i is (i, 1.5 i), map entry i is (10 i, 2.5 i).
LIST_OF_COMPOSITE = [_inner(0, 0, 0.0), _inner(1, 1, 1.5), _inner(2, 2, 3.0), _inner(3, 3, 4.5)]
LIST_OF_COMPOSITE.append(_inner(4, 4, 6.0))
MAP_OF_COMPOSITE = {f"nested_key{i}": _inner(i, 10 * i, 2.5 * i) for i in range(5)}


def composite_row(key: str, count: int) -> Row:
    return Row(
        primitiveValue=f"key_{key}_count_{count}",
        listOfPrimitive=[f"item_{i}" for i in range(count)],
        mapOfPrimitive={f"key{i}": f"value{i}" for i in range(count)},
        listOfComposite=LIST_OF_COMPOSITE[:count],
        mapOfComposite={k: MAP_OF_COMPOSITE[k] for k in list(MAP_OF_COMPOSITE)[:count]},
    )


def test_composite_output_schema(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:

    def check(batch_id: int, rows: list[Any]) -> None:
        got = sorted(rows, key=lambda r: r.primitiveValue)
        if batch_id == 0:
            assert got == [composite_row("0", 2), composite_row("1", 2)]
        else:
            assert got == [composite_row("0", 5), composite_row("1", 4)]

    processor = P.CompositeOutput(mode == "pandas")
    check_each(basic_run(spark, tmp_path, provider, processor, COMPOSITE_OUTPUT), 2, check)


def test_transform_with_state_with_timers_single_partition(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    with sql_conf(spark, {"spark.sql.shuffle.partitions": "1"}):
        event_time_run(spark, tmp_path / "event", provider, mode)
        proc_timer_run(spark, tmp_path / "proc", provider, mode)


# ---------------------------------------------------------------------------------------------
# Schema evolution of a value state across restarts (Spark runs these with Avro encoding).

AVRO = {"spark.sql.streaming.stateStore.encodingFormat": "avro"}


def evolution_run(
    df: Any,
    mode: str,
    processor: Any,
    checkpoint: Path,
    provider: str,
    check: Callable[[list[Any]], None],
) -> None:
    """Spark's ``_run_evolution_test``: the processor's state schema is the output's value."""
    output = schema(("id", StringType()), ("value", processor.state_schema))
    planned = transform(df, mode, processor, output)
    batches = run_batches(planned, "evolution_test", checkpoint, provider)
    assert batches
    for rows in batches.values():
        check(rows)


def test_schema_evolution_scenarios(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    pandas = mode == "pandas"
    checkpoint = tmp_path / "checkpoint"
    feed = TextFeed(tmp_path / "input")
    feed.resource1()
    df = input_df(spark, feed.path)

    def basic(rows: list[Any]) -> None:
        assert rows[0].value["id"] == 0
        assert rows[0].value["name"] == "name-0"

    def added(rows: list[Any]) -> None:  # the new fields of a stored value are null
        value = rows[0].value
        assert value["id"] == 0
        assert value["count"] is None
        assert value["active"] is None
        assert value["score"] is None

    def removed(rows: list[Any]) -> None:
        assert rows[0].value["id"] == 0
        assert rows[0].value["name"] == "name-00"

    def reordered(rows: list[Any]) -> None:
        assert rows[0].value["name"] == "name-00"
        assert rows[0].value["id"] == 0

    def upcast(rows: list[Any]) -> None:
        assert rows[0].value["id"] == 1
        assert rows[0].value["name"] == "name-0"

    with sql_conf(spark, AVRO):
        evolution_run(df, mode, P.BasicState(pandas), checkpoint, provider, basic)
        feed.resource2()
        evolution_run(df, mode, P.AddedFieldsState(pandas), checkpoint, provider, added)
        feed.resource3()
        evolution_run(df, mode, P.RemovedFieldsState(pandas), checkpoint, provider, removed)
        feed.resource4()
        evolution_run(df, mode, P.ReorderedFieldsState(pandas), checkpoint, provider, reordered)
        feed.resource5()
        evolution_run(df, mode, P.UpcastState(pandas), checkpoint, provider, upcast)


def test_schema_evolution_fails(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    """A long narrowed back to an int is refused on restart (Spark's case expects
    STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION)."""
    pandas = mode == "pandas"
    checkpoint = tmp_path / "checkpoint"
    feed = TextFeed(tmp_path / "input")
    feed.resource1()
    df = input_df(spark, feed.path)

    def added(rows: list[Any]) -> None:
        assert rows[0].value["count"] == 100
        assert rows[0].value["active"]

    def upcast(rows: list[Any]) -> None:
        assert rows[0].value["name"] == "name-0"

    def basic(rows: list[Any]) -> None:
        assert rows[0].value["id"] == 0
        assert rows[0].value["name"] == "name-0"

    with sql_conf(spark, AVRO):
        evolution_run(df, mode, P.AddedFieldsState(pandas), checkpoint, provider, added)
        feed.resource2()
        evolution_run(df, mode, P.UpcastState(pandas), checkpoint, provider, upcast)
        feed.resource3()
        with pytest.raises(Exception) as failure:
            evolution_run(df, mode, P.BasicState(pandas), checkpoint, provider, basic)
    message = str(failure.value)
    assert "[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION]" in message, message
    assert "Schema evolution is not possible" in message, message


def test_not_nullable_fails(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    """A state schema with a non-nullable field is refused (Spark's case expects
    TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE)."""
    feed = TextFeed(tmp_path / "input")
    feed.resource1()
    df = input_df(spark, feed.path)

    def basic(rows: list[Any]) -> None:
        assert rows[0].value["id"] == 0
        assert rows[0].value["name"] == "name-0"

    processor = P.BasicStateNotNullable(mode == "pandas")
    with sql_conf(spark, AVRO), pytest.raises(Exception) as failure:
        evolution_run(df, mode, processor, tmp_path / "checkpoint", provider, basic)
    message = str(failure.value)
    assert "[TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE]" in message, message
    assert "column family state must be nullable" in message, message


# ---------------------------------------------------------------------------------------------
# Arrow batch limits: how many frames a key's rows come in (pandas mode only, as in Spark).

INITIAL_3 = [("0", 789), ("3", 987)]
SMALL_LIMIT = [
    {Row(id="0", chunkCount=2), Row(id="1", chunkCount=2)},
    {Row(id="0", chunkCount=3), Row(id="1", chunkCount=2)},
]
LARGE_LIMIT = [
    {Row(id="0", chunkCount=1), Row(id="1", chunkCount=1)},
    {Row(id="0", chunkCount=1), Row(id="1", chunkCount=1)},
]


def chunk_runs(spark: Any, tmp_path: Path, provider: str, expected: list[set[Row]]) -> None:
    initial = spark.createDataFrame(INITIAL_3, "id string, initVal int").groupBy("id")

    def check(batch_id: int, rows: list[Any]) -> None:
        assert set(rows) == expected[0 if batch_id == 0 else 1]

    plain = basic_run(spark, tmp_path / "plain", provider, P.ChunkCount(True), CHUNK_OUTPUT)
    check_each(plain, 2, check)
    with_initial = basic_run(
        spark,
        tmp_path / "initial",
        provider,
        P.ChunkCount(True, initial=True),
        CHUNK_OUTPUT,
        initial_state=initial,
    )
    check_each(with_initial, 2, check)


@pytest.mark.parametrize("limit", ["small", "large"])
def test_transform_with_state_with_bytes_limit(
    spark: Any, tmp_path: Path, provider: str, limit: str, request: pytest.FixtureRequest
) -> None:
    # "2" bytes: every row its own frame; 100000: a key's rows in one frame
    value, expected = ("2", SMALL_LIMIT) if limit == "small" else ("100000", LARGE_LIMIT)
    with sql_conf(spark, {"spark.sql.execution.arrow.maxBytesPerBatch": value}):
        chunk_runs(spark, tmp_path, provider, expected)


@pytest.mark.parametrize("limit", ["small", "large"])
def test_transform_with_state_with_records_limit(
    spark: Any, tmp_path: Path, provider: str, limit: str, request: pytest.FixtureRequest
) -> None:
    value, expected = ("1", SMALL_LIMIT) if limit == "small" else ("-1", LARGE_LIMIT)
    with sql_conf(spark, {"spark.sql.execution.arrow.maxRecordsPerBatch": value}):
        chunk_runs(spark, tmp_path, provider, expected)


def test_transform_with_state_large_values(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    large = "a" * (512 * 1024)
    row = {
        "valueStateResult": large,
        "listStateResult": ",".join([large, large + "b", large + "c"]),
        "mapStateResult": f"large_string_key:{large}",
    }

    def check(batch_id: int, rows: list[Any]) -> None:
        assert set(rows) == {Row(id="0", **row), Row(id="1", **row)}

    output = schema(
        ("id", StringType()),
        ("valueStateResult", StringType()),
        ("listStateResult", StringType()),
        ("mapStateResult", StringType()),
    )
    processor = P.LargeValues(mode == "pandas")
    batches = basic_run(spark, tmp_path, provider, processor, output, single_batch=True)
    check_each(batches, 1, check)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
