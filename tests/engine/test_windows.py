"""Windowed aggregation against Spark's: tumbling and sliding windows, every output mode, every
kind of aggregate (nulls among the values, a key whose values are all null, windows whose buffers
merge across batches and across the restart).

Each case is the query as a PySpark user writes it (the watermark on the input DataFrame,
``availableNow`` over a file source with ``maxFilesPerTrigger``); sparkstate runs it with only the
input wrapped. Both run the first file, stop, and run the second on the same checkpoint, so a
restart falls in the middle of every query (the late rows of the second file merge into windows
kept across it), and their outputs must match batch by batch (the no-data batches Spark runs after
a watermark move included).

Three cases, one per output mode: sliding windows in append mode on memory, the event time itself
as a key in update mode (its state evicted by the watermark) on rocksdb, sliding windows with a
start offset in complete mode on rocksdb. test_aggregate_functions runs the rest: tumbling windows
keyed window first in append mode on rocksdb (every later aggregate), and update and complete mode
on memory (every aggregate).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.plan.aggregate.plan import AggregateStep
from sparkstate.engine.plan.chain import plan_stages
from sparkstate.engine.run.batch_job import engine_settings
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .helpers import WIDE_SCHEMA as SCHEMA
from .helpers import Differential, SparkRuns, aggregates, compat, runs
from .helpers import wide_row as row

#: Two files: the second has the late rows and comes after the restart.
FILES = 2


def rows(i: int) -> list[dict[str, Any]]:
    """File ``i``: 20 s of event time for three keys (``k1``'s first value of a window has no
    ``d`` nor ``s``, its last no ``v``), ``kn`` whose values are all null, and from the second
    file on a row behind the watermark whose window is closed (dropped) and one whose window is
    still open."""
    base = 20 * i + 60
    out = [
        row("k0", base, 10 * i, i + 0.5, f"a{i % 2}", i + 0.25),
        row("k1", base + 4, 10 * i + 1, None, None, -1.1),
        row("k2", base + 8, 10 * i + 2, 2.25, "c", None),
        row("k1", base + 9, None, -1.5 * i, f"b{i}", None),
        row("kn", base + 2, None, None, None, None),
    ]
    if i >= 1:
        out.append(row("k0", base - 25, 100 + i, 7.0, "late", 9.99))  # its window has closed
        out.append(row("k2", base - 18, 200 + i, 0.25, None, 0.01))  # late, window still open
    return out


def windowed(df: DataFrame, keys: Callable[[Any], list[Any]], sf_keys: bool, ours: bool) -> Any:
    """Grouped by ``keys``, spelled with ``pyspark.sql.functions`` (Spark's query) or, for ours
    when ``sf_keys``, with ``SF``; every kind of aggregate."""
    df = df.withWatermark("ts", "5 seconds")
    if ours:
        return ss.stream(df).groupBy(*keys(SF if sf_keys else F)).agg(*aggregates(SF))
    return df.groupBy(*keys(F)).agg(*aggregates(F))


def case(
    name: str, mode: str, keys: Callable[[Any], list[Any]], sf_keys: bool = False
) -> Differential:
    def build(df: DataFrame, ours: bool) -> Any:
        return windowed(df, keys, sf_keys, ours)

    files = [rows(i) for i in range(FILES)]
    return Differential(name, SCHEMA, files, mode, build, restart_after=1)


CASES = [
    case(
        "sliding-append",
        "append",
        lambda f: ["k", f.window("ts", "10 seconds", "5 seconds")],
        sf_keys=True,
    ),
    case(
        "sliding-start-complete",
        "complete",
        lambda f: [f.window("ts", "20 seconds", "10 seconds", "5 seconds").alias("w")],
        sf_keys=True,
    ),
    case("event-time-key-update", "update", lambda f: [F.col("ts"), "k"]),
]


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


#: Append mode on memory, update and complete mode on rocksdb (see the module's docstring).
RUNS = runs(CASES, on_memory=("sliding-append",))


@pytest.mark.parametrize(("case", "provider"), compat(RUNS, "sliding-append-memory"))
def test_windowed_aggregation_matches_spark(
    spark_runs: SparkRuns, tmp_path: Path, case: Differential, provider: str
) -> None:
    ours, ops = spark_runs.check(case, tmp_path, provider)
    emitted = sum(len(rows) for rows in ours.batches.values())
    assert emitted > 0
    names = ours.schema.names
    if "k" in names:  # the key whose values are all null has its windows too
        assert any(r[names.index("k")] == "kn" for rows in ours.batches.values() for r in rows)
    if case.mode == "append":
        # every window is emitted once, when the watermark closes it, and leaves the state
        assert sum(op["numRowsRemoved"] for op in ops) == emitted
        assert sum(op["numRowsDroppedByWatermark"] for op in ops) > 0
    if case.mode == "update":
        # the keys the watermark passed leave the state; the rows behind it are dropped
        assert sum(op["numRowsRemoved"] for op in ops) > 0
        assert sum(op["numRowsDroppedByWatermark"] for op in ops) > 0
    if case.mode == "complete":
        assert sum(op["numRowsRemoved"] for op in ops) == 0


def test_append_needs_a_watermarked_key_as_in_spark(spark: SparkSession, tmp_path: Path) -> None:
    """Refused at ``start()`` with Spark's AnalysisException (its condition and parameters),
    also a ConfigurationError with sparkstate's message."""
    df = FileFeed(tmp_path / "input").stream(spark, SCHEMA)
    queries = [
        lambda wrap, fn: wrap(df).groupBy(fn.window("ts", "10 seconds")).agg(fn.count("*")),
        lambda wrap, fn: wrap(df.withWatermark("ts", "5 seconds")).groupBy("k").agg(fn.count("*")),
    ]
    for i, query in enumerate(queries):
        errors = []
        for wrap, fn in ((lambda d: d, F), (ss.stream, SF)):
            with pytest.raises(AnalysisException) as refused:
                query(wrap, fn).writeStream.outputMode("append").foreachBatch(Collector()).option(
                    "checkpointLocation", str(tmp_path / f"c{i}")
                ).start()
            e = refused.value
            errors.append((e.getCondition(), e.getMessageParameters(), e.getSqlState()))
        assert errors[0] == errors[1]
        assert isinstance(refused.value, ConfigurationError)
        assert "Append output mode not supported" in str(refused.value)


@pytest.mark.parametrize(
    "window",
    [
        lambda: F.window("ts", "10 seconds"),
        lambda: F.window("ts", "10 seconds", "5 seconds").alias("w"),
        lambda: SF.window("ts", "10 seconds"),
    ],
    ids=["tumbling", "sliding-aliased", "sparkstate-window"],
)
def test_a_batch_s_rows_cross_one_shuffle_into_their_state_partitions(
    spark: SparkSession, window: Callable[[], Any]
) -> None:
    """The partial aggregate per window and key is shuffled once, straight into the partitions
    its state keys hash to (those of Spark's ``repartition`` by the state key columns)."""
    batch = spark.range(200).select(
        (F.col("id") % 7).alias("k"), F.timestamp_seconds(F.col("id") * 3).alias("ts")
    )
    step = AggregateStep((window(), "k"), (F.count(F.lit(1)).alias("n"),))
    (stage,) = plan_stages(batch, [step], "update", None)
    with engine_settings(spark, 4):  # as a batch runs
        shuffled = stage.shuffled(batch, 1, 4)
        plan = shuffled._jdf.queryExecution().executedPlan().toString()
        state_keys = stage.partition_columns
        placed = shuffled.select(*state_keys, F.spark_partition_id().alias("p"))
        rows = sorted(tuple(r) for r in placed.collect())
        again = placed.drop("p").repartition(4, *state_keys)
        expected = sorted(tuple(r) for r in again.select("*", F.spark_partition_id()).collect())
    assert plan.count("Exchange hashpartitioning") == 1, plan
    assert rows == expected
    assert len({r[-1] for r in rows}) > 1  # the keys spread over the partitions
