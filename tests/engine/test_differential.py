"""sparkstate against Spark's built-in streaming operators: same input, same output per batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, compat, run_batches, same_schema, source, start_ours, start_spark

SCHEMA = "k string, g int, v int, d double, s string"

BATCHES: list[list[dict[str, Any]]] = [
    [
        {"k": "a", "g": 1, "v": 1, "d": 0.5, "s": "x"},
        {"k": "a", "g": 1, "v": None, "d": None, "s": None},
        {"k": "b", "g": None, "v": 3, "d": -1.0, "s": "m"},
        {"k": None, "g": None, "v": 4, "d": 2.0, "s": "z"},
    ],
    [],  # an empty batch
    [
        {"k": "a", "g": 1, "v": 10, "d": 1.5, "s": "a"},
        {"k": "c", "g": 2, "v": None, "d": None, "s": None},  # only nulls aggregated
        {"k": None, "g": None, "v": None, "d": None, "s": None},
    ],
    [
        {"k": "c", "g": 2, "v": -7, "d": float("nan"), "s": "q"},
        {"k": "b", "g": None, "v": 2147483647, "d": 1e300, "s": "n"},
        {"k": "b", "g": None, "v": 2147483647, "d": 1e300, "s": "n"},
    ],
]


def aggregates() -> list[Any]:
    return [
        SF.count("*"),
        SF.count("v"),
        SF.sum("v"),
        SF.min("v"),
        SF.max("v").alias("max_v"),
        SF.avg("v"),
        SF.sum("d"),
        SF.max("d"),
        SF.min("s"),
    ]


def spark_aggregates() -> list[Any]:
    return [
        F.count("*"),
        F.count("v"),
        F.sum("v"),
        F.min("v"),
        F.max("v").alias("max_v"),
        F.avg("v"),
        F.sum("d"),
        F.max("d"),
        F.min("s"),
    ]


@pytest.mark.parametrize(
    ("mode", "provider"),
    compat(
        [
            pytest.param(mode, provider, id=f"{mode}-{provider}")
            for mode in ("update", "complete")
            for provider in PROVIDERS
        ],
        "update-memory",
        f"complete-{PROVIDERS[-1]}",
    ),
)
def test_aggregation_matches_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str, mode: str
) -> None:
    ours, theirs = Collector(), Collector()
    df = source(spark, feed, SCHEMA)
    q = start_ours(
        ss.stream(df).groupBy("k", "g").agg(*aggregates()), mode, tmp_path / "a", provider, ours
    )
    run_batches(feed, q, BATCHES)
    feed.reset()
    df = source(spark, feed, SCHEMA)
    q = start_spark(df.groupBy("k", "g").agg(*spark_aggregates()), mode, tmp_path / "b", theirs)
    run_batches(feed, q, BATCHES)
    assert same_schema(ours.schema, theirs.schema), (ours.schema, theirs.schema)
    assert ours.batches == theirs.batches


@pytest.mark.parametrize("provider", PROVIDERS)
def test_dedup_matches_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    dedup_ours, dedup_theirs = Collector(), Collector()
    df = source(spark, feed, SCHEMA)
    q = start_ours(
        ss.stream(df).dropDuplicates(["k", "g"]), "append", tmp_path / "a", provider, dedup_ours
    )
    run_batches(feed, q, BATCHES)
    feed.reset()
    df = source(spark, feed, SCHEMA)
    q = start_spark(df.dropDuplicates(["k", "g"]), "append", tmp_path / "b", dedup_theirs)
    run_batches(feed, q, BATCHES)
    assert same_schema(dedup_ours.schema, dedup_theirs.schema)
    assert dedup_ours.batches == dedup_theirs.batches


@pytest.mark.parametrize("provider", PROVIDERS[:1])
def test_dedup_then_aggregate_matches_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    ours, theirs = Collector(), Collector()
    stream = ss.stream(source(spark, feed, SCHEMA)).dropDuplicates(["k", "v"])
    q = start_ours(
        stream.groupBy("g").agg(SF.count("*"), SF.sum("v")),
        "complete",
        tmp_path / "a",
        provider,
        ours,
    )
    run_batches(feed, q, BATCHES)
    feed.reset()
    deduped = source(spark, feed, SCHEMA).dropDuplicates(["k", "v"])
    q = start_spark(
        deduped.groupBy("g").agg(F.count("*"), F.sum("v")), "complete", tmp_path / "b", theirs
    )
    run_batches(feed, q, BATCHES)
    assert same_schema(ours.schema, theirs.schema)
    assert ours.batches == theirs.batches
