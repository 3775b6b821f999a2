"""Queries as PySpark users write them, with only the input wrapped: the same batches as Spark's
own run of the same query, across a restart.

Aggregates inside and around expressions (``F.sum(F.col("v") * 2)``, ``F.round(F.avg("v"), 2)``,
``F.sum("v") / F.count("v")``, ``F.expr("sum(v) FILTER (WHERE v > 2)")``, ...) are read off
Spark's analyzed plan: the operator merges the aggregate functions inside, Spark evaluates the
expressions around them (engine/aggregate_analysis.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import PROVIDERS
from .helpers import Differential, SparkRuns, at

SCHEMA = "k string, v long, d double, ts timestamp"


def row(k: str, v: int | None, d: float | None, t: int) -> dict[str, Any]:
    return {"k": k, "v": v, "d": d, "ts": at(t)}


FILES = [
    [row("a", 1, 0.5, 1), row("a", 7, 2.0, 2), row("b", 3, None, 3), row("c", None, 1.0, 4)],
    [row("a", 4, 1.5, 12), row("b", None, 2.5, 14), row("b", 6, 0.25, 15)],
    # a restart on the checkpoint here
    [row("c", 9, 3.0, 25), row("a", 2, 4.0, 26), row("d", 5, None, 27)],
    [row("b", 8, 1.0, 41), row("d", 1, 2.0, 42)],
]


def expressions(fn: Any) -> list[Any]:
    """The aggregates of the update-mode query: the issue's shapes, beside a plain aggregate
    written with ``fn`` (PySpark's, or SF on our side)."""
    return [
        fn.count("*").alias("n"),
        F.sum(F.col("v") * 2),
        F.round(F.avg("v"), 2),
        (F.sum("v") / F.count("v")).alias("mean"),
        F.size(F.collect_set("v")),
        F.count_if(F.col("v") > 5),
        F.max(F.when(F.col("v") > 3, F.col("v"))),
        F.max("v").cast("string"),
        F.expr("sum(v) FILTER (WHERE v > 2)"),
        F.expr("count(*) FILTER (WHERE d > 1)"),
        (F.max("v") - F.min("v") + F.sum("v")).alias("spread_plus_sum"),
        F.first(F.upper("k")),
        F.coalesce(F.max("d"), F.lit(-1.0)).alias("top_d"),
    ]


def update_case() -> Differential:
    def build(df: DataFrame, ours: bool) -> Any:
        return (ss.stream(df) if ours else df).groupBy("k").agg(*expressions(SF if ours else F))

    return Differential("expressions-update", SCHEMA, FILES, "update", build)


def append_case() -> Differential:
    """A windowed aggregation in append mode, expressions over its aggregates, and steps after
    it, as a user writes them."""

    def build(df: DataFrame, ours: bool) -> Any:
        df = df.withWatermark("ts", "5 seconds")
        grouped = (ss.stream(df) if ours else df).groupBy(F.window("ts", "10 seconds"), "k")
        out = grouped.agg(
            F.round(F.avg("v"), 1).alias("avg_v"),
            (F.sum("v") / F.count("v")).alias("mean"),
            F.expr("count(*) FILTER (WHERE v > 2)").alias("big"),
        )
        return out.where(F.col("big") >= 0).withColumn("twice", F.col("avg_v") * 2)

    return Differential("expressions-append", SCHEMA, FILES, "append", build)


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_aggregates_in_expressions_match_spark(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path, provider: str
) -> None:
    """Every shape of the issue in one ``agg()``, in update mode: Spark's names, types and rows,
    batch by batch, across a restart (the operator's own names for the aggregates inside stay
    those of the checkpoint)."""
    case = update_case()
    ours, _ = spark_runs.check(case, tmp_path, provider)
    expected = spark_runs.of(case).batches
    assert any(len(rows) > 1 for rows in expected.values())
    assert ours.schema is not None and "round(avg(v), 2)" in ours.schema.names


def test_expressions_over_a_windowed_aggregation_in_append_mode(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path
) -> None:
    """Windows closed by the watermark, with expressions over their aggregates and the steps a
    user writes after them: Spark's batches."""
    case = append_case()
    ours, _ = spark_runs.check(case, tmp_path, PROVIDERS[-1])
    assert sum(len(rows) for rows in ours.batches.values()) >= 5


def projected_case(name: str, mode: str) -> Differential:
    """A projection before the aggregation drops the watermarked column: the event time lives
    on in a window struct, an alias of the column's own name, or nowhere (Spark's watermark is
    still the largest event time read, and its no-data batches follow it)."""
    shapes = {
        "window-alias": lambda df: (
            df.select(F.window("ts", "10 seconds").alias("ts"), "k", "v")
            .groupBy("ts", "k")
            .agg(F.sum("v").alias("total"))
        ),
        "session-alias": lambda df: (
            df.select(F.session_window("ts", "5 seconds").alias("s"), "k").groupBy("s", "k").count()
        ),
        "dropped": lambda df: df.select("k", "v").groupBy("k").agg(F.max("v")),
    }

    def build(df: DataFrame, ours: bool) -> Any:
        df = df.withWatermark("ts", "5 seconds")
        return shapes[name](ss.stream(df) if ours else df)

    return Differential(f"{name}-{mode}", SCHEMA, FILES, mode, build)


@pytest.mark.parametrize(
    ("name", "mode", "provider"),
    [
        ("window-alias", "append", PROVIDERS[-1]),
        ("session-alias", "append", PROVIDERS[0]),
        ("dropped", "update", PROVIDERS[0]),
    ],
)
def test_a_projection_before_the_aggregation_keeps_spark_s_watermark(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path, name: str, mode: str, provider: str
) -> None:
    """``select(F.window("ts", ...).alias("ts"), ...).groupBy("ts", ...)`` and its kin: Spark's
    batches, windows closed by the watermark, no-data batches included."""
    case = projected_case(name, mode)
    ours, _ = spark_runs.check(case, tmp_path, provider)
    assert sum(len(rows) for rows in ours.batches.values()) >= 3
