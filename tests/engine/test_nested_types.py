"""Nested types in Spark's own ``transformWithStateInPandas`` and in the wrapped query: a
``ValueState`` of an array, a ``ListState`` of structs, and struct, array and map output columns,
over the same files, with a restart in the middle; the outputs are equal batch for batch on both
providers. And arrays and structs as the keys of an aggregation and of a deduplication, as
Spark's own operators key their state by them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

import sparkstate as ss

from .conftest import PROVIDERS
from .helpers import Differential, FileFeed, SparkRuns, spark_rocksdb

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v int"
OUTPUT = (
    "k string, summary struct<count: bigint, vs: array<int>, last: struct<v: int, name: string>>, "
    "seen map<string, bigint>"
)
INFO = StructType([StructField("name", StringType()), StructField("n", IntegerType())])


class Nested(StatefulProcessor):
    """Keeps every value of a key in an array (nulls too) and one struct element per batch in a
    list; outputs a struct of both and a map of the names seen."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.hist = handle.getValueState(
            "hist", StructType([StructField("vs", ArrayType(IntegerType()))])
        )
        self.events = handle.getListState(
            "events", StructType([StructField("v", LongType()), StructField("info", INFO)])
        )

    def handleInputRows(  # noqa: N802 - PySpark's names
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        new = [None if pd.isna(v) else int(v) for f in frames for v in f["v"]]
        vs = list(self.hist.get()[0]) if self.hist.exists() else []
        vs += new
        self.hist.update((vs,))
        total = sum(v for v in new if v is not None)
        self.events.appendList([(total, {"name": f"{key[0]}{len(vs)}", "n": len(new)})])
        events = list(self.events.get())
        last_v, last_info = events[-1]
        seen: dict[str, int] = {}
        for _, info in events:
            seen[info["name"]] = seen.get(info["name"], 0) + info.n
        summary = {"count": len(events), "vs": vs, "last": {"v": last_v, "name": last_info.name}}
        yield pd.DataFrame({"k": [key[0]], "summary": [summary], "seen": [seen]})

    def close(self) -> None:
        pass


FILES: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": None}],
    [{"k": "a", "v": 3}],
    [{"k": "b", "v": 4}, {"k": "c", "v": None}],
    [{"k": "a", "v": 5}, {"k": "c", "v": 6}, {"k": "b", "v": 7}],
]


def _build(df: DataFrame, ours: bool) -> Any:
    stream = ss.stream(df) if ours else df
    return stream.groupBy("k").transformWithStateInPandas(
        statefulProcessor=Nested(),
        outputStructType=OUTPUT,
        outputMode="Update",
        timeMode="None",
    )


CASE = Differential("nested-tws", SCHEMA, FILES, "update", _build, restart_after=2)


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    runs = SparkRuns(spark, tmp_path_factory)
    with spark_rocksdb(spark):  # Spark's transformWithState needs its RocksDB provider
        runs.of(CASE)
    return runs


@pytest.mark.parametrize("provider", PROVIDERS)
def test_nested_state_and_output_match_spark(
    spark_runs: SparkRuns, tmp_path: Path, provider: str
) -> None:
    theirs = spark_runs.of(CASE)
    assert len(theirs.batches) == len(FILES)
    # the struct and map columns carry what the state kept across the restart
    last = dict((r[0], r) for r in theirs.batches[3])
    assert last["a"][1]["vs"] == [1, None, 3, 5] and last["a"][1]["count"] == 3
    spark_runs.check(CASE, tmp_path, provider)


KEYED_SCHEMA = "a array<int>, st struct<n: int, s: string>, v int"


def keyed(a: list[int | None] | None, n: int | None, s: str | None, v: int) -> dict[str, Any]:
    """A row keyed by the array ``a`` and the struct ``(n, s)`` (None, None: a null struct)."""
    st = None if n is None and s is None else {"n": n, "s": s}
    return {"a": a, "st": st, "v": v}


#: Keys that differ only inside an array or a struct (order, a null element, a null field), and
#: null ones, coming back across batches and the restart.
KEYED_FILES: list[list[dict[str, Any]]] = [
    [keyed([1, 2], 1, "x", 1), keyed([2, 1], 1, "x", 2), keyed([1, 2], 1, "x", 3)],
    [keyed([], None, "x", 4), keyed(None, 1, None, 5), keyed([None], None, None, 6)],
    [keyed([1, 2], 1, "x", 7), keyed([None], None, None, 8), keyed([], 2, "x", 9)],
    [keyed(None, 1, None, 10), keyed([1, 2, None], 1, "x", 11), keyed([], None, "x", 12)],
]

KEYED_CASES = {
    "update": Differential(
        "nested-key-aggregate",
        KEYED_SCHEMA,
        KEYED_FILES,
        "update",
        lambda df, ours: (
            (ss.stream(df) if ours else df)
            .groupBy("a", "st")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        ),
    ),
    "append": Differential(
        "nested-key-dedup",
        KEYED_SCHEMA,
        KEYED_FILES,
        "append",
        lambda df, ours: (ss.stream(df) if ours else df).dropDuplicates(["a", "st"]),
    ),
}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("mode", list(KEYED_CASES))
def test_array_and_struct_keys_match_spark(
    spark_runs: SparkRuns, tmp_path: Path, mode: str, provider: str
) -> None:
    """``groupBy(array, struct)`` and ``dropDuplicates([array, struct])``: Spark's batches,
    across the restart, each key counted or kept once however often it comes back."""
    case = KEYED_CASES[mode]
    ours, _ = spark_runs.check(case, tmp_path / mode, provider)
    assert sum(len(rows) for rows in ours.batches.values()) >= 6


def test_a_map_to_deduplicate_is_refused_as_spark_refuses_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``dropDuplicates`` over a map: Spark's analyzer refuses it where the query is written;
    ours fails with Spark's error when it is planned, at the latest at ``start()``."""
    df = FileFeed(tmp_path / "input").stream(spark, "m map<string, int>, v int")
    with pytest.raises(AnalysisException) as theirs:
        df.dropDuplicates(["m"])
    writer = ss.stream(df).dropDuplicates(["m"]).writeStream.format("noop")
    with pytest.raises(AnalysisException) as ours:
        writer.option("checkpointLocation", str(tmp_path / "checkpoint")).start()
    assert ours.value.getCondition() == theirs.value.getCondition()
    assert not (tmp_path / "checkpoint").exists()
