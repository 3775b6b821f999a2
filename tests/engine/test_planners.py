"""Each stateful step type has its planner, found from the step's class; a step without one is an
error before anything is planned (never planned as some other step). A union of stateful steps'
outputs has no operator of its own: plan.py plans each input's steps, each by its planner."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from sparkstate.engine.plan.chain import plan_chain
from sparkstate.engine.plan.planners import PLANNERS, planner_for
from sparkstate.engine.plan.steps import DedupStep, StatelessStep, Step, UnionStep


@dataclasses.dataclass(frozen=True)
class SortWithinGroups:
    """A step type no planner knows."""

    columns: tuple[str, ...]


def test_every_stateful_step_type_has_a_planner() -> None:
    stateful = {t for t in typing.get_args(Step) if t not in (StatelessStep, UnionStep)}
    assert set(PLANNERS) == stateful


def test_a_subclass_of_a_step_is_planned_as_its_base() -> None:
    @dataclasses.dataclass(frozen=True)
    class Distinct(DedupStep):
        pass

    assert planner_for(Distinct(None)) is PLANNERS[DedupStep]


def test_an_unknown_step_is_an_error() -> None:
    with pytest.raises(TypeError, match="no planner for the step SortWithinGroups"):
        planner_for(SortWithinGroups(("k",)))
    with pytest.raises(TypeError, match="SortWithinGroups"):
        plan_chain(None, [SortWithinGroups(("k",))], "append", None)  # type: ignore[arg-type, list-item]
