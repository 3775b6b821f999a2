"""Spark's state variable tests of ``transformWithStateInPandas`` and ``transformWithState``.

Re-stated from Apache Spark's
``python/pyspark/sql/tests/pandas/streaming/test_pandas_transform_with_state_state_variable.py``
(commit ea1eae76bd3a as stored) and its row-mode twin
``.../streaming/test_transform_with_state_state_variable.py`` (commit 611b1b43cfd4), which runs
the same mixin with ``use_pandas() == False``; the processors are those of
``.../helper/helper_pandas_transform_with_state.py`` (``state_variable_processors.py`` here).
Each case runs in both modes (``pandas`` / ``row``) and on both providers (once in each mode,
on the two providers: ``conftest.py``), with the session conf of
Spark's suites (five shuffle partitions, UTC, two records per Arrow batch, no no-data batches).
Only the query's input is wrapped; the state reads of the metadata cases use our reader's
format names (``sparkstate`` for ``statestore``, ``sparkstate-metadata`` for ``state-metadata``)
with Spark's options and columns. Where Spark's test sleeps two seconds between its two input
files, the files are written with modification times a second apart before the query starts.

=====================================================  ==========================================
Spark's case                                           here
=====================================================  ==========================================
test_transform_with_state_basic                        ported
test_transform_with_state_non_exist_value_state        ported
test_transform_with_state_list_state                   ported
test_transform_with_state_list_state_large_list        ported
test_transform_with_state_list_state_large_ttl         ported
test_transform_with_state_map_state                    ported
test_transform_with_state_map_state_large_ttl          ported
test_value_state_ttl_basic                             ported
test_value_state_ttl_expiration                        left out: skipped in Spark itself
                                                       (SPARK-50908, its timing is flaky)
test_transform_with_state_init_state                   ported
test_transform_with_state_init_state_with_extra_       ported
transformation
test_transform_with_state_init_state_with_timers       ported
test_transform_with_map_state_metadata                 ported (one batch: Spark's state reads
                                                       sit in the branch of batch 1, never run)
test_transform_with_map_state_metadata_with_init_      ported (as above)
state
test_transform_with_list_state_metadata                ported
test_transform_with_value_state_metadata               ported
test_transform_with_state_restart_with_multiple_       ported
rows_init_state
test_transform_with_state_with_timers_single_          ported
partition
=====================================================  ==========================================
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as fn
from pyspark.sql.functions import array_sort, col, explode, split
from pyspark.sql.types import StringType, StructField, StructType

from . import state_variable_processors as procs
from .porting import ORACLE, TextFiles, wrap

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

#: The conf of Spark's two suites besides the compat session's (partitions, time zone).
SUITE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.execution.arrow.transformWithStateInPandas.maxRecordsPerBatch": "2",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


@pytest.fixture(scope="module", autouse=True)
def suite_conf(spark: SparkSession) -> Iterator[None]:
    with _conf(spark, SUITE_CONF):
        yield


class _conf:  # noqa: N801 - used as a context manager, as Spark's sql_conf
    def __init__(self, spark: SparkSession, conf: dict[str, str]) -> None:
        self.spark, self.conf, self.before = spark, conf, {}

    def __enter__(self) -> None:
        for key, value in self.conf.items():
            self.before[key] = self.spark.conf.get(key, None)
            self.spark.conf.set(key, value)

    def __exit__(self, *exc: Any) -> None:
        for key, value in self.before.items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)


def source(name: str) -> str:
    """A state reader format of Spark's test, as a sparkstate checkpoint is read."""
    if ORACLE:
        return name
    return {"statestore": "sparkstate", "state-metadata": "sparkstate-metadata"}[name]


# --- Spark's input files and query ---------------------------------------------------------------


def _lines(col1: list[Any], col2: list[Any]) -> str:
    return "".join(f"{a}, {b}\n" for a, b in zip(col1, col2, strict=True))


FILE1 = _lines([0, 0, 1, 1], [123, 46, 146, 346])
FILE2 = _lines([0, 0, 0, 1, 1], [123, 223, 323, 246, 6])
INIT_FILE2 = _lines([0, 3], [67, 12])

COUNT_OUTPUT = StructType(
    [StructField("id", StringType(), True), StructField("countAsString", StringType(), True)]
)


def _input(spark: SparkSession, path: Path) -> Any:
    df = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(path))
    parts = df.withColumn("split_values", split(df["value"], ","))
    return parts.select(
        parts.split_values.getItem(0).alias("id").cast("string"),
        parts.split_values.getItem(1).alias("temperature").cast("int"),
    )


class Run:
    """One case's query: Spark's ``_test_transform_with_state_basic`` and
    ``_test_transform_with_state_init_state`` (its files, processor, schema, mode, checks)."""

    def __init__(self, spark: SparkSession, tmp_path: Path, provider: str, mode: str) -> None:
        self.spark, self.tmp, self.provider, self.pandas = (
            spark,
            tmp_path,
            provider,
            mode == "pandas",
        )
        self.runs = 0

    def processor(self, cls: type[procs.Processor]) -> procs.Processor:
        return cls(self.pandas)

    def start(
        self,
        cls: type[procs.Processor],
        check: Callable[[Any, int], None],
        files: list[str],
        output: Any,
        time_mode: str = "None",
        checkpoint: str | None = None,
        initial_state: Any = None,
        extra: Callable[[Any], Any] | None = None,
    ) -> list[int]:
        """Write ``files``, run the query until it has read them, stop it; the batch ids the
        checks ran for."""
        self.runs += 1
        inp = TextFiles(self.tmp / f"in-{self.runs}")
        for i, text in enumerate(files, start=1):
            inp.write(f"text-test{i}.txt", text)
        checkpoint = checkpoint or str(self.tmp / f"chk-{self.runs}")
        df = _input(self.spark, inp.path)
        assert df.isStreaming
        grouped = wrap(df).groupBy("id")
        api = grouped.transformWithStateInPandas if self.pandas else grouped.transformWithState
        out = api(
            statefulProcessor=self.processor(cls),
            outputStructType=output,
            outputMode="Update",
            timeMode=time_mode,
            initialState=initial_state,
        )
        if extra is not None:
            out = extra(out)
        seen: list[int] = []

        def check_results(batch_df: Any, batch_id: int) -> None:
            check(batch_df, batch_id)
            seen.append(batch_id)

        q = (
            out.writeStream.queryName("this_query")
            .option("checkpointLocation", checkpoint)
            .option("stateStore", self.provider)
            .foreachBatch(check_results)
            .outputMode("update")
            .start()
        )
        try:
            assert q.name == "this_query"
            assert q.isActive
            q.processAllAvailable()
        finally:
            q.stop()
        q.awaitTermination(10)
        assert q.exception() is None
        assert set(range(len(files))) <= set(seen), f"checks ran for batches {seen}"
        return seen

    def basic(
        self,
        cls: type[procs.Processor],
        check: Callable[[Any, int], None],
        single_batch: bool = False,
        time_mode: str = "None",
        checkpoint: str | None = None,
        initial_state: Any = None,
        output: Any = COUNT_OUTPUT,
    ) -> list[int]:
        files = [FILE1] if single_batch else [FILE1, FILE2]
        return self.start(cls, check, files, output, time_mode, checkpoint, initial_state)

    def init_state(
        self,
        cls: type[procs.Processor],
        check: Callable[[Any, int], None],
        time_mode: str = "None",
        checkpoint: str | None = None,
        initial_state: Any = None,
        extra: Callable[[Any], Any] | None = None,
    ) -> list[int]:
        if initial_state is None:
            data = [("0", 789), ("3", 987)]
            initial_state = self.spark.createDataFrame(data, "id string, initVal int").groupBy("id")
        return self.start(
            cls,
            check,
            [FILE1, INIT_FILE2],
            "id string, value string",
            time_mode,
            checkpoint,
            initial_state,
            extra,
        )


@pytest.fixture
def run(spark: SparkSession, tmp_path: Path, provider: str, mode: str) -> Run:
    return Run(spark, tmp_path, provider, mode)


def _count_rows(*pairs: tuple[str, str]) -> set[Row]:
    return {Row(id=i, countAsString=c) for i, c in pairs}


# --- value, list and map state -------------------------------------------------------------------


def test_transform_with_state_basic(
    run: Run, provider: str, request: pytest.FixtureRequest
) -> None:

    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == _count_rows(("0", "2"), ("1", "2"))
        else:
            assert set(batch_df.sort("id").collect()) == _count_rows(("0", "3"), ("1", "2"))

    run.basic(procs.SimpleStatefulProcessor, check)


def test_transform_with_state_non_exist_value_state(run: Run) -> None:
    def check(batch_df: Any, _: int) -> None:
        batch_df.collect()
        assert set(batch_df.sort("id").collect()) == _count_rows(("0", "0"), ("1", "0"))

    run.basic(procs.InvalidSimpleStatefulProcessor, check, True)


def _two_each(batch_df: Any, _: int) -> None:
    batch_df.collect()
    assert set(batch_df.sort("id").collect()) == _count_rows(("0", "2"), ("1", "2"))


def test_transform_with_state_list_state(run: Run) -> None:
    run.basic(procs.ListStateProcessor, _two_each, True, "processingTime")


def test_transform_with_state_list_state_large_list(run: Run) -> None:
    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            prev, updated = "", ",".join(map(str, range(100)))
        else:
            prev, updated = ",".join(map(str, range(100))), ",".join(map(str, range(190)))
        assert set(batch_df.sort("id").collect()) == {
            Row(id="0", prevElements=prev, updatedElements=updated),
            Row(id="1", prevElements=prev, updatedElements=updated),
        }

    output = StructType(
        [
            StructField("id", StringType(), True),
            StructField("prevElements", StringType(), True),
            StructField("updatedElements", StringType(), True),
        ]
    )
    run.start(procs.ListStateLargeListProcessor, check, [FILE1, FILE2], output, "none")


def test_transform_with_state_list_state_large_ttl(run: Run) -> None:
    """List state under a TTL that does not expire behaves as list state."""
    run.basic(procs.ListStateLargeTTLProcessor, _two_each, True, "processingTime")


def test_transform_with_state_map_state(run: Run) -> None:
    run.basic(procs.MapStateProcessor, _two_each, True)


def test_transform_with_state_map_state_large_ttl(run: Run) -> None:
    """Map state under a TTL that does not expire behaves as map state."""
    run.basic(procs.MapStateLargeTTLProcessor, _two_each, True, "processingTime")


def test_value_state_ttl_basic(run: Run, provider: str, request: pytest.FixtureRequest) -> None:
    """Value state under a TTL that does not expire behaves as value state."""

    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == _count_rows(("0", "2"), ("1", "2"))
        else:
            assert set(batch_df.sort("id").collect()) == _count_rows(("0", "3"), ("1", "2"))

    run.basic(procs.SimpleTTLStatefulProcessor, check, False, "processingTime")


# --- initial state -------------------------------------------------------------------------------


def _init_state_check(batch_df: Any, batch_id: int) -> None:
    batch_df.collect()
    if batch_id == 0:
        # key 0 had initial state (used once), key 1 none; key 3 is not in this batch's input
        assert set(batch_df.sort("id").collect()) == {
            Row(id="0", value=str(789 + 123 + 46)),
            Row(id="1", value=str(146 + 346)),
        }
    else:
        # key 0's initial state was not applied again; key 3's is applied on its first input
        assert set(batch_df.sort("id").collect()) == {
            Row(id="0", value=str(789 + 123 + 46 + 67)),
            Row(id="3", value=str(987 + 12)),
        }


def test_transform_with_state_init_state(run: Run) -> None:
    run.init_state(procs.SimpleStatefulProcessorWithInitialState, _init_state_check)


def test_transform_with_state_init_state_with_extra_transformation(
    run: Run, provider: str, request: pytest.FixtureRequest
) -> None:

    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            assert set(batch_df.sort("key").collect()) == {
                Row(key="0", value=f'{{"value":"{789 + 123 + 46}"}}'),
                Row(key="1", value=f'{{"value":"{146 + 346}"}}'),
            }
        else:
            assert set(batch_df.sort("key").collect()) == {
                Row(key="0", value=f'{{"value":"{789 + 123 + 46 + 67}"}}'),
                Row(key="3", value=f'{{"value":"{987 + 12}"}}'),
            }

    def extra(out: Any) -> Any:
        return out.select(
            fn.col("id").cast("string").alias("key"),
            fn.to_json(fn.struct(fn.col("value"))).alias("value"),
        )

    run.init_state(procs.SimpleStatefulProcessorWithInitialState, check, extra=extra)


def _init_state_with_timers(run: Run) -> None:
    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            # the initial state's timers (keys 0 and 3) have expired by the end of batch 0,
            # whether the key has input rows or not
            expired = batch_df.filter(batch_df["id"].contains("expired"))
            data = batch_df.filter(~batch_df["id"].contains("expired"))
            assert set(expired.sort("id").select("id").collect()) == {
                Row(id="0-expired"),
                Row(id="3-expired"),
            }
            assert set(data.sort("id").collect()) == {
                Row(id="0", value=str(789 + 123 + 46)),
                Row(id="1", value=str(146 + 346)),
            }
        else:
            # the initial state is handled in batch 0 only: no more timers
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", value=str(789 + 123 + 46 + 67)),
                Row(id="3", value=str(987 + 12)),
            }

    run.init_state(procs.StatefulProcessorWithInitialStateTimers, check, "processingTime")


def test_transform_with_state_init_state_with_timers(run: Run) -> None:
    _init_state_with_timers(run)


# --- reading the state: the metadata cases -------------------------------------------------------


def _map_state_metadata(run: Run, initial_state: Any) -> None:
    checkpoint = str(run.tmp / "chk-map-metadata")
    operator = "transformWithStateInPandasExec" if run.pandas else "transformWithStateInPySparkExec"

    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == _count_rows(("0", "2"), ("1", "2"))
            return
        spark = batch_df.sparkSession
        metadata = spark.read.format(source("state-metadata")).load(checkpoint)
        assert set(
            metadata.select(
                "operatorId",
                "operatorName",
                "stateStoreName",
                "numPartitions",
                "minBatchId",
                "maxBatchId",
            ).collect()
        ) == {
            Row(
                operatorId=0,
                operatorName=operator,
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
        reader = spark.read.format(source("statestore")).option("path", checkpoint)
        map_rows = reader.option("stateVarName", "mapState").load()
        assert map_rows.selectExpr(
            "key.id AS groupingKey",
            "user_map_key.name AS mapKey",
            "user_map_value.value.count AS mapValue",
        ).sort("groupingKey").collect() == [
            Row(groupingKey="0", mapKey="key2", mapValue=2),
            Row(groupingKey="1", mapKey="key2", mapValue=2),
        ]
        nested = (
            spark.read.format(source("statestore"))
            .option("path", checkpoint)
            .option("stateVarName", "mapState")
            .option("flattenCollectionTypes", False)
            .load()
        )
        assert nested.select(
            "key.id", explode(col("map_value")).alias("map_key", "map_value")
        ).selectExpr(
            "id AS groupingKey", "map_key.name AS mapKey", "map_value.value.count AS mapValue"
        ).sort("groupingKey").collect() == [
            Row(groupingKey="0", mapKey="key2", mapValue=2),
            Row(groupingKey="1", mapKey="key2", mapValue=2),
        ]
        ttl = map_rows.selectExpr("user_map_value.ttlExpirationMs AS TTLVal").collect()
        assert len(ttl) == 2
        assert len(set(ttl)) == 1
        lists = (
            spark.read.format(source("statestore"))
            .option("path", checkpoint)
            .option("stateVarName", "listState")
            .load()
        )
        assert lists.isEmpty()

    run.basic(
        procs.MapStateLargeTTLProcessor,
        check,
        True,
        "processingTime",
        checkpoint=checkpoint,
        initial_state=initial_state,
    )


def test_transform_with_map_state_metadata(run: Run) -> None:
    """Map state with TTL, an empty state variable (Spark's reads run only after a batch 1,
    which a single input file never makes)."""
    _map_state_metadata(run, None)


def test_transform_with_map_state_metadata_with_init_state(run: Run) -> None:
    """The same through the initial state runner (an initial state nothing reads)."""
    data = [("0", 789), ("3", 987)]
    initial = run.spark.createDataFrame(data, "id string, temperature int").groupBy("id")
    _map_state_metadata(run, initial)


def test_transform_with_list_state_metadata(
    run: Run, provider: str, request: pytest.FixtureRequest
) -> None:
    """Several list state variables, read back flattened and not."""
    checkpoint = str(run.tmp / "chk-list-metadata")

    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == _count_rows(("0", "2"), ("1", "2"))
            return
        spark = batch_df.sparkSession
        metadata = spark.read.format(source("state-metadata")).load(checkpoint)
        properties = json.loads(metadata.select("operatorProperties").collect()[0][0])
        variables = properties["stateVariables"]
        assert len(variables) == 4, variables
        for var in variables:
            if var["stateName"] in ["listState1", "listState2", "listStateTimestamp"]:
                assert var["stateVariableType"] == "ListState"
            else:
                assert var["stateName"] == "$procTimers_keyToTimestamp"
                assert var["stateVariableType"] == "TimerState"
        flat = (
            spark.read.format(source("statestore"))
            .option("path", checkpoint)
            .option("stateVarName", "listState1")
            .option("flattenCollectionTypes", True)
            .load()
        )
        assert flat.selectExpr(
            "key.id AS groupingKey", "list_element.temperature AS listElement"
        ).sort("groupingKey", "listElement").collect() == [
            Row(groupingKey=k, listElement=e) for k in ("0", "1") for e in (20, 20, 111, 120, 120)
        ]
        whole = (
            spark.read.format(source("statestore"))
            .option("path", checkpoint)
            .option("stateVarName", "listState2")
            .option("flattenCollectionTypes", False)
            .load()
        )
        assert whole.selectExpr(
            "key.id AS groupingKey", "list_value.temperature AS valueList"
        ).sort("groupingKey").withColumn("valueSortedList", array_sort(col("valueList"))).select(
            "groupingKey", "valueSortedList"
        ).collect() == [
            Row(groupingKey="0", valueSortedList=[20, 20, 120, 120, 222]),
            Row(groupingKey="1", valueSortedList=[20, 20, 120, 120, 222]),
        ]

    run.basic(procs.ListStateProcessor, check, False, "processingTime", checkpoint=checkpoint)


def test_transform_with_value_state_metadata(
    run: Run, provider: str, request: pytest.FixtureRequest
) -> None:
    """Value state read back as a change feed and from a snapshot batch."""
    checkpoint = str(run.tmp / "chk-value-metadata")

    def check(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == _count_rows(("0", "2"), ("1", "2"))
            return
        assert set(batch_df.sort("id").collect()) == _count_rows(("0", "3"), ("1", "2"))
        spark = batch_df.sparkSession
        metadata = spark.read.format(source("state-metadata")).load(checkpoint)
        properties = json.loads(metadata.select("operatorProperties").collect()[0][0])
        variables = properties["stateVariables"]
        assert len(variables) == 3
        for var in variables:
            if var["stateName"] not in ["numViolations", "tempState"]:
                assert var["stateName"] == "$procTimers_keyToTimestamp"
                assert var["stateVariableType"] == "TimerState"
        changes = (
            spark.read.format(source("statestore"))
            .option("path", checkpoint)
            .option("stateVarName", "numViolations")
            .option("readChangeFeed", True)
            .option("changeStartBatchId", 0)
            .load()
        ).selectExpr("change_type", "key.id AS groupingKey", "value.value AS value", "partition_id")
        assert changes.select("change_type", "groupingKey", "value").sort(
            "groupingKey"
        ).collect() == [
            Row(change_type="update", groupingKey="0", value=1),
            Row(change_type="update", groupingKey="1", value=2),
        ]
        for partition in [r["partition_id"] for r in changes.select("partition_id").collect()]:
            snapshot = (
                spark.read.format(source("statestore"))
                .option("path", checkpoint)
                .option("stateVarName", "numViolations")
                .option("snapshotPartitionId", partition)
                .option("snapshotStartBatchId", 0)
                .load()
            )
            assert (
                changes.select("partition_id", "groupingKey", "value")
                .filter(changes["partition_id"] == partition)
                .sort("groupingKey")
                .collect()
                == snapshot.selectExpr(
                    "partition_id", "key.id AS groupingKey", "value.value AS value"
                )
                .sort("groupingKey")
                .collect()
            )

    changelog = {"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
    with _conf(run.spark, changelog):
        run.basic(
            procs.SimpleStatefulProcessor, check, False, "processingTime", checkpoint=checkpoint
        )


def _restart_with_multiple_rows_init_state(run: Run) -> None:
    first_checkpoint = str(run.tmp / "chk-first")
    second_checkpoint = str(run.tmp / "chk-second")

    def check_second(batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", value=str(123 + 46)),
                Row(id="1", value=str(146 + 346)),
            }
            return
        assert set(batch_df.sort("id").collect()) == {
            Row(id="0", value=str(123 + 46 + 67)),
            Row(id="3", value=str(12)),
        }
        # every initial state row of a key was appended to its list state
        state = (
            batch_df.sparkSession.read.format(source("statestore"))
            .option("path", second_checkpoint)
            .option("stateVarName", "list_state")
            .load()
        ).selectExpr("key.id AS id", "list_element.value AS value")

        def values(df: Any) -> list[Any]:
            return [r["value"] for r in df.sort("value").select("value").collect()]

        assert values(state.filter(state.id == "0")) == [20, 20, 111, 120, 120]
        assert values(state.filter(state.id == "1")) == [20, 20, 111, 120, 120]

    # a query's state, read back from its checkpoint, is the next query's initial state
    run.basic(procs.ListStateProcessor, _two_each, True, checkpoint=first_checkpoint)
    list_state = (
        run.spark.read.format(source("statestore"))
        .option("path", first_checkpoint)
        .option("stateVarName", "listState1")
        .load()
    ).selectExpr("key.id AS id", "list_element.temperature AS initVal")
    run.init_state(
        procs.StatefulProcessorWithListStateInitialState,
        check_second,
        checkpoint=second_checkpoint,
        initial_state=list_state.groupBy("id"),
    )


def test_transform_with_state_restart_with_multiple_rows_init_state(run: Run) -> None:
    _restart_with_multiple_rows_init_state(run)


def test_transform_with_state_with_timers_single_partition(run: Run) -> None:
    """The two cases above again with a single shuffle partition."""
    with _conf(run.spark, {"spark.sql.shuffle.partitions": "1"}):
        _init_state_with_timers(run)
        _restart_with_multiple_rows_init_state(run)
