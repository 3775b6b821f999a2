"""Session windows against Spark's: fixed and dynamic gaps, sessions merging within a batch and
with sessions kept from earlier batches, late rows, append and complete mode, every kind of
aggregate (nulls among the values, a key whose values are all null), merged as sessions join.

As in ``test_windows``: the query as a PySpark user writes it, only its input wrapped, through two
``availableNow`` runs on one checkpoint (a restart in the middle), compared batch by batch. The
append case runs on memory, the complete case on rocksdb (test_aggregate_functions runs session
windows in append mode on rocksdb).
"""

from __future__ import annotations

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

from .helpers import AGGREGATES, Differential, SparkRuns, aggregates, runs
from .helpers import WIDE_SCHEMA as SCHEMA
from .helpers import wide_row as row

#: Three files, a restart after the first: sessions kept across it merge in the second.
FILES = 3


def rows(i: int) -> list[dict[str, Any]]:
    """File ``i``, 25 s of event time after the previous one (gap 10 s, watermark 20 s):

    - ``k0`` every 8 s: one session that grows across every batch (its first value of a file
      has no ``d`` nor ``s``);
    - ``k1`` once per file: a session of its own each time;
    - ``k2``: two sessions in an even file (the first without ``s``), then in the next file a
      row between them that merges both with itself (sessions kept in state merging through a
      new one); ``kn`` likewise, but every value it aggregates is null;
    - ``k3``: from the third file on, a row so late its session closed (dropped), and
      ``k4`` two rows of one file that merge in the batch (and a row without a time).
    """
    base = 60 + 25 * i
    out = [
        row("k0", base, i, None, None, i + 0.5),
        row("k0", base + 8, i, 0.5 * i, f"a{i % 3}", None),
        row("k0", base + 16, i, -1.0, "a", 1.01),
        row("k1", base + 3, 10 + i, 2.5, f"b{i}", -3.0),
    ]
    if i % 2 == 0:
        out.append(row("k2", base, 20 + i, 0.0, None, 0.02))
        out.append(row("k2", base + 14, 20 + i, 3.5, "c14", 0.02))
        out += [row("kn", base + d, None, None, None, None) for d in (0, 14)]
    else:
        out.append(row("k2", base - 25 + 9, None, 9.0, "c9", None))
        out.append(row("kn", base - 25 + 9, None, None, None, None))
    if i >= 2:
        out.append(row("k3", base - 70, 30 + i, 1.0, "late", 0.03))
    out += [row("k4", base + d, 40 + i, None, f"e{d}", 4.0) for d in (1, 6)]
    if i == 1:
        out.append(row("k4", None, 99, 1.0, "none", 9.0))  # no event time: in no session
    return out


#: Every kind of aggregate (``helpers.AGGREGATES``): sessions merge all their buffers.
MERGED = tuple(AGGREGATES)


def sessions(df: DataFrame, gap: Callable[[], Any], kinds: tuple[str, ...], ours: bool) -> Any:
    """Sessions of ``gap`` per key; Spark's query computes every kind of aggregate, ours
    ``kinds``."""
    df = df.withWatermark("ts", "20 seconds")
    if ours:
        grouped = ss.stream(df).groupBy(SF.session_window("ts", gap()), "k")
        return grouped.agg(*aggregates(SF, kinds))
    return df.groupBy(F.session_window("ts", gap()), "k").agg(*aggregates(F))


def case(
    name: str, mode: str, gap: Callable[[], Any], kinds: tuple[str, ...] = MERGED
) -> Differential:
    def build(df: DataFrame, ours: bool) -> Any:
        return sessions(df, gap, kinds, ours)

    files = [rows(i) for i in range(FILES)]
    return Differential(name, SCHEMA, files, mode, build, restart_after=1)


def fixed_gap() -> str:
    return "10 seconds"


def dynamic_gap() -> Any:
    return F.when(F.col("k") == "k1", "5 seconds").otherwise("10 seconds")


#: A dynamic gap (``k1``'s 5 s, the other keys' 10 s) in append mode, a fixed one in complete
#: mode: each gap's spelling once, each mode once.
CASES = [
    case("dynamic-gap-append", "append", dynamic_gap),
    case("fixed-gap-complete", "complete", fixed_gap),
]


#: Append mode on memory here (on rocksdb in test_aggregate_functions), complete on rocksdb.
RUNS = runs(CASES, on_memory=("dynamic-gap-append",))


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


@pytest.mark.parametrize(("case", "provider"), RUNS)
def test_session_windows_match_spark(
    spark_runs: SparkRuns, tmp_path: Path, case: Differential, provider: str
) -> None:
    ours, ops = spark_runs.check(case, tmp_path, provider)
    if case.mode == "append":
        assert sum(len(rows) for rows in ours.batches.values()) > 0
        assert sum(op["numRowsDroppedByWatermark"] for op in ops) > 0
    # k2's and kn's two sessions of an even file became one in the next batch: n == 3, both
    # sessions and the row between them
    merged = {r[1] for rows in ours.batches.values() for r in rows if r[2] == 3}
    assert {"k2", "kn"} <= merged


def test_session_windows_refuse_update_mode(spark: SparkSession, tmp_path: Path) -> None:
    df = FileFeed(tmp_path / "input").stream(spark, SCHEMA).withWatermark("ts", "20 seconds")
    query = ss.stream(df).groupBy(SF.session_window("ts", "10 seconds"), "k").agg(SF.count("*"))
    with pytest.raises(ConfigurationError, match="update"):
        query.writeStream.outputMode("update").foreachBatch(Collector()).option(
            "checkpointLocation", str(tmp_path / "c")
        ).start()
