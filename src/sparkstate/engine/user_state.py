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
from sparkstate.operators.arbitrary.state_errors import StateVariableDeletedError, raise_deleted_as

__all__ = [
    "SPARK_GROUP_STATES",
    "SparkGroupState",
    "SparkPickledGroupState",
    "SparkStateVariableDeletedError",
    "use_spark_errors",
]


class SparkGroupState(GroupState, PySparkGroupState):  # type: ignore[misc]
    """A :class:`~sparkstate.GroupState` that is also PySpark's ``GroupState``."""

    __slots__ = ()


class SparkPickledGroupState(PickledGroupState, PySparkGroupState):  # type: ignore[misc]
    """A ``sparkstate.PICKLED`` state's ``GroupState``, also PySpark's ``GroupState``."""

    __slots__ = ()


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
