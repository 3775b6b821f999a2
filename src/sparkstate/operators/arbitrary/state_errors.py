"""Errors raised to user code by ``GroupState`` and the ``StatefulProcessor`` handle.

They extend the tree of :mod:`sparkstate.exceptions` and the builtin PySpark's own error for the
same misuse derives from, so ``except ValueError`` in a ported function keeps working::

    SparkstateError
    └── StateApiError                                   misuse of the arbitrary-state API
        ├── StateNotExistsError (ValueError)            GroupState.get on an absent state
        ├── InvalidStateValueError (ValueError)         None state, non-positive duration, ...
        ├── InvalidOutputError (ValueError)             returned rows that do not fit the output
        ├── UnsupportedStateOperationError (RuntimeError)
        │                                               not allowed in this timeout/time mode
        │                                               or at this point of the processor's life
        └── StateVariableDeletedError (RuntimeError)    use of a variable after deleteIfExists
"""

from __future__ import annotations

from sparkstate.exceptions import SparkstateError

__all__ = [
    "InvalidOutputError",
    "InvalidStateValueError",
    "StateApiError",
    "StateNotExistsError",
    "StateVariableDeletedError",
    "UnsupportedStateOperationError",
]


class StateApiError(SparkstateError):
    """User code used GroupState or a StatefulProcessor handle in a way Spark does not allow."""


class StateNotExistsError(StateApiError, ValueError):
    """The state of the current key does not exist (never set, removed or expired)."""


class InvalidStateValueError(StateApiError, ValueError):
    """A state value, duration or timestamp that Spark would refuse."""


class InvalidOutputError(StateApiError, ValueError):
    """The user function returned something that is not rows of the declared output schema."""


class UnsupportedStateOperationError(StateApiError, RuntimeError):
    """An operation the configured timeout / time mode or the handle's life stage forbids."""


class StateVariableDeletedError(StateApiError, RuntimeError):
    """A state variable object used after ``handle.deleteIfExists`` deleted its variable."""


#: What a deleted variable's use raises: the engine makes it a subclass that is PySpark's
#: ``PySparkRuntimeError`` too, which users' code (and Spark's own tests) catch.
_deleted_error: list[type[StateVariableDeletedError]] = [StateVariableDeletedError]


def deleted_variable_error(msg: str) -> StateVariableDeletedError:
    """The error of an operation on a variable ``deleteIfExists`` deleted."""
    return _deleted_error[0](msg)


def raise_deleted_as(cls: type[StateVariableDeletedError]) -> None:
    """Make :func:`deleted_variable_error` raise ``cls`` (a subclass of the error)."""
    _deleted_error[0] = cls
