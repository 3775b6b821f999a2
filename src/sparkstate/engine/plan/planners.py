"""One planner per step type, found from the step's class.

Every planner takes the step and the :class:`~sparkstate.engine.plan.stage.PlanContext` of its
place in the query and gives back a :class:`~sparkstate.engine.plan.stage.Planned`. A step type
without a planner is an error: :mod:`sparkstate.engine.plan.chain` never guesses what a step
means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkstate.engine.plan.aggregate.plan import plan_aggregate
from sparkstate.engine.plan.arbitrary.plan import plan_arbitrary
from sparkstate.engine.plan.dedup import plan_dedup
from sparkstate.engine.plan.join.plan import plan_join_step
from sparkstate.engine.plan.limit import plan_limit
from sparkstate.engine.plan.stage import PlanContext, Planned
from sparkstate.engine.plan.steps import (
    AggregateStep,
    ArbitraryStep,
    DedupStep,
    JoinStep,
    LimitStep,
)

__all__ = ["PLANNERS", "Planner", "planner_for"]

#: A planner: ``(step, context) -> Planned``, for the step type it is registered under.
Planner = Callable[[Any, PlanContext], Planned]

#: The planner of each stateful step type.
PLANNERS: dict[type, Planner] = {
    AggregateStep: plan_aggregate,
    ArbitraryStep: plan_arbitrary,
    DedupStep: plan_dedup,
    JoinStep: plan_join_step,
    LimitStep: plan_limit,
}


def planner_for(step: object) -> Planner:
    """The planner of ``step``'s type (or of the nearest of its base classes that has one)."""
    for cls in type(step).__mro__:
        planner = PLANNERS.get(cls)
        if planner is not None:
            return planner
    known = ", ".join(sorted(cls.__name__ for cls in PLANNERS))
    msg = f"no planner for the step {step!r}: a stateful step is one of {known}"
    raise TypeError(msg)
