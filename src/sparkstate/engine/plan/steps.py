"""The steps of a query as the user wrote them, before planning: one dataclass per step type
(:mod:`sparkstate.engine.plan.planners` finds each type's planner)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.sql import DataFrame

from sparkstate.engine.plan.arbitrary.initial_state import InitialState
from sparkstate.functions import AggregateExpression

__all__ = [
    "ARBITRARY_FUNCTION_APIS",
    "PROCESSOR_APIS",
    "AggregateStep",
    "ArbitraryStep",
    "DedupStep",
    "JoinStep",
    "LimitStep",
    "StatelessStep",
    "Step",
    "UnionStep",
    "is_processor",
]


@dataclasses.dataclass(frozen=True)
class AggregateStep:
    """``groupBy(*keys).agg(*aggregates)``."""

    keys: tuple[Any, ...]
    aggregates: tuple[AggregateExpression, ...]


@dataclasses.dataclass(frozen=True)
class DedupStep:
    """``dropDuplicates(columns)`` or ``dropDuplicatesWithinWatermark(columns)``; None means
    every column."""

    columns: tuple[str, ...] | None
    within_watermark: bool = False

    @property
    def api(self) -> str:
        return "dropDuplicatesWithinWatermark" if self.within_watermark else "dropDuplicates"


@dataclasses.dataclass(frozen=True)
class LimitStep:
    """``limit(num)``: stateful in append mode, a per-batch limit of the result in complete
    mode (as Spark plans it), refused in update mode."""

    num: Any


@dataclasses.dataclass(frozen=True)
class ArbitraryStep:
    """``groupBy(*keys)`` then one of the arbitrary-state APIs.

    ``api`` is ``applyInPandasWithState``, ``flatMapGroupsWithState``,
    ``transformWithStateInPandas`` or ``transformWithState``; ``func`` is the user function or the
    ``StatefulProcessor``; ``timing`` the ``GroupStateTimeout`` or the ``timeMode``.
    """

    api: str
    keys: tuple[Any, ...]
    func: Any
    output_schema: Any
    state_schema: Any
    output_mode: str
    timing: str
    row_format: str = "tuple"
    #: ``initialState`` of the processor APIs.
    initial_state: InitialState | None = None
    #: ``eventTimeColumnName`` of the processor APIs ("" for none).
    output_event_time: str = ""


@dataclasses.dataclass(frozen=True)
class StatelessStep:
    """A DataFrame method after a stateful step (``select``, ``where``, ``withColumn``, ...),
    applied to that step's output in the same batch."""

    method: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    def apply(self, df: DataFrame) -> DataFrame:
        result: DataFrame = getattr(df, self.method)(*self.args, **dict(self.kwargs))
        return result


@dataclasses.dataclass(frozen=True)
class JoinStep:
    """``left.join(right, on, how)`` of two streams, planned when it was called (Spark analyses
    it over both inputs): a ``sparkstate.engine.plan.join.plan.JoinPlan``."""

    plan: Any

    @property
    def name(self) -> str:
        return "join"


@dataclasses.dataclass(frozen=True)
class UnionStep:
    """``left.union(right)`` (or ``unionByName``) where an input has stateful steps of its own:
    a ``sparkstate.engine.plan.union.UnionPlan``, both inputs' steps planned at ``start()``."""

    plan: Any

    @property
    def name(self) -> str:
        return "union"


Step = AggregateStep | DedupStep | ArbitraryStep | LimitStep | JoinStep | UnionStep | StatelessStep

#: The APIs of ``ArbitraryStep`` that run a ``StatefulProcessor``.
PROCESSOR_APIS = ("transformWithStateInPandas", "transformWithState")
#: The APIs of ``ArbitraryStep`` that run a function with a ``GroupState``.
ARBITRARY_FUNCTION_APIS = ("applyInPandasWithState", "flatMapGroupsWithState")


def is_processor(step: Step) -> bool:
    """A transformWithState(InPandas) step: Spark 4 lets stateful steps follow it."""
    return isinstance(step, ArbitraryStep) and step.api in PROCESSOR_APIS
