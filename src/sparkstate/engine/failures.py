"""How a failed query's error reaches the user: as sparkstate's own error, its line first.

Spark wraps an error raised in ``foreachBatch`` in ``FOREACH_BATCH_USER_FUNCTION_ERROR`` inside a
``StreamingQueryException`` whose first lines are Spark's and py4j's, the real error far below.
The driver keeps the error itself (:attr:`BatchDriver.error`; a task's is rebuilt from the
:class:`~sparkstate.runtime.records.TaskFailure` it left). The handle raises that error instead,
as an instance of a class that is both the error's own and PySpark's ``StreamingQueryException``:
``except CorruptStateFileError`` catches it, and so does the ``except StreamingQueryException``
of a query ported from Spark. Spark's exception stays reachable as ``spark_exception``.
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
    PySparkException.__init__(out, message=str(error))
    out.__cause__ = error.__cause__
    out.__context__ = spark_exception
    out.__suppress_context__ = True  # Spark's text of the same error is not printed again
    out.spark_exception = spark_exception
    return out  # type: ignore[no-any-return]


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
                    "__reduce__": lambda self: (kind, self.args),
                },
            )
            _classes[kind] = cls
        return cls
