"""A stateful step after ``transformWithStateInPandas`` (Spark 4): the processor's output carries
the watermark in its ``eventTimeColumnName``, so a windowed count over that column closes its
windows in append mode; the same query through Spark and through sparkstate."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, source, spark_rocksdb, start_ours, start_spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, ts timestamp"


def at(seconds: int) -> str:
    return f"2024-01-01T00:00:{seconds:02d}Z"


#: Watermark (10 s delay): 0 after the first file, 15 s after the second, 30 s after the third.
BATCHES = [
    [{"k": "a", "ts": at(0)}, {"k": "a", "ts": at(5)}, {"k": "b", "ts": at(6)}],
    [{"k": "a", "ts": at(25)}, {"k": "a", "ts": at(3)}],  # 3 s: not late yet (watermark 0)
    [{"k": "b", "ts": at(40)}],
]
SETTLE_S = 2.0


class FirstSeen(StatefulProcessor):  # type: ignore[misc]
    """Emits each row with the key's running count (its own ValueState)."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:  # noqa: N802, N803
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            out = pdf[["k", "ts"]].copy()
            out["n"] = range(n + 1, n + 1 + len(pdf))
            n += len(pdf)
            yield out
        self.count.update((n,))

    def close(self) -> None:
        pass


def _query(df: Any, fn: Any) -> Any:
    seen = (
        df.withWatermark("ts", "10 seconds")
        .groupBy("k")
        .transformWithStateInPandas(
            FirstSeen(),
            "k string, ts timestamp, n long",
            "Append",
            "EventTime",
            eventTimeColumnName="ts",
        )
    )
    return seen.groupBy(fn.window("ts", "10 seconds")).agg(fn.count("*").alias("rows"), fn.max("n"))


def _run(feed: FileFeed, start: Callable[[Collector], Any]) -> Collector:
    collector = Collector()
    query = start(collector)
    try:
        for rows in BATCHES:
            feed.add(rows)
            query.processAllAvailable()
            time.sleep(SETTLE_S)  # the batch without data after a watermark move
            query.processAllAvailable()
    finally:
        query.stop()
    return collector


@pytest.mark.parametrize("provider", PROVIDERS[-1:])
def test_window_after_processor_matches_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    with spark_rocksdb(spark):
        theirs = _run(
            feed,
            lambda c: start_spark(
                _query(source(spark, feed, SCHEMA), F), "append", tmp_path / "s", c
            ),
        )
    feed.reset()
    ours = _run(
        feed,
        lambda c: start_ours(
            _query(ss.stream(source(spark, feed, SCHEMA)), SF),
            "append",
            tmp_path / "o",
            provider,
            c,
        ),
    )
    emitted = [r for b in sorted(theirs.batches) for r in theirs.batches[b]]
    assert len(emitted) >= 2, theirs.batches  # windows [0, 10) and [20, 30) closed
    assert ours.schema == theirs.schema
    assert ours.batches == theirs.batches
