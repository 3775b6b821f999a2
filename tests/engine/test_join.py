"""Stream-stream joins against Spark's: impressions and clicks, batch by batch.

Each query is written as a PySpark user writes it: both inputs with their watermark, joined on
the ad id with a time range (a click in the 10 s after its impression), and sparkstate runs it
with only the left input wrapped. Both read one file per side per batch (``availableNow``),
stop after the first half and start again on the same checkpoint. The files hold keys shared
by many rows of each side, null keys, rows that match only after several batches, late rows on
both sides, and rows that never match.

Spark runs each query once (:class:`SparkResults`), on one shuffle partition (its result does not
depend on them); sparkstate's on two. Where sparkstate's run: on memory the full and right outer
joins, the inner join on the range condition (the deduplicated join's: its deduplication leaves the
same impressions) and the inner equi-join without watermarks; on rocksdb the left semi join, the
left outer join on the range condition (the windowed count's: its state and what it delivered, per
window), the full outer join on a watermarked key and the join of windowed counts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.engine.spark.versions import PYSPARK
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .helpers import (
    PROVIDERS,
    SortedSetsCollector,
    assert_same_as_spark,
    at,
    compat,
    run_available,
    shuffle_partitions,
)

IMPRESSIONS = "ad long, imp_id long, imp_ts timestamp"
CLICKS = "click_ad long, click_id long, click_ts timestamp"


def imp(ad: int | None, i: int, t: int) -> dict[str, Any]:
    return {"ad": ad, "imp_id": i, "imp_ts": at(t)}


def clk(ad: int | None, i: int, t: int) -> dict[str, Any]:
    return {"click_ad": ad, "click_id": i, "click_ts": at(t)}


#: Per batch: (impressions, clicks). Watermarks: 5 s on both sides.
FILES: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    (
        [imp(1, 1, 10), imp(1, 2, 11), imp(2, 3, 12), imp(None, 4, 12), imp(3, 5, 13)],
        [clk(1, 101, 12), clk(1, 102, 15), clk(None, 103, 13), clk(9, 104, 14), clk(1, 118, 10)],
    ),
    (
        [imp(2, 6, 20), imp(4, 7, 21), imp(1, 8, 22)],
        [clk(2, 105, 19), clk(3, 106, 30), clk(1, 107, 21)],  # (2, 19 s) matches imp 3 late
    ),
    (
        [imp(5, 9, 33), imp(4, 10, 35), imp(1, 11, 5)],  # imp 11 is late
        [clk(4, 108, 29), clk(5, 109, 40), clk(2, 110, 8)],  # click 110 is late
    ),
    (
        [imp(6, 12, 45), imp(5, 13, 44), imp(None, 14, 46)],
        [clk(6, 111, 50), clk(5, 112, 47), clk(None, 113, 46), clk(1, 114, 31), clk(5, 119, 44)],
    ),
    ([imp(7, 15, 70)], [clk(7, 116, 90)]),  # click 114 (batch 3) matches imp 8 (batch 1)
    ([imp(8, 16, 100)], [clk(8, 117, 101)]),
]

CONDITION = "click_ad = ad AND click_ts >= imp_ts AND click_ts <= imp_ts + interval 10 seconds"
#: The same condition with its range written as SQL's BETWEEN (the left semi join's).
BETWEEN = "click_ad = ad AND click_ts BETWEEN imp_ts AND imp_ts + interval 10 seconds"


def condition_of(how: str) -> str:
    """The condition a join type is written with here: the left semi join's with BETWEEN."""
    return BETWEEN if how == "leftsemi" else CONDITION


Inputs = Callable[[Any, Any], tuple[Any, Any]]


def watermarked(left: Any, right: Any) -> tuple[Any, Any]:
    """Both sides with a 5-second watermark on their time."""
    return left.withWatermark("imp_ts", "5 seconds"), right.withWatermark("click_ts", "5 seconds")


def feed_query(
    spark: SparkSession,
    tmp: Path,
    provider: str | None,
    build: Callable[[Any, Any], Any],
    inputs: Inputs = watermarked,
    files: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = FILES,
) -> tuple[Collector, list[dict[str, Any]]]:
    """``build(left, right)`` over the two feeds as ``inputs`` shapes them, as a PySpark user
    writes it; sparkstate's with only ``left`` wrapped, unless ``provider`` is None (Spark's
    own query). The first half of the files, a stop, then the rest on the same checkpoint:
    what it delivered and its last operator's progress per batch."""
    collector, progress = feed_all(spark, tmp, provider, build, inputs, files)
    ops = [p["stateOperators"][0] for p in progress if p.get("stateOperators")]
    return collector, ops


def feed_all(
    spark: SparkSession,
    tmp: Path,
    provider: str | None,
    build: Callable[[Any, Any], Any],
    inputs: Inputs = watermarked,
    files: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = FILES,
) -> tuple[Collector, list[dict[str, Any]]]:
    """:func:`feed_query`, with every batch's whole progress. Spark's own query runs on one
    shuffle partition: its result does not depend on them."""
    theirs = shuffle_partitions(spark, 1) if provider is None else contextlib.nullcontext()
    with theirs:
        return _feed_all(spark, tmp, provider, build, inputs, files)


def _feed_all(
    spark: SparkSession,
    tmp: Path,
    provider: str | None,
    build: Callable[[Any, Any], Any],
    inputs: Inputs,
    files: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]],
) -> tuple[Collector, list[dict[str, Any]]]:
    imps, clicks = FileFeed(tmp / "imps"), FileFeed(tmp / "clicks")
    collector: Collector = SortedSetsCollector()
    progress: list[dict[str, Any]] = []
    half = len(files) // 2
    for part in (files[:half], files[half:]):
        for left_rows, right_rows in part:
            imps.add(left_rows)
            clicks.add(right_rows)
        left, right = inputs(imps.stream(spark, IMPRESSIONS), clicks.stream(spark, CLICKS))
        query = build(ss.stream(left) if provider else left, right)
        writer = query.writeStream.outputMode("append").foreachBatch(collector)
        writer = writer.option("checkpointLocation", str(tmp / "checkpoint"))
        if provider is not None:
            writer = writer.option("stateStore", provider)
        handle = run_available(writer, "join")
        progress += [p if isinstance(p, dict) else p.asDict() for p in handle.recentProgress]
    return collector, progress


def run(
    spark: SparkSession, tmp: Path, how: str, provider: str | None
) -> tuple[Collector, list[dict[str, Any]]]:
    """The join of the feeds on :data:`CONDITION`, Spark's own (``provider`` None) or
    sparkstate's."""

    def build(left: Any, right: Any) -> Any:
        return left.join(right, F.expr(condition_of(how)), how)

    return feed_query(spark, tmp, provider, build)


@pytest.fixture(scope="module", autouse=True)
def two_partitions(spark: SparkSession) -> Iterator[None]:
    """The module's queries on two partitions: keys still spread over several, for half the
    tasks and stores of each batch."""
    with shuffle_partitions(spark, 2):
        yield


class SparkResults:
    """Spark's own result of each query of the module, run at its first use and kept: what
    :func:`feed_all` returns."""

    def __init__(self, spark: SparkSession, tmp: pytest.TempPathFactory) -> None:
        self.spark = spark
        self.tmp = tmp
        self.results: dict[str, tuple[Collector, list[dict[str, Any]]]] = {}

    def of(
        self,
        name: str,
        build: Callable[[Any, Any], Any],
        files: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = FILES,
    ) -> tuple[Collector, list[dict[str, Any]]]:
        if name not in self.results:
            where = self.tmp.mktemp(f"spark-{name}")
            self.results[name] = feed_all(self.spark, where, None, build, files=files)
        return self.results[name]


@pytest.fixture(scope="module")
def spark_results(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkResults:
    return SparkResults(spark, tmp_path_factory)


def assert_sides_add_up(ops: list[dict[str, Any]]) -> None:
    """Each join operator's rows are its two sides' shares, under Spark's field names."""
    assert ops and {op["operatorName"] for op in ops} == {"symmetricHashJoin"}
    for op in ops:
        sides = op["customMetrics"]
        for f in ("numRowsTotal", "numRowsUpdated", "numRowsRemoved"):
            name = f[0].upper() + f[1:]
            assert sides.get(f"left{name}", 0) + sides.get(f"right{name}", 0) == op[f]


def sparks_join_counts(how: str) -> bool:
    """Whether the running Spark counts the state rows of a ``how`` join as sparkstate does, as
    Spark 4.3 does: Spark's own outer joins report no removed rows before 4.3, its left semi
    join more rows in state before 4.2 (the output is the same; see the docs' PySpark
    versions)."""
    since = (4, 2) if how == "leftsemi" else (4, 3)
    return since <= PYSPARK


#: The inner join on :data:`CONDITION` runs as :func:`deduplicated_join`'s, the left outer
#: join as :func:`windowed_count`'s.
JOIN_TYPES = ["rightouter", "full", "leftsemi"]

#: Each join type on one provider (the join on rocksdb: the left semi join here, the outer
#: joins in the tests below).
RUNS = [
    pytest.param(how, provider, id=f"{how}-{provider}")
    for how in JOIN_TYPES
    for provider in (PROVIDERS[-1:] if how == "leftsemi" else PROVIDERS[:1])
]


@pytest.mark.parametrize(
    ("how", "provider"), compat(RUNS, f"full-{PROVIDERS[0]}", f"leftsemi-{PROVIDERS[-1]}")
)
def test_join_matches_spark(
    spark: SparkSession,
    spark_results: SparkResults,
    tmp_path: Path,
    how: str,
    provider: str,
) -> None:
    def build(left: Any, right: Any) -> Any:
        return left.join(right, F.expr(condition_of(how)), how)

    theirs, their_progress = spark_results.of(how, build)
    their_ops = [p["stateOperators"][0] for p in their_progress if p.get("stateOperators")]
    ours, our_ops = run(spark, tmp_path, how, provider)
    assert sum(len(rows) for rows in theirs.batches.values()) > 3
    assert_same_as_spark(ours, theirs)
    fields = ("numRowsTotal", "numRowsUpdated", "numRowsRemoved", "numRowsDroppedByWatermark")
    if sparks_join_counts(how):
        assert [[op[f] for f in fields] for op in our_ops] == [
            [op[f] for f in fields] for op in their_ops
        ]
    assert_sides_add_up(our_ops)


def test_outer_join_without_a_range_is_refused_as_in_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    left = FileFeed(tmp_path / "l").stream(spark, IMPRESSIONS).withWatermark("imp_ts", "5 seconds")
    right = FileFeed(tmp_path / "r").stream(spark, CLICKS).withWatermark("click_ts", "5 seconds")
    with pytest.raises(ConfigurationError, match="Stream-stream LeftOuter join between two"):
        ss.stream(left).join(right, F.expr("click_ad = ad"), "left")
    with pytest.raises(ConfigurationError, match="without equality predicate"):
        ss.stream(left).join(right, F.expr("click_ts >= imp_ts"), "inner")
    with pytest.raises(ConfigurationError, match="LeftAnti joins"):
        ss.stream(left).join(right, F.expr("click_ad = ad"), "anti")


def test_a_side_with_a_stateful_step_of_sparks_own_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A side whose stateful step Spark would run (the input not wrapped) is refused, naming
    the way that works: the step on ``ss.stream(input)``."""
    left = FileFeed(tmp_path / "l").stream(spark, IMPRESSIONS).withWatermark("imp_ts", "5 seconds")
    right = FileFeed(tmp_path / "r").stream(spark, CLICKS).withWatermark("click_ts", "5 seconds")
    deduplicated = right.dropDuplicates(["click_id", "click_ts"])
    with pytest.raises(ConfigurationError, match=r"right side runs a stateful step in Spark"):
        ss.stream(left).join(deduplicated, F.expr(CONDITION), "inner")
    wrapped = ss.stream(right).dropDuplicates(["click_id", "click_ts"])
    joined = ss.stream(left).join(wrapped, F.expr(CONDITION), "inner")
    assert joined.df.isStreaming


#: The fields of each stateful operator's progress compared with Spark's, batch by batch.
OPERATOR_FIELDS = (
    "operatorName",
    "numRowsTotal",
    "numRowsUpdated",
    "numRowsRemoved",
    "numRowsDroppedByWatermark",
)


def operators_of(progress: list[dict[str, Any]]) -> list[list[list[Any]]]:
    """Each batch's stateful operators, as :data:`OPERATOR_FIELDS`."""
    return [
        [[op[f] for f in OPERATOR_FIELDS] for op in p["stateOperators"]]
        for p in progress
        if p.get("stateOperators")
    ]


def windowed_count(left: Any, right: Any) -> Any:
    """A left outer join, then impressions and their clicks counted per 10-second window of
    the impression's time (append mode: each window once, when the join's watermark, behind
    the inputs' by the condition's range, passes it), with the sums of their ids: which
    impressions and clicks the join delivered."""
    joined = left.join(right, F.expr(CONDITION), "left_outer")
    return joined.groupBy(F.window("imp_ts", "10 seconds")).agg(
        F.count("*").alias("rows"),
        F.count("click_id").alias("clicks"),
        F.sum("imp_id").alias("imp_ids"),
        F.sum("click_id").alias("click_ids"),
    )


def test_a_left_outer_join_and_a_windowed_count_after_it_match_spark(
    spark: SparkSession, spark_results: SparkResults, tmp_path: Path
) -> None:
    """The left outer join on :data:`CONDITION`: what it delivered, counted per window, and
    its state batch by batch, as Spark's (the count first in the progress, then the join)."""
    theirs, their_progress = spark_results.of("windowed-count", windowed_count)
    ours, our_progress = feed_all(spark, tmp_path, PROVIDERS[-1], windowed_count)
    assert sum(len(rows) for rows in theirs.batches.values()) > 2
    assert_same_as_spark(ours, theirs)
    assert operators_of(our_progress) == operators_of(their_progress)
    joins = [p["stateOperators"][1] for p in our_progress if p.get("stateOperators")]
    assert sum(op["numRowsRemoved"] for op in joins) > 0
    assert_sides_add_up(joins)


def keyed(
    spark: SparkSession, tmp: Path, provider: str | None, how: str, on: Any, watermark: bool
) -> tuple[Collector, list[dict[str, Any]]]:
    """The two inputs with the same key column ``ad`` (and, with ``watermark``, the same
    watermarked time column ``ts``), joined on column names (a USING join)."""

    def inputs(left: Any, right: Any) -> tuple[Any, Any]:
        right = right.withColumnRenamed("click_ad", "ad")
        if watermark:
            left = left.withColumnRenamed("imp_ts", "ts").withWatermark("ts", "5 seconds")
            right = right.withColumnRenamed("click_ts", "ts").withWatermark("ts", "5 seconds")
        return left, right

    return feed_query(spark, tmp, provider, lambda left, right: left.join(right, on, how), inputs)


def test_an_equi_join_without_watermarks_keeps_its_state_and_says_so(
    spark: SparkSession, tmp_path: Path
) -> None:
    theirs, their_ops = keyed(spark, tmp_path / "spark", None, "inner", "ad", watermark=False)
    ours, our_ops = keyed(spark, tmp_path / "ours", "memory", "inner", "ad", watermark=False)
    assert_same_as_spark(ours, theirs)
    assert [op["numRowsTotal"] for op in our_ops] == [op["numRowsTotal"] for op in their_ops]
    assert all(op["numRowsRemoved"] == 0 for op in our_ops)
    kept = [op["customMetrics"]["numRowsNeverEvicted"] for op in our_ops]
    assert kept == [op["numRowsTotal"] for op in our_ops] and kept[-1] > 0


def test_a_full_outer_join_on_a_watermarked_key_matches_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``on=["ad", "ts"]``: the watermark is in the join keys, so both sides are evicted by it
    (Spark's key predicate); the USING join's keys are coalesced from both sides."""
    on = ["ad", "ts"]
    theirs, their_ops = keyed(spark, tmp_path / "spark", None, "full_outer", on, watermark=True)
    ours, our_ops = keyed(spark, tmp_path / "ours", "rocksdb", "full_outer", on, watermark=True)
    assert sum(len(rows) for rows in theirs.batches.values()) > 3
    assert_same_as_spark(ours, theirs)
    fields = ("numRowsTotal", "numRowsUpdated", "numRowsRemoved", "numRowsDroppedByWatermark")
    assert [[op[f] for f in fields] for op in our_ops] == [
        [op[f] for f in fields] for op in their_ops
    ]


#: :data:`FILES` with impressions delivered more than once: in the same file and in a later
#: one (the late impression of :data:`FILES` is dropped by the deduplication).
DUPLICATED: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    ([*FILES[0][0], imp(1, 1, 10), imp(2, 3, 12)], FILES[0][1]),
    ([*FILES[1][0], imp(1, 2, 11), imp(4, 7, 21)], FILES[1][1]),
    ([*FILES[2][0], imp(4, 7, 21), imp(5, 9, 33)], FILES[2][1]),
    ([*FILES[3][0], imp(5, 9, 33), imp(5, 13, 44)], FILES[3][1]),
    ([*FILES[4][0], imp(6, 12, 45)], FILES[4][1]),
    FILES[5],
]


def deduplicated_join(left: Any, right: Any) -> Any:
    """Each impression once (dropDuplicates on its id and time, with the watermark), then
    joined with its clicks: Spark 4 runs the join after the deduplication in append mode."""
    return left.dropDuplicates(["imp_id", "imp_ts"]).join(right, F.expr(CONDITION), "inner")


def joined_windows(left: Any, right: Any) -> Any:
    """Impressions and clicks counted per 10-second window and ad, each side in append mode,
    then the two counts of a window and ad joined (a left outer join on the watermarked
    window: an ad's window without clicks comes out with nulls). Both inputs are wrapped in
    sparkstate's query, each being the input of a stateful step."""
    if isinstance(left, ss.StatefulStream):
        right = ss.stream(right)
    imps = left.groupBy(F.window("imp_ts", "10 seconds").alias("imp_window"), "ad").count()
    clicks = right.groupBy(F.window("click_ts", "10 seconds").alias("click_window"), "click_ad")
    clicks = clicks.agg(F.count("*").alias("clicks"))
    on = F.expr("imp_window = click_window AND ad = click_ad")
    return imps.join(clicks, on, "left_outer")


CHAINS = {"dedup-join": (deduplicated_join, DUPLICATED), "windows-join": (joined_windows, FILES)}


@pytest.mark.parametrize(
    ("name", "provider"), [("dedup-join", PROVIDERS[0]), ("windows-join", PROVIDERS[-1])]
)
def test_a_join_after_stateful_steps_matches_spark(
    spark: SparkSession, spark_results: SparkResults, tmp_path: Path, name: str, provider: str
) -> None:
    """Batch by batch, the same output and the same stateful operators in each batch's
    progress as Spark's (the join first, then its left input's step, then its right's)."""
    build, files = CHAINS[name]
    theirs, their_progress = spark_results.of(name, build, files)
    ours, our_progress = feed_all(spark, tmp_path, provider, build, files=files)
    assert sum(len(rows) for rows in theirs.batches.values()) > 3
    assert_same_as_spark(ours, theirs)
    assert operators_of(our_progress) == operators_of(their_progress)
    assert_sides_add_up([p["stateOperators"][0] for p in our_progress if p.get("stateOperators")])


def window_sides(left: Any, right: Any) -> tuple[Any, Any]:
    """Each side as Spark's windowed join tests write it: the watermark on its time, then only
    a window of it kept (``select(key, window(time, ...), value)``)."""
    left = left.withWatermark("imp_ts", "5 seconds").select(
        F.col("ad").alias("key"), F.window("imp_ts", "10 seconds"), "imp_id"
    )
    right = right.withWatermark("click_ts", "5 seconds").select(
        F.col("click_ad").alias("key"), F.window("click_ts", "10 seconds"), "click_id"
    )
    return left, right


@pytest.mark.parametrize(
    ("how", "provider"),
    [("inner", PROVIDERS[0]), ("left_outer", PROVIDERS[-1]), ("left_semi", PROVIDERS[0])],
)
def test_a_join_of_windows_whose_sides_keep_only_the_window_matches_spark(
    spark: SparkSession, spark_results: SparkResults, tmp_path: Path, how: str, provider: str
) -> None:
    """Joined on the key and the window, each side's event time only inside its window
    struct: the watermark is still the largest event time each side read (carried past its
    projection), so rows match, wait and leave state as in Spark's run."""

    def build(left: Any, right: Any) -> Any:
        return left.join(right, ["key", "window"], how)

    theirs, _ = feed_all(spark, tmp_path / "spark", None, build, window_sides)
    ours, our_ops = feed_query(spark, tmp_path / "ours", provider, build, window_sides)
    assert sum(len(rows) for rows in theirs.batches.values()) > 3
    assert_same_as_spark(ours, theirs)
    assert any(op["numRowsRemoved"] > 0 for op in our_ops)  # windows left state
