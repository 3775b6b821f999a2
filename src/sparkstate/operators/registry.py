"""Operator classes by kind: the ``kind`` a checkpoint's ``metadata.json`` records for each
operator, to the class that wrote it and knows how its state is laid out and shown
(:class:`~sparkstate.operators.state_layout.StateLayout`)."""

from __future__ import annotations

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.aggregation.aggregate import StreamingAggregate
from sparkstate.operators.aggregation.session_window import SessionWindowAggregate
from sparkstate.operators.arbitrary.flat_map_groups import (
    ApplyInPandasWithState,
    FlatMapGroupsWithState,
)
from sparkstate.operators.arbitrary.transform_with_state import TransformWithState
from sparkstate.operators.base import StatefulOperator
from sparkstate.operators.dedup import Deduplicate, DeduplicateWithinWatermark
from sparkstate.operators.join import StreamingJoin
from sparkstate.operators.limit import StreamingLimit
from sparkstate.operators.state_layout import StateLayout

__all__ = ["OPERATORS", "layout_of", "operator_class"]

#: Every stateful operator class, by its kind.
OPERATORS: dict[str, type[StatefulOperator]] = {
    cls.kind: cls
    for cls in (
        StreamingAggregate,
        SessionWindowAggregate,
        Deduplicate,
        DeduplicateWithinWatermark,
        StreamingJoin,
        StreamingLimit,
        FlatMapGroupsWithState,
        ApplyInPandasWithState,
        TransformWithState,
    )
}


def operator_class(kind: str) -> type[StatefulOperator]:
    """The operator class of ``kind``; an unknown kind is an error that names the known ones."""
    found = OPERATORS.get(kind)
    if found is None:
        msg = f"no stateful operator of kind {kind!r}; the kinds are {sorted(OPERATORS)}"
        raise ConfigurationError(msg)
    return found


def layout_of(kind: str) -> type[StateLayout]:
    """How the state of an operator of ``kind`` is laid out and shown: its class's answers, or
    the defaults (one store, keys and values as stored) for a kind this version does not know."""
    return OPERATORS.get(kind, StateLayout)
