"""Arbitrary state against Spark's own ``applyInPandasWithState`` / ``transformWithStateInPandas``.

The same user function (or processor) runs through Spark and through sparkstate on the same file
source input, and the output is compared batch by batch. Spark's Python stateful operators are
slow (seconds per batch even for a handful of rows), so the inputs are tiny and each Spark query
runs once per test, against every sparkstate variant of it.

Spark runs a no-data batch after a batch that moved the watermark (event-time timeouts fire there);
so does sparkstate (its clock source, ``engine/spark/clock.py``), so those rows come in the same
batch.

One query checks several things: the counting queries carry the stateless steps a user writes
after the operator (their rows keep every column of its output), and transformWithState's runs
in an append-mode query. Each sparkstate variant runs on one provider, each operator on both in
the module, and one variant of each test is stopped and restarted on its checkpoint in the
middle: the count runs applyInPandasWithState on memory and flatMapGroupsWithState on rocksdb
(restarted), transformWithStateInPandas on rocksdb (restarted); the event-time timeouts run on
rocksdb and transformWithState's timers on memory (both restarted).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, same_schema, source, spark_rocksdb

# The user functions below are shipped to the Python workers by value (the workers cannot import
# this test module by its pytest name).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long"
OUTPUT = "k string, count long, removed boolean"
STATE = "count long"
LIMIT = 3  # a key's state is removed when its count reaches this

COUNT_BATCHES: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}],
    [{"k": "b", "v": 4}, {"k": "c", "v": 5}],
    [{"k": "a", "v": 6}, {"k": "b", "v": 7}, {"k": "c", "v": 8}, {"k": None, "v": 9}],
    [{"k": "a", "v": 6}],  # a again after its state was removed: starts over
]


# --- the user logic, identical for Spark and sparkstate ------------------------------------------


def count_pandas(key: tuple[Any, ...], pdfs: Iterable[pd.DataFrame], state: Any) -> Iterator[Any]:
    n = int(state.get[0]) if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    removed = n >= LIMIT
    if removed:
        state.remove()
    else:
        state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "count": [n], "removed": [removed]})


def count_rows(key: tuple[Any, ...], rows: list[Any], state: Any) -> Iterator[tuple[Any, ...]]:
    n = (int(state.get[0]) if state.exists else 0) + len(rows)
    removed = n >= LIMIT
    if removed:
        state.remove()
    else:
        state.update((n,))
    yield (key[0], n, removed)


def _processor_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class CountProcessor(_processor_base()):  # type: ignore[misc]
    """The same count with a ValueState; ``handleInputRows`` works for pandas and row mode."""

    def init(self, handle: Any) -> None:
        self._count = handle.getValueState("count", STATE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        current = self._count.get()
        n = int(current[0]) if current is not None else 0
        pandas_mode = False
        for item in rows:
            if isinstance(item, pd.DataFrame):
                pandas_mode = True
                n += len(item)
            else:
                n += 1
        removed = n >= LIMIT
        if removed:
            self._count.clear()
        else:
            self._count.update((n,))
        if pandas_mode:
            yield pd.DataFrame({"k": [key[0]], "count": [n], "removed": [removed]})
        else:
            yield (key[0], n, removed)

    def close(self) -> None:
        pass


#: ``customMetrics`` of a batch with input: the phases of the tasks' time.
INPUT_PHASES = {
    "inputReadTimeMs",
    "groupingTimeMs",
    "stateReadTimeMs",
    "userFunctionTimeMs",
    "stateWriteTimeMs",
}


# --- running both sides ---------------------------------------------------------------------------


def _run(
    feed: FileFeed,
    start: Callable[[Collector], Any],
    batches: list[list[dict[str, Any]]],
    *,
    settle_s: float = 0.0,
    restart_after: int | None = None,
    before_stop: Callable[[Any], None] | None = None,
) -> tuple[Collector, list[list[int]]]:
    """Feed one file per batch; returns the output and the batch ids each file led to.

    ``restart_after=n``: stop the query after ``n`` files and start it again (``start`` builds
    it anew on the same checkpoint) before the next one. ``before_stop(query)`` runs before
    each stop that follows the files fed.
    """
    feed.reset()
    collector = Collector()
    query = start(collector)
    groups: list[list[int]] = []
    seen: set[int] = set()
    try:
        for n, rows in enumerate(batches):
            if n == restart_after:
                if before_stop is not None:
                    before_stop(query)
                query.stop()
                query = start(collector)
            feed.add(rows)
            query.processAllAvailable()
            if settle_s:  # let Spark run its no-data batch
                time.sleep(settle_s)
                query.processAllAvailable()
            new = sorted(set(collector.batches) - seen)
            seen.update(new)
            groups.append(new)
        if before_stop is not None:
            before_stop(query)
    finally:
        query.stop()
    return collector, groups


def _spark_writer(
    df: DataFrame, checkpoint: Path, collector: Collector, mode: str = "update"
) -> Any:
    return (
        df.writeStream.outputMode(mode)
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def _ours_writer(
    stream: ss.StatefulStream,
    checkpoint: Path,
    provider: str,
    collector: Collector,
    mode: str = "update",
) -> Any:
    return (
        stream.writeStream.outputMode(mode)
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .option("stateStore", provider)
        .start()
    )


def _per_feed(collector: Collector, groups: list[list[int]]) -> list[list[tuple[Any, ...]]]:
    return [sorted(r for b in ids for r in collector.batches[b]) for ids in groups]


def _per_batch(collector: Collector, groups: list[list[int]]) -> list[list[list[tuple[Any, ...]]]]:
    """Per feed, the sorted output of each batch that produced rows, in batch order."""
    return [[sorted(collector.batches[b]) for b in ids if collector.batches[b]] for ids in groups]


def after(df: Any) -> Any:
    """Stateless steps after the operator, as a user writes them: ``where`` / ``withColumn`` /
    ``select`` name its output's columns. The rows kept keep every column of that output."""
    kept = df.where(~F.col("k").eqNullSafe("c")).withColumn("twice", F.col("count") * 2)
    return kept.select("k", "count", "twice", F.col("removed").alias("gone"))


def _check_phases(query: Any) -> None:
    """Where the tasks' time went in the last batch, summed over the partitions that had input."""
    op = query.lastProgress["stateOperators"][0]
    phases = {k: v for k, v in op["customMetrics"].items() if k in INPUT_PHASES}
    assert set(phases) == INPUT_PHASES and all(v >= 0 for v in phases.values()), op


#: A sparkstate variant of a query: its name, provider, ``build(grouped input)``, and after how
#: many files it is stopped and restarted on its checkpoint (None: it runs through).
Variant = tuple[str, str, Callable[[Any], ss.StatefulStream], int | None]


# --- tests ----------------------------------------------------------------------------------------


@pytest.mark.versions
def test_count_and_remove_match_spark_aipws(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    theirs, _ = _run(
        feed,
        lambda c: _spark_writer(
            after(
                source(spark, feed, SCHEMA)
                .groupBy("k")
                .applyInPandasWithState(
                    count_pandas, OUTPUT, STATE, "Update", GroupStateTimeout.NoTimeout
                )
            ),
            tmp_path / "spark",
            c,
        ),
        COUNT_BATCHES,
    )
    assert len(theirs.batches) == len(COUNT_BATCHES)
    assert theirs.batches[0] == [("a", 2, 4, False), ("b", 1, 2, False)]
    variants: list[Variant] = [
        (
            "aipws",
            PROVIDERS[0],
            lambda g: g.applyInPandasWithState(
                count_pandas, OUTPUT, STATE, "update", GroupStateTimeout.NoTimeout
            ),
            None,
        ),
        (
            "rows",
            PROVIDERS[-1],
            lambda g: g.flatMapGroupsWithState(
                count_rows, OUTPUT, STATE, "update", GroupStateTimeout.NoTimeout
            ),
            2,
        ),
    ]
    _compare(spark, feed, tmp_path, theirs, variants, before_stop=_check_phases)


def _compare(
    spark: SparkSession,
    feed: FileFeed,
    tmp_path: Path,
    theirs: Collector,
    variants: list[Variant],
    mode: str = "update",
    before_stop: Callable[[Any], None] | None = None,
) -> None:
    """Each variant, with :func:`after`'s steps, over the counting files: Spark's batches."""
    for i, (name, provider, build, restart_after) in enumerate(variants):
        ours, _ = _run(
            feed,
            lambda c, build=build, provider=provider, i=i: _ours_writer(
                after(build(ss.stream(source(spark, feed, SCHEMA)).groupBy("k"))),
                tmp_path / f"ours-{i}",
                provider,
                c,
                mode,
            ),
            COUNT_BATCHES,
            restart_after=restart_after,
            before_stop=before_stop,
        )
        assert same_schema(ours.schema, theirs.schema), (name, ours.schema, theirs.schema)
        assert ours.batches == theirs.batches, (name, provider)


@pytest.mark.versions
def test_count_and_clear_match_spark_tws(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """The count with a ValueState, in an append-mode query: Spark checks a *GroupsWithState
    operator's outputMode against the query's, not a transformWithState's, so
    ``outputMode="Update"`` runs under append output in both systems."""

    def spark_query(c: Collector) -> Any:
        planned = (
            source(spark, feed, SCHEMA)
            .groupBy("k")
            .transformWithStateInPandas(
                statefulProcessor=CountProcessor(),
                outputStructType=OUTPUT,
                outputMode="Update",
                timeMode="None",
            )
        )
        return _spark_writer(after(planned), tmp_path / "spark", c, "append")

    with spark_rocksdb(spark):  # Spark's transformWithState needs it
        theirs, _ = _run(feed, spark_query, COUNT_BATCHES)
    assert len(theirs.batches) == len(COUNT_BATCHES)
    assert theirs.batches[1] == [("b", 2, 4, False)]
    # pandas mode here, rows mode in the timers' test
    variants: list[Variant] = [
        (
            "tws-pandas",
            PROVIDERS[-1],
            lambda g: g.transformWithStateInPandas(
                statefulProcessor=CountProcessor(),
                outputStructType=OUTPUT,
                outputMode="Update",
                timeMode="None",
            ),
            2,
        ),
    ]
    _compare(spark, feed, tmp_path, theirs, variants, mode="append")


EVENT_SCHEMA = "k string, ts timestamp"
TIMEOUT_OUTPUT = "k string, count long, timed_out boolean"
BASE_S = 1_700_000_000


def _at(key: str, seconds: int) -> dict[str, Any]:
    return {"k": key, "ts": pd.Timestamp((BASE_S + seconds) * 1_000_000_000).isoformat() + "Z"}


# watermark delay 10 s; a key times out 5 s (event time) after its latest row
EVENT_BATCHES: list[list[dict[str, Any]]] = [
    [_at("a", 100), _at("b", 100)],  # wm -> 90
    [_at("a", 112)],  # a's timeout 117; wm -> 102: nothing due
    [_at("c", 130)],  # wm -> 120: a (117) and b (105) time out (Spark: in its no-data batch)
    [_at("a", 125), _at("c", 126)],  # a starts over (its state timed out); wm stays
]


def timeout_pandas(key: tuple[Any, ...], pdfs: Iterable[pd.DataFrame], state: Any) -> Iterator[Any]:
    if state.hasTimedOut:
        n = int(state.get[0])
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "count": [n], "timed_out": [True]})
        return
    n = int(state.get[0]) if state.exists else 0
    latest = 0
    for pdf in pdfs:
        n += len(pdf)
        if len(pdf):
            latest = max(latest, int(pd.Timestamp(pdf["ts"].max()).timestamp() * 1000))
    state.update((n,))
    state.setTimeoutTimestamp(latest + 5000)
    yield pd.DataFrame({"k": [key[0]], "count": [n], "timed_out": [False]})


def test_event_time_timeout_matches_spark_aipws(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def spark_query(c: Collector) -> Any:
        df = source(spark, feed, EVENT_SCHEMA).withWatermark("ts", "10 seconds")
        planned = df.groupBy("k").applyInPandasWithState(
            timeout_pandas, TIMEOUT_OUTPUT, STATE, "Update", GroupStateTimeout.EventTimeTimeout
        )
        return _spark_writer(planned, tmp_path / "spark", c)

    theirs, spark_groups = _run(feed, spark_query, EVENT_BATCHES, settle_s=1.5)
    expected = _per_feed(theirs, spark_groups)
    # Spark's no-data batch after feed 2 timed out a and b, before a's new row of feed 3
    assert ("a", 2, True) in expected[2] and ("b", 1, True) in expected[2], expected
    assert ("a", 1, False) in expected[3], expected
    # stopped after the second file and restarted on its checkpoint, timeouts pending

    def ours_query(c: Collector) -> Any:
        stream = ss.stream(source(spark, feed, EVENT_SCHEMA)).withWatermark("ts", "10 seconds")
        planned = stream.groupBy("k").applyInPandasWithState(
            timeout_pandas, TIMEOUT_OUTPUT, STATE, "update", GroupStateTimeout.EventTimeTimeout
        )
        return _ours_writer(planned, tmp_path / "ours", PROVIDERS[-1], c)

    ours, groups = _run(feed, ours_query, EVENT_BATCHES, settle_s=1.5, restart_after=2)
    assert same_schema(ours.schema, theirs.schema)
    # the same rows in the same batches: the timed-out ones in a no-data batch of their own
    assert _per_batch(ours, groups) == _per_batch(theirs, spark_groups)


def test_unsupported_combinations_fail_at_start(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    feed.add([])
    df = source(spark, feed, SCHEMA)
    grouped = ss.stream(df).groupBy("k")
    update = grouped.applyInPandasWithState(
        count_pandas, OUTPUT, STATE, "update", GroupStateTimeout.NoTimeout
    )
    with pytest.raises(ConfigurationError, match="update mode is not supported with append"):
        update.writeStream.format("noop").outputMode("append").option(
            "checkpointLocation", str(tmp_path)
        ).start()
    with pytest.raises(ConfigurationError, match="complete"):
        update.writeStream.format("noop").outputMode("complete").option(
            "checkpointLocation", str(tmp_path)
        ).start()
    event = grouped.applyInPandasWithState(
        count_pandas, OUTPUT, STATE, "update", GroupStateTimeout.EventTimeTimeout
    )
    with pytest.raises(ConfigurationError, match="watermark"):
        event.writeStream.format("noop").outputMode("update").option(
            "checkpointLocation", str(tmp_path)
        ).start()
    with pytest.raises(ConfigurationError, match="outputMode"):
        grouped.flatMapGroupsWithState(
            count_rows, OUTPUT, STATE, "complete", "NoTimeout"
        ).writeStream.format("noop").outputMode("update").option(
            "checkpointLocation", str(tmp_path)
        ).start()
    with pytest.raises(ConfigurationError, match="initialState"):
        grouped.transformWithState(CountProcessor(), OUTPUT, "update", "None", initialState=df)
    with pytest.raises(ConfigurationError, match="update mode is not supported with aggregation"):
        update.groupBy("k").count().writeStream.format("noop").outputMode("complete").option(
            "checkpointLocation", str(tmp_path)
        ).start()
    with pytest.raises(ConfigurationError, match="not supported yet"):
        update.dropDuplicates(["k"]).writeStream.format("noop").outputMode("update").option(
            "checkpointLocation", str(tmp_path)
        ).start()


def timeout_rows(key: tuple[Any, ...], rows: list[Any], state: Any) -> Any:
    if state.hasTimedOut:
        n = int(state.get[0])
        state.remove()
        return [(key[0], n, True)]
    n = (int(state.get[0]) if state.exists else 0) + len(rows)
    state.update((n,))
    state.setTimeoutDuration("1 second")
    return [(key[0], n, False)]


def test_processing_time_timeout_fires_on_an_idle_stream(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """No new data: the timeout still fires, in a no-data batch of its own, as in Spark."""

    def ours_query(c: Collector) -> Any:
        planned = (
            ss.stream(source(spark, feed, SCHEMA))
            .groupBy("k")
            .flatMapGroupsWithState(
                timeout_rows, TIMEOUT_OUTPUT, STATE, "update", "ProcessingTimeTimeout"
            )
        )
        return _ours_writer(planned, tmp_path / "ours", PROVIDERS[-1], c)

    feed.reset()
    collector = Collector()
    query = ours_query(collector)
    try:
        feed.add([{"k": "a", "v": 1}])
        query.processAllAvailable()
        first = min(collector.batches)
        assert collector.batches[first] == [("a", 1, False)]
        deadline = time.time() + 60
        while time.time() < deadline and not any(
            ("a", 1, True) in rows for rows in collector.batches.values()
        ):
            time.sleep(0.2)
        fired = [b for b, rows in collector.batches.items() if ("a", 1, True) in rows]
        assert fired and fired[0] > first, collector.batches  # a batch of its own, no new data
        assert collector.batches[fired[0]] == [("a", 1, True)]
        time.sleep(1.5)  # nothing is due any more: no further batch runs
        assert max(collector.batches) == fired[0], collector.batches
        feed.add([{"k": "b", "v": 1}])
        query.processAllAvailable()
        after = [collector.batches[b] for b in sorted(collector.batches) if b > fired[0]]
        assert after[0] == [("b", 1, False)], collector.batches  # b's own timeout may follow
    finally:
        query.stop()


class TimerProcessor(_processor_base()):  # type: ignore[misc]
    """A count per key that an event-time timer ends 5 s after the key's latest row."""

    def __init__(self, pandas: bool) -> None:
        self.pandas = pandas

    def init(self, handle: Any) -> None:
        self.handle = handle
        self._count = handle.getValueState("count", STATE)

    def _out(self, key: Any, n: int, fired: bool) -> Any:
        if self.pandas:
            return pd.DataFrame({"k": [key[0]], "count": [n], "timed_out": [fired]})
        return (key[0], n, fired)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        current = self._count.get()
        n = int(current[0]) if current is not None else 0
        latest = 0
        for item in rows:
            if isinstance(item, pd.DataFrame):
                n += len(item)
                stamps = [pd.Timestamp(t) for t in item["ts"]]
            else:
                n += 1
                stamps = [pd.Timestamp(item["ts"])]
            for t in stamps:
                t = t.tz_localize("UTC") if t.tzinfo is None else t
                latest = max(latest, int(t.timestamp() * 1000))
        self._count.update((n,))
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.handle.registerTimer(latest + 5000)
        yield self._out(key, n, False)

    def handleExpiredTimer(  # noqa: N802
        self,
        key: Any,
        timerValues: Any,  # noqa: N803
        expiredTimerInfo: Any,  # noqa: N803
    ) -> Any:
        current = self._count.get()
        self._count.clear()
        yield self._out(key, int(current[0]), True)

    def close(self) -> None:
        pass


def test_event_time_timers_match_spark_tws(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def spark_query(c: Collector) -> Any:
        df = source(spark, feed, EVENT_SCHEMA).withWatermark("ts", "10 seconds")
        planned = df.groupBy("k").transformWithStateInPandas(
            statefulProcessor=TimerProcessor(pandas=True),
            outputStructType=TIMEOUT_OUTPUT,
            outputMode="Update",
            timeMode="EventTime",
        )
        return _spark_writer(planned, tmp_path / "spark", c)

    with spark_rocksdb(spark):
        theirs, spark_groups = _run(feed, spark_query, EVENT_BATCHES, settle_s=1.5)
    expected = _per_feed(theirs, spark_groups)
    assert ("a", 2, True) in expected[2] and ("b", 1, True) in expected[2], expected
    # rows mode (pandas mode's event-time timers: test_port.py's event-time-column case),
    # stopped after the second file and restarted on its checkpoint, timers pending

    def ours_query(c: Collector) -> Any:
        stream = ss.stream(source(spark, feed, EVENT_SCHEMA)).withWatermark("ts", "10 seconds")
        planned = stream.groupBy("k").transformWithState(
            TimerProcessor(pandas=False), TIMEOUT_OUTPUT, "update", "EventTime"
        )
        return _ours_writer(planned, tmp_path / "ours", PROVIDERS[0], c)

    ours, groups = _run(feed, ours_query, EVENT_BATCHES, settle_s=1.5, restart_after=2)
    assert same_schema(ours.schema, theirs.schema)
    assert _per_batch(ours, groups) == _per_batch(theirs, spark_groups)
