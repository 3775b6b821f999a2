"""Deduplication with a watermark against Spark's: ``dropDuplicates`` over the event-time column
(keys expire once the watermark passes them), over other columns (kept forever), and
``dropDuplicatesWithinWatermark`` (a key is dropped until its first row's time plus the delay).

Each query is written as a PySpark user writes it, the watermark on the input DataFrame;
sparkstate runs it with only the input wrapped. Both run the first file, stop, and run the
rest on the same checkpoint; their outputs must match batch by batch, the no-data batches Spark
runs after a watermark move included. The files hold duplicates within a batch and across
batches, late rows, keys whose state expired and come back, and a row without event time.

``dropDuplicatesWithinWatermark`` keeps its state in a store of its own (a key's expiry beside
it) and runs on every provider; the two ``dropDuplicates`` share one operator, over the event
time on the memory provider and without it on RocksDB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .helpers import PROVIDERS, Differential, SparkRuns, at, compat, runs

SCHEMA = "k string, ts timestamp, v long"


def row(k: str, t: int | None, v: int) -> dict[str, Any]:
    return {"k": k, "ts": None if t is None else at(t), "v": v}


FILES = [
    [
        *[row("a", 10, 1), row("a", 10, 2), row("b", 12, 3), row("a", 11, 4), row("c", None, 5)],
        *[row("a", 10, 6), row("b", 30, 7), row("d", 20, 8), row("b", 12, 9)],
    ],
    # after the restart: the watermark is 25 s, so (a, 10 s) is late; (b, 30 s) is kept
    [row("a", 10, 10), row("d", 27, 11), row("b", 30, 12), row("e", 26, 13), row("c", None, 14)],
    # the watermark is 28 s: (d, 27 s) again, and a back once its first row expired
    [
        row("d", 27, 15),
        row("a", 40, 16),
        row("e", 33, 17),
        row("b", 31, 18),
        row("a", 41, 19),
        row("d", 34, 20),
        row("b", 50, 21),
    ],
]


def case(name: str, dedup: Any) -> Differential:
    """``dedup(stream)`` over the watermarked input, Spark's query or (wrapped) ours."""

    def build(df: DataFrame, ours: bool) -> Any:
        df = df.withWatermark("ts", "5 seconds")
        return dedup(ss.stream(df) if ours else df)

    return Differential(name, SCHEMA, FILES, "append", build)


CASES = [
    case("with-event-time", lambda s: s.dropDuplicates(["k", "ts"])),
    case("without-event-time", lambda s: s.dropDuplicates(["k"])),
    case("within-watermark", lambda s: s.dropDuplicatesWithinWatermark(["k"])),
]


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


@pytest.mark.parametrize(
    ("case", "provider"),
    compat(
        runs(CASES, on_memory=("with-event-time",), on_both=("within-watermark",)),
        "with-event-time-memory",
        f"within-watermark-{PROVIDERS[-1]}",
    ),
)
def test_dedup_with_watermark_matches_spark(
    spark_runs: SparkRuns, tmp_path: Path, case: Differential, provider: str
) -> None:
    ours, ops = spark_runs.check(case, tmp_path, provider)
    assert sum(len(rows) for rows in ours.batches.values()) > 0
    assert sum(op["numRowsDroppedByWatermark"] for op in ops) > 0
    removed = sum(op["numRowsRemoved"] for op in ops)
    if case.name == "without-event-time":
        assert removed == 0  # nothing says when a key may be forgotten
    else:
        assert removed > 0
        assert ops[-1]["numRowsTotal"] < sum(op["numRowsUpdated"] for op in ops)


def test_within_watermark_needs_a_watermark(spark: SparkSession, tmp_path: Path) -> None:
    df = FileFeed(tmp_path / "input").stream(spark, SCHEMA)
    query = ss.stream(df).dropDuplicatesWithinWatermark(["k"])
    with pytest.raises(ConfigurationError, match="without watermark") as refused:
        query.writeStream.foreachBatch(Collector()).option(
            "checkpointLocation", str(tmp_path / "c")
        ).start()
    assert isinstance(refused.value, AnalysisException)  # Spark's error, as Spark raises it
    assert refused.value.getCondition() == "_LEGACY_ERROR_TEMP_3102"


def test_within_watermark_before_a_join_needs_a_watermark_at_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The watermark on the join's other side only: the query is written (join() plans the
    side's steps), and start() refuses it with Spark's error, as Spark does."""
    df = FileFeed(tmp_path / "input").stream(spark, SCHEMA)
    other = FileFeed(tmp_path / "other").stream(spark, SCHEMA).withWatermark("ts", "10 seconds")
    query = ss.stream(df).select("k").dropDuplicatesWithinWatermark().join(other, "k")
    with pytest.raises(AnalysisException, match="without watermark") as refused:
        query.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c")).start()
    assert refused.value.getCondition() == "_LEGACY_ERROR_TEMP_3102"


def test_a_source_column_added_between_runs_like_spark(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's deduplication keeps only its key columns in state, so a column added to the
    source between runs is accepted, and the rows after it carry it."""
    narrow, wide = "k string, v long", "k string, v long, w string"
    out: dict[bool, list[dict[int, list[Any]]]] = {}
    for ours in (False, True):
        feed = FileFeed(tmp_path / f"input-{ours}")
        checkpoint = str(tmp_path / f"checkpoint-{ours}")
        out[ours] = []
        for schema, files in (
            (narrow, [[{"k": "a", "v": 1}, {"k": "b", "v": 2}]]),
            (wide, [[{"k": "a", "v": 3, "w": "x"}, {"k": "c", "v": 4, "w": "y"}]]),
        ):
            for rows in files:
                feed.add(rows)
            df = feed.stream(spark, schema)
            collector = Collector()
            q = (
                (ss.stream(df) if ours else df)
                .dropDuplicates(["k"])
                .writeStream.foreachBatch(collector)
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            assert q.awaitTermination(180)
            out[ours].append(dict(collector.batches))
    assert out[True] == out[False]
    assert [r for rows in out[True][1].values() for r in rows] == [("c", 4, "y")]
