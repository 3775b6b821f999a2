"""A union of a stateful step's output with another stream against Spark's: impressions and
clicks, batch by batch.

Each query is written as a PySpark user writes it; sparkstate runs it with the input of each
stateful step wrapped (the other input a wrapped stream or Spark's own DataFrame). Both read one
file per input per batch (``availableNow``), stop after the first half and start again on the
same checkpoint, and must deliver the same batches (the batches without data a moved watermark
asks for included), with Spark's column names and types (the union's widened ones), and show the
same stateful operators in each batch's progress. Spark runs each query once, on one shuffle
partition; sparkstate's on two. The deduplication's and the windowed counts' (one of them after
the union) run on rocksdb, the counts' in update and complete mode on memory. Spark's refusals of
such a union, and of a stateful step after it, are sparkstate's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .helpers import (
    PROVIDERS,
    SortedSetsCollector,
    assert_same_as_spark,
    at,
    run_available,
    shuffle_partitions,
)

IMPRESSIONS = "ad long, imp_id long, imp_ts timestamp"
CLICKS = "click_ad long, click_id long, click_ts timestamp"


def imp(ad: int, i: int, t: int) -> dict[str, Any]:
    return {"ad": ad, "imp_id": i, "imp_ts": at(t)}


def clk(ad: int, i: int, t: int) -> dict[str, Any]:
    return {"click_ad": ad, "click_id": i, "click_ts": at(t)}


#: Per batch: (impressions, clicks), impressions repeated (the deduplication keeps one), late
#: ones after the restart (behind the watermark of 5 s), and ads counted again in later batches.
FILES: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    ([imp(1, 1, 10), imp(1, 1, 10), imp(2, 2, 12), imp(1, 3, 14)], [clk(1, 101, 12)]),
    ([imp(2, 4, 21), imp(1, 3, 14), imp(3, 5, 23)], [clk(2, 102, 22), clk(9, 103, 5)]),
    ([imp(1, 6, 31), imp(2, 7, 8), imp(3, 5, 23)], []),  # imp 7 is late
    ([imp(4, 8, 45), imp(1, 9, 44), imp(1, 9, 44)], [clk(4, 104, 46), clk(1, 105, 3)]),
    ([imp(2, 10, 60)], [clk(3, 106, 61)]),
]


def deduplicated(left: Any, right: Any) -> Any:
    """Each impression once (dropDuplicates on its id and time, with its watermark), with the
    clicks (their own watermark) as they come, by position: Spark's watermark is the min of
    both inputs'. The clicks are Spark's own DataFrame."""
    impressions = left.withWatermark("imp_ts", "5 seconds").dropDuplicates(["imp_id", "imp_ts"])
    return impressions.union(right.withWatermark("click_ts", "5 seconds"))


def counted(left: Any, right: Any) -> Any:
    """The clicks as they come (their id an int), then the impressions counted per ad and
    their latest time: by position, the second column the count's type (a long, Spark's union
    widens the int) and the clicks' names."""
    clicks = right.select("click_ad", F.col("click_id").cast("int"), "click_ts")
    counts = left.groupBy("ad").agg(F.count("*").alias("n"), F.max("imp_ts").alias("latest"))
    return clicks.union(counts)


def windowed(left: Any, right: Any) -> Any:
    """Impressions counted per 10-second window and ad in append mode (a window comes out once
    the watermark passed its end), with the clicks by name, the columns either lacks null."""
    counts = left.withWatermark("imp_ts", "5 seconds").groupBy(
        F.window("imp_ts", "10 seconds"), "ad"
    )
    clicks = right.select(F.col("click_ad").alias("ad"), "click_ts")
    return counts.count().unionByName(clicks, allowMissingColumns=True)


def counted_after(left: Any, right: Any) -> Any:
    """:func:`deduplicated`, then counted per 10-second window and ad in append mode: Spark 4
    runs the aggregation after the deduplication's output unioned with the clicks (their rows
    behind the watermark dropped there)."""
    both = deduplicated(left, right)
    return both.groupBy(F.window("imp_ts", "10 seconds"), "ad").agg(F.count("*").alias("n"))


@dataclass(frozen=True)
class Case:
    name: str
    mode: str
    #: ``build(left, right)``: the query over both inputs, each wrapped or not.
    build: Callable[[Any, Any], Any]
    #: Which inputs sparkstate's query wraps: (left, right).
    wrapped: tuple[bool, bool]


CASES = {
    "dedup-append": Case("dedup-append", "append", deduplicated, (True, False)),
    "counts-update": Case("counts-update", "update", counted, (True, True)),
    "counts-complete": Case("counts-complete", "complete", counted, (True, True)),
    "windows-append": Case("windows-append", "append", windowed, (True, False)),
    "dedup-windows-append": Case("dedup-windows-append", "append", counted_after, (True, False)),
}
RUNS = [
    pytest.param(name, provider, id=f"{name}-{provider}")
    for name in CASES
    for provider in (PROVIDERS[:1] if name.startswith("counts") else PROVIDERS[-1:])
]


def feed(
    spark: SparkSession, tmp: Path, case: Case, provider: str | None
) -> tuple[Collector, list[list[dict[str, Any]]]]:
    """``case``'s query over the feeds, Spark's own (``provider`` None) or sparkstate's: the
    first half of the files, a stop, then the rest on the same checkpoint. What it delivered
    and each batch's ``stateOperators``."""
    imps, clicks = FileFeed(tmp / "imps"), FileFeed(tmp / "clicks")
    collector: Collector = SortedSetsCollector()
    progress: list[dict[str, Any]] = []
    half = len(FILES) // 2
    for part in (FILES[:half], FILES[half:]):
        for left_rows, right_rows in part:
            imps.add(left_rows)
            clicks.add(right_rows)
        left, right = imps.stream(spark, IMPRESSIONS), clicks.stream(spark, CLICKS)
        if provider is not None:
            left = ss.stream(left) if case.wrapped[0] else left
            right = ss.stream(right) if case.wrapped[1] else right
        query = case.build(left, right)
        writer = query.writeStream.outputMode(case.mode).foreachBatch(collector)
        writer = writer.option("checkpointLocation", str(tmp / "checkpoint"))
        if provider is not None:
            writer = writer.option("stateStore", provider)
        handle = run_available(writer, case.name)
        progress += [p if isinstance(p, dict) else p.asDict() for p in handle.recentProgress]
    return collector, [p["stateOperators"] for p in progress if p.get("stateOperators")]


@pytest.fixture(scope="module", autouse=True)
def two_partitions(spark: SparkSession) -> Iterator[None]:
    """The module's queries on two partitions: keys still spread over several."""
    with shuffle_partitions(spark, 2):
        yield


@pytest.mark.parametrize(("name", "provider"), RUNS)
def test_a_union_after_a_stateful_step_matches_spark(
    spark: SparkSession, tmp_path: Path, name: str, provider: str
) -> None:
    case = CASES[name]
    with shuffle_partitions(spark, 1):
        theirs, their_operators = feed(spark, tmp_path / "spark", case, None)
    ours, our_operators = feed(spark, tmp_path / "ours", case, provider)
    assert sum(len(rows) for rows in theirs.batches.values()) > len(FILES)
    assert_same_as_spark(ours, theirs)

    def shown(operators: list[list[dict[str, Any]]]) -> list[list[tuple[str, int]]]:
        return [[(op["operatorName"], op["numRowsTotal"]) for op in ops] for ops in operators]

    assert shown(our_operators) == shown(their_operators)


def test_a_union_spark_refuses_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's refusals of a union after a stateful step: its analyzer's at ``union()``, its
    streaming checks' at ``start()`` (sparkstate's of a batch DataFrame at ``union()``), with
    Spark's message."""
    inputs = FileFeed(tmp_path / "input")
    inputs.add(FILES[0][0])
    df = inputs.stream(spark, IMPRESSIONS)
    static = spark.createDataFrame([(1, 2)], "ad long, imp_id long")

    def counts(s: Any) -> Any:
        return s.groupBy("ad").count()

    for stream in (df, ss.stream(df)):  # the number of columns
        with pytest.raises(AnalysisException, match="NUM_COLUMNS_MISMATCH"):
            counts(stream).union(df)
    with pytest.raises(AnalysisException, match="streaming and batch"):
        counts(ss.stream(df)).union(static)
    shapes = [
        ("update", lambda s: counts(s).union(static), "streaming and batch"),
        ("append", lambda s: counts(s).union(df.select("ad", "imp_id")), "without watermark"),
        ("complete", lambda s: s.dropDuplicates(["ad"]).union(df), "streaming aggregation"),
        ("append", lambda s: s.dropDuplicates(["ad"]).union(df).orderBy("ad"), "(?i)sorting"),
        (
            "update",
            lambda s: counts(s).union(df.select("ad", "imp_id")).groupBy("ad").count(),
            "correctness",
        ),
    ]
    for i, (mode, query, message) in enumerate(shapes):
        with pytest.raises((AnalysisException, StreamingQueryException), match=message):
            spark_query = query(df).writeStream.outputMode(mode).format("noop")
            spark_query = spark_query.option("checkpointLocation", str(tmp_path / f"s{i}"))
            spark_query.trigger(availableNow=True).start().awaitTermination(120)
        if i == 0:
            continue  # refused at union() above
        with pytest.raises(ConfigurationError, match=message):
            ours = query(ss.stream(df)).writeStream.outputMode(mode).format("noop")
            ours.option("checkpointLocation", str(tmp_path / f"o{i}")).start().stop()
