"""Processing-time timeouts and timers against Spark's own, on a stream that goes idle.

Spark runs no-data batches on every trigger for processing-time timeouts and timers; sparkstate
runs one when a timeout or timer comes due (``engine/spark/clock.py``). Both must emit the same
rows in the same order: each key's data row, then, with no new data arriving, its timed-out row.
Each side runs once, with a 500 ms trigger; the waits are generous because the machine is shared.
The applyInPandasWithState query goes on, after those keys, to a key whose timeout is pending
when the query stops and starts again on its checkpoint (rocksdb); transformWithState's timers
run on memory.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.streaming.state import GroupStateTimeout

import sparkstate as ss

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, source, spark_rocksdb

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long"
OUTPUT = "k string, count long, timed_out boolean"
STATE = "count long"
TIMEOUT_MS = 1000
TRIGGER = "500 milliseconds"
FEEDS = [[{"k": "a", "v": 1}], [{"k": "b", "v": 1}, {"k": "b", "v": 2}]]
#: What each feed must lead to: its data row, then its timed-out row on the idle stream.
EXPECTED = [[("a", 1, False), ("a", 1, True)], [("b", 2, False), ("b", 2, True)]]


#: Long enough that a query stopped right after a key's data row stops before the key times out.
PENDING_TIMEOUT_MS = 4000
#: The keys that time out :data:`PENDING_TIMEOUT_MS` after their last data.
PENDING_KEYS = ("p", "q")


def timeout_pandas(key: tuple[Any, ...], pdfs: Iterable[pd.DataFrame], state: Any) -> Iterator[Any]:
    """An ``applyInPandasWithState`` count per key that times out :data:`TIMEOUT_MS` (for
    :data:`PENDING_KEYS`: :data:`PENDING_TIMEOUT_MS`) after the key's last data and then emits
    its count and removes it."""
    if state.hasTimedOut:
        n = int(state.get[0])
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "count": [n], "timed_out": [True]})
        return
    n = (int(state.get[0]) if state.exists else 0) + sum(len(pdf) for pdf in pdfs)
    state.update((n,))
    state.setTimeoutDuration(PENDING_TIMEOUT_MS if key[0] in PENDING_KEYS else TIMEOUT_MS)
    yield pd.DataFrame({"k": [key[0]], "count": [n], "timed_out": [False]})


def _processor_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class ExpiringCount(_processor_base()):  # type: ignore[misc]
    """A count per key, emitted and cleared by a processing-time timer 1 s after its last row."""

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
        for item in rows:
            n += len(item) if isinstance(item, pd.DataFrame) else 1
        self._count.update((n,))
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + TIMEOUT_MS)
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


def _rows(collector: Collector) -> list[tuple[Any, ...]]:
    return [r for b in sorted(collector.batches) for r in collector.batches[b]]


def _run(feed: FileFeed, start: Callable[[Collector], Any]) -> list[list[tuple[Any, ...]]]:
    """Per feed, the rows that followed it once its last expected row came (or a time limit)."""
    feed.reset()
    collector = Collector()
    query = start(collector)
    try:
        return _feed_until_idle(feed, collector, query)
    finally:
        query.stop()


def _feed_until_idle(
    feed: FileFeed, collector: Collector, query: Any
) -> list[list[tuple[Any, ...]]]:
    """Feed each of :data:`FEEDS`; per feed, the rows that followed it once its last expected
    row came (or a time limit)."""
    out: list[list[tuple[Any, ...]]] = []
    for rows, expected in zip(FEEDS, EXPECTED, strict=True):
        before = len(_rows(collector))
        feed.add(rows)
        deadline = time.time() + 90
        while time.time() < deadline and expected[-1] not in _rows(collector)[before:]:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        time.sleep(1.0)  # nothing more may come: a second timeout would show here
        out.append(_rows(collector)[before:])
    return out


def _wait_for(collector: Collector, row: tuple[Any, ...], query: Any, limit_s: float) -> None:
    deadline = time.time() + limit_s
    while time.time() < deadline and row not in _rows(collector):
        assert query.exception() is None, query.exception()
        time.sleep(0.1)


def test_processing_time_timeout_matches_spark_aipws(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """Each key of :data:`FEEDS` times out on the idle stream, as in Spark. Then the query stops
    while a key's timeout is pending and starts again on its checkpoint.

    Spark runs no no-data batch after a restart until new data comes (its rule needs the previous
    batch's plan, and a restarted query has none), unless the stop interrupted a batch that the
    restart then runs again: the timeout fires with the next data or, by that chance, when due.
    We fire it when it comes due, as on a running query. The rows are the same.
    """

    def planned(stream: Any) -> Any:  # a Spark DataFrame or a sparkstate stream: same calls
        return stream.groupBy("k").applyInPandasWithState(
            timeout_pandas, OUTPUT, STATE, "update", GroupStateTimeout.ProcessingTimeTimeout
        )

    def spark_query(c: Collector) -> Any:
        writer = planned(source(spark, feed, SCHEMA)).writeStream.outputMode("update")
        writer = writer.foreachBatch(c).trigger(processingTime=TRIGGER)
        return writer.option("checkpointLocation", str(tmp_path / "spark")).start()

    def ours_query(c: Collector) -> Any:
        writer = planned(ss.stream(source(spark, feed, SCHEMA))).writeStream.outputMode("update")
        writer = writer.foreachBatch(c)
        writer = writer.trigger(processingTime=TRIGGER)
        writer = writer.option("checkpointLocation", str(tmp_path / "ours"))
        return writer.option("stateStore", PROVIDERS[-1]).start()

    timed_out = ("p", 2, True)
    idle, outputs, fired_while_idle = [], [], []
    for start in (spark_query, ours_query):
        feed.reset()
        collector = Collector()
        query = start(collector)
        try:
            idle.append(_feed_until_idle(feed, collector, query))
            before = len(_rows(collector))
            feed.add([{"k": "p", "v": 1}, {"k": "p", "v": 2}])
            _wait_for(collector, ("p", 2, False), query, 90)
        finally:
            query.stop()
        assert _rows(collector)[before:] == [("p", 2, False)], "timed out before the restart"
        query = start(collector)  # the same checkpoint, no new data
        try:
            _wait_for(collector, timed_out, query, 4 * PENDING_TIMEOUT_MS / 1000)
            fired_while_idle.append(timed_out in _rows(collector))
            feed.add([{"k": "q", "v": 1}])
            _wait_for(collector, ("q", 1, False), query, 90)
            _wait_for(collector, timed_out, query, 30)
            time.sleep(1.5)  # nothing more may come
        finally:
            query.stop()
        outputs.append(sorted(_rows(collector)[before:], key=str))
    assert idle[0] == EXPECTED
    assert idle[1] == idle[0], ("sparkstate", idle)
    assert outputs[0] == sorted([("p", 2, False), timed_out, ("q", 1, False)], key=str), outputs
    assert outputs[1] == outputs[0], ("sparkstate", outputs)
    assert fired_while_idle[1], "sparkstate: the pending timeout did not fire while idle"


def test_processing_time_timers_match_spark_tws(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def spark_query(c: Collector) -> Any:
        planned = (
            source(spark, feed, SCHEMA)
            .groupBy("k")
            .transformWithStateInPandas(
                ExpiringCount(pandas=True), OUTPUT, "Update", "ProcessingTime"
            )
        )
        return (
            planned.writeStream.outputMode("update")
            .foreachBatch(c)
            .trigger(processingTime=TRIGGER)
            .option("checkpointLocation", str(tmp_path / "spark"))
            .start()
        )

    with spark_rocksdb(spark):  # Spark's transformWithState needs it
        theirs = _run(feed, spark_query)
    assert theirs == EXPECTED

    def ours_query(c: Collector) -> Any:
        planned = (
            ss.stream(source(spark, feed, SCHEMA))
            .groupBy("k")
            .transformWithState(ExpiringCount(pandas=False), OUTPUT, "update", "ProcessingTime")
        )
        return (
            planned.writeStream.outputMode("update")
            .foreachBatch(c)
            .trigger(processingTime=TRIGGER)
            .option("checkpointLocation", str(tmp_path / "ours"))
            .option("stateStore", PROVIDERS[0])
            .start()
        )

    assert _run(feed, ours_query) == theirs
