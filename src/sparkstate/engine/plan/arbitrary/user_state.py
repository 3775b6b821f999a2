"""The ``GroupState`` a query's user function receives: ours, and PySpark's class as well.

Ported code (and Spark's own tests) check ``isinstance(state, pyspark.sql.streaming.state.
GroupState)``; these classes put PySpark's class behind ours in the method order, so every
method is still ours (no JVM, same speed) and the check holds. They live in the engine, the only
package that imports pyspark; the operator is given them when the query is planned.
"""

from __future__ import annotations

from pyspark.errors import PySparkRuntimeError
from pyspark.sql.streaming.state import GroupState as PySparkGroupState

from sparkstate.operators.arbitrary.group_state import GroupState, PickledGroupState
from sparkstate.operators.arbitrary.state_errors import (
    StateVariableDeletedError,
    UnsupportedStateOperationError,
    raise_deleted_as,
)

__all__ = [
    "SPARK_GROUP_STATES",
    "SparkGroupState",
    "SparkPickledGroupState",
    "SparkStateVariableDeletedError",
    "SparkUnsupportedStateOperationError",
    "use_spark_errors",
]


class SparkUnsupportedStateOperationError(UnsupportedStateOperationError, PySparkRuntimeError):
    """What PySpark's ``GroupState`` raises as ``PySparkRuntimeError`` (a timeout the query's
    timeout conf does not allow, the watermark of a query without one), ours too."""

    def __init__(self, msg: str) -> None:
        UnsupportedStateOperationError.__init__(self, msg)
        PySparkRuntimeError.__init__(self, message=msg)


class SparkGroupState(GroupState, PySparkGroupState):  # type: ignore[misc]
    """A :class:`~sparkstate.GroupState` that is also PySpark's ``GroupState``."""

    __slots__ = ()
    unsupported_error = SparkUnsupportedStateOperationError


class SparkPickledGroupState(PickledGroupState, PySparkGroupState):  # type: ignore[misc]
    """A ``sparkstate.PICKLED`` state's ``GroupState``, also PySpark's ``GroupState``."""

    __slots__ = ()
    unsupported_error = SparkUnsupportedStateOperationError


#: The state classes of a row (tuple) state and of a ``sparkstate.PICKLED`` state.
SPARK_GROUP_STATES: tuple[type[GroupState], type[GroupState]] = (
    SparkGroupState,
    SparkPickledGroupState,
)


class SparkStateVariableDeletedError(StateVariableDeletedError, PySparkRuntimeError):
    """A deleted state variable's use, raised as PySpark raises it (``PySparkRuntimeError``)."""

    def __init__(self, msg: str) -> None:
        StateVariableDeletedError.__init__(self, msg)
        PySparkRuntimeError.__init__(self, message=msg)


def use_spark_errors() -> None:
    """In a Python worker: the state API's errors are PySpark's classes too."""
    raise_deleted_as(SparkStateVariableDeletedError)
