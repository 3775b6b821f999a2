"""The streaming limit against Spark's: ``limit(n)`` in append mode (the count kept in state
across a restart) after ``dropDuplicates`` and after a windowed aggregation, before them, and
before and after an aggregation in complete mode (after it, a limit of each batch's result);
and the queries Spark refuses, refused at ``start()``.

Each case is the query as a PySpark user writes it, over one file per batch (so both systems see
the rows of a batch in the same order); sparkstate runs it with only the input wrapped. Both run
the first files, stop, and run the rest on the same checkpoint, and their outputs must match
batch by batch. The limit after a deduplication runs on every provider, the limits before and
after an aggregation in complete mode (one query) on the memory provider, the others on RocksDB.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .helpers import Differential, SparkRuns, at, runs

SCHEMA = "k string, v long"
TIMED = "k string, ts timestamp"


def rows(k: str, *values: int) -> list[dict[str, Any]]:
    return [{"k": k, "v": v} for v in values]


def timed(k: str, *seconds: int) -> list[dict[str, Any]]:
    return [{"k": k, "ts": at(t)} for t in seconds]


def wrap(df: DataFrame, ours: bool) -> Any:
    return ss.stream(df) if ours else df


CASES = [
    # duplicates do not count: 2 distinct rows, then 1, the restart, 1 more (the 4th distinct
    # row fills the limit: the count went on from 3), then new keys and nothing emitted
    Differential(
        "dedup-limit-append",
        SCHEMA,
        [
            rows("a", 1, 2) + rows("b", 3),
            rows("a", 4) + rows("c", 5, 6) + rows("b", 7),
            rows("c", 8) + rows("d", 9),
            rows("e", 10, 11) + rows("f", 12),
        ],
        "append",
        lambda df, ours: wrap(df, ours).dropDuplicates(["k"]).limit(4),
        restart_after=2,
    ),
    # a limit of the windows the watermark closes: none until the batch after the second file,
    # which closes two (the limit), then one more, not emitted
    Differential(
        "window-limit-append",
        TIMED,
        [timed("a", 1, 4, 12), timed("b", 25), timed("c", 41)],
        "append",
        lambda df, ours: (
            wrap(df.withWatermark("ts", "5 seconds"), ours)
            .groupBy(F.window("ts", "10 seconds"))
            .count()
            .limit(2)
        ),
        restart_after=2,
    ),
    # the first 4 rows of the stream, deduplicated: a and b, the restart, c (a 4th row), nothing
    Differential(
        "limit-dedup-append",
        SCHEMA,
        [rows("a", 1, 2) + rows("b", 3), rows("c", 4) + rows("d", 5), rows("e", 6)],
        "append",
        lambda df, ours: wrap(df, ours).limit(4).dropDuplicates(["k"]),
        restart_after=1,
    ),
    # counts of the first 7 rows of the stream, and of them the two largest of each batch's
    # complete result: a and b, the restart, c ahead of a and b (the 8th row not counted), then
    # nothing new
    Differential(
        "limit-count-top-2-complete",
        SCHEMA,
        [
            rows("a", 1, 2) + rows("b", 3),
            rows("c", 4, 5, 6) + rows("b", 7) + rows("c", 8),
            rows("d", 9),
        ],
        "complete",
        lambda df, ours: (
            wrap(df, ours).limit(7).groupBy("k").count().orderBy(F.desc("count"), "k").limit(2)
        ),
        restart_after=1,
    ),
]


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


#: The stateful limit (after a deduplication) on every provider; the limits before and after an
#: aggregation in complete mode on the memory provider; the others on RocksDB.
RUNS = runs(CASES, on_memory=("limit-count-top-2-complete",), on_both=("dedup-limit-append",))


@pytest.mark.parametrize(("case", "provider"), RUNS)
def test_limit_matches_spark(
    spark_runs: SparkRuns, tmp_path: Path, case: Differential, provider: str
) -> None:
    ours, ops = spark_runs.check(case, tmp_path, provider)
    delivered = [len(ours.batches[b]) for b in sorted(ours.batches)]
    if case.name == "dedup-limit-append":
        assert delivered == [2, 1, 1, 0]
        assert [op["operatorName"] for op in ops] == ["globalLimit"] * 4  # op 0: the limit
        assert [op["numRowsUpdated"] for op in ops] == [1, 1, 1, 0]  # the count, one key
        assert {op["numRowsTotal"] for op in ops} == {1}
    if case.name == "window-limit-append":
        assert [len(rows) for rows in ours.batches.values() if rows] == [2]
        assert {op["operatorName"] for op in ops} == {"globalLimit"}  # op 0, as Spark numbers
    if case.name == "limit-dedup-append":
        assert delivered == [2, 1, 0]
    if case.name == "limit-count-top-2-complete":
        assert delivered == [2, 2, 2]
        assert ours.batches[max(ours.batches)] == [("a", 2), ("c", 3)]
        metadata = json.loads((tmp_path / "checkpoint/sparkstate/metadata.json").read_text())
        kinds = sorted(op["kind"] for op in metadata["operators"])
        assert kinds == ["aggregate", "limit"]  # the limit of each batch's result keeps none


#: Queries Spark refuses, and the words of ours: (what, mode, query over the input).
REFUSED: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("in Update output mode", "update", lambda s: s.limit(3)),
    ("in Update output mode", "update", lambda s: s.groupBy("k").count().limit(3)),
    ("greater than 0, but got -1", "append", lambda s: s.limit(-1)),
    ("must be an int", "append", lambda s: s.limit("3")),
    ("must be an int", "append", lambda s: s.limit(2.5)),
    ("must be an int", "append", lambda s: s.limit(2**31)),
    ("complete output mode needs a streaming aggregation", "complete", lambda s: s.limit(3)),
]


def test_refused_limits(spark: SparkSession, tmp_path: Path) -> None:
    df = FileFeed(tmp_path / "input").stream(spark, SCHEMA)
    for i, (words, mode, query) in enumerate(REFUSED):
        checkpoint = str(tmp_path / f"c{i}")
        with pytest.raises((AnalysisException, Py4JError)):  # at limit() or at start()
            spark_query = query(df).writeStream.outputMode(mode).foreachBatch(Collector())
            spark_query.option("checkpointLocation", checkpoint + "-spark").start().stop()
        ours = query(ss.stream(df)).writeStream.outputMode(mode).foreachBatch(Collector())
        with pytest.raises(ConfigurationError, match=words):
            ours.option("checkpointLocation", checkpoint).start()
