"""Processing-time timeouts and timers against Spark's own, on a stream that goes idle.

Spark runs no-data batches on every trigger for processing-time timeouts and timers; sparkstate
runs one when a timeout or timer comes due (``engine/clock.py``). Both must emit the same rows in
the same order: each key's data row, then, with no new data arriving, its timed-out row.
Each side runs once, with a 500 ms trigger; the waits are generous because the machine is shared.
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
from .helpers import Collector, source

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long"
OUTPUT = "k string, count long, timed_out boolean"
STATE = "count long"
TIMEOUT_MS = 1000
TRIGGER = "500 milliseconds"
FEEDS = [[{"k": "a", "v": 1}], [{"k": "b", "v": 1}, {"k": "b", "v": 2}]]
#: What each feed must lead to: its data row, then its timed-out row on the idle stream.
EXPECTED = [[("a", 1, False), ("a", 1, True)], [("b", 2, False), ("b", 2, True)]]
RocksDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


def counting_timeout(duration_ms: int) -> Callable[..., Iterator[Any]]:
    """An ``applyInPandasWithState`` count per key that times out ``duration_ms`` after the
    key's last data and then emits its count and removes it."""

    def count(key: tuple[Any, ...], pdfs: Iterable[pd.DataFrame], state: Any) -> Iterator[Any]:
        if state.hasTimedOut:
            n = int(state.get[0])
            state.remove()
            yield pd.DataFrame({"k": [key[0]], "count": [n], "timed_out": [True]})
            return
        n = (int(state.get[0]) if state.exists else 0) + sum(len(pdf) for pdf in pdfs)
        state.update((n,))
        state.setTimeoutDuration(duration_ms)
        yield pd.DataFrame({"k": [key[0]], "count": [n], "timed_out": [False]})

    return count


timeout_pandas = counting_timeout(TIMEOUT_MS)


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
    out: list[list[tuple[Any, ...]]] = []
    try:
        for rows, expected in zip(FEEDS, EXPECTED, strict=True):
            before = len(_rows(collector))
            feed.add(rows)
            deadline = time.time() + 90
            while time.time() < deadline and expected[-1] not in _rows(collector)[before:]:
                assert query.exception() is None, query.exception()
                time.sleep(0.2)
            time.sleep(1.0)  # nothing more may come: a second timeout would show here
            out.append(_rows(collector)[before:])
    finally:
        query.stop()
    return out


def test_processing_time_timeout_matches_spark_aipws(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def spark_query(c: Collector) -> Any:
        planned = (
            source(spark, feed, SCHEMA)
            .groupBy("k")
            .applyInPandasWithState(
                timeout_pandas, OUTPUT, STATE, "Update", GroupStateTimeout.ProcessingTimeTimeout
            )
        )
        return (
            planned.writeStream.outputMode("update")
            .foreachBatch(c)
            .trigger(processingTime=TRIGGER)
            .option("checkpointLocation", str(tmp_path / "spark"))
            .start()
        )

    theirs = _run(feed, spark_query)
    assert theirs == EXPECTED

    def ours_query(c: Collector) -> Any:
        planned = (
            ss.stream(source(spark, feed, SCHEMA))
            .groupBy("k")
            .applyInPandasWithState(
                timeout_pandas, OUTPUT, STATE, "update", GroupStateTimeout.ProcessingTimeTimeout
            )
        )
        return (
            planned.writeStream.outputMode("update")
            .foreachBatch(c)
            .trigger(processingTime=TRIGGER)
            .option("checkpointLocation", str(tmp_path / "ours"))
            .option("stateStore", PROVIDERS[-1])
            .start()
        )

    assert _run(feed, ours_query) == theirs


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

    previous = spark.conf.get(PROVIDER_CONF, None)
    spark.conf.set(PROVIDER_CONF, RocksDB)
    try:
        theirs = _run(feed, spark_query)
    finally:
        if previous is None:
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, previous)
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


#: Long enough that a query stopped right after a key's data row stops before the key times out.
PENDING_TIMEOUT_MS = 4000
pending_timeout_pandas = counting_timeout(PENDING_TIMEOUT_MS)


def _wait_for(collector: Collector, row: tuple[Any, ...], query: Any, limit_s: float) -> None:
    deadline = time.time() + limit_s
    while time.time() < deadline and row not in _rows(collector):
        assert query.exception() is None, query.exception()
        time.sleep(0.1)


def test_a_timeout_pending_at_a_restart_fires_after_it(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """Stop the query while a key's timeout is pending and start it again on its checkpoint.

    Spark runs no no-data batch after a restart until new data comes (its rule needs the previous
    batch's plan, and a restarted query has none), unless the stop interrupted a batch that the
    restart then runs again: the timeout fires with the next data or, by that chance, when due.
    We fire it when it comes due, as on a running query. The rows are the same.
    """

    def planned(stream: Any) -> Any:  # a Spark DataFrame or a sparkstate stream: same calls
        return stream.groupBy("k").applyInPandasWithState(
            pending_timeout_pandas, OUTPUT, STATE, "update", GroupStateTimeout.ProcessingTimeTimeout
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

    timed_out = ("a", 2, True)
    outputs, fired_while_idle = [], []
    for start in (spark_query, ours_query):
        feed.reset()
        collector = Collector()
        query = start(collector)
        try:
            feed.add([{"k": "a", "v": 1}, {"k": "a", "v": 2}])
            _wait_for(collector, ("a", 2, False), query, 90)
        finally:
            query.stop()
        assert _rows(collector) == [("a", 2, False)], "timed out before the restart"
        query = start(collector)  # the same checkpoint, no new data
        try:
            _wait_for(collector, timed_out, query, 4 * PENDING_TIMEOUT_MS / 1000)
            fired_while_idle.append(timed_out in _rows(collector))
            feed.add([{"k": "b", "v": 1}])
            _wait_for(collector, ("b", 1, False), query, 90)
            _wait_for(collector, timed_out, query, 30)
            time.sleep(1.5)  # nothing more may come
        finally:
            query.stop()
        outputs.append(sorted(_rows(collector), key=str))
    assert outputs[0] == sorted([("a", 2, False), timed_out, ("b", 1, False)], key=str), outputs
    assert outputs[1] == outputs[0], ("sparkstate", outputs)
    assert fired_while_idle[1], "sparkstate: the pending timeout did not fire while idle"
