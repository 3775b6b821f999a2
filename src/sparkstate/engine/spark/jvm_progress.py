"""What Spark's JVM sees of a sparkstate query's progress: its state operators, the user's sink,
the user's sources.

Spark builds each batch's ``StreamingQueryProgress`` in the JVM, puts it in the query's progress
buffer (the JVM query's ``lastProgress`` and ``recentProgress``, which Spark's metrics system reads
for its ``states-rowsTotal`` and other gauges) and posts it to the listener bus of the query's
session, whose thread hands it to the JVM listeners one after the other. One listener of ours,
PySpark's own ``PythonStreamingQueryListenerWrapper`` around a Python object, is put first on
that bus: it rewrites the progress object of a sparkstate query's batch in place (its state
operators, sink, sources, event time and durations taken from a progress Spark parses out of the
merged JSON), before any other JVM listener gets the event; the buffer holds the same object. An
idle trigger's progress (Spark adds one to the buffer every
``spark.sql.streaming.noDataProgressEventInterval`` and posts a ``QueryIdleEvent``) is rewritten
the same way, as Spark's own idle progress of a stateful query reads: the last batch's operators
with the batch's counts cleared by Spark's own rule.

Not covered: the rewrite runs on the bus's thread, a few milliseconds after the stream's thread
added the progress, so a read of the JVM query's ``lastProgress`` in between (or Spark's event
log, another queue of the bus) can still see Spark's own; and a Spark Connect query's driver has
no JVM to reach.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from py4j.protocol import Py4JError

from sparkstate.engine.spark.clock import is_clock_source

__all__ = ["rewrite_progress"]

log = logging.getLogger("sparkstate.engine")

#: A run id and Spark's progress of one of its batches (a dict) -> the progress the JVM should
#: hold instead, or None to leave Spark's.
Merge = Callable[[str, dict[str, Any]], dict[str, Any] | None]

#: The fields of Spark's ``StreamingQueryProgress`` that are set from the merged progress (its
#: ``sources`` are Spark's, the clock left out). ``stateOperators`` last: a reader on another
#: thread that sees them sees the whole rewrite (and :meth:`ProgressRewriter._rewrite` takes a
#: progress with operators as done).
REWRITTEN = ("sink", "eventTime", "durationMs", "stateOperators")

_lock = threading.Lock()
#: The sessions' listener buses our listener is on.
_buses: list[Any] = []
#: The JVM queries rewritten, by run id, until their run ends.
_queries: dict[str, Any] = {}


def rewrite_progress(jquery: Any, merge: Merge) -> None:
    """The JVM progress of ``jquery`` (a classic session's JVM ``StreamingQuery``) is rewritten
    by ``merge`` from now on. Best effort: a failure is logged, and the query runs on."""
    try:
        with _lock:
            _queries[str(jquery.runId().toString())] = jquery
        _listen(jquery, merge)
    except Exception:  # noqa: BLE001 - the JVM keeps Spark's own progress
        log.warning("could not put sparkstate's progress on the JVM's", exc_info=True)


def _listen(jquery: Any, merge: Merge) -> None:
    from pyspark import SparkContext  # noqa: PLC0415 - only a classic session has one
    from pyspark.java_gateway import ensure_callback_server_started  # noqa: PLC0415

    gateway = SparkContext._gateway  # noqa: SLF001 - PySpark's own gateway
    assert gateway is not None
    jvm = gateway.jvm
    manager = jquery.sparkSession().streams()
    field = manager.getClass().getDeclaredField("listenerBus")
    field.setAccessible(True)
    bus = field.get(manager)
    with _lock:
        if any(_same(bus, known) for known in _buses):
            return
        ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
        listener = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(
            ProgressRewriter(gateway, merge)
        )
        manager.addListener(listener)
        _buses.append(bus)
    _put_first(bus, listener)


def _same(bus: Any, known: Any) -> bool:
    """Whether ``bus`` is ``known`` (identity in the JVM; False for one of a JVM gone since)."""
    try:
        return bool(bus.equals(known))
    except Exception:  # noqa: BLE001 - a JavaObject of a gateway that has shut down
        return False


def _put_first(bus: Any, listener: Any) -> None:
    """``listener`` first on ``bus``, so every other listener gets the rewritten event."""
    entries = getattr(bus, "org$apache$spark$util$ListenerBus$$listenersPlusTimers")()
    for i, entry in enumerate(entries):  # a CopyOnWriteArrayList of (listener, timer)
        if entry._1().equals(listener):
            del entries[i]
            entries.insert(0, entry)
            return


class ProgressRewriter:
    """A JVM ``StreamingQueryListener`` in Python (through PySpark's wrapper): rewrites the
    progress of the batches ``merge`` knows, in place."""

    def __init__(self, gateway: Any, merge: Merge) -> None:
        self._gateway = gateway
        self._jvm = gateway.jvm
        self._merge = merge
        self._fields: dict[str, Any] = {}
        self._parser: Any = None
        self._ran: dict[str, int] = {}  # run id -> the newest batch rewritten

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's names
        pass

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        try:
            self._rewrite(jevent.progress(), idle=False)
        except Exception:  # noqa: BLE001 - the listeners get Spark's own progress
            log.warning("could not put sparkstate's progress on the JVM's", exc_info=True)

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        """Spark has added the idle trigger's progress to the buffer just before it posted the
        event: the query's newest progress, if its time is the event's."""
        try:
            with _lock:
                query = _queries.get(str(jevent.runId().toString()))
            last = query.lastProgress() if query is not None else None
            if last is not None and last.timestamp() == jevent.timestamp():
                self._rewrite(last, idle=True)
        except Exception:  # noqa: BLE001
            log.warning("could not put sparkstate's progress on the JVM's", exc_info=True)

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        try:
            run_id = str(jevent.runId().toString())
            with _lock:
                _queries.pop(run_id, None)
            self._ran.pop(run_id, None)
        except Exception:  # noqa: BLE001
            log.warning("could not forget a query's run", exc_info=True)

    def _rewrite(self, progress: Any, *, idle: bool) -> None:
        spark = json.loads(progress.json())
        if spark.get("stateOperators"):
            return  # Spark's own stateful query, or rewritten already
        run_id = str(progress.runId().toString())
        if idle:  # an idle trigger's progress has the next batch's id
            ran = self._ran.get(run_id)
            merged = None if ran is None else self._merge(run_id, {**spark, "batchId": ran})
            merged = None if merged is None else _as_idle(merged, spark)
        else:
            merged = self._merge(run_id, spark)
        if merged is None:
            return
        if not idle:
            self._ran[run_id] = spark["batchId"]
        parsed = self._parse(json.dumps(_as_spark_json(merged)))
        self._field("sources").set(progress, self._without_clock(progress.sources()))
        for name in REWRITTEN:
            field = self._field(name)
            value = field.get(parsed)
            if idle and name == "stateOperators":
                value = self._idle_operators(value)
            field.set(progress, value)

    def _without_clock(self, sources: Any) -> Any:
        """Spark's sources of a progress but sparkstate's clock."""
        kept = [
            s
            for s in sources
            if not is_clock_source({"startOffset": s.startOffset(), "endOffset": s.endOffset()})
        ]
        out = self._gateway.new_array(
            self._jvm.org.apache.spark.sql.streaming.SourceProgress, len(kept)
        )
        for i, source in enumerate(kept):
            out[i] = source
        return out

    def _idle_operators(self, operators: Any) -> Any:
        """The operators as Spark's idle progress shows its own: copied by Spark's own rule of
        the version (which counts of the batch it zeroes differs)."""
        idle = self._gateway.new_array(
            self._jvm.org.apache.spark.sql.streaming.StateOperatorProgress, len(operators)
        )
        for i, op in enumerate(operators):
            try:
                idle[i] = op.copyForNoExecution()  # Spark's rule where it has one
            except Py4JError:  # 4.0's: rows updated and dropped by the watermark cleared
                idle[i] = op.copy(0, 0)
        return idle

    def _parse(self, text: str) -> Any:
        if self._parser is None:
            companion = self._jvm.java.lang.Class.forName(
                "org.apache.spark.sql.streaming.StreamingQueryProgress$"
            )
            self._parser = companion.getField("MODULE$").get(None)
        return self._parser.fromJson(text)

    def _field(self, name: str) -> Any:
        if name not in self._fields:
            cls = self._jvm.java.lang.Class.forName(
                "org.apache.spark.sql.streaming.StreamingQueryProgress"
            )
            field = cls.getDeclaredField(name)
            field.setAccessible(True)
            self._fields[name] = field
        return self._fields[name]

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _as_idle(merged: dict[str, Any], spark: dict[str, Any]) -> dict[str, Any]:
    """The idle trigger's progress as Spark's of a stateful query: the last batch's operators
    (copied as Spark copies its own, :meth:`ProgressRewriter._idle_operators`), Spark's
    durations, the watermark alone, no rows written."""
    idle = dict(merged)
    idle["batchId"] = spark["batchId"]
    idle["durationMs"] = spark.get("durationMs", {})
    idle["sink"] = {**merged.get("sink", {}), "numOutputRows": 0}
    watermark = (merged.get("eventTime") or {}).get("watermark")
    idle["eventTime"] = {"watermark": watermark} if watermark else {}
    return idle


def _as_spark_json(progress: dict[str, Any]) -> dict[str, Any]:
    """What of ``progress`` is parsed, as Spark's parser of every version takes it: whole
    numbers where Spark keeps longs; no sources (4.0's parser takes their offsets only as
    strings) and no observed metrics (Spark's own are kept)."""
    out = dict(progress)
    out["sources"] = []
    out.pop("observedMetrics", None)
    out["stateOperators"] = [
        {**op, "customMetrics": {k: int(v) for k, v in op.get("customMetrics", {}).items()}}
        for op in progress.get("stateOperators", [])
    ]
    out["durationMs"] = {k: int(v) for k, v in progress.get("durationMs", {}).items()}
    out["sink"] = {"metrics": {}, **progress.get("sink", {})}
    return out
