"""The handle of a running query, and the progress listeners."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from pyspark import SparkContext
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.listener import QueryProgressEvent, StreamingQueryProgress
from pyspark.sql.streaming.query import StreamingQuery as SparkStreamingQuery

from sparkstate.engine.plan.stage import Stage
from sparkstate.engine.run.batch_job import snapshot_at_stop
from sparkstate.engine.run.driver import BatchDriver, BatchRelay
from sparkstate.engine.run.failures import surfaced
from sparkstate.engine.run.sinks import Sink
from sparkstate.engine.run.stopping import RunTasks, StopRequest, cancel_batch, quiet_run
from sparkstate.engine.spark.listeners import register_run, spark_progress, without_clock
from sparkstate.engine.spark.session import run_on_server
from sparkstate.runtime.logs import CheckpointLock, CheckpointLog
from sparkstate.runtime.progress import progress_as_dict

__all__ = [
    "ProgressListener",
    "StreamingQuery",
    "add_listener",
    "notify_progress",
    "remove_listener",
]

log = logging.getLogger("sparkstate.engine")


class ProgressListener(Protocol):
    """Receives every batch's progress as PySpark's listeners do: ``event.progress`` is the
    ``StreamingQueryProgress`` that ``lastProgress`` shows."""

    def onQueryProgress(self, event: QueryProgressEvent) -> None: ...  # noqa: N802 - PySpark's name


_listeners: list[Any] = []
_listeners_lock = threading.Lock()


def add_listener(listener: Any) -> None:
    """Register a listener: an object with ``onQueryProgress(event)`` (a PySpark
    ``StreamingQueryListener``), or a callable given each batch's ``StreamingQueryProgress``."""
    with _listeners_lock:
        _listeners.append(listener)


def remove_listener(listener: Any) -> None:
    with _listeners_lock:
        if listener in _listeners:
            _listeners.remove(listener)


def notify_progress(progress: dict[str, Any]) -> None:
    with _listeners_lock:
        targets = list(_listeners)
    for listener in targets:
        try:
            hook = getattr(listener, "onQueryProgress", None)
            if hook is not None:
                hook(QueryProgressEvent(spark_progress(progress)))
            else:
                listener(spark_progress(progress))
        except Exception:  # a broken listener must not fail the query
            log.exception("progress listener %r failed", listener)


#: Checkpoint root -> the handle of the query that holds it, in this process.
_active: dict[str, StreamingQuery] = {}
_active_lock = threading.Lock()


def release_if_finished(root: str) -> None:
    """Let go of a checkpoint whose query ended by itself (availableNow, failure)."""
    with _active_lock:
        handle = _active.get(root)
    if handle is not None and not handle.isActive:
        handle._release()


class StreamingQuery(SparkStreamingQuery):
    """A running sparkstate query: PySpark's ``StreamingQuery`` (``isinstance`` holds in a
    classic session), with sparkstate's progress, stop and failures."""

    def __init__(
        self,
        spark_query: SparkStreamingQuery,
        driver: BatchDriver,
        lock: CheckpointLock | None,
        sink: Sink,
        stages: list[Stage],
        log_: CheckpointLog,
        relay: BatchRelay | None = None,
    ) -> None:
        """``lock`` None: the driver runs in a process of the Spark Connect server's, and what
        it records (progress, the error that failed it) is read back through the session;
        ``relay``: what Spark calls each batch, let go of at stop."""
        self._jsq = getattr(spark_query, "_jsq", None)  # PySpark's own methods, classic only
        self._query = spark_query
        self._driver = driver
        self._lock = lock
        self._sink = sink
        self._stages = stages
        self._log = log_
        self._id = driver.config.query_id
        self._released = False
        self._relay = relay
        self._remote = lock is None
        #: The session the query started in (its ``writeStream`` set it).
        self.sparkSession: Any = None
        with _active_lock:
            _active[log_.root] = self
        if not self._remote:  # Spark's own Python listeners see the state operators too
            progress_of = _progress_of(driver.progress_reader())
            register_run(str(spark_query.runId), progress_of, self._jsq)

    @property
    def id(self) -> str:
        """Stays the same across restarts from the same checkpoint."""
        return self._id

    @property
    def runId(self) -> str:  # noqa: N802 - PySpark's name
        """New at every start (Spark's run id)."""
        return str(self._query.runId)

    @property
    def name(self) -> str:
        """The query's name (``queryName``), None where it has none, as PySpark's."""
        return self._driver.config.name  # type: ignore[return-value]

    @property
    def checkpoint_location(self) -> str:
        """Where the query keeps its checkpoint (``checkpointLocation``), as a path or URI."""
        return self._driver.config.checkpoint

    @property
    def isActive(self) -> bool:  # noqa: N802 - PySpark's name
        return bool(self._query.isActive)

    @property
    def sink(self) -> Sink:
        return self._sink

    @property
    def spark_query(self) -> SparkStreamingQuery:
        """The underlying Spark query (its ``foreachBatch`` runs sparkstate's driver)."""
        return self._query

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        """Wait for the query to end (or ``timeout`` seconds); raises its failure as the
        sparkstate error that failed it (:mod:`.failures`)."""
        try:
            with self._failure_surfaced():
                result = self._query.awaitTermination(timeout)  # type: ignore[arg-type]
        finally:
            if not self._query.isActive:
                self._release()
        return bool(result) if result is not None else None

    def processAllAvailable(self) -> None:  # noqa: N802 - PySpark's name
        with self._failure_surfaced():
            self._query.processAllAvailable()

    @contextlib.contextmanager
    def _failure_surfaced(self) -> Iterator[None]:
        try:
            yield
        except StreamingQueryException as exc:
            error = surfaced(self._driver_error(), exc)
            if error is exc:
                raise
            raise error from error.__cause__  # the user's own exception, where there is one

    def _driver_error(self) -> BaseException | None:
        """The error that failed the driver's batch, if it failed one."""
        if not self._remote:
            return self._driver.error
        log_, start_id = self._log, self._driver.config.start_id
        failure = run_on_server(self._spark(), lambda _: log_.read_failure(start_id), None)
        return failure.error() if failure is not None else None

    def _spark(self) -> Any:
        return self._query._session  # type: ignore[attr-defined] # noqa: SLF001 - Connect's handle

    def stop(self) -> None:
        """Stop the query. A batch in flight is abandoned: nothing of it is committed, and the
        next start runs it again. Returns once the query's tasks have ended (over Spark Connect,
        once the server has ended the driver's process; its tasks may run on a few seconds)."""
        try:
            if self._remote:
                self._query.stop()
            elif self._query.isActive:
                self._stop_running()
            else:
                self._query.stop()
        finally:
            self._release()

    def _stop_running(self) -> None:
        """The driver is told; the batch's jobs are cancelled until it lets go of the batch;
        their tasks end; then Spark stops the query (:mod:`.stopping`)."""
        run_id = str(self._query.runId)
        sc = SparkContext.getOrCreate()
        tasks = RunTasks(sc, run_id)
        self._driver.request_stop(StopRequest(run_id, lambda: not self._query.isActive))
        with quiet_run(sc, run_id, str(self._query.id)):
            cancel_batch(sc, run_id, self._driver.holds_batch)
            tasks.wait_ended()
            self._query.stop()
            if not tasks.wait_ended():
                log.warning("query %s stopped, but some of its tasks still run", self._id)

    def exception(self) -> Any:
        """The error that ended the query (as :meth:`awaitTermination` raises it), or None."""
        spark_exception = self._query.exception()
        if spark_exception is None:
            return None
        return surfaced(self._driver_error(), spark_exception)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self._query.status)

    @property
    def recentProgress(self) -> list[StreamingQueryProgress]:  # noqa: N802 - PySpark's name
        """PySpark's progress objects (dicts too): Spark's progress of each batch with
        sparkstate's state operators, sink and event time on it."""
        spark = {}
        for p in self._query.recentProgress or []:
            d = progress_as_dict(p)
            spark[d.get("batchId")] = d
        merged = [_merge(ours, spark.get(ours["batchId"])) for ours in self._our_progress(spark)]
        return [spark_progress(p, self.runId) for p in merged]

    @property
    def lastProgress(self) -> StreamingQueryProgress | None:  # noqa: N802 - PySpark's name
        recent = self.recentProgress
        return recent[-1] if recent else None

    def _our_progress(self, spark: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
        """The driver's progress of this run: kept in memory here, or, over Spark Connect, read
        back from the checkpoint for the batches Spark's progress of the run names."""
        if not self._remote:
            return self._driver.recent_progress()
        log_ = self._log
        recorded = run_on_server(self._spark(), lambda _: log_.read_progress(), None)
        latest = {p["batchId"]: p for p in recorded if p.get("batchId") in spark}
        return [latest[b] for b in sorted(latest)]

    def explain(self, extended: bool = False) -> None:
        """As PySpark's: print the physical plan of the query Spark runs (its last batch's;
        ``extended``: the logical plans too), then sparkstate's stateful operators."""
        lines = [f"sparkstate query {self._id} ({self._driver.config.output_mode} mode)"]
        for stage in self._stages:
            op = stage.operator
            lines.append(
                f"  op {stage.op_id}: {op.kind} by {stage.partition_columns} "
                f"-> {list(op.output_schema.names)}"
            )
        self._query.explain(extended)
        print("\n".join(lines))

    def _snapshot_on_server(self) -> None:
        """The snapshot at stop of a query driven by a Spark Connect server (its driver's
        process has ended): from a Spark task, which reaches the executors' state homes. Best
        effort, as in a classic session."""
        config, stages, log_ = self._driver.config, self._stages, self._log

        def snapshot(_: None) -> int:
            last = log_.latest_commit()
            return 0 if last is None else snapshot_at_stop(config, stages, last)

        try:
            written = run_on_server(self._spark(), snapshot, None)
        except Exception:  # noqa: BLE001 - the stop goes on; the next start replays instead
            log.warning("could not snapshot the state at stop", exc_info=True)
            return
        log.info("stopped: %d snapshot(s) written", written)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._query.exception() is None:
            if self._remote:
                self._snapshot_on_server()
            else:
                self._driver.snapshot_at_stop()
        with _active_lock:
            if _active.get(self._log.root) is self:
                del _active[self._log.root]
        if self._lock is not None:
            self._lock.release()
        self._sink.stop()
        if self._relay is not None and not self._query.isActive:
            self._relay.release()


def _progress_of(
    recent: Callable[[], list[dict[str, Any]]],
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """Spark's progress of one of a run's batches as its handle's ``recentProgress`` shows it
    (None before the driver has its own), from the run's ``recent`` progress alone: Spark's
    listeners keep it past the run, and the handle and its driver hold the query's plans."""

    def progress_of(spark: dict[str, Any]) -> dict[str, Any] | None:
        for ours in reversed(recent()):
            if ours.get("batchId") == spark.get("batchId"):
                return _merge(ours, spark)
        return None

    return progress_of


def _merge(ours: dict[str, Any], spark: dict[str, Any] | None) -> dict[str, Any]:
    """Spark's progress of the batch (sources, input rates) with our state operators on it."""
    if spark is None:
        return dict(ours)
    merged = without_clock(spark)
    merged["stateOperators"] = ours["stateOperators"]
    merged["sink"] = ours["sink"]
    merged["durationMs"] = {**spark.get("durationMs", {}), **ours["durationMs"]}
    merged["durationMs"]["triggerExecution"] = spark.get("durationMs", {}).get(
        "triggerExecution", ours["durationMs"].get("triggerExecution")
    )
    merged["id"] = ours["id"]
    merged["runId"] = ours["runId"] or spark.get("runId")  # unknown to a driver over Connect
    merged.pop("eventTime", None)
    if "eventTime" in ours:
        merged["eventTime"] = ours["eventTime"]
    return merged
