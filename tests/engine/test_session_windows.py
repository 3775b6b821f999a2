"""Session windows against Spark's: fixed and dynamic gaps, sessions merging within a batch and
with sessions kept from earlier batches, late rows, append and complete mode.

As in ``test_windows``: the query as a PySpark user writes it, only its input wrapped, through two
``availableNow`` runs on one checkpoint (a restart in the middle), compared batch by batch.
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
from .helpers import run_in_two_runs

SCHEMA = "k string, ts timestamp, v long"
FILES = 6


def at(seconds: int) -> str:
    return f"2024-01-01 00:{seconds // 60:02d}:{seconds % 60:02d}"


def rows(i: int) -> list[dict[str, Any]]:
    """File ``i``, 25 s of event time after the previous one (gap 10 s, watermark 20 s):

    - ``k0`` every 8 s: one session that grows across every batch;
    - ``k1`` once per file: a session of its own each time;
    - ``k2``: two sessions in an even file, then in the next file a row between them that
      merges both with itself (sessions kept in state merging through a new one);
    - ``k3``: from the third file on, a row so late its session closed (dropped), and
      ``k4`` two rows of one file that merge in the batch (and a row without a time).
    """
    base = 60 + 25 * i
    out = [{"k": "k0", "ts": at(base + d), "v": i} for d in (0, 8, 16)]
    out.append({"k": "k1", "ts": at(base + 3), "v": 10 + i})
    if i % 2 == 0:
        out += [{"k": "k2", "ts": at(base + d), "v": 20 + i} for d in (0, 14)]
    else:
        out.append({"k": "k2", "ts": at(base - 25 + 9), "v": None})
    if i >= 2:
        out.append({"k": "k3", "ts": at(base - 70), "v": 30 + i})
    out += [{"k": "k4", "ts": at(base + d), "v": 40 + i} for d in (1, 6)]
    if i == 1:
        out.append({"k": "k4", "ts": None, "v": 99})  # no event time: in no session
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    mode: str
    gap: Callable[[], Any]


CASES = [
    Case("fixed-gap-append", "append", lambda: "10 seconds"),
    Case(
        "dynamic-gap-append",
        "append",
        lambda: F.when(F.col("k") == "k1", "5 seconds").otherwise("10 seconds"),
    ),
    Case("fixed-gap-complete", "complete", lambda: "10 seconds"),
]


def spark_query(df: DataFrame, case: Case) -> DataFrame:
    grouped = df.withWatermark("ts", "20 seconds").groupBy(F.session_window("ts", case.gap()), "k")
    return grouped.agg(F.count("*").alias("n"), F.sum("v").alias("total"), F.max("v"))


def our_query(df: DataFrame, case: Case) -> Any:
    stream = ss.stream(df.withWatermark("ts", "20 seconds"))
    grouped = stream.groupBy(SF.session_window("ts", case.gap()), "k")
    return grouped.agg(SF.count("*").alias("n"), SF.sum("v").alias("total"), SF.max("v"))


def run_twice(
    spark: SparkSession, tmp: Path, case: Case, provider: str | None
) -> tuple[Collector, list[dict[str, Any]]]:
    def build(df: DataFrame) -> Any:
        return spark_query(df, case) if provider is None else our_query(df, case)

    files = [rows(i) for i in range(FILES)]
    return run_in_two_runs(spark, tmp, SCHEMA, files, build, case.mode, provider)


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
def test_session_windows_match_spark(
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
    ops = [p["stateOperators"][0] for p in progress if p.get("stateOperators")]
    if case.mode == "append":
        assert sum(len(rows) for rows in ours.batches.values()) > 0
        assert sum(op["numRowsDroppedByWatermark"] for op in ops) > 0
    # k2's two sessions of an even file became one in the next batch
    merged = [
        r
        for rows in ours.batches.values()
        for r in rows
        if r[1] == "k2" and r[2] == 3  # n == 3: both sessions and the row between them
    ]
    assert merged


def test_session_windows_refuse_update_mode(spark: SparkSession, tmp_path: Path) -> None:
    df = FileFeed(tmp_path / "input").stream(spark, SCHEMA).withWatermark("ts", "20 seconds")
    query = ss.stream(df).groupBy(SF.session_window("ts", "10 seconds"), "k").agg(SF.count("*"))
    with pytest.raises(ConfigurationError, match="update"):
        query.writeStream.outputMode("update").foreachBatch(Collector()).option(
            "checkpointLocation", str(tmp_path / "c")
        ).start()
