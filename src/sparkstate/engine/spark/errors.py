"""Spark's errors, raised where sparkstate refuses what Spark's analyzer refuses.

A query Spark refuses fails with PySpark's ``AnalysisException`` carrying an error condition
(``STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE``); users catch it by type and branch on
``getCondition()`` (an argument it refuses outright, an ``IllegalArgumentException``). Ours is
the same exception with the same condition and parameters, and also
the :class:`~sparkstate.exceptions.ConfigurationError` sparkstate raises for a query it cannot
run, with sparkstate's message (what to do instead). It lives here, not in
``sparkstate.exceptions``, which the layers without pyspark import.
"""

from __future__ import annotations

from typing import Any

from pyspark.errors import AnalysisException, IllegalArgumentException, PySparkException

from sparkstate.exceptions import ConfigurationError

__all__ = [
    "SQLSTATES",
    "SparkAnalysisError",
    "SparkIllegalArgumentError",
    "unsupported_operation",
]

#: The SQLSTATE of each error class sparkstate raises, from Spark's ``error-conditions.json``
#: (PySpark's own copy holds only the errors raised in Python, so it cannot say).
SQLSTATES = {
    "STATE_STORE_UNSUPPORTED_OPERATION_BINARY_INEQUALITY": "XXKST",
    "STREAMING_OUTPUT_MODE": "42KDE",
}


class _SparkRefusal(ConfigurationError, PySparkException):
    """Spark's error ``condition`` with its ``parameters``, and sparkstate's ``message``."""

    def __init__(self, message: str, condition: str, parameters: dict[str, str]) -> None:
        ConfigurationError.__init__(self, message)
        PySparkException.__init__(
            self, message=message, errorClass=condition, messageParameters=parameters
        )

    def getSqlState(self) -> str | None:  # noqa: N802 - PySpark's name
        return SQLSTATES.get(str(self.getCondition()).split(".")[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self._message, self.getCondition(), self.getMessageParameters())


class SparkAnalysisError(_SparkRefusal, AnalysisException):
    """A query that Spark's analyzer refuses with ``condition`` and ``parameters``.

    ``str()`` is ``[condition] message``, as PySpark shows its own; ``message`` is sparkstate's,
    and starts with Spark's text where the condition has one."""


class SparkIllegalArgumentError(_SparkRefusal, IllegalArgumentException):
    """An argument Spark refuses with its ``IllegalArgumentException`` (an output mode it does
    not know, a file sink without a path), with ``condition`` and ``parameters``."""


def unsupported_operation(message: str, mode: str, operation: str) -> SparkAnalysisError:
    """Spark's error for an output mode that the query's operations do not take."""
    parameters = {"outputMode": mode, "operation": operation}
    return SparkAnalysisError(message, "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION", parameters)
