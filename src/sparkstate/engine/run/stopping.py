"""Stopping a query in the middle of a batch: the batch is abandoned, quietly, in bounded time.

Spark's ``StreamingQuery.stop()`` marks the query terminated, cancels its job group and interrupts
its stream thread. With the stream thread inside sparkstate's ``foreachBatch`` function, that
alone floods the terminal:

- the batch's error goes back to Spark as the Python traceback of a ``Py4JJavaError``, which quotes
  a whole Java stack trace. Spark decides whether an error of a stopped query is the stop's own by
  matching that text with ``StreamExecution.PROXY_ERROR``, whose ``(.|\\r\\n|\\r|\\n)*`` recurses
  once per character: the stream thread dies of a ``StackOverflowError`` (1,024 frames of
  ``java.util.regex``);
- the interrupted write of the file sink is aborted while its tasks still run: an ERROR and a
  stack trace on the driver ("Aborting job"), one in each task killed mid-write ("Aborting task"),
  and tasks that start writing as the abort deletes their directory fail with theirs.

So :meth:`StreamingQuery.stop <sparkstate.engine.run.query.StreamingQuery.stop>` tells the driver
first (:class:`StopRequest`), cancels the jobs of the batch in flight (their tag, set by
:func:`batch_jobs`) until the driver lets go of the batch, waits for their tasks
(:class:`RunTasks`), and only then lets Spark stop the query. A batch the driver abandons ends
in :class:`BatchCancelled`, short and worded as Spark's cancelled job group, so Spark ends the
query as stopped. Spark still logs the abort of the cancelled write; :func:`quiet_run` drops, while
the query stops, the log events of its own threads and the scheduler's warnings about its tasks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import SparkContext

from sparkstate.exceptions import QueryError

__all__ = [
    "BatchCancelled",
    "RunTasks",
    "StopRequest",
    "batch_jobs",
    "cancel_batch",
    "hide_cancelled_from_py4j",
    "quiet_run",
]

log = logging.getLogger("sparkstate.engine")

#: The job group of a query's stream thread: Spark's run id of the query.
JOB_GROUP = "spark.jobGroup.id"
#: A local property of the stream thread, so of every job it runs; executors put the ``mdc.``
#: properties of a task into the logging context of the thread that runs it.
TASK_RUN_KEY = "mdc.sparkstate.runId"
#: The bound on each wait of a stop: for Spark to mark the query stopped, for the driver to let go
#: of its batch, for the run's tasks to end.
STOP_WAIT_S = 30.0
_POLL_S = 0.02


class BatchCancelled(QueryError):
    """The error that ends a batch abandoned because its query is stopping.

    Spark ends the query as stopped, not failed, when the error of its foreachBatch function names
    a ``SparkException`` and its cancelled job group (``StreamExecution.isInterruptionException``);
    the text is short, so Spark's matching stays cheap. The user never sees it.
    """

    def __init__(self, batch_id: int, run_id: str) -> None:
        super().__init__(
            f"batch {batch_id} is abandoned: the query was stopped "
            f"(org.apache.spark.SparkException: job group {run_id} cancelled)"
        )


@dataclasses.dataclass(frozen=True)
class StopRequest:
    """``stop()`` was called: the driver starts no batch and commits nothing of one in flight."""

    run_id: str
    spark_stopped: Callable[[], bool]
    #: Set once the driver has let go of its batch (it waits for Spark to stop the query).
    let_go: threading.Event = dataclasses.field(default_factory=threading.Event)

    def cancelled(self, batch_id: int) -> BatchCancelled:
        """The error to end ``batch_id`` with, once Spark has marked the query stopped (before
        that, Spark would take the error for a failure of the query)."""
        self.let_go.set()
        deadline = time.monotonic() + STOP_WAIT_S
        while not self.spark_stopped() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return BatchCancelled(batch_id, self.run_id)


def _job_tag(run_id: str) -> str:
    """The tag of the jobs that batches of the run start (no job Spark starts between batches)."""
    return f"sparkstate-batch-{run_id}"


@contextlib.contextmanager
def batch_jobs(sc: SparkContext) -> Iterator[None]:
    """Mark the jobs of one batch, started on the calling stream thread (the foreachBatch function
    runs on it): a tag that :func:`cancel_batch` cancels, and the run id in the logging context
    of their tasks, which :func:`quiet_run` matches."""
    run_id = sc.getLocalProperty(JOB_GROUP)
    if run_id is None:  # not on a stream thread
        yield
        return
    if sc.getLocalProperty(TASK_RUN_KEY) != run_id:
        sc.setLocalProperty(TASK_RUN_KEY, run_id)
    sc.addJobTag(_job_tag(run_id))
    try:
        yield
    finally:
        sc.removeJobTag(_job_tag(run_id))


def cancel_batch(sc: SparkContext, run_id: str, holds_batch: Callable[[], bool]) -> None:
    """Cancel the batch's jobs until the driver lets go of the batch (or finishes it).

    Cancelling kills a job's tasks before it fails the job, so the write the job ran is aborted
    after its tasks were told to stop, not while they run on (as when Spark interrupts the stream
    thread under the write). Again and again: the batch may start a job after the first cancel.
    """
    deadline = time.monotonic() + STOP_WAIT_S
    while holds_batch() and time.monotonic() < deadline:
        sc.cancelJobsWithTag(_job_tag(run_id))
        time.sleep(_POLL_S)


class RunTasks:
    """The jobs of one run (its job group) that may still have tasks when the run stops."""

    def __init__(self, sc: SparkContext, run_id: str) -> None:
        self.tracker = sc.statusTracker()
        self.run_id = run_id
        self.seen = set(self.tracker.getJobIdsForGroup(run_id))
        self.active = set(self.tracker.getActiveJobsIds()) & self.seen

    def wait_ended(self, timeout_s: float = STOP_WAIT_S) -> bool:
        """Wait until no task of the run's jobs runs (those active when this object was made, and
        any started since); False if some still ran after ``timeout_s``."""
        jobs = self.active | (set(self.tracker.getJobIdsForGroup(self.run_id)) - self.seen)
        stages: set[int] = set()
        for job in jobs:
            info = self.tracker.getJobInfo(job)
            if info is not None:
                stages.update(info.stageIds)
        deadline = time.monotonic() + timeout_s
        while any(self._running(stage) for stage in stages):
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def _running(self, stage: int) -> bool:
        info: Any = self.tracker.getStageInfo(stage)
        return info is not None and info.numActiveTasks > 0


@contextlib.contextmanager
def quiet_run(sc: SparkContext, run_id: str, query_id: str) -> Iterator[None]:
    """Drop, while a query stops, the log events of its run's threads (its stream thread, its
    tasks in this JVM) and the scheduler's warnings about its tasks: Spark logs the abort of the
    cancelled write with stack traces. Nothing else is filtered.

    Filters of log4j's configuration: one matches the run id in the logging context of the thread
    that logs, one the ``[queryId = ...]`` that starts the scheduler's messages about a streaming
    query's tasks. Nothing is filtered if the JVM does not log through log4j 2.
    """
    try:
        config, filters = _add_filters(sc, run_id, query_id)
    except Exception:  # noqa: BLE001 - another logging backend: stop without the filters
        log.debug("no log4j 2 configuration to quiet the stop of run %s", run_id, exc_info=True)
        config, filters = None, []
    try:
        yield
    finally:
        for f in filters:
            config.removeFilter(f)
            f.stop()


def _add_filters(sc: SparkContext, run_id: str, query_id: str) -> tuple[Any, list[Any]]:
    jvm: Any = sc._jvm
    log4j = jvm.org.apache.logging.log4j
    config = log4j.LogManager.getContext(False).getConfiguration()
    result = log4j.core.Filter.Result
    # the stream thread keeps the run id in its logging context under Spark's LogKeys.RUN_ID
    try:  # a Java enum from Spark 4.1
        stream_key = str(jvm.org.apache.spark.internal.LogKeys.RUN_ID.name())
    except Exception:  # noqa: BLE001 - Spark 4.0: a Scala object, its key the lower-case name
        stream_key = "run_id"
    pairs = sc._gateway.new_array(log4j.core.util.KeyValuePair, 2)  # type: ignore[union-attr]
    pairs[0] = log4j.core.util.KeyValuePair(stream_key, run_id)
    pairs[1] = log4j.core.util.KeyValuePair(TASK_RUN_KEY, run_id)
    threads = log4j.core.filter.ThreadContextMapFilter.createFilter(
        pairs, "or", result.DENY, result.NEUTRAL
    )
    # the scheduler shortens the query id (to 5 characters unless configured otherwise)
    scheduler = log4j.core.filter.RegexFilter.createFilter(
        rf"(?s)\[queryId = {_any_prefix(query_id)}\] .*", None, False, result.DENY, result.NEUTRAL
    )
    filters = [threads, scheduler]
    for f in filters:
        f.start()
        config.addFilter(f)
    return config, filters


def _any_prefix(text: str) -> str:
    """A regular expression that matches any non-empty prefix of ``text``."""
    head, *rest = (re.escape(c) for c in text)
    return head + "".join(f"(?:{c}" for c in rest) + ")?" * len(rest)


class _HideCancelled(logging.Filter):
    """py4j logs the error of a Python callback with its traceback; not that of a stop."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, BatchCancelled)


_HIDE_CANCELLED = _HideCancelled()


def hide_cancelled_from_py4j() -> None:
    """Keep py4j from logging :class:`BatchCancelled` (with a traceback, at ERROR)."""
    for name in ("py4j.clientserver", "py4j.java_gateway"):
        logger = logging.getLogger(name)
        if _HIDE_CANCELLED not in logger.filters:
            logger.addFilter(_HIDE_CANCELLED)
