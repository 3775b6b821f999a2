"""What Spark's own listeners see of a sparkstate query: its state operators, the user's sources
and sink.

To Spark, a sparkstate query is a stateless ``foreachBatch`` query with one more source (the
clock, :mod:`sparkstate.engine.spark.clock`): its progress has no ``stateOperators``, names the
``ForeachBatchSink`` and lists the clock. PySpark hands each progress event to a Python listener
(``spark.streams.addListener``) through one class of its own, whichever listener it is; here that
hand-over is taken once per process, and the progress of a sparkstate query's batch is given as
the query's handle shows it: Spark's progress with sparkstate's state operators, sink and event
time on it, the clock left out. Other queries' events pass as they are. What the JVM holds
(its listeners, Spark's metrics system, the JVM query's ``lastProgress``) is rewritten the same
way by :mod:`sparkstate.engine.spark.jvm_progress`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming import listener as pyspark_listener
from pyspark.sql.streaming.listener import QueryProgressEvent, StreamingQueryProgress

from sparkstate.engine.spark.clock import is_clock_source
from sparkstate.engine.spark.jvm_progress import rewrite_progress
from sparkstate.runtime.progress import progress_as_dict

__all__ = ["register_run", "spark_progress", "without_clock"]

log = logging.getLogger("sparkstate.engine")

#: runId -> a function giving sparkstate's progress of a batch id (None: not known), for the
#: newest runs of the process: a run's last events reach listeners after it ended.
_runs: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {}
_KEPT_RUNS = 64
_lock = threading.Lock()
_installed = False


def register_run(
    run_id: str,
    merged: Callable[[dict[str, Any]], dict[str, Any] | None],
    jquery: Any = None,
) -> None:
    """Spark's listeners see the run ``run_id``'s progress as ``merged`` makes it of Spark's;
    with ``jquery`` (the run's JVM ``StreamingQuery``), the JVM's listeners and buffer too."""
    _install()
    with _lock:
        _runs[run_id] = merged
        for old in list(_runs)[:-_KEPT_RUNS]:
            del _runs[old]
    if jquery is not None:
        rewrite_progress(jquery, _merged)


def _merged(run_id: str, progress: dict[str, Any]) -> dict[str, Any] | None:
    """Spark's ``progress`` of a batch of the run ``run_id`` as its handle shows it; None for
    another query's, or a batch the driver has no progress of."""
    with _lock:
        merged = _runs.get(run_id)
    return None if merged is None else merged(progress)


def without_clock(progress: dict[str, Any]) -> dict[str, Any]:
    """``progress`` with the clock left out of its sources."""
    sources = [s for s in progress.get("sources") or [] if not is_clock_source(s)]
    return {**progress, "sources": sources}


def _seen(event: QueryProgressEvent) -> QueryProgressEvent:
    """The event a Python listener gets: a sparkstate query's batch as its handle shows it."""
    progress = event.progress
    with _lock:
        merged = _runs.get(str(progress.runId))
    if merged is None:
        return event
    try:
        ours = merged(progress_as_dict(progress))
    except Exception:  # noqa: BLE001 - the listener still gets Spark's own event
        log.warning("could not put sparkstate's progress on Spark's event", exc_info=True)
        return event
    if ours is None:
        return event
    return QueryProgressEvent(spark_progress(ours, str(progress.runId)))


def _install() -> None:
    """Take PySpark's hand-over of progress events to Python listeners, once."""
    global _installed  # noqa: PLW0603 - once per process
    with _lock:
        if _installed:
            return
        _installed = True
    cls: Any = pyspark_listener.JStreamingQueryListener

    def on_query_progress(self: Any, jevent: Any) -> None:
        self.pylistener.onQueryProgress(_seen(QueryProgressEvent.fromJObject(jevent)))

    cls.onQueryProgress = on_query_progress


def spark_progress(progress: dict[str, Any], run_id: str = "") -> StreamingQueryProgress:
    """A progress dict as PySpark's ``StreamingQueryProgress`` (attribute and key access,
    ``json``, ``prettyJson``); fields Spark always has are filled in where ours lack them."""
    data = dict(progress)
    data["runId"] = data.get("runId") or run_id or str(uuid.UUID(int=0))
    data.setdefault("name", None)
    data.setdefault("batchDuration", data.get("durationMs", {}).get("triggerExecution", 0))
    data.setdefault("sources", [])
    data["sink"] = {"description": "", "numOutputRows": -1, "metrics": {}, **data.get("sink", {})}
    return StreamingQueryProgress.fromJson(data)
