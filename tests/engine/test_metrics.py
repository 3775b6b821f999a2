"""A query's progress: ``memoryUsedBytes`` grows with the state, ``customMetrics`` carries
Spark's names for what the stores did, and ``numRowsTotal`` counts the rows Spark's own operator
counts on the same input, whatever else sparkstate keeps beside them (an index of sessions or of
expiries, a processor's timers and TTL indexes), also in a rescale's batch: transformWithState's
are its value and list states' keys and its map states' entries, as Spark's RocksDB store counts
the keys of the variables' column families and none of its internal ones."""

from __future__ import annotations

import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.runtime.logs import CheckpointLog
from sparkstate.store.spark_metrics import HDFS_METRICS, ROCKSDB_METRICS

from .conftest import PARTITIONS, PROVIDERS, FileFeed
from .helpers import (
    Collector,
    Differential,
    SparkRuns,
    at,
    run_batches,
    source,
    spark_rocksdb,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Keys 0..n-1 per batch: each batch touches the keys of the one before and four times as many.
SIZES = [3_000, 12_000, 48_000]
#: The rocksdb provider takes a snapshot at version 4: its commit (batch 3) flushes.
SNAPSHOT_AT = len(SIZES) + 1


def _count_query(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str, **store: str
) -> Any:
    """A count by key over ``feed`` on ``provider`` with the ``stateStore.*`` options ``store``,
    started."""
    writer = (
        ss.stream(source(spark, feed, "k string"))
        .groupBy("k")
        .agg(SF.count("*").alias("n"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("stateStore", provider)
    )
    for name, value in store.items():
        writer = writer.option(f"stateStore.{name}", value)
    return writer.start()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_memory_follows_the_state_and_spark_names_describe_the_batch(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    q = _count_query(
        spark,
        feed,
        tmp_path,
        provider,
        min_deltas_for_snapshot=str(SNAPSHOT_AT),
        value_copy_mb="0",  # rocksdb: its lookups read RocksDB
    )
    ops: list[dict[str, Any]] = []
    batches = [[{"k": f"k{i:06d}"} for i in range(n)] for n in [*SIZES, SIZES[-1]]]
    run_batches(
        feed, q, batches, on_batch=lambda _: ops.append(q.lastProgress["stateOperators"][0])
    )
    growing = ops[: len(SIZES)]
    assert [op["numRowsTotal"] for op in growing] == SIZES
    # Each batch adds keys: memory grows by 20 bytes a key or more. (Not by a ratio: the
    # partitions' share of a Python worker's RocksDB cache includes what other queries' stores
    # left there.)
    memory = [op["memoryUsedBytes"] for op in growing]
    steps = zip(pairwise(memory), pairwise(SIZES), strict=True)
    assert all(m1 - m0 >= 20 * (n1 - n0) for (m0, m1), (n0, n1) in steps), memory
    for op, stored in zip(ops, [0, *SIZES], strict=False):
        custom = op["customMetrics"]
        shown = [f"SnapshotLastUploaded.partition_{p}_default" for p in range(PARTITIONS)]
        assert all(custom[name] == -1 for name in shown)  # no snapshot uploaded yet
        if provider == "memory":
            assert set(HDFS_METRICS) <= set(custom)
            assert custom["stateOnCurrentVersionSizeBytes"] <= op["memoryUsedBytes"]
            continue
        assert set(ROCKSDB_METRICS) <= set(custom)
        assert all(custom[name] >= 0 for name in ROCKSDB_METRICS)
        assert custom["rocksdbPutCount"] == op["numRowsUpdated"]  # the keys the commit wrote
        # The stored keys a batch reads are looked up, no more (none above a partition's
        # largest stored key).
        assert custom["rocksdbGetCount"] == stored
        assert isinstance(custom["rocksdbGetLatency"], int)  # whole milliseconds, as Spark's
    if provider == "rocksdb":
        # (A partition that moves to another Python worker is flushed as well, when its
        # database is closed in the worker it leaves.)
        flushed = ops[-1]["customMetrics"]
        assert flushed["rocksdbSstFileSize"] > 0 and flushed["rocksdbTotalBytesWrittenByFlush"] > 0


def test_a_small_rocksdb_state_is_read_from_its_copy_in_memory(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """By default a rocksdb query whose state fits its homes' copies reads RocksDB for no
    lookup, and counts and writes its rows as with the copy off (the test above)."""
    q = _count_query(spark, feed, tmp_path, "rocksdb")
    ops: list[dict[str, Any]] = []
    batches = [[{"k": f"k{i:06d}"} for i in range(n)] for n in SIZES[:2]]
    run_batches(
        feed, q, batches, on_batch=lambda _: ops.append(q.lastProgress["stateOperators"][0])
    )
    assert [op["numRowsTotal"] for op in ops] == SIZES[:2]
    for op in ops:
        custom = op["customMetrics"]
        assert custom["rocksdbGetCount"] == 0
        assert custom["rocksdbPutCount"] == op["numRowsUpdated"] > 0


# --- numRowsTotal against Spark's operators -----------------------------------------------------

ROWS_SCHEMA = "k string, ts timestamp, v long"


def _row(k: str, t: int, v: int) -> dict[str, Any]:
    return {"k": k, "ts": at(t), "v": v}


#: Keys with several sessions and expiries each; the last files move the watermark past some.
FILES = [
    [_row("a", 1, 1), _row("a", 3, 2), _row("b", 2, 3), _row("a", 20, 4), _row("c", 5, 5)],
    [_row("b", 4, 6), _row("a", 22, 7), _row("d", 25, 8), _row("c", 30, 9), _row("b", 31, 1)],
    [_row("a", 40, 2), _row("b", 42, 3), _row("e", 44, 4), _row("a", 50, 5)],
    [_row("c", 70, 6), _row("b", 71, 7), _row("f", 72, 8)],
]


class Timers(StatefulProcessor):  # type: ignore[misc]
    """Per key: a value, a list and a map, and an event-time timer 20 s after its latest row
    (the watermark fires some of them)."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.total = handle.getValueState("total", "v long")
        self.seen = handle.getListState("seen", "v long")
        self.by_value = handle.getMapState("by_value", "v long", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        frames = list(rows)
        vs = [int(v) for pdf in frames for v in pdf["v"]]
        latest = max(pd.Timestamp(t) for pdf in frames for t in pdf["ts"])
        current = self.total.get()
        total = (int(current[0]) if current is not None else 0) + sum(vs)
        self.total.update((total,))
        for v in vs:
            self.seen.appendValue((v,))
            self.by_value.updateValue((v,), (1,))
        self.handle.registerTimer(int(latest.timestamp() * 1000) + 20_000)
        yield pd.DataFrame({"k": [key[0]], "total": [total]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:  # noqa: N802,N803
        self.total.clear()
        yield pd.DataFrame({"k": [key[0]], "total": [-1]})

    def close(self) -> None:
        pass


#: An hour: nothing the test keeps under it expires while it runs.
HOUR_MS = 3_600_000


class Expiring(StatefulProcessor):  # type: ignore[misc]
    """Per key, under a TTL: a value, a list and a map whose user keys repeat, the list cleared
    and an entry removed once the total passes 15; and a processing-time timer an hour on."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.total = handle.getValueState("total", "v long", HOUR_MS)
        self.seen = handle.getListState("seen", "v long", HOUR_MS)
        self.by_rest = handle.getMapState("by_rest", "r long", "v long", HOUR_MS)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        vs = [int(v) for pdf in rows for v in pdf["v"]]
        current = self.total.get()
        total = (int(current[0]) if current is not None else 0) + sum(vs)
        self.total.update((total,))
        if total > 15:
            self.seen.clear()
            self.by_rest.removeKey((total % 3,))
        else:
            self.seen.appendList([(v,) for v in vs])
        for v in vs:
            self.by_rest.updateValue((v % 3,), (v,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + HOUR_MS)
        yield pd.DataFrame({"k": [key[0]], "total": [total]})

    def close(self) -> None:
        pass


def _count_case(name: str, mode: str, query: Any) -> Differential:
    def build(df: DataFrame, ours: bool) -> Any:
        df = df.withWatermark("ts", "10 seconds")
        return query(ss.stream(df) if ours else df, SF if ours else F)

    return Differential(name, ROWS_SCHEMA, FILES, mode, build)


COUNT_CASES = [
    _count_case(
        "session-window",
        "append",
        lambda s, f: s.groupBy(f.session_window("ts", "5 seconds"), "k").agg(
            f.count("*").alias("n"), f.sum("v").alias("v")
        ),
    ),
    _count_case(
        "dedup-within-watermark", "append", lambda s, f: s.dropDuplicatesWithinWatermark(["k"])
    ),
    _count_case(
        "transform-with-state",
        "update",
        lambda s, f: s.groupBy("k").transformWithStateInPandas(
            Timers(), "k string, total long", "Update", "EventTime"
        ),
    ),
]


@pytest.fixture(scope="module")
def count_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in COUNT_CASES])
def test_rows_total_is_sparks(
    spark: SparkSession, count_runs: SparkRuns, tmp_path: Path, case: Differential, provider: str
) -> None:
    with spark_rocksdb(spark, wanted=case.name.startswith("transform-with-state")):
        theirs = [[op["numRowsTotal"] for op in ops] for ops in count_runs.run(case)[1]]
    _, operators = count_runs.check_all(case, tmp_path, provider)
    totals = [[op["numRowsTotal"] for op in ops] for ops in operators]
    assert totals == theirs
    assert max(max(t) for t in theirs) > 0


def _expiring(df: DataFrame, checkpoint: Path, collector: Collector, provider: str | None) -> Any:
    """``Expiring`` over ``df``: Spark's query (``provider`` None) or sparkstate's, started."""
    stream = df if provider is None else ss.stream(df)
    planned = stream.groupBy("k").transformWithStateInPandas(
        Expiring(), "k string, total long", "Update", "ProcessingTime"
    )
    writer = (
        planned.writeStream.outputMode("update")
        .foreachBatch(collector)
        .trigger(processingTime="500 milliseconds")
        .option("checkpointLocation", str(checkpoint))
    )
    return writer.start() if provider is None else writer.option("stateStore", provider).start()


def _rows_total_once_delivered(query: Any, collector: Collector, seen: set[int], keys: int) -> int:
    """``numRowsTotal`` after the batch that delivered the rows of ``keys`` keys beyond the
    batches ``seen`` (or a later one: no state changes in a batch without data, nothing
    expires). Not ``processAllAvailable``: in ProcessingTime mode Spark runs a batch on every
    trigger, and the call may never see the query idle."""
    deadline = time.time() + 180
    while time.time() < deadline:
        assert query.exception() is None, query.exception()
        new = sorted(set(collector.batches) - seen)
        last = query.lastProgress
        delivered = sum(len(collector.batches[b]) for b in new)
        if delivered >= keys and last is not None and last["batchId"] >= new[-1]:
            return int(last["stateOperators"][0]["numRowsTotal"])
        time.sleep(0.2)
    msg = f"no progress after batch {sorted(collector.batches)}"
    raise AssertionError(msg)


def test_rows_total_with_ttl_and_processing_time_timers_is_sparks(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A value, a list and a map under a TTL, and processing-time timers: Spark counts the
    variables' rows, none of its TTL indexes' or timers' entries, on either store of ours and
    across a restart (ours stops after the second file and starts again)."""
    totals: dict[str, list[int]] = {}
    for provider in (None, *PROVIDERS):
        name = provider or "spark"
        feed, collector = FileFeed(tmp_path / f"{name}-input"), Collector()
        checkpoint = tmp_path / f"{name}-checkpoint"
        totals[name] = []
        query = None
        try:
            with spark_rocksdb(spark):
                for i, rows in enumerate(FILES):
                    if query is None or (provider is not None and i == 2):
                        if query is not None:
                            query.stop()
                        df = source(spark, feed, ROWS_SCHEMA)
                        query = _expiring(df, checkpoint, collector, provider)
                    seen = set(collector.batches)
                    feed.add(rows)
                    keys = len({r["k"] for r in rows})
                    total = _rows_total_once_delivered(query, collector, seen, keys)
                    totals[name].append(total)
        finally:
            if query is not None:
                query.stop()
    theirs = totals.pop("spark")
    assert all(t > 0 for t in theirs), theirs
    assert totals == dict.fromkeys(PROVIDERS, theirs)


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.name) for c in COUNT_CASES if c.name != "dedup-within-watermark"]
)
def test_a_rescale_records_the_operators_rows(
    spark: SparkSession, tmp_path: Path, case: Differential
) -> None:
    """A rescale's batch records each operator's rows as its query counted them, not its
    store's keys (a session window's index and lists of starts are no rows, nor are a
    processor's timers; a map's entries are)."""
    _, operators = case.run(spark, tmp_path, "memory")
    checkpoint = str(tmp_path / "checkpoint")
    ss.repartition(spark, checkpoint, PARTITIONS + 1)
    commit = CheckpointLog.of_checkpoint(checkpoint).latest_commit()
    assert commit is not None
    assert commit.operators[0].num_rows_total == operators[-1][0]["numRowsTotal"] > 0
