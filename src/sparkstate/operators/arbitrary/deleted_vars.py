"""State variables after ``handle.deleteIfExists(name)``: every later use fails as in PySpark.

Spark's state server forgets a variable it deleted, so PySpark's client for an object obtained
before gets "<Kind> state <name> is not initialized." back and raises ``PySparkRuntimeError``
with the message of the operation; its iterators (``ListState.get``, ``MapState.iterator``,
``keys``, ``values``) end at once instead. A deleted variable here switches class in place, so
the variables still in use pay nothing for the check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

from sparkstate.operators.arbitrary.state_collections import ListState, MapState
from sparkstate.operators.arbitrary.state_errors import deleted_variable_error
from sparkstate.operators.arbitrary.state_vars import StateVariable, ValueState

__all__ = ["retire"]


def _fail(var: StateVariable, kind: str, operation: str) -> NoReturn:
    msg = f"{operation}: {kind} state {var._name} is not initialized."
    raise deleted_variable_error(msg)


class DeletedValueState(ValueState):
    """A ``ValueState`` whose variable was deleted."""

    def exists(self) -> bool:
        _fail(self, "Value", "Error checking value state exists")

    def get(self) -> Any:
        _fail(self, "Value", "Error getting value state")

    def update(self, newValue: Any) -> None:  # noqa: N803 - PySpark's name
        _fail(self, "Value", "Error updating value state")

    def clear(self) -> None:
        _fail(self, "Value", "Error clearing value state")


class DeletedListState(ListState):
    """A ``ListState`` whose variable was deleted."""

    def exists(self) -> bool:
        _fail(self, "List", "Error checking value state exists")

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def put(self, newState: Any) -> None:  # noqa: N803
        _fail(self, "List", "Error updating value state")

    def appendValue(self, newState: Any) -> None:  # noqa: N802, N803
        _fail(self, "List", "Error updating value state")

    def appendList(self, newState: Any) -> None:  # noqa: N802, N803
        _fail(self, "List", "Error updating value state")

    def clear(self) -> None:
        _fail(self, "List", "Error clearing value state")


class DeletedMapState(MapState):
    """A ``MapState`` whose variable was deleted."""

    def exists(self) -> bool:
        _fail(self, "Map", "Error checking map state exists")

    def getValue(self, key: Any) -> tuple[Any, ...] | None:  # noqa: N802
        _fail(self, "Map", "Error getting value")

    def containsKey(self, key: Any) -> bool:  # noqa: N802
        _fail(self, "Map", "Error checking if map state contains key")

    def updateValue(self, key: Any, value: Any) -> None:  # noqa: N802
        _fail(self, "Map", "Error updating map state value")

    def removeKey(self, key: Any) -> None:  # noqa: N802
        _fail(self, "Map", "Error removing key from map state")

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        return iter(())

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def values(self) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def clear(self) -> None:
        _fail(self, "Map", "Error clearing map state")


_DELETED: dict[type, type] = {
    ValueState: DeletedValueState,
    ListState: DeletedListState,
    MapState: DeletedMapState,
}


def retire(var: StateVariable) -> None:
    """Make every later use of ``var`` fail as PySpark's does for a deleted variable."""
    for live, deleted in _DELETED.items():
        if isinstance(var, live) and not isinstance(var, deleted):
            var.__class__ = deleted
            return
