"""A query that ran with Spark's own stateful operators, wrapped with ``ss.stream`` and started on
its checkpoint: sparkstate takes Spark's state over and the query goes on, with the output of
Spark's own restart on the same checkpoint, batch for batch."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

import sparkstate as ss
from sparkstate.console import plain
from sparkstate.engine.jobs.take_over import SparkFiles
from sparkstate.engine.run.batch_job import session_conf
from sparkstate.exceptions import SchemaMismatchError
from sparkstate.observe import inspect_text
from sparkstate.observe.inspect import inspect_checkpoint
from sparkstate.observe.progress_log import read_progress_log
from sparkstate.observe.report import render
from sparkstate.operators.aggregation.aggregate import StreamingAggregate
from sparkstate.runtime import take_over as take_over_logs

from .conftest import PROVIDERS, FileFeed
from .helpers import JOIN_BATCHES, LEFT, RIGHT, Collector, at

#: The user's functions of this module go to Spark's workers by value (it is not importable
#: there under the name pytest gives it).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
FORMAT_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
#: Spark's state store settings, by the name of a case.
SPARK_STORES: dict[str, dict[str, str]] = {
    "hdfs": {PROVIDER_CONF: HDFS},
    "rocksdb": {PROVIDER_CONF: ROCKSDB, CHANGELOG_CONF: "false"},
    "rocksdb-changelog-v2": {PROVIDER_CONF: ROCKSDB, CHANGELOG_CONF: "true", FORMAT_CONF: "2"},
    "rocksdb-v2": {PROVIDER_CONF: ROCKSDB, CHANGELOG_CONF: "false", FORMAT_CONF: "2"},
}

SCHEMA = "k string, v long, ts timestamp"
#: Spark runs the first two batches; then both restarts run the rest, one file a batch.
BATCHES: list[list[dict[str, Any]]] = [
    [
        {"k": "a", "v": 1, "ts": at(1)},
        {"k": "b", "v": 2, "ts": at(5)},
        {"k": "a", "v": 1, "ts": at(2)},
    ],
    [{"k": "a", "v": 3, "ts": at(7)}, {"k": "b", "v": 3, "ts": at(21)}, {"k": None, "v": 4}],
    [
        {"k": "a", "v": 5, "ts": at(22)},
        {"k": "b", "v": 3, "ts": at(21)},
        {"k": "a", "v": 9, "ts": at(40)},
    ],
    [{"k": "a", "v": 5, "ts": at(41)}, {"k": "b", "v": 4, "ts": at(19)}, {"k": "c", "v": None}],
    [{"k": "c", "v": 7, "ts": at(70)}],
]
SPARK_RUNS = 2


def windowed(df: Any) -> Any:
    return (
        df.withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "5 seconds"), "k")
        .agg(
            F.count("*").alias("n"),
            F.sum("v"),
            F.avg("v"),
            F.max("v"),
            F.min("k").alias("first_k"),
        )
    )


def sessions(df: Any) -> Any:
    return (
        df.withWatermark("ts", "10 seconds")
        .groupBy(F.session_window("ts", "5 seconds"), "k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"), F.avg("v"))
    )


def sessions_complete(df: Any) -> Any:
    return df.groupBy(F.session_window("ts", "5 seconds"), "k").agg(F.count("*").alias("n"))


def count_until_quiet(key: Any, pdfs: Any, state: Any) -> Any:
    """A count per key, emitted when the watermark passes its last row's time (or the
    watermark) plus 5 s."""
    import pandas as pd

    if state.hasTimedOut:
        (n,) = state.get
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "n": [n], "timed_out": [True]})
        return
    n = state.get[0] if state.exists else 0
    latest = 0
    for pdf in pdfs:
        n += len(pdf)
        latest = max(latest, int(pdf["ts"].max().timestamp() * 1000))
    state.update((n,))
    state.setTimeoutTimestamp(max(latest, state.getCurrentWatermarkMs()) + 5000)
    yield pd.DataFrame({"k": [key[0]], "n": [n], "timed_out": [False]})


def arbitrary(df: Any) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    return (
        df.withWatermark("ts", "10 seconds")
        .dropna(subset=["ts"])
        .groupBy("k")
        .applyInPandasWithState(
            count_until_quiet,
            "k string, n long, timed_out boolean",
            "n long",
            "update",
            GroupStateTimeout.EventTimeTimeout,
        )
    )


def dedup_then_count(df: Any) -> Any:
    """Two stateful operators: a deduplication, then a windowed count of its rows."""
    deduplicated = df.withWatermark("ts", "10 seconds").dropDuplicates(["k", "ts"])
    return deduplicated.groupBy(F.window("ts", "10 seconds"), "k").agg(F.count("*").alias("n"))


def by_key(df: Any) -> Any:
    return df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))


def global_count(df: Any) -> Any:
    return df.groupBy().agg(F.count("*").alias("n"), F.first("k").alias("first_k"))


def limited(df: Any) -> Any:
    return df.limit(7)


def dedup(df: Any) -> Any:
    return df.withWatermark("ts", "10 seconds").dropDuplicates(["k", "ts"])


def dedup_within(df: Any) -> Any:
    return df.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["k"])


class Switch:
    """One query, run by Spark for the first batches, then restarted twice on copies of that
    checkpoint: by Spark (the expected output), and wrapped with ``ss.stream`` (ours). Each
    restart runs the rest of the batches, stops, and starts once more."""

    def __init__(self, spark: SparkSession, tmp_path: Path, query: Callable[[Any], Any]) -> None:
        self.spark = spark
        self.tmp_path = tmp_path
        self.feed = FileFeed(tmp_path / "input")
        self.query = query
        self.spark_chk = tmp_path / "spark"
        self.ours_chk = tmp_path / "ours"

    def df(self) -> DataFrame:
        return self.feed.stream(self.spark, SCHEMA)

    def start_spark(self, mode: str, collector: Collector, chk: Path) -> Any:
        writer = self.query(self.df()).writeStream.outputMode(mode).foreachBatch(collector)
        return writer.option("checkpointLocation", str(chk)).start()

    def start_ours(self, mode: str, collector: Collector, provider: str, **options: str) -> Any:
        writer = self.query(ss.stream(self.df())).writeStream.outputMode(mode)
        writer = writer.foreachBatch(collector).option("stateStore", provider)
        return writer.options(**options).option("checkpointLocation", str(self.ours_chk)).start()

    def run_spark_first(self, mode: str, store: dict[str, str]) -> Collector:
        with session_conf(self.spark, store):
            collector = Collector()
            query = self.start_spark(mode, collector, self.spark_chk)
            for rows in BATCHES[:SPARK_RUNS]:
                self.feed.add(rows)
                query.processAllAvailable()
            query.stop()
        shutil.copytree(self.spark_chk, self.ours_chk)
        for rows in BATCHES[SPARK_RUNS:]:
            self.feed.add(rows)
        return collector

    def expected(self, mode: str) -> Collector:
        collector = Collector()
        for _ in range(2):
            query = self.start_spark(mode, collector, self.spark_chk)
            query.processAllAvailable()
            query.stop()
        return collector

    def ours(self, mode: str, provider: str, **options: str) -> Collector:
        collector = Collector()
        for _ in range(2):
            query = self.start_ours(mode, collector, provider, **options)
            query.processAllAvailable()
            query.stop()
        return collector


CASES = [
    pytest.param(windowed, "update", "hdfs", PROVIDERS[0], id="window-update-hdfs"),
    pytest.param(windowed, "append", "rocksdb", PROVIDERS[-1], id="window-append-rocksdb"),
    pytest.param(
        by_key, "update", "rocksdb-changelog-v2", PROVIDERS[0], id="keys-update-rocksdb-v2"
    ),
    pytest.param(sessions, "append", "hdfs", PROVIDERS[0], id="sessions-append-hdfs"),
    pytest.param(
        sessions_complete, "complete", "rocksdb", PROVIDERS[-1], id="sessions-complete-rocksdb"
    ),
    pytest.param(global_count, "complete", "hdfs", PROVIDERS[-1], id="global-complete-hdfs"),
    pytest.param(dedup, "append", "hdfs", PROVIDERS[-1], id="dedup-hdfs"),
    pytest.param(dedup, "append", "rocksdb-v2", PROVIDERS[0], id="dedup-rocksdb-v2"),
    pytest.param(dedup_then_count, "append", "rocksdb", PROVIDERS[0], id="two-operators"),
    pytest.param(limited, "append", "rocksdb", PROVIDERS[-1], id="limit-rocksdb"),
    pytest.param(arbitrary, "update", "hdfs", PROVIDERS[-1], id="applyInPandasWithState-hdfs"),
    pytest.param(dedup_within, "append", "rocksdb", PROVIDERS[0], id="dedup-within-rocksdb"),
]


#: The cases whose operators' state is read from the files of Spark's RocksDB provider (how
#: many of them), not by its state reader: its plain stores with a snapshot of the version.
READ_FROM_FILES = {
    "window-append-rocksdb": 1,
    "two-operators": 2,
    "dedup-within-rocksdb": 1,
    "dedup-rocksdb-v2": 1,
}


def took_over(caplog: pytest.LogCaptureFixture) -> str:
    (line,) = (r.getMessage() for r in caplog.records if "took over the state" in r.getMessage())
    return line


@pytest.mark.parametrize(("query", "mode", "spark_store", "provider"), CASES)
def test_the_query_goes_on_from_sparks_checkpoint(
    spark: SparkSession,
    tmp_path: Path,
    query: Callable[[Any], Any],
    mode: str,
    spark_store: str,
    provider: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    switch = Switch(spark, tmp_path, query)
    first = switch.run_spark_first(mode, SPARK_STORES[spark_store])
    expected = switch.expected(mode)
    with caplog.at_level(logging.WARNING, logger="sparkstate.engine"):
        ours = switch.ours(mode, provider)
    assert ours.batches == expected.batches
    files = READ_FROM_FILES.get(request.node.callspec.id, 0)
    assert f"{files} read from Spark's files" in took_over(caplog)
    assert min(ours.batches) == max(first.batches) + 1  # the batch ids go on from Spark's
    doc = inspect_checkpoint(str(switch.ours_chk))
    (event,) = doc["history"]
    assert event["event"] == "taken_over_from_spark"
    assert event["batch"] == max(first.batches)
    shown = f"taken over from Spark's own operators ({event['spark_provider']}) after its batch"
    assert shown in plain(inspect_text.summary(doc))
    assert escape(shown) in render(read_progress_log(str(switch.ours_chk)), str(switch.ours_chk))


def test_another_query_is_refused_and_the_checkpoint_left_as_it_was(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A query whose grouping key is not the one Spark's state holds is refused with Spark's
    condition, writes nothing of its state, and Spark's own query goes on from the checkpoint."""
    switch = Switch(spark, tmp_path, by_key)
    switch.run_spark_first("update", SPARK_STORES["hdfs"])
    before = sorted(p.relative_to(switch.ours_chk) for p in switch.ours_chk.rglob("*"))

    def other(df: Any) -> Any:
        return df.groupBy("v").agg(F.count("*").alias("n"), F.sum("v").alias("total"))

    switch.query = other
    with pytest.raises(SchemaMismatchError) as refused:
        switch.start_ours("update", Collector(), PROVIDERS[0])
    assert refused.value.condition == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
    after = sorted(p.relative_to(switch.ours_chk) for p in switch.ours_chk.rglob("*"))
    assert after == before


@pytest.mark.parametrize(
    "fails_in",
    [
        pytest.param("write_metadata", id="before-the-commit-point"),
        pytest.param("_set_aside_operator_metadata", id="after-the-commit-point"),
    ],
)
def test_a_take_over_that_fails_leaves_sparks_checkpoint_or_completes(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_in: str
) -> None:
    """A take-over that dies before its commit point leaves a checkpoint Spark's own query goes
    on from; after it, the next start finishes it. Either way the next start of the wrapped
    query gives Spark's output."""
    switch = Switch(spark, tmp_path, windowed)
    switch.run_spark_first("update", SPARK_STORES["hdfs"])
    expected = switch.expected("update")

    def dies(*args: Any, **kwargs: Any) -> None:
        msg = "killed"
        raise OSError(msg)

    if fails_in == "write_metadata":
        monkeypatch.setattr(take_over_logs.CheckpointLog, "write_metadata", dies)
    else:
        monkeypatch.setattr(take_over_logs, "_set_aside_operator_metadata", dies)
    with pytest.raises(OSError, match="killed"):
        switch.start_ours("update", Collector(), PROVIDERS[0])
    monkeypatch.undo()
    if fails_in == "write_metadata":  # Spark's own query still runs on it, as if nothing happened
        backup = tmp_path / "backup"
        shutil.copytree(switch.ours_chk, backup)
        spark_again = Collector()
        for _ in range(2):
            query = switch.start_spark("update", spark_again, switch.ours_chk)
            query.processAllAvailable()
            query.stop()
        assert spark_again.batches == expected.batches
        shutil.rmtree(switch.ours_chk)
        shutil.copytree(backup, switch.ours_chk)
    ours = switch.ours("update", PROVIDERS[0])
    assert ours.batches == expected.batches


class Remembers:
    """A ``StatefulProcessor`` with state of every kind: a count per key (value state), the
    values seen (list state), a count per value (map state), and an event-time timer 5 s after
    each key's latest row, at which it says what it holds."""

    def init(self, handle: Any) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        def one(name: str) -> StructType:
            return StructType([StructField(name, LongType())])

        self.handle = handle
        self.count = handle.getValueState("count", one("n"))
        self.seen = handle.getListState("seen", one("v"))
        self.per_value = handle.getMapState("perValue", one("v"), one("n"))

    def _said(self, key: str, why: str) -> Any:
        import pandas as pd

        seen = sorted(v for (v,) in self.seen.get() if v is not None)
        entries = sorted((k[0], n[0]) for k, n in self.per_value.iterator() if k[0] is not None)
        return pd.DataFrame(
            {
                "k": [key],
                "n": [self.count.get()[0] if self.count.exists() else 0],
                "seen": [",".join(map(str, seen))],
                "per_value": [",".join(f"{v}:{n}" for v, n in entries)],
                "why": [why],
            }
        )

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802, N803
        n = self.count.get()[0] if self.count.exists() else 0
        latest = 0
        for pdf in rows:
            n += len(pdf)
            latest = max(latest, int(pdf["ts"].max().timestamp() * 1000))
            for v in pdf["v"].dropna().astype("int64"):
                self.seen.appendValue((int(v),))
                count = (
                    self.per_value.getValue((int(v),))[0]
                    if self.per_value.containsKey((int(v),))
                    else 0
                )
                self.per_value.updateValue((int(v),), (count + 1,))
        self.count.update((n,))
        for old in self.handle.listTimers():
            self.handle.deleteTimer(old)
        self.handle.registerTimer(latest + 5000)
        yield self._said(key[0], "rows")

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:  # noqa: N802, N803
        yield self._said(key[0], "timer")
        self.count.clear()

    def close(self) -> None:
        pass


def remembered(df: Any) -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    processor = type("RemembersProcessor", (Remembers, StatefulProcessor), {})()
    return (
        df.withWatermark("ts", "10 seconds")
        .dropna(subset=["k", "ts"])
        .groupBy("k")
        .transformWithStateInPandas(
            processor,
            "k string, n long, seen string, per_value string, why string",
            "update",
            "EventTime",
        )
    )


@pytest.mark.parametrize(
    ("spark_store", "provider"),
    [
        pytest.param("rocksdb", PROVIDERS[0], id="rocksdb"),
        pytest.param("rocksdb-changelog-v2", PROVIDERS[-1], id="rocksdb-changelog-v2"),
    ],
)
def test_a_stateful_processor_goes_on_from_sparks_checkpoint(
    spark: SparkSession, tmp_path: Path, spark_store: str, provider: str
) -> None:
    """``transformWithStateInPandas`` with value, list and map state and event-time timers:
    each state variable and the registered timers taken over from Spark's state (which Spark
    keeps in RocksDB only), so the later rows add to the values, lists and maps, and the timers
    fire at Spark's batches."""
    switch = Switch(spark, tmp_path, remembered)
    first = switch.run_spark_first("update", SPARK_STORES[spark_store])
    expected = switch.expected("update")
    ours = switch.ours("update", provider)
    assert ours.batches == expected.batches
    assert min(ours.batches) == max(first.batches) + 1
    assert any("timer" in str(rows) for rows in ours.batches.values())


class Expiring:
    """A ``StatefulProcessor`` whose count lives 4 s (it starts again after a pause) and whose
    list and map of the counts of each batch live an hour."""

    def init(self, handle: Any) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        n = StructType([StructField("n", LongType())])
        self.count = handle.getValueState("count", n, 4000)
        self.seen = handle.getListState("seen", n, 3_600_000)
        self.by_size = handle.getMapState("by_size", n, n, 3_600_000)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802, N803
        import pandas as pd

        n = sum(len(p) for p in rows)
        total = (self.count.get()[0] if self.count.exists() else 0) + n
        self.count.update((total,))
        self.seen.appendValue((n,))
        seen = len(list(self.seen.get()))
        self.by_size.updateValue((seen,), (n,))
        sizes = sorted(k[0] for k in self.by_size.keys())  # noqa: SIM118 - a MapState
        yield pd.DataFrame({"k": [key[0]], "n": [total], "seen": [seen], "sizes": [str(sizes)]})

    def close(self) -> None:
        pass


def expiring(df: Any) -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    processor = type("ExpiringProcessor", (Expiring, StatefulProcessor), {})()
    return (
        df.dropna(subset=["k"])
        .groupBy("k")
        .transformWithStateInPandas(
            processor, "k string, n long, seen long, sizes string", "update", "ProcessingTime"
        )
    )


def _until_output(start: Callable[[Collector], Any], chk: Path) -> Collector:
    """A query whose processing-time TTL runs a batch on every trigger, stopped once a batch
    gave rows and committed."""
    collector = Collector()
    query = start(collector)
    deadline = time.monotonic() + 120

    def committed() -> bool:
        gave = [b for b, rows in collector.batches.items() if rows]
        return bool(gave) and (chk / "commits" / str(max(gave))).exists()

    while not committed() and query.isActive and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()
    return collector


def test_state_with_a_ttl_goes_on_with_the_expirations_spark_gave_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A processor's value, list and map state with a TTL: each value, element and entry keeps
    the expiration Spark gave it (Spark's reader shows it beside the value). After a pause
    longer than the count's TTL, the count starts again in both restarts, and the list and
    map, whose TTL is an hour, go on."""
    switch = Switch(spark, tmp_path, expiring)
    switch.feed.add(BATCHES[0])
    with session_conf(spark, SPARK_STORES["rocksdb"]):
        _until_output(lambda c: switch.start_spark("update", c, switch.spark_chk), switch.spark_chk)
    shutil.copytree(switch.spark_chk, switch.ours_chk)
    time.sleep(4.5)  # the count of every key has expired
    switch.feed.add(BATCHES[1])
    expected = _until_output(
        lambda c: switch.start_spark("update", c, switch.spark_chk), switch.spark_chk
    )
    ours = _until_output(lambda c: switch.start_ours("update", c, PROVIDERS[0]), switch.ours_chk)
    rows = sorted(r for batch in expected.batches.values() for r in batch)
    assert sorted(r for batch in ours.batches.values() for r in batch) == rows
    assert ("a", 1, 2, "[1, 2]") in rows  # the count expired, the list and map went on


def joined(left: DataFrame, right: DataFrame, how: str) -> DataFrame:
    condition = F.expr("lk = rk AND lt BETWEEN rt - interval 5 seconds AND rt + interval 5 seconds")
    return left.withWatermark("lt", "10 seconds").join(
        right.withWatermark("rt", "10 seconds"), condition, how
    )


@pytest.mark.parametrize(
    ("how", "spark_store", "provider"),
    [
        pytest.param("inner", "hdfs", PROVIDERS[-1], id="inner-hdfs"),
        pytest.param("leftOuter", "rocksdb", PROVIDERS[0], id="leftOuter-rocksdb"),
        pytest.param("fullOuter", "rocksdb-changelog-v2", PROVIDERS[-1], id="fullOuter-rocksdb-v2"),
    ],
)
def test_a_stream_stream_join_goes_on_from_sparks_checkpoint(
    spark: SparkSession, tmp_path: Path, how: str, spark_store: str, provider: str
) -> None:
    """Both sides' rows, with their matched flags, taken over from Spark's four stores: the
    rows that arrive later match them, and an outer join emits those that never matched when
    the watermark passes them, as Spark's own restart does."""
    feeds = {side: FileFeed(tmp_path / side) for side in ("left", "right")}
    spark_chk, ours_chk = tmp_path / "spark", tmp_path / "ours"

    def run(collector: Collector, chk: Path, *, wrapped: bool) -> None:
        left, right = feeds["left"].stream(spark, LEFT), feeds["right"].stream(spark, RIGHT)
        writer = joined(ss.stream(left) if wrapped else left, right, how).writeStream
        writer = writer.outputMode("append").foreachBatch(collector)
        if wrapped:
            writer = writer.option("stateStore", provider)
        query = writer.option("checkpointLocation", str(chk)).start()
        query.processAllAvailable()
        query.stop()

    first = Collector()
    with session_conf(spark, SPARK_STORES[spark_store]):
        for left_rows, right_rows in JOIN_BATCHES[:2]:
            feeds["left"].add(left_rows)
            feeds["right"].add(right_rows)
            run(first, spark_chk, wrapped=False)
    shutil.copytree(spark_chk, ours_chk)
    for left_rows, right_rows in JOIN_BATCHES[2:]:
        feeds["left"].add(left_rows)
        feeds["right"].add(right_rows)
    expected, ours = Collector(), Collector()
    for _ in range(2):
        run(expected, spark_chk, wrapped=False)
        run(ours, ours_chk, wrapped=True)
    assert ours.batches == expected.batches
    assert min(ours.batches) == max(first.batches) + 1
    left_rows = spark.read.format("sparkstate").option("joinSide", "left").load(str(ours_chk))
    assert left_rows.count() > 0  # the rows the later batches still hold, as ours


def test_a_join_of_other_columns_is_refused_and_the_checkpoint_left_as_it_was(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A join whose side keeps other columns than Spark's state of it is refused with Spark's
    condition, and nothing is written into Spark's checkpoint."""
    chk = tmp_path / "chk"
    feeds = {side: FileFeed(tmp_path / side) for side in ("left", "right")}
    feeds["left"].add(JOIN_BATCHES[0][0])
    feeds["right"].add(JOIN_BATCHES[0][1])
    left, right = feeds["left"].stream(spark, LEFT), feeds["right"].stream(spark, RIGHT)
    query = joined(left, right, "inner").writeStream.foreachBatch(Collector())
    query = query.option("checkpointLocation", str(chk)).start()
    query.processAllAvailable()
    query.stop()
    before = sorted(p.relative_to(chk) for p in chk.rglob("*"))
    other = ss.stream(feeds["left"].stream(spark, LEFT)).withColumnRenamed("lv", "lv2")
    writer = joined(other, right, "inner").writeStream.foreachBatch(Collector())
    with pytest.raises(SchemaMismatchError, match="lv2") as refused:
        writer.option("checkpointLocation", str(chk)).start()
    assert refused.value.condition == "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"
    assert sorted(p.relative_to(chk) for p in chk.rglob("*")) == before


#: The wrapped query of the drivers killed during a take-over: ``windowed``, started on ``chk``
#: over ``feed`` with the ``options`` their script sets.
KILLED_QUERY = textwrap.dedent(
    """
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    df = spark.readStream.schema("k string, v long, ts timestamp").option(
        "maxFilesPerTrigger", 1
    ).json(feed)
    (
        ss.stream(df)
        .withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "5 seconds"), "k")
        .agg(
            F.count("*").alias("n"),
            F.sum("v"),
            F.avg("v"),
            F.max("v"),
            F.min("k").alias("first_k"),
        )
        .writeStream.outputMode("update")
        .format("noop")
        .options(**options)
        .option("checkpointLocation", chk)
        .start()
    )
    """
)


#: A driver that starts the wrapped query on Spark's checkpoint and is SIGKILLed in the middle
#: of the take-over: before its commit point (Spark's state read and ours written, nothing
#: committed) or after it (``metadata.json`` written, Spark's logs not finished).
KILLED = (
    textwrap.dedent(
        """
    import os, signal, sys
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    import sparkstate as ss
    from sparkstate.runtime import take_over

    chk, feed, point = sys.argv[1], sys.argv[2], sys.argv[3]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "before-the-commit-point":
        take_over.CheckpointLog.write_commit = die
    else:
        take_over.settle_take_over = die
    options = {}
    """
    )
    + KILLED_QUERY
)


def test_a_killed_take_over_leaves_sparks_checkpoint_or_completes(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The driver SIGKILLed during the take-over: before the commit point, Spark's own query
    goes on from the checkpoint as if nothing had happened; after it, the next start finishes
    the take-over. Either way the wrapped query's next start gives Spark's output."""
    switch = Switch(spark, tmp_path, windowed)
    switch.run_spark_first("update", SPARK_STORES["hdfs"])
    expected = switch.expected("update")
    taken = tmp_path / "taken"
    shutil.move(switch.ours_chk, taken)
    for point in ("before-the-commit-point", "after-the-commit-point"):
        shutil.copytree(taken, switch.ours_chk)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        done = subprocess.run(
            [sys.executable, "-c", KILLED, str(switch.ours_chk), str(switch.feed.path), point],
            env=env,
            capture_output=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
        engine = switch.ours_chk / "sparkstate"
        assert (engine / "metadata.json").exists() == (point == "after-the-commit-point")
        if point == "before-the-commit-point":  # Spark's own query goes on from a copy
            spark_chk = tmp_path / "spark-after-kill"
            shutil.copytree(switch.ours_chk, spark_chk)
            spark_again = Collector()
            for _ in range(2):
                query = switch.start_spark("update", spark_again, spark_chk)
                query.processAllAvailable()
                query.stop()
            assert spark_again.batches == expected.batches
        ours = switch.ours("update", PROVIDERS[0])
        assert ours.batches == expected.batches
        shutil.rmtree(switch.ours_chk)


def test_rows_a_task_finds_in_another_partition_than_the_engines_go_through_the_shuffle(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window's key is hashed by Spark as its struct and by the engine as two columns, so the
    rows of Spark's partitions are not in the engine's: told otherwise, the tasks that write
    each partition in place find the rows of other partitions, and the take-over shuffles."""
    monkeypatch.setattr(StreamingAggregate, "spark_partitioned", lambda self: True)
    switch = Switch(spark, tmp_path, windowed)
    switch.run_spark_first("update", SPARK_STORES["hdfs"])
    expected = switch.expected("update")
    assert switch.ours("update", PROVIDERS[0]).batches == expected.batches


def test_a_start_that_asks_for_another_partition_count_rescales_what_it_took_over(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark ran the query on the session's shuffle partitions; the wrapped query asks for
    three: the state taken over is rescaled to them as it starts, and the output is Spark's."""
    switch = Switch(spark, tmp_path, by_key)
    switch.run_spark_first("update", SPARK_STORES["hdfs"])
    expected = switch.expected("update")
    assert switch.ours("update", PROVIDERS[0], numPartitions="3").batches == expected.batches
    metadata = json.loads((switch.ours_chk / "sparkstate" / "metadata.json").read_text())
    assert metadata["num_partitions"] == 3


def test_a_batch_spark_planned_and_did_not_commit_runs_again_after_the_take_over(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark stopped in the middle of its last batch (its offsets written, its commit not):
    both restarts run that batch again with the input Spark planned for it, on the state of
    the batch before."""
    switch = Switch(spark, tmp_path, by_key)
    switch.run_spark_first("update", SPARK_STORES["hdfs"])
    for chk in (switch.spark_chk, switch.ours_chk):
        last = max(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())
        (chk / "commits" / str(last)).unlink()
        (chk / "commits" / f".{last}.crc").unlink(missing_ok=True)
    expected = switch.expected("update")
    ours = switch.ours("update", PROVIDERS[0])
    assert ours.batches == expected.batches
    assert min(ours.batches) == last  # the batch Spark did not commit, run again


def last_commit(chk: Path) -> int:
    return max(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())


def _positional(state: DataFrame) -> DataFrame:
    """Spark's state rows with the value's fields named by position, as the take-over reads
    them (an aggregation's buffer repeats names)."""
    value = state.schema["value"].dataType
    positional = StructType([StructField(f"_{i}", f.dataType) for i, f in enumerate(value.fields)])
    return state.select("key", F.col("value").cast(positional).alias("value"), "partition_id")


def with_nulls(df: Any) -> Any:
    """Null keys and null values among strings, longs, doubles and timestamps."""
    return df.groupBy("k").agg(F.sum("v"), F.avg("v"), F.max("ts"), F.min("k"))


@pytest.mark.parametrize("query", [windowed, with_nulls], ids=["windows", "nulls"])
def test_sparks_rocksdb_files_read_as_its_state_reader_reads_them(
    spark: SparkSession, tmp_path: Path, query: Callable[[Any], Any]
) -> None:
    """Each partition of Spark's RocksDB state after each batch, read from its snapshot files,
    holds the rows Spark's state data source reads."""
    switch = Switch(spark, tmp_path, query)
    switch.run_spark_first("update", SPARK_STORES["rocksdb"])
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 0)
    operator_dir = str(switch.spark_chk / "state" / "0")
    seen: list[dict[str, Any]] = []
    for batch in range(last_commit(switch.spark_chk) + 1):  # the state after each batch
        reader = spark.read.format("statestore").option("batchId", batch)
        read = _positional(reader.load(str(switch.spark_chk))).toArrow()
        key_type, value_type = (read.schema.field(c).type for c in ("key", "value"))
        files = SparkFiles(operator_dir, batch + 1, (None,) * partitions, key_type, value_type)
        for p in range(partitions):
            ours = files.rows_of(p).to_pylist()
            theirs = read.filter(pc.equal(read.column("partition_id"), p)).to_pylist()
            assert sorted(map(repr, ours)) == sorted(map(repr, theirs))
            seen += ours
    assert len(seen) > 3
    if query is with_nulls:
        assert any(r["key"]["k"] is None for r in seen)
        assert any(None in r["value"].values() for r in seen)  # the latest of no time


def test_sparks_files_that_do_not_read_as_expected_are_read_by_its_state_reader(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A snapshot whose rows are not what its metadata says (here: its key count) is not taken
    from the files: the take-over reads Spark's state with Spark's reader, and says why."""
    switch = Switch(spark, tmp_path, windowed)
    switch.run_spark_first("append", SPARK_STORES["rocksdb"])
    expected = switch.expected("append")
    version = last_commit(switch.ours_chk) + 1
    snapshot = switch.ours_chk / "state" / "0" / "0" / f"{version}.zip"
    with zipfile.ZipFile(snapshot) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    header, body = entries["metadata"].decode().split("\n", 1)
    metadata = json.loads(body)
    metadata["numKeys"] += 1
    entries["metadata"] = f"{header}\n{json.dumps(metadata)}".encode()
    with zipfile.ZipFile(snapshot, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    (snapshot.parent / f".{snapshot.name}.crc").unlink()  # Spark's reader checks the file's own
    with caplog.at_level(logging.INFO, logger="sparkstate.engine"):
        ours = switch.ours("append", PROVIDERS[-1])
    assert ours.batches == expected.batches
    assert "0 read from Spark's files, 1 by its state reader" in took_over(caplog)
    assert "keys where its metadata says" in caplog.text


#: The wrapped query's start in a driver of its own, which says when its take-over begins (a
#: file ``started``; also where there is nothing to take over) and, the take-over done, waits
#: to be killed instead of running batches.
STARTED_THEN_KILLED = (
    textwrap.dedent(
        """
    import os, sys, time
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    import sparkstate as ss
    from sparkstate.engine.api import writer
    from sparkstate.engine.jobs import take_over as take_over_job

    chk, feed, started = sys.argv[1], sys.argv[2], sys.argv[3]
    take_over = take_over_job.take_over

    def announced(*args, **kwargs):
        open(started, "w").close()
        return take_over(*args, **kwargs)

    writer.take_over = announced

    def no_batches(*args, **kwargs):
        open(started, "a").close()  # nothing (more) to take over: started, to be killed
        open(started + ".done", "w").close()
        time.sleep(600)

    writer.DataStreamWriter._start_spark = no_batches
    options = {"stateStore": "rocksdb"}
    """
    )
    + KILLED_QUERY
)


def _sparks_files(chk: Path) -> dict[str, bytes]:
    """Spark's own files in the checkpoint (its logs and state), less its operator metadata,
    which the take-over sets aside at its commit point."""
    return {
        str(p.relative_to(chk)): p.read_bytes()
        for p in chk.rglob("*")
        if p.is_file() and "sparkstate" not in p.parts and "_metadata" not in p.parts
    }


def test_kills_at_moments_spread_over_the_take_over_lose_and_repeat_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The driver SIGKILLed again and again on one checkpoint, each time a little later after
    its take-over began (before its Spark job, in it, about its commit point, after it): every
    kill leaves either Spark's files as Spark left them or a committed take-over, and the
    wrapped query's start after the last kill gives Spark's output."""
    switch = Switch(spark, tmp_path, windowed)
    switch.run_spark_first("update", SPARK_STORES["rocksdb"])
    expected = switch.expected("update")
    before = _sparks_files(switch.ours_chk)
    started = tmp_path / "started"
    outcomes = []
    done = tmp_path / "started.done"  # the take-over over, or none to make
    for delay in (0.0, 0.4, 0.8, 1.2, 1.8, None):  # None: once the take-over is done
        started.unlink(missing_ok=True)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        args = [str(switch.ours_chk), str(switch.feed.path), str(started)]
        driver = subprocess.Popen(
            [sys.executable, "-c", STARTED_THEN_KILLED, *args],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 180
        while not started.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert started.exists(), driver.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        if delay is None:
            while not done.exists() and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert done.exists(), driver.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        else:
            time.sleep(delay)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        committed = (switch.ours_chk / "sparkstate" / "metadata.json").exists()
        if not committed:
            assert _sparks_files(switch.ours_chk) == before  # as Spark left it
        outcomes.append(committed)
    assert switch.ours("update", PROVIDERS[-1]).batches == expected.batches
    assert outcomes[0] is False, outcomes  # the first kill landed before the commit point
    assert outcomes[-1] is True, outcomes  # the last kill came after the commit point
