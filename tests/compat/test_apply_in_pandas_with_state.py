"""Spark's ``test_pandas_grouped_map_with_state.py`` (``applyInPandasWithState``), ported.

Re-stated from ``python/pyspark/sql/tests/pandas/test_pandas_grouped_map_with_state.py`` in
Apache Spark (the version at commit 08b1495dc235: of the stored versions, the mixin with the
most cases, seven). Every case keeps Spark's input files, function, output and state schemas,
output mode, timeout and per-batch assertions; only the query's input is wrapped
(``ss.stream(df)``) and a checkpoint added where Spark's test has none. Each runs on both
providers.

================================================================  ========================
Spark's case                                                      here
================================================================  ========================
test_apply_in_pandas_with_state_basic                             ported
test_apply_in_pandas_with_state_basic_no_state                    ported
test_apply_in_pandas_with_state_basic_no_state_no_data            ported
test_apply_in_pandas_with_state_basic_more_data                   ported
test_apply_in_pandas_with_state_basic_fewer_data                  ported
test_apply_in_pandas_with_state_basic_with_null                   ported
test_apply_in_pandas_with_state_python_worker_random_failure      ported (the restarts kept)
================================================================  ========================

No case is left out.
"""

from __future__ import annotations

import random
import string
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row, SparkSession
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType

from .porting import wrap

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark


OUTPUT = StructType([StructField("key", StringType()), StructField("countAsString", StringType())])
STATE = StructType([StructField("c", LongType())])


def _run_basic(
    spark: SparkSession,
    tmp_path: Path,
    provider: str,
    func: Callable[..., Iterator[pd.DataFrame]],
    check: Callable[[Any, int], None],
) -> None:
    """Spark's ``_test_apply_in_pandas_with_state_basic``: one file of two words, one batch."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "text-test.txt").write_text("hello\nthis\n")
    df = spark.readStream.format("text").load(str(src))
    assert df.isStreaming

    seen: list[int] = []

    def check_results(batch_df: Any, batch_id: int) -> None:
        check(batch_df, batch_id)
        seen.append(batch_id)

    q = (
        wrap(df)
        .groupBy(df["value"])
        .applyInPandasWithState(func, OUTPUT, STATE, "Update", GroupStateTimeout.NoTimeout)
        .writeStream.queryName("this_query")
        .foreachBatch(check_results)
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("stateStore", provider)
        .start()
    )
    try:
        assert q.name == "this_query"
        assert q.isActive
        q.processAllAvailable()
        assert q.exception() is None
    finally:
        q.stop()
    assert seen == [0]  # the batch's assertions ran


def test_apply_in_pandas_with_state_basic(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:

    def func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        assert isinstance(state, GroupState)
        total_len = 0
        for pdf in pdf_iter:
            total_len += len(pdf)
        state.update((total_len,))
        assert state.get[0] == 1
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(total_len)]})

    def check(batch_df: Any, _: int) -> None:
        assert set(batch_df.sort("key").collect()) == {
            Row(key="hello", countAsString="1"),
            Row(key="this", countAsString="1"),
        }

    _run_basic(spark, tmp_path, provider, func, check)


def test_apply_in_pandas_with_state_basic_no_state(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:

    def func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        assert isinstance(state, GroupState)
        yield pd.DataFrame({"key": [key[0], "foo"], "countAsString": ["100", "222"]})

    def check(batch_df: Any, _: int) -> None:
        assert set(batch_df.sort("key").collect()) == {
            Row(key="hello", countAsString="100"),
            Row(key="this", countAsString="100"),
            Row(key="foo", countAsString="222"),
        }

    _run_basic(spark, tmp_path, provider, func, check)


def test_apply_in_pandas_with_state_basic_no_state_no_data(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:

    def func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        assert isinstance(state, GroupState)
        yield pd.DataFrame({"key": [], "countAsString": []})

    def check(batch_df: Any, _: int) -> None:
        assert len(set(batch_df.sort("key").collect())) == 0

    _run_basic(spark, tmp_path, provider, func, check)


def test_apply_in_pandas_with_state_basic_more_data(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:

    def func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        state.update((1,))
        assert isinstance(state, GroupState)
        yield pd.DataFrame(
            {"key": [key[0], "foo", key[0] + "_2"], "countAsString": ["1", "666", "2"]}
        )

    def check(batch_df: Any, _: int) -> None:
        assert set(batch_df.sort("key").collect()) == {
            Row(key="hello", countAsString="1"),
            Row(key="foo", countAsString="666"),
            Row(key="hello_2", countAsString="2"),
            Row(key="this", countAsString="1"),
            Row(key="this_2", countAsString="2"),
        }

    _run_basic(spark, tmp_path, provider, func, check)


def test_apply_in_pandas_with_state_basic_fewer_data(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:

    def func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        state.update((1,))
        assert isinstance(state, GroupState)
        yield pd.DataFrame({"key": [], "countAsString": []})

    def check(batch_df: Any, _: int) -> None:
        assert len(set(batch_df.sort("key").collect())) == 0

    _run_basic(spark, tmp_path, provider, func, check)


def test_apply_in_pandas_with_state_basic_with_null(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:

    def func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        assert isinstance(state, GroupState)
        total_len = 0
        for pdf in pdf_iter:
            total_len += len(pdf)
        state.update((total_len,))
        assert state.get[0] == 1
        yield pd.DataFrame({"key": [None], "countAsString": [str(total_len)]})

    def check(batch_df: Any, _: int) -> None:
        assert set(batch_df.sort("key").collect()) == {Row(key=None, countAsString="1")}

    _run_basic(spark, tmp_path, provider, func, check)


def test_apply_in_pandas_with_state_python_worker_random_failure(
    spark: SparkSession, tmp_path: Path, provider: str, request: pytest.FixtureRequest
) -> None:
    """The user function kills its Python worker now and then (one call in 30); a killed query
    is started again on its checkpoint until the output holds every word's count."""
    input_path = tmp_path / "in"
    input_path.mkdir()
    output_path = str(tmp_path / "out")
    checkpoint = str(tmp_path / "chk")

    letters = list(string.ascii_lowercase)
    for i in range(5):
        picked = [letters[random.randrange(0, len(letters) - 1)] for _ in range(100)]
        (input_path / f"part-{i}.txt").write_text("".join(w + "\n" for w in picked))

    output_type = StructType([StructField("value", StringType()), StructField("count", LongType())])
    state_type = StructType([StructField("cnt", LongType())])

    def func(key: Any, pdf_iter: Any, state: Any) -> Iterator[pd.DataFrame]:
        assert isinstance(state, GroupState)
        if random.randrange(30) == 1:
            sys.exit(1)
        count = state.getOption
        count = 0 if count is None else count[0]
        for pdf in pdf_iter:
            count += len(pdf)
        state.update((count,))
        yield pd.DataFrame({"value": [key[0]], "count": [count]})

    def run_query() -> Any:
        df = spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(str(input_path))
        assert df.isStreaming
        return (
            wrap(df)
            .groupBy(df["value"])
            .applyInPandasWithState(
                func, output_type, state_type, "Append", GroupStateTimeout.NoTimeout
            )
            .writeStream.queryName("this_query")
            .format("json")
            .outputMode("append")
            .option("path", output_path)
            .option("checkpointLocation", checkpoint)
            .option("stateStore", provider)
            .start()
        )

    expected = (
        spark.read.format("text").load(str(input_path)).groupBy("value").count().sort("value")
    ).collect()

    q = run_query()
    assert q.name == "this_query"
    assert q.isActive
    restarts = 0
    deadline = time.monotonic() + 240
    try:
        while True:
            assert time.monotonic() < deadline, f"no complete output after {restarts} restarts"
            if not q.isActive:
                restarts += 1
                q = run_query()
                assert q.name == "this_query"
                continue
            status = q.status
            if status["isDataAvailable"] or status["isTriggerActive"]:
                time.sleep(0.2)
                continue
            if not Path(output_path, "_spark_metadata").exists() and not list(
                Path(output_path).glob("*.json")
            ):
                time.sleep(0.2)
                continue
            result = (
                spark.read.schema("value string, count int")
                .format("json")
                .load(output_path)
                .groupBy("value")
                .max("count")
                .selectExpr("value", "`max(count)` AS count")
                .sort("value")
                .collect()
            )
            if result == expected:
                break
            time.sleep(0.2)
    finally:
        q.stop()
