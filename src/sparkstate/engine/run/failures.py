"""How a failed query's error reaches the user: as sparkstate's own error, its line first.

Spark wraps an error raised in ``foreachBatch`` in ``FOREACH_BATCH_USER_FUNCTION_ERROR`` inside a
``StreamingQueryException`` whose first lines are Spark's and py4j's, the real error far below.
The driver keeps the error itself (:attr:`BatchDriver.error`; a task's is rebuilt from the
:class:`~sparkstate.runtime.records.TaskFailure` it left). The handle raises that error instead,
as an instance of a class that is both the error's own and PySpark's ``StreamingQueryException``:
``except CorruptStateFileError`` catches it, and so does the ``except StreamingQueryException``
of a query ported from Spark. Its ``getCondition()``, ``getMessageParameters()`` and
``getSqlState()`` are those of Spark's exception of the same failure (``STREAM_FAILED``, the
query's ``id`` and ``runId``; ``StreamingQuery.exception()`` gives none, as PySpark's does), but
for the ``message`` parameter, which is sparkstate's message: for a state schema change Spark
refuses too, it starts with Spark's condition (``[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] ...``),
as the message parameter of Spark's does. Spark's exception stays reachable as
``spark_exception``.
"""

from __future__ import annotations

import threading
from typing import Any

from pyspark.errors import PySparkException, StreamingQueryException

from sparkstate.exceptions import SparkstateError, UserFunctionError
from sparkstate.runtime.records import raised_by_user_function, user_traceback

__all__ = ["surfaced"]

_classes: dict[type[BaseException], type[BaseException]] = {}
_classes_lock = threading.Lock()


def surfaced(error: BaseException | None, spark_exception: BaseException) -> BaseException:
    """``error`` (what failed the driver's batch) as the query's exception; Spark's own where
    the error is neither sparkstate's nor a user function's (Spark's text says it all)."""
    if error is None:
        return spark_exception
    if not isinstance(error, SparkstateError):
        if not raised_by_user_function(error):
            return spark_exception
        original, error = error, UserFunctionError(user_traceback(error).rstrip("\n"))
        error.__cause__ = original
    cls = _query_class(type(error))
    out: Any = cls.__new__(cls, *error.args)
    out.__dict__.update(error.__dict__)  # notes included
    condition, parameters, sql_state = _spark_failure(error, spark_exception)
    PySparkException.__init__(
        out, message=str(error), errorClass=condition, messageParameters=parameters
    )
    out._sql_state = sql_state
    out.__cause__ = error.__cause__
    out.__context__ = spark_exception
    out.__suppress_context__ = True  # Spark's text of the same error is not printed again
    out.spark_exception = spark_exception
    return out  # type: ignore[no-any-return]


def _spark_failure(
    error: BaseException, spark_exception: BaseException
) -> tuple[str | None, dict[str, str] | None, str | None]:
    """The condition, parameters and SQLSTATE of Spark's exception of the failure, with
    ``error``'s message as the ``message`` parameter."""
    if not isinstance(spark_exception, PySparkException):
        return None, None, None
    parameters = spark_exception.getMessageParameters()
    if parameters is not None and "message" in parameters:
        parameters = {**parameters, "message": str(error)}
    return spark_exception.getCondition(), parameters, spark_exception.getSqlState()


def _sql_state(self: Any) -> str | None:
    """Spark's SQLSTATE of the failure (PySpark's table has no entry for ``STREAM_FAILED``)."""
    return getattr(self, "_sql_state", None)


def _query_class(kind: type[BaseException]) -> type[BaseException]:
    """``kind`` that is also PySpark's ``StreamingQueryException``, one class per ``kind``."""
    with _classes_lock:
        cls = _classes.get(kind)
        if cls is None:
            cls = type(
                kind.__name__,
                (kind, StreamingQueryException),
                {
                    "__module__": kind.__module__,
                    "__qualname__": kind.__qualname__,
                    "__doc__": kind.__doc__,
                    "__str__": kind.__str__,
                    "getSqlState": _sql_state,
                    "__reduce__": lambda self: (kind, self.args),
                },
            )
            _classes[kind] = cls
        return cls
