"""``sparkstate-metadata`` against Spark's ``state-metadata`` for a ``transformWithStateInPandas``
in each time mode: the same rows, ``operatorProperties`` included (every state variable, the
timers' own among them, in Spark's order)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

import sparkstate as ss

from .conftest import FileFeed
from .helpers import spark_rocksdb

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, ts timestamp"
BATCHES = [
    [{"k": "a", "ts": "2024-01-01T00:00:00Z"}, {"k": "b", "ts": "2024-01-01T00:00:05Z"}],
    [{"k": "a", "ts": "2024-01-01T00:00:20Z"}],
]
SETTLE_S = 2.0
#: 2100-01-01: a timer that never fires in the test.
LATER_MS = 4_102_444_800_000


class Keeper(StatefulProcessor):  # type: ignore[misc]
    """One state variable of each kind, and a timer per key where the time mode has timers."""

    def __init__(self, timers: bool) -> None:
        self.timers = timers

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.seen = handle.getListState("seen", "t timestamp")
        self.named = handle.getMapState("named", "name string", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:  # noqa: N802, N803
        n = sum(len(pdf) for pdf in rows)
        self.count.update((n,))
        self.named.updateValue((key[0],), (n,))
        if self.timers:
            self.handle.registerTimer(LATER_MS)
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:  # noqa: N802, N803
        yield pd.DataFrame({"k": [key[0]], "n": [-1]})

    def close(self) -> None:
        pass


def _query(df: Any, time_mode: str) -> Any:
    return (
        df.withWatermark("ts", "10 seconds")
        .groupBy("k")
        .transformWithStateInPandas(
            Keeper(time_mode != "None"), "k string, n long", "Update", time_mode
        )
    )


def _run(query: Any, feed: FileFeed, checkpoint: Path, time_mode: str) -> None:
    """Both files read, then the batch without data the moved watermark asks for, committed in
    Spark's log of the query (a loaded machine may take seconds); with processing-time timers,
    a while for such batches (Spark's query runs them at every trigger, without end). Stopped by
    hand: in that mode neither ``availableNow`` nor ``processAllAvailable`` would return."""
    q = (
        query.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    wanted = sum(len(rows) for rows in BATCHES)
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            if sum(p["numInputRows"] for p in q.recentProgress) >= wanted:
                break
            time.sleep(0.5)
        if time_mode == "ProcessingTime":
            time.sleep(SETTLE_S)
        else:
            last = checkpoint / "commits" / str(len(BATCHES))
            while time.time() < deadline and not last.exists():
                time.sleep(0.2)
    finally:
        q.stop()


def test_metadata_lists_every_state_variable_as_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    ss.register(spark)
    for time_mode in ("None", "ProcessingTime", "EventTime"):
        feed.reset()
        for rows in BATCHES:
            feed.add(rows)
        spark_chk, ours_chk = tmp_path / f"spark-{time_mode}", tmp_path / f"ours-{time_mode}"
        with spark_rocksdb(spark):
            _run(_query(feed.stream(spark, SCHEMA), time_mode), feed, spark_chk, time_mode)
        _run(_query(ss.stream(feed.stream(spark, SCHEMA)), time_mode), feed, ours_chk, time_mode)
        theirs = spark.read.format("state-metadata").load(str(spark_chk))
        ours = spark.read.format("sparkstate-metadata").load(str(ours_chk))
        assert ours.schema == theirs.schema
        expected = [r.asDict() for r in theirs.collect()]
        found = [r.asDict() for r in ours.collect()]
        if time_mode == "ProcessingTime":  # Spark runs a batch at every trigger, we when due
            for row in expected + found:
                row.pop("maxBatchId")
        assert found == expected, time_mode
        names = [
            v["stateName"] for v in json.loads(expected[0]["operatorProperties"])["stateVariables"]
        ]
        timers = {
            "None": [],
            "ProcessingTime": ["$procTimers_keyToTimestamp"],
            "EventTime": ["$eventTimers_keyToTimestamp"],
        }
        assert sorted(names) == sorted(["count", "seen", "named", *timers[time_mode]]), time_mode
