"""Windowed aggregation against Spark's: tumbling and sliding windows, every output mode, every
kind of aggregate (nulls among the values, a key whose values are all null, windows whose buffers
merge across batches and across the restart).

Each case is the query as a PySpark user writes it (the watermark on the input DataFrame,
``availableNow`` over a file source with ``maxFilesPerTrigger``); sparkstate runs it with only the
input wrapped. Both run half of the files, stop, and run the rest on the same checkpoint, so a
restart falls in the middle of every query, and their outputs must match batch by batch (the
no-data batches Spark runs after a watermark move included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .conftest import PROVIDERS
from .helpers import WIDE_SCHEMA as SCHEMA
from .helpers import SortedSetsCollector, aggregates, run_in_two_runs

FILES = 6


def at(seconds: int) -> str:
    return f"2024-01-01 00:{seconds // 60:02d}:{seconds % 60:02d}"


def row(
    k: str, t: int, v: int | None, d: float | None, s: str | None, m: float | None
) -> dict[str, Any]:
    return {"k": k, "ts": at(t), "v": v, "d": d, "s": s, "m": m}


def rows(i: int) -> list[dict[str, Any]]:
    """File ``i``: 20 s of event time for three keys (``k1``'s first value of a window has no
    ``d`` nor ``s``, its last no ``v``), ``kn`` whose values are all null, and from the third
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
    if i >= 2:
        out.append(row("k0", base - 25, 100 + i, 7.0, "late", 9.99))  # its window has closed
        out.append(row("k2", base - 18, 200 + i, 0.25, None, 0.01))  # late, window still open
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    mode: str
    #: The grouping keys, from ``pyspark.sql.functions`` (Spark's query) or ``SF`` (ours).
    keys: Callable[[Any], list[Any]]
    #: Whether sparkstate's query spells the window with ``SF`` (else Spark's own function).
    sf_keys: bool = False


CASES = [
    Case("tumbling-append", "append", lambda f: [f.window("ts", "10 seconds"), "k"]),
    Case(
        "sliding-append",
        "append",
        lambda f: ["k", f.window("ts", "10 seconds", "5 seconds")],
        sf_keys=True,
    ),
    Case(
        "start-update", "update", lambda f: [f.window("ts", "10 seconds", None, "3 seconds"), "k"]
    ),
    Case(
        "sliding-start-complete",
        "complete",
        lambda f: [f.window("ts", "20 seconds", "10 seconds", "5 seconds").alias("w")],
        sf_keys=True,
    ),
    Case("event-time-key-append", "append", lambda f: [F.col("ts"), "k"]),
]


def spark_query(df: DataFrame, case: Case) -> DataFrame:
    grouped = df.withWatermark("ts", "5 seconds").groupBy(*case.keys(F))
    return grouped.agg(*aggregates(F))


def our_query(df: DataFrame, case: Case) -> Any:
    stream = ss.stream(df.withWatermark("ts", "5 seconds"))
    grouped = stream.groupBy(*case.keys(SF if case.sf_keys else F))
    return grouped.agg(*aggregates(SF))


def run_twice(
    spark: SparkSession, tmp: Path, case: Case, provider: str | None
) -> tuple[Collector, list[dict[str, Any]]]:
    def build(df: DataFrame) -> Any:
        return spark_query(df, case) if provider is None else our_query(df, case)

    files = [rows(i) for i in range(FILES)]
    collector = SortedSetsCollector()
    return run_in_two_runs(spark, tmp, SCHEMA, files, build, case.mode, provider, collector)


@pytest.fixture(scope="module")
def spark_results(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Collector]:
    return {
        case.name: run_twice(spark, tmp_path_factory.mktemp(case.name), case, None)[0]
        for case in CASES
    }


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_windowed_aggregation_matches_spark(
    spark: SparkSession,
    spark_results: dict[str, Collector],
    tmp_path: Path,
    case: Case,
    provider: str,
) -> None:
    ours, progress = run_twice(spark, tmp_path, case, provider)
    theirs = spark_results[case.name]
    assert ours.schema == theirs.schema
    assert ours.batches == theirs.batches
    emitted = sum(len(rows) for rows in ours.batches.values())
    assert emitted > 0
    ops = [p["stateOperators"][0] for p in progress if p.get("stateOperators")]
    if case.mode == "append":
        # every window is emitted once, when the watermark closes it, and leaves the state
        assert sum(op["numRowsRemoved"] for op in ops) == emitted
        assert sum(op["numRowsDroppedByWatermark"] for op in ops) > 0
    if case.mode == "complete":
        assert sum(op["numRowsRemoved"] for op in ops) == 0


def test_append_needs_a_watermarked_key(spark: SparkSession, tmp_path: Path) -> None:
    df = FileFeed(tmp_path / "input").stream(spark, SCHEMA)
    no_watermark = ss.stream(df).groupBy(SF.window("ts", "10 seconds")).agg(SF.count("*"))
    not_on_key = ss.stream(df.withWatermark("ts", "5 seconds")).groupBy("k").agg(SF.count("*"))
    for query in (no_watermark, not_on_key):
        with pytest.raises(ConfigurationError, match="Append output mode not supported"):
            query.writeStream.outputMode("append").foreachBatch(Collector()).option(
                "checkpointLocation", str(tmp_path / "c")
            ).start()
