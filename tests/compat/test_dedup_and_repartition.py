"""Spark's streaming tests of deduplication and of offline state repartition, ported.

Re-stated from Apache Spark's ``python/pyspark/sql/tests/streaming/test_streaming.py`` (commit
of the stored ``StreamingTestsMixin`` with ``test_streaming_drop_duplicate_within_watermark``;
its other cases run no stateful operator) and
``python/pyspark/sql/tests/streaming/test_streaming_offline_state_repartition.py`` (commit
6417a9390373 as stored, with the multiple-state-variable cases). Only the query's input is
wrapped; Spark's ``spark._streamingCheckpointManager.repartition(checkpoint, n)`` is
``ss.repartition(spark, checkpoint, n)``. The repartition cases run with their suite's three
shuffle partitions; the stream-running cases run on both providers (a transformWithState case
once in each mode, on the two providers: ``conftest.py``), the three refusals (no query, no
state) once.

=========================================================  ====================================
Spark's case                                               here
=========================================================  ====================================
test_streaming.py:
test_streaming_drop_duplicate_within_watermark             ported (its input file re-created)
(the file's other 18 cases)                                left out: no stateful operator
test_streaming_offline_state_repartition.py:
test_fail_if_empty_checkpoint_directory                    ported
test_fail_if_no_batch_found_in_checkpoint_directory        ported
test_fail_if_repartition_parameter_is_invalid              ported
test_repartition_with_apply_in_pandas_with_state           ported
test_repartition_with_streaming_aggregation                ported
test_repartition_with_streaming_dedup                      ported
test_repartition_with_streaming_tws                        ported
test_repartition_with_streaming_tws_in_pandas              ported
test_repartition_with_streaming_tws_multiple_state_vars    ported
test_repartition_with_streaming_tws_in_pandas_multiple_    ported
state_vars
=========================================================  ====================================
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import split
from pyspark.sql.streaming.state import GroupStateTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from . import state_variable_processors as procs
from .porting import ORACLE, wrap

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

NUM_SHUFFLE_PARTITIONS = 3


def _repartition(spark: SparkSession, checkpoint: str, n: Any) -> Any:
    if ORACLE:
        return spark._streamingCheckpointManager.repartition(checkpoint, n)
    import sparkstate as ss

    return ss.repartition(spark, checkpoint, n)


# --- test_streaming.py ----------------------------------------------------------------------

#: Spark's ``python/test_support/sql/streaming/time/text-with-time-test.txt``.
TIMES = """2024-05-24 15:03:20;1
2024-05-24 15:03:21;2
2024-05-24 15:03:24;3
2024-05-24 15:03:25;3
2024-05-24 15:03:31;4
2024-05-24 15:03:31;1
2024-05-24 15:03:32;3
2024-05-24 15:03:45;2
2024-05-24 15:03:46;5
2024-05-24 15:03:50;6"""


def test_streaming_drop_duplicate_within_watermark(
    spark: SparkSession, tmp_path: Path, provider: str
) -> None:
    src = tmp_path / "time"
    src.mkdir()
    (src / "text-with-time-test.txt").write_text(TIMES)
    schema = StructType().add("time", TimestampType()).add("id", "integer")
    df = spark.readStream.option("sep", ";").schema(schema).csv(str(src))
    name = f"test_streaming_drop_duplicates_within_wm_{provider}"
    q1 = (
        wrap(df.withWatermark("time", "2 seconds"))
        .dropDuplicatesWithinWatermark(["id"])
        .writeStream.outputMode("update")
        .format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("stateStore", provider)
        .start()
    )
    try:
        assert q1.isActive
        q1.processAllAvailable()
    finally:
        q1.stop()
    result = spark.sql(f"SELECT * FROM {name}").collect()
    assert 6 <= len(result) <= 9


# --- test_streaming_offline_state_repartition.py ---------------------------------------------


@pytest.fixture
def three_partitions(spark: SparkSession) -> Iterator[None]:
    """The repartition suite's conf: three shuffle partitions (and Spark's RocksDB provider)."""
    conf = {
        "spark.sql.shuffle.partitions": str(NUM_SHUFFLE_PARTITIONS),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
    }
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    yield
    for k, v in before.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def test_fail_if_empty_checkpoint_directory(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(Exception, match="STATE_REPARTITION_INVALID_CHECKPOINT.NO_COMMITTED_BATCH"):
        _repartition(spark, str(tmp_path), 5)


def test_fail_if_no_batch_found_in_checkpoint_directory(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    commits = tmp_path / "commits"
    commits.mkdir()
    (commits / "0").write_text("v1\n{}")  # a commit of batch 0 and no offsets
    with pytest.raises(Exception, match="STATE_REPARTITION_INVALID_CHECKPOINT.NO_BATCH_FOUND"):
        _repartition(spark, str(tmp_path), 5)


def test_fail_if_repartition_parameter_is_invalid(spark: SparkSession) -> None:
    with pytest.raises(Exception, match="STATE_REPARTITION_INVALID_PARAMETER.IS_NULL"):
        _repartition(spark, None, 5)
    with pytest.raises(Exception, match="STATE_REPARTITION_INVALID_PARAMETER.IS_EMPTY"):
        _repartition(spark, "", 5)
    with pytest.raises(
        Exception, match="STATE_REPARTITION_INVALID_PARAMETER.IS_NOT_GREATER_THAN_ZERO"
    ):
        _repartition(spark, "test", 0)


def _run_repartition_test(
    spark: SparkSession,
    tmp_path: Path,
    provider: str,
    create_streaming_df: Callable[[DataFrame], Any],
    output_mode: str,
    batches: tuple[str, str, str],
    verify: tuple[Callable[[list[Any]], None], ...],
) -> None:
    """Spark's ``run_repartition_test``: run, rescale to twice the partitions, add a file and
    run again, rescale to one fewer than at first, add a file and run again; each run's rows
    checked by its ``verify``."""
    input_dir = tmp_path / "in"
    input_dir.mkdir()
    checkpoint = str(tmp_path / "chk")
    collected: list[Any] = []

    def collect_batch(batch_df: Any, batch_id: int) -> None:
        collected.extend(batch_df.collect())

    def run() -> None:
        df = spark.readStream.format("text").load(str(input_dir))
        q = (
            create_streaming_df(df)
            .writeStream.foreachBatch(collect_batch)
            .option("checkpointLocation", checkpoint)
            .option("stateStore", provider)
            .outputMode(output_mode)
            .start()
        )
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    counts = (None, NUM_SHUFFLE_PARTITIONS * 2, NUM_SHUFFLE_PARTITIONS - 1)
    for i, (data, check, count) in enumerate(zip(batches, verify, counts, strict=True), 1):
        if count is not None:
            _repartition(spark, checkpoint, count)
        (input_dir / f"batch{i}.txt").write_text(data)
        collected.clear()
        run()
        check(collected)


def _counts_by(column: str) -> tuple[Callable[[list[Any]], None], ...]:
    """Spark's checks of a running count per word: a 2 b 1 c 1, then a 3 b 2 d 1, then
    a 4 c 2 e 1."""

    def expect(expected: dict[str, int]) -> Callable[[list[Any]], None]:
        def check(results: list[Any]) -> None:
            counts = {row[column]: row["count"] for row in results}
            for word, n in expected.items():
                assert counts.get(word) == n, (word, counts)

        return check

    return (
        expect({"a": 2, "b": 1, "c": 1}),
        expect({"a": 3, "b": 2, "d": 1}),
        expect({"a": 4, "c": 2, "e": 1}),
    )


WORDS = ("a\nb\na\nc\n", "a\nb\nd\n", "a\nc\ne\n")


@pytest.mark.usefixtures("three_partitions")
def test_repartition_with_apply_in_pandas_with_state(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:

    def stateful_count_func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        existing = state.getOption
        count = 0 if existing is None else existing[0]
        new = 0
        for pdf in pdf_iter:
            new += len(pdf)
        total = count + new
        state.update((total,))
        yield pd.DataFrame({"key": [key[0]], "count": [total]})

    output_schema = StructType([StructField("key", StringType()), StructField("count", LongType())])
    state_schema = StructType([StructField("count", LongType())])

    def create(df: DataFrame) -> Any:
        return (
            wrap(df)
            .groupBy(df["value"])
            .applyInPandasWithState(
                stateful_count_func,
                output_schema,
                state_schema,
                "Update",
                GroupStateTimeout.NoTimeout,
            )
        )

    _run_repartition_test(spark, tmp_path, provider, create, "update", WORDS, _counts_by("key"))


@pytest.mark.usefixtures("three_partitions")
def test_repartition_with_streaming_aggregation(
    spark: SparkSession, tmp_path: Path, provider: str
) -> None:
    def create(df: DataFrame) -> Any:
        return wrap(df).groupBy("value").count()

    _run_repartition_test(spark, tmp_path, provider, create, "update", WORDS, _counts_by("value"))


@pytest.mark.usefixtures("three_partitions")
def test_repartition_with_streaming_dedup(
    spark: SparkSession, tmp_path: Path, provider: str
) -> None:
    def create(df: DataFrame) -> Any:
        return wrap(df).dropDuplicates(["value"])

    def only(expected: set[str]) -> Callable[[list[Any]], None]:
        def check(results: list[Any]) -> None:
            assert {row.value for row in results} == expected

        return check

    _run_repartition_test(
        spark,
        tmp_path,
        provider,
        create,
        "append",
        ("a\nb\na\nc\n", "a\nb\nd\ne\n", "a\nc\nf\ng\n"),
        (only({"a", "b", "c"}), only({"d", "e"}), only({"f", "g"})),  # only new keys after each
    )


def _parsed(df: DataFrame) -> DataFrame:
    parts = split(df["value"], ",")
    return df.select(
        parts.getItem(0).alias("id"), parts.getItem(1).cast("integer").alias("temperature")
    )


def _tws(df: DataFrame, pandas: bool, cls: type[procs.Processor], output: Any) -> Any:
    grouped = wrap(_parsed(df)).groupBy("id")
    api = grouped.transformWithStateInPandas if pandas else grouped.transformWithState
    return api(
        statefulProcessor=cls(pandas),
        outputStructType=output,
        outputMode="Update",
        timeMode="None",
        initialState=None,
    )


@pytest.mark.usefixtures("three_partitions")
def test_repartition_with_streaming_tws(
    spark: SparkSession, tmp_path: Path, provider: str, mode: str
) -> None:
    """``test_repartition_with_streaming_tws`` (row) and ``..._tws_in_pandas`` (pandas)."""
    output = StructType(
        [StructField("id", StringType(), True), StructField("value", StringType(), True)]
    )

    def create(df: DataFrame) -> Any:
        return _tws(df, mode == "pandas", procs.SimpleStatefulProcessorWithInitialState, output)

    def expect(expected: dict[str, str]) -> Callable[[list[Any]], None]:
        def check(results: list[Any]) -> None:
            values = {row.id: row.value for row in results}
            for key, value in expected.items():
                assert values.get(key) == value, (key, values)

        return check

    _run_repartition_test(
        spark,
        tmp_path,
        provider,
        create,
        "update",
        ("a,120\na,150\nb,50\nc,30\n", "a,101\nb,102\nd,103\n", "a,104\nc,105\ne,106\n"),
        (
            expect({"a": "270", "b": "50", "c": "30"}),
            expect({"a": "371", "b": "152", "d": "103"}),  # the state kept across the rescale
            expect({"a": "475", "c": "135", "e": "106"}),
        ),
    )


@pytest.mark.usefixtures("three_partitions")
def test_repartition_with_streaming_tws_multiple_state_vars(
    spark: SparkSession,
    tmp_path: Path,
    provider: str,
    mode: str,
    request: pytest.FixtureRequest,
) -> None:
    """``..._tws_multiple_state_vars`` (row) and ``..._tws_in_pandas_multiple_state_vars``
    (pandas): value, list and map state holding arrays, structs and maps."""
    output = StructType(
        [
            StructField("id", StringType(), True),
            StructField("value_arr", StringType(), True),
            StructField("list_state_arr", StringType(), True),
            StructField("map_state_arr", StringType(), True),
            StructField("nested_map_state_arr", StringType(), True),
        ]
    )

    def create(df: DataFrame) -> Any:
        return _tws(df, mode == "pandas", procs.StatefulProcessorCompositeType, output)

    def initial(results: list[Any]) -> None:
        rows = {row.id: row for row in results}
        assert rows["a"].value_arr == "0"
        assert rows["a"].list_state_arr == "0"
        assert rows["a"].map_state_arr == '{"key1": [1], "key2": [10]}'
        assert rows["a"].nested_map_state_arr == '{"e1": {"e2": 5, "e3": 10}}'

    def after_increase(results: list[Any]) -> None:
        rows = {row.id: row for row in results}
        assert rows["a"].value_arr == "100"
        assert rows["a"].list_state_arr == "0,100"
        assert rows["a"].map_state_arr == '{"a": [100], "key1": [1], "key2": [10]}'
        assert rows["a"].nested_map_state_arr == '{"e1": {"a": 100, "e2": 5, "e3": 10}}'
        assert rows["d"].value_arr == "0"
        assert rows["d"].list_state_arr == "0"
        assert rows["d"].map_state_arr == '{"key1": [1], "key2": [10]}'
        assert rows["d"].nested_map_state_arr == '{"e1": {"e2": 5, "e3": 10}}'

    def after_decrease(results: list[Any]) -> None:
        rows = {row.id: row for row in results}
        assert rows["d"].value_arr == "102"
        assert rows["d"].list_state_arr == "0,102"
        assert rows["d"].map_state_arr == '{"d": [102], "key1": [1], "key2": [10]}'
        assert rows["d"].nested_map_state_arr == '{"e1": {"d": 102, "e2": 5, "e3": 10}}'
        assert rows["a"].value_arr == "201"
        assert rows["a"].list_state_arr == "0,100,101"
        assert rows["a"].map_state_arr == '{"a": [101], "key1": [1], "key2": [10]}'
        assert rows["a"].nested_map_state_arr == '{"e1": {"a": 101, "e2": 5, "e3": 10}}'

    _run_repartition_test(
        spark,
        tmp_path,
        provider,
        create,
        "update",
        ("a,100\n", "a,100\nd,100\n", "d,102\na,101\n"),
        (initial, after_increase, after_decrease),
    )
