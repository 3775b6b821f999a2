"""Stopping a query in the middle of a batch: the batch is abandoned, and Spark knows why.

Spark's ``StreamingQuery.stop()`` marks the query terminated, cancels its job group and interrupts
its stream thread. With the stream thread inside sparkstate's ``foreachBatch`` function, that
alone floods the terminal:

- the batch's error goes back to Spark as the Python traceback of a ``Py4JJavaError``, which quotes
  a whole Java stack trace. Spark decides whether an error of a stopped query is the stop's own by
  matching that text with ``StreamExecution.PROXY_ERROR``, whose ``(.|\\r\\n|\\r|\\n)*`` recurses
  once per character: the stream thread dies of a ``StackOverflowError`` (1,024 frames of
  ``java.util.regex``).

So :meth:`StreamingQuery.stop <sparkstate.engine.query.StreamingQuery.stop>` tells the driver
first (:class:`StopRequest`): a batch the driver abandons ends in :class:`BatchCancelled`, short
and worded as Spark's cancelled job group, so Spark ends the query as stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from sparkstate.exceptions import QueryError

__all__ = ["BatchCancelled", "StopRequest", "hide_cancelled_from_py4j"]

#: How long an abandoned batch waits for Spark to mark its query stopped before it raises.
SPARK_STOP_WAIT_S = 30.0
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
