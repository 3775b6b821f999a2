"""Spark's transformWithState state-variable tests, ported with only the query's input wrapped.

Source: ``test_pandas_transform_with_state_state_variable.py`` in
``python/pyspark/sql/tests/pandas/streaming/`` (apache/spark, stored version 1394b0cf): value,
list and map state, TTL, initial state, timers and the state readers over the checkpoint.
Spark runs it in pandas mode and, through ``test_transform_with_state_state_variable.py``, in
row mode; every case runs in both modes on both providers, with the conventions of
``test_transform_with_state.py``. The state readers: Spark's ``statestore`` and
``state-metadata`` read Spark's checkpoints; a wrapped query's checkpoint is read by ours
(``sparkstate``, ``sparkstate-metadata``), which take the same options and give the same columns.

Left out, with the reason:

==========================================  ===================================================
Spark's case                                why
==========================================  ===================================================
test_value_state_ttl_expiration             skipped in Spark itself (flaky, sleeps for TTL)
==========================================  ===================================================
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from . import tws_processors as P
from .tws_support import (
    DELETE_IF_EXISTS,
    METADATA_READER,
    METADATA_TIMERS,
    MODES,
    SELECT_AFTER_TWS,
    STATE_READER,
    SUITE_CONF,
    Batches,
    TextFeed,
    basic_run,
    check_each,
    expect_failure,
    input_df,
    run_batches,
    schema,
    sql_conf,
    transform,
)

cloudpickle.register_pickle_by_value(P)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", autouse=True)
def suite_conf(spark: Any) -> Iterator[None]:
    with sql_conf(spark, SUITE_CONF):
        yield


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def counts(*pairs: tuple[str, str]) -> set[Row]:
    return {Row(id=k, countAsString=c) for k, c in pairs}


def test_transform_with_state_basic(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    expect_failure(request, DELETE_IF_EXISTS)

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == counts(("0", "2"), ("1", "2"))
        else:
            assert set(rows) == counts(("0", "3"), ("1", "2"))

    batches = basic_run(spark, tmp_path, provider, P.ViolationsCount(mode == "pandas"))
    check_each(batches, 2, check)


def single_batch_case(
    spark: Any, tmp_path: Path, provider: str, processor: Any, time_mode: str
) -> None:
    """Spark's single-batch cases: every batch emits a count of 2 for keys 0 and 1."""

    def check(batch_id: int, rows: list[Any]) -> None:
        assert set(rows) == counts(("0", "2"), ("1", "2"))

    batches = basic_run(
        spark, tmp_path, provider, processor, single_batch=True, time_mode=time_mode
    )
    check_each(batches, 1, check)


def test_transform_with_state_non_exist_value_state(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    def check(batch_id: int, rows: list[Any]) -> None:
        assert set(rows) == counts(("0", "0"), ("1", "0"))

    processor = P.NeverSetValue(mode == "pandas")
    check_each(basic_run(spark, tmp_path, provider, processor, single_batch=True), 1, check)


def test_transform_with_state_list_state(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    processor = P.ListStates(mode == "pandas")
    single_batch_case(spark, tmp_path, provider, processor, "processingTime")


def test_transform_with_state_list_state_large_list(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            before, after = "", ",".join(str(i) for i in range(100))
        else:
            before = ",".join(str(i) for i in range(100))
            after = ",".join(str(i) for i in range(190))
        assert set(rows) == {
            Row(id=k, prevElements=before, updatedElements=after) for k in ("0", "1")
        }

    output = schema(
        ("id", StringType()), ("prevElements", StringType()), ("updatedElements", StringType())
    )
    feed = TextFeed(tmp_path / "input")
    feed.resource1()
    feed.resource2()
    df = input_df(spark, feed.path)
    assert df.isStreaming
    planned = transform(df, mode, P.LargeList(mode == "pandas"), output, time_mode="none")
    check_each(run_batches(planned, "this_query", tmp_path / "chk", provider), 2, check)


def test_transform_with_state_list_state_large_ttl(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    processor = P.ListStates(mode == "pandas", ttl=True)
    single_batch_case(spark, tmp_path, provider, processor, "processingTime")


def test_transform_with_state_map_state(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    single_batch_case(spark, tmp_path, provider, P.MapStateCounts(mode == "pandas"), "None")


def test_transform_with_state_map_state_large_ttl(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    processor = P.MapStateCounts(mode == "pandas", ttl=True)
    single_batch_case(spark, tmp_path, provider, processor, "processingTime")


def test_value_state_ttl_basic(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    expect_failure(request, DELETE_IF_EXISTS)

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == counts(("0", "2"), ("1", "2"))
        else:
            assert set(rows) == counts(("0", "3"), ("1", "2"))

    processor = P.ViolationsCountTTL(mode == "pandas")
    batches = basic_run(spark, tmp_path, provider, processor, time_mode="processingTime")
    check_each(batches, 2, check)


# ---------------------------------------------------------------------------------------------
# Initial state: Spark's ``_test_transform_with_state_init_state``.

INIT_OUTPUT = "id string, value string"


def init_state_batches(
    spark: Any,
    tmp_path: Path,
    provider: str,
    mode: str,
    processor: Any,
    *,
    time_mode: str = "None",
    initial_state: Any = None,
    extra_transformation: bool = False,
    checkpoint: Path | None = None,
    inside: Any = None,
) -> Batches:
    feed = TextFeed(tmp_path / "input")
    feed.resource1()
    feed.pairs("text-test2.txt", [0, 3], [67, 12])
    df = input_df(spark, feed.path)
    assert df.isStreaming
    if initial_state is None:
        initial_state = spark.createDataFrame(
            [("0", 789), ("3", 987)], "id string, initVal int"
        ).groupBy("id")
    planned = transform(
        df, mode, processor, INIT_OUTPUT, time_mode=time_mode, initial_state=initial_state
    )
    if extra_transformation:
        planned = planned.select(
            F.col("id").cast("string").alias("key"),
            F.to_json(F.struct(F.col("value"))).alias("value"),
        )
    chk = checkpoint or tmp_path / "chk"
    return run_batches(planned, "this_query", chk, provider, inside)


def values(key: str = "id", **expected: int) -> set[Row]:
    return {Row(**{key: k, "value": str(v)}) for k, v in expected.items()}


def test_transform_with_state_init_state(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            # key 0's initial state is taken once; key 1 has none; key 3 has no input yet
            assert set(rows) == {Row(id="0", value="958"), Row(id="1", value="492")}
        else:
            assert set(rows) == {
                Row(id="0", value=str(789 + 123 + 46 + 67)),
                Row(id="3", value=str(987 + 12)),
            }

    processor = P.SumWithInitialState(mode == "pandas")
    check_each(init_state_batches(spark, tmp_path, provider, mode, processor), 2, check)


def test_transform_with_state_init_state_with_extra_transformation(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    expect_failure(request, SELECT_AFTER_TWS)

    def as_json(key: str, value: int) -> Row:
        return Row(key=key, value=f'{{"value":"{value}"}}')

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == {as_json("0", 789 + 123 + 46), as_json("1", 146 + 346)}
        else:
            assert set(rows) == {as_json("0", 789 + 123 + 46 + 67), as_json("3", 987 + 12)}

    processor = P.SumWithInitialState(mode == "pandas")
    batches = init_state_batches(
        spark, tmp_path, provider, mode, processor, extra_transformation=True
    )
    check_each(batches, 2, check)


def init_state_with_timers_run(spark: Any, tmp_path: Path, provider: str, mode: str) -> None:
    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            # the initial state's timers (keys 0 and 3) fire in the first batch, input or not
            expired = {Row(id=r.id) for r in rows if "expired" in r.id}
            assert expired == {Row(id="0-expired"), Row(id="3-expired")}
            data = {r for r in rows if "expired" not in r.id}
            assert data == {Row(id="0", value="958"), Row(id="1", value="492")}
        else:
            assert set(rows) == {
                Row(id="0", value=str(789 + 123 + 46 + 67)),
                Row(id="3", value=str(987 + 12)),
            }

    processor = P.SumWithInitialStateTimers(mode == "pandas")
    batches = init_state_batches(
        spark, tmp_path, provider, mode, processor, time_mode="processingTime"
    )
    check_each(batches, 2, check)


def test_transform_with_state_init_state_with_timers(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    init_state_with_timers_run(spark, tmp_path, provider, mode)


# ---------------------------------------------------------------------------------------------
# The state readers over the query's checkpoint.


def map_state_metadata_case(
    spark: Any, tmp_path: Path, provider: str, mode: str, initial_state: Any
) -> None:
    checkpoint = tmp_path / "checkpoint"
    operator_name = (
        "transformWithStateInPandasExec" if mode == "pandas" else "transformWithStateInPySparkExec"
    )

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == counts(("0", "2"), ("1", "2"))

    def inside(batch_df: Any, batch_id: int) -> None:
        if batch_id == 0:
            return
        session = batch_df.sparkSession
        metadata = session.read.format(METADATA_READER).load(str(checkpoint))
        columns = ["operatorId", "operatorName", "stateStoreName", "numPartitions"]
        assert set(metadata.select(*columns, "minBatchId", "maxBatchId").collect()) == {
            Row(
                operatorId=0,
                operatorName=operator_name,
                stateStoreName="default",
                numPartitions=5,
                minBatchId=0,
                maxBatchId=0,
            )
        }
        properties = json.loads(metadata.select("operatorProperties").collect()[0][0])
        assert properties["timeMode"] == "ProcessingTime"
        assert properties["outputMode"] == "Update"
        variables = properties["stateVariables"]
        assert len(variables) == 3
        for var in variables:
            if var["stateName"] == "mapState":
                assert var["stateVariableType"] == "MapState"
                assert var["ttlEnabled"]
            elif var["stateName"] == "listState":
                assert var["stateVariableType"] == "ListState"
                assert not var["ttlEnabled"]
            else:
                assert var["stateName"] == "$procTimers_keyToTimestamp"
                assert var["stateVariableType"] == "TimerState"

        def read(**options: Any) -> Any:
            reader = session.read.format(STATE_READER).option("path", str(checkpoint))
            for k, v in options.items():
                reader = reader.option(k, v)
            return reader.load()

        expected = [
            Row(groupingKey="0", mapKey="key2", mapValue=2),
            Row(groupingKey="1", mapKey="key2", mapValue=2),
        ]
        map_state = read(stateVarName="mapState")
        assert (
            map_state.selectExpr(
                "key.id AS groupingKey",
                "user_map_key.name AS mapKey",
                "user_map_value.value.count AS mapValue",
            )
            .sort("groupingKey")
            .collect()
            == expected
        )
        nested = read(stateVarName="mapState", flattenCollectionTypes=False)
        assert (
            nested.select("key.id", F.explode(F.col("map_value")).alias("map_key", "map_value"))
            .selectExpr(
                "id AS groupingKey", "map_key.name AS mapKey", "map_value.value.count AS mapValue"
            )
            .sort("groupingKey")
            .collect()
            == expected
        )
        ttls = map_state.selectExpr("user_map_value.ttlExpirationMs AS TTLVal").collect()
        assert len(ttls) == 2  # one TTL a row, the same for both
        assert len(set(ttls)) == 1
        assert read(stateVarName="listState").isEmpty()

    processor = P.MapStateCounts(mode == "pandas", ttl=True)
    batches = basic_run(
        spark,
        tmp_path,
        provider,
        processor,
        single_batch=True,
        time_mode="processingTime",
        initial_state=initial_state,
        checkpoint=checkpoint,
        inside=inside,
    )
    check_each(batches, 1, check)


def test_transform_with_map_state_metadata(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    map_state_metadata_case(spark, tmp_path, provider, mode, None)


def test_transform_with_map_state_metadata_with_init_state(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    # a no-op initial state (its column matches no state): TWS with initial state runs
    # through another path in Spark
    initial = spark.createDataFrame([("0", 789), ("3", 987)], "id string, temperature int").groupBy(
        "id"
    )
    map_state_metadata_case(spark, tmp_path, provider, mode, initial)


def test_transform_with_list_state_metadata(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    expect_failure(request, METADATA_TIMERS)
    checkpoint = tmp_path / "checkpoint"

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == counts(("0", "2"), ("1", "2"))

    def inside(batch_df: Any, batch_id: int) -> None:
        if batch_id == 0:
            return
        session = batch_df.sparkSession
        metadata = session.read.format(METADATA_READER).load(str(checkpoint))
        properties = json.loads(metadata.select("operatorProperties").collect()[0][0])
        variables = properties["stateVariables"]
        assert len(variables) == 4, variables
        for var in variables:
            if var["stateName"] in ("listState1", "listState2", "listStateTimestamp"):
                assert var["stateVariableType"] == "ListState"
            else:
                assert var["stateName"] == "$procTimers_keyToTimestamp"
                assert var["stateVariableType"] == "TimerState"

        def read(name: str, flatten: bool) -> Any:
            return (
                session.read.format(STATE_READER)
                .option("path", str(checkpoint))
                .option("stateVarName", name)
                .option("flattenCollectionTypes", flatten)
                .load()
            )

        flat = read("listState1", True).selectExpr(
            "key.id AS groupingKey", "list_element.temperature AS listElement"
        )
        assert flat.sort("groupingKey", "listElement").collect() == [
            Row(groupingKey=k, listElement=v) for k in ("0", "1") for v in (20, 20, 111, 120, 120)
        ]
        nested = (
            read("listState2", False)
            .selectExpr("key.id AS groupingKey", "list_value.temperature AS valueList")
            .sort("groupingKey")
            .withColumn("valueSortedList", F.array_sort(F.col("valueList")))
        )
        assert nested.select("groupingKey", "valueSortedList").collect() == [
            Row(groupingKey=k, valueSortedList=[20, 20, 120, 120, 222]) for k in ("0", "1")
        ]

    processor = P.ListStates(mode == "pandas")
    batches = basic_run(
        spark,
        tmp_path,
        provider,
        processor,
        time_mode="processingTime",
        checkpoint=checkpoint,
        inside=inside,
    )
    check_each(batches, 2, check)


def test_transform_with_value_state_metadata(
    spark: Any, tmp_path: Path, provider: str, mode: str, request: pytest.FixtureRequest
) -> None:
    expect_failure(request, DELETE_IF_EXISTS, METADATA_TIMERS)
    checkpoint = tmp_path / "checkpoint"

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == counts(("0", "2"), ("1", "2"))
        else:
            assert set(rows) == counts(("0", "3"), ("1", "2"))

    def inside(batch_df: Any, batch_id: int) -> None:
        if batch_id == 0:
            return
        session = batch_df.sparkSession
        metadata = session.read.format(METADATA_READER).load(str(checkpoint))
        properties = json.loads(metadata.select("operatorProperties").collect()[0][0])
        variables = properties["stateVariables"]
        assert len(variables) == 3, variables
        for var in variables:
            if var["stateName"] not in ("numViolations", "tempState"):
                assert var["stateName"] == "$procTimers_keyToTimestamp"
                assert var["stateVariableType"] == "TimerState"
        changes = (
            session.read.format(STATE_READER)
            .option("path", str(checkpoint))
            .option("stateVarName", "numViolations")
            .option("readChangeFeed", True)
            .option("changeStartBatchId", 0)
            .load()
            .selectExpr(
                "change_type", "key.id AS groupingKey", "value.value AS value", "partition_id"
            )
        )
        assert changes.select("change_type", "groupingKey", "value").sort(
            "groupingKey"
        ).collect() == [
            Row(change_type="update", groupingKey="0", value=1),
            Row(change_type="update", groupingKey="1", value=2),
        ]
        for (partition,) in changes.select("partition_id").collect():
            snapshot = (
                session.read.format(STATE_READER)
                .option("path", str(checkpoint))
                .option("stateVarName", "numViolations")
                .option("snapshotPartitionId", partition)
                .option("snapshotStartBatchId", 0)
                .load()
            )
            from_changes = (
                changes.select("partition_id", "groupingKey", "value")
                .filter(changes["partition_id"] == partition)
                .sort("groupingKey")
                .collect()
            )
            assert (
                from_changes
                == snapshot.selectExpr(
                    "partition_id", "key.id AS groupingKey", "value.value AS value"
                )
                .sort("groupingKey")
                .collect()
            )

    conf = {"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
    with sql_conf(spark, conf):
        batches = basic_run(
            spark,
            tmp_path,
            provider,
            P.ViolationsCount(mode == "pandas"),
            time_mode="processingTime",
            checkpoint=checkpoint,
            inside=inside,
        )
    check_each(batches, 2, check)


def restart_with_multiple_rows_init_state_run(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    """A query's list state, read back by the state reader, is the initial state (several rows
    a key) of a new query."""
    pandas = mode == "pandas"
    first = tmp_path / "first"
    single_batch_case(spark, first, provider, P.ListStates(pandas), "None")
    list_state = (
        spark.read.format(STATE_READER)
        .option("path", str(first / "checkpoint"))
        .option("stateVarName", "listState1")
        .load()
        .selectExpr("key.id AS id", "list_element.temperature AS initVal")
    )
    new_checkpoint = tmp_path / "second" / "chk"

    def check(batch_id: int, rows: list[Any]) -> None:
        if batch_id == 0:
            assert set(rows) == {Row(id="0", value=str(123 + 46)), Row(id="1", value="492")}
        else:
            assert set(rows) == {Row(id="0", value=str(123 + 46 + 67)), Row(id="3", value="12")}

    def inside(batch_df: Any, batch_id: int) -> None:
        if batch_id == 0:
            return
        df = (
            batch_df.sparkSession.read.format(STATE_READER)
            .option("path", str(new_checkpoint))
            .option("stateVarName", "list_state")
            .load()
            .selectExpr("key.id AS id", "list_element.value AS value")
        )
        for key in ("0", "1"):  # every initial row is in the list state
            got = [r["value"] for r in df.filter(df.id == key).sort("value").collect()]
            assert got == [20, 20, 111, 120, 120]

    batches = init_state_batches(
        spark,
        tmp_path / "second",
        provider,
        mode,
        P.SumWithListInitialState(pandas),
        initial_state=list_state.groupBy("id"),
        checkpoint=new_checkpoint,
        inside=inside,
    )
    check_each(batches, 2, check)


def test_transform_with_state_restart_with_multiple_rows_init_state(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    restart_with_multiple_rows_init_state_run(spark, tmp_path, provider, mode)


def test_transform_with_state_with_timers_single_partition(
    spark: Any, tmp_path: Path, provider: str, mode: str
) -> None:
    with sql_conf(spark, {"spark.sql.shuffle.partitions": "1"}):
        init_state_with_timers_run(spark, tmp_path / "timers", provider, mode)
        restart_with_multiple_rows_init_state_run(spark, tmp_path / "restart", provider, mode)
