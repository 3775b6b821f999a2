"""Stateful steps in a chain against Spark 4's: a windowed count after a deduplication and a
window over its windows (``window_time``; the README's query, which holds the chain of a window
over a first aggregation's windows), and a ``transformWithStateInPandas`` over an aggregation's
output, in append mode, with Spark's watermark and operator numbering; and Spark's refusals of
the chains it does not run.

Each query is written as a PySpark user writes it; sparkstate runs it with only the input wrapped.
Both run the first two files, stop, and run the rest on the same checkpoint, and must deliver the
same batches (the no-data batches after a watermark move included) and show the same stateful
operators in each batch's progress, operator 0 (the last step) first. Spark runs each query once,
on one shuffle partition (its result does not depend on them); ours on two. The README's chain
(deduplication, aggregation, aggregation) runs on memory, the processor after an aggregation on
rocksdb: an aggregation feeding the next step on each provider (the steps themselves are on both in
their own modules).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import FileFeed

from .helpers import Differential, SparkRuns, at, runs, shuffle_partitions, spark_rocksdb

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, ts timestamp, v long"


def row(k: str, t: int, v: int) -> dict[str, Any]:
    return {"k": k, "ts": at(t), "v": v}


FILES = [
    [row("a", 1, 1), row("a", 1, 1), row("b", 3, 2), row("a", 7, 3), row("c", 12, 4)],
    [row("a", 14, 5), row("b", 15, 6), row("a", 22, 7), row("a", 22, 7), row("c", 25, 8)],
    # after the restart: (a, 8 s) is behind the watermark of 20 s
    [row("a", 31, 9), row("b", 33, 10), row("a", 8, 11), row("c", 41, 12), row("b", 33, 10)],
    [row("a", 45, 13), row("b", 52, 14), row("c", 63, 15)],
]


class RunningTotal(StatefulProcessor):  # type: ignore[misc]
    """Per key, the windows and rows seen so far, emitted with each window that arrives."""

    def init(self, handle: Any) -> None:
        self.seen = handle.getValueState("seen", "windows long, rows long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        current = self.seen.get()
        windows, total = (int(current[0]), int(current[1])) if current is not None else (0, 0)
        for pdf in rows:
            windows += len(pdf)
            total += int(pdf["count"].sum())
        self.seen.update((windows, total))
        yield pd.DataFrame({"k": [key[0]], "windows": [windows], "rows": [total]})

    def close(self) -> None:
        pass


def readme_chain(s: Any, f: Any) -> Any:
    """The README's chained query: deduplicate, count per window and key, then per hour of
    those windows (here 10 s and 20 s)."""
    deduped = s.dropDuplicates(["k", "ts"])
    counts = deduped.groupBy(f.window("ts", "10 seconds"), "k").agg(f.count("*").alias("n"))
    hourly = counts.groupBy(F.window(F.window_time("window"), "20 seconds"))
    return hourly.agg(f.sum("n").alias("n"), f.count("*").alias("key_windows"))


def window_of_windows(s: Any, f: Any) -> Any:
    first = s.groupBy(F.window("ts", "10 seconds"), "k").agg(f.count("*").alias("n"))
    second = first.groupBy(F.window(F.window_time("window"), "20 seconds"))
    return second.agg(f.sum("n").alias("rows"), f.count("*").alias("windows"))


def window_then_processor(s: Any, f: Any) -> Any:
    counts = s.groupBy(F.window("ts", "10 seconds"), "k").count()
    return counts.groupBy("k").transformWithStateInPandas(
        RunningTotal(), "k string, windows long, rows long", "Append", "None"
    )


def case(name: str, query: Any) -> Differential:
    def build(df: DataFrame, ours: bool) -> Any:
        df = df.withWatermark("ts", "5 seconds")
        return query(ss.stream(df), SF) if ours else query(df, F)

    return Differential(name, SCHEMA, FILES, "append", build)


CASES = [
    case("dedup-window-window", readme_chain),
    case("window-processor", window_then_processor),
]


@pytest.fixture(scope="module")
def two_partitions(spark: SparkSession) -> Iterator[None]:
    """The module's queries on two partitions: keys still spread over several, for half the
    tasks and stores of each batch."""
    with shuffle_partitions(spark, 2):
        yield


@pytest.fixture(scope="module")
def spark_runs(
    spark: SparkSession, two_partitions: None, tmp_path_factory: pytest.TempPathFactory
) -> SparkRuns:
    runs = SparkRuns(spark, tmp_path_factory)
    for c in CASES:  # Spark's transformWithState needs its RocksDB provider
        with (
            spark_rocksdb(spark, wanted=c.name == "window-processor"),
            shuffle_partitions(spark, 1),
        ):
            runs.run(c)
    return runs


#: The three-step chain on memory, the processor on rocksdb.
RUNS = runs(CASES, on_memory=("dedup-window-window",))


@pytest.mark.parametrize(("case", "provider"), RUNS)
def test_chain_matches_spark(
    spark_runs: SparkRuns, tmp_path: Path, case: Differential, provider: str
) -> None:
    ours, operators = spark_runs.check_all(case, tmp_path, provider)
    assert sum(len(rows) for rows in ours.batches.values()) > 0
    theirs = spark_runs.run(case)[1]
    names = [[op["operatorName"] for op in ops] for ops in operators]
    assert names == [[op["operatorName"] for op in ops] for ops in theirs]
    # each operator has its own line, the last step's first
    assert len(names[0]) == (3 if case.name == "dedup-window-window" else 2)
    # each operator keeps its own state: the first step's rows are not the last one's
    totals = [[op["numRowsTotal"] for op in ops] for ops in operators]
    assert totals == [[op["numRowsTotal"] for op in ops] for ops in theirs]
    if case.name != "window-processor":
        assert sum(ops[0]["numRowsRemoved"] for ops in operators) > 0


def test_chains_spark_refuses_are_refused(spark: SparkSession, tmp_path: Path) -> None:
    feed = FileFeed(tmp_path / "input")
    feed.add(FILES[0])  # Spark checks the plan of its first batch
    df = feed.stream(spark, SCHEMA).withWatermark("ts", "5 seconds")

    def apply(key: Any, pdfs: Any, state: Any) -> Any:
        yield pd.DataFrame({"k": [key[0]], "n": [sum(len(p) for p in pdfs)]})

    def after_counts(s: Any, f: Any, mode: str) -> Any:
        counts = s.groupBy(F.window("ts", "10 seconds"), "k").agg(f.count("*").alias("n"))
        return counts.groupBy("k").applyInPandasWithState(
            apply, "k string, n long", "n long", mode, "NoTimeout"
        )

    shapes = [
        ("append", lambda s, f: after_counts(s, f, "append"), "not supported after aggregation"),
        ("update", lambda s, f: after_counts(s, f, "update"), "not supported with aggregation"),
        ("update", window_of_windows, "possible 'correctness' issue"),
        ("complete", lambda s, f: s.groupBy("k").count().groupBy("count").count(), "correctness"),
        ("update", lambda s, f: s.groupBy("ts", "k").count().dropDuplicates(["k", "ts"]), "rows"),
    ]
    for i, (mode, query, message) in enumerate(shapes):
        with pytest.raises((AnalysisException, StreamingQueryException), match=message):
            spark_query = query(df, F).writeStream.outputMode(mode).format("noop")
            spark_query = spark_query.option("checkpointLocation", str(tmp_path / f"s{i}"))
            spark_query.trigger(availableNow=True).start().awaitTermination(120)
        with pytest.raises(ConfigurationError, match=message):
            ours = query(ss.stream(df), SF).writeStream.outputMode(mode).format("noop")
            ours.option("checkpointLocation", str(tmp_path / f"o{i}")).start().stop()
