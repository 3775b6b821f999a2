"""Stopping a query in the middle of a batch: the batch is abandoned, quietly, in bounded time.

Spark's ``StreamingQuery.stop()`` marks the query terminated, cancels its job group and interrupts
its stream thread. With the stream thread inside sparkstate's ``foreachBatch`` function, that
alone floods the terminal:

- the batch's error goes back to Spark as the Python traceback of a ``Py4JJavaError``, which quotes
  a whole Java stack trace. Spark decides whether an error of a stopped query is the stop's own by
  matching that text with ``StreamExecution.PROXY_ERROR``, whose ``(.|\\r\\n|\\r|\\n)*`` recurses
  once per character: the stream thread dies of a ``StackOverflowError`` (1,024 frames of
  ``java.util.regex``);
- the cancelled write of the file sink is aborted with an ERROR and a stack trace on the driver
  ("Aborting job") and in each task killed mid-write ("Aborting task"), and tasks that still run
  after the abort fail on the directories it deleted.

So :meth:`StreamingQuery.stop <sparkstate.engine.query.StreamingQuery.stop>` tells the driver
first (:class:`StopRequest`): a batch the driver abandons ends in :class:`BatchCancelled`, short
and worded as Spark's cancelled job group, so Spark ends the query as stopped. While Spark stops,
:func:`quiet_run` drops the log events of the stopping run's own threads (its stream thread, its
tasks in this JVM), and :class:`RunTasks` waits until those tasks are gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import SparkContext

from sparkstate.exceptions import QueryError

__all__ = [
    "BatchCancelled",
    "RunTasks",
    "StopRequest",
    "hide_cancelled_from_py4j",
    "quiet_run",
    "tag_tasks",
]

log = logging.getLogger("sparkstate.engine")

#: The job group of a query's stream thread: Spark's run id of the query.
JOB_GROUP = "spark.jobGroup.id"
#: A local property of the stream thread, so of every job it runs; executors put the ``mdc.``
#: properties of a task into the logging context of the thread that runs it.
TASK_RUN_KEY = "mdc.sparkstate.runId"
#: How long an abandoned batch waits for Spark to mark its query stopped before it raises.
SPARK_STOP_WAIT_S = 30.0
#: How long ``stop()`` waits for the tasks of the stopping run to end.
TASKS_WAIT_S = 30.0
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

    def cancelled(self, batch_id: int) -> BatchCancelled:
        """The error to end ``batch_id`` with, once Spark has marked the query stopped (before
        that, Spark would take the error for a failure of the query)."""
        deadline = time.monotonic() + SPARK_STOP_WAIT_S
        while not self.spark_stopped() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return BatchCancelled(batch_id, self.run_id)


def tag_tasks(sc: SparkContext) -> None:
    """Put the run id into the logging context of every task of the calling stream thread's jobs
    (the foreachBatch function runs on that thread), so :func:`quiet_run` knows them."""
    run_id = sc.getLocalProperty(JOB_GROUP)
    if run_id is not None and sc.getLocalProperty(TASK_RUN_KEY) != run_id:
        sc.setLocalProperty(TASK_RUN_KEY, run_id)


@contextlib.contextmanager
def quiet_run(sc: SparkContext, run_id: str) -> Iterator[None]:
    """Drop the log events of one run's threads while it stops: Spark logs the abort of every
    cancelled write with a stack trace. Events of any other thread are untouched.

    A filter of log4j's configuration, matching the run id in the logging context of the thread
    that logs; nothing is filtered if the JVM does not log through log4j 2.
    """
    try:
        config, deny = _add_run_filter(sc, run_id)
    except Exception:  # noqa: BLE001 - another logging backend: stop without the filter
        log.debug("no log4j 2 configuration to quiet the stop of run %s", run_id, exc_info=True)
        config = deny = None
    try:
        yield
    finally:
        if config is not None:
            config.removeFilter(deny)
            deny.stop()


def _add_run_filter(sc: SparkContext, run_id: str) -> tuple[Any, Any]:
    """Add to log4j's configuration a filter that denies the events of the run's threads."""
    jvm: Any = sc._jvm
    log4j = jvm.org.apache.logging.log4j
    config = log4j.LogManager.getContext(False).getConfiguration()
    # the stream thread keeps the run id in its logging context under Spark's LogKeys.RUN_ID
    stream_key = jvm.org.apache.spark.internal.LogKeys.RUN_ID.name()
    pairs = sc._gateway.new_array(log4j.core.util.KeyValuePair, 2)  # type: ignore[union-attr]
    pairs[0] = log4j.core.util.KeyValuePair(stream_key, run_id)
    pairs[1] = log4j.core.util.KeyValuePair(TASK_RUN_KEY, run_id)
    result = log4j.core.Filter.Result
    deny = log4j.core.filter.ThreadContextMapFilter.createFilter(
        pairs, "or", result.DENY, result.NEUTRAL
    )
    deny.start()
    config.addFilter(deny)
    return config, deny


class RunTasks:
    """The jobs of one run (its job group) that may still have tasks when the run stops."""

    def __init__(self, sc: SparkContext, run_id: str) -> None:
        self.tracker = sc.statusTracker()
        self.run_id = run_id
        self.seen = set(self.tracker.getJobIdsForGroup(run_id))
        self.active = set(self.tracker.getActiveJobsIds()) & self.seen

    def wait_ended(self, timeout_s: float = TASKS_WAIT_S) -> bool:
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
