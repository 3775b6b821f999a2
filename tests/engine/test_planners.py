"""Each stateful step type plans itself and says where it may stand in a line of steps, as
Spark's rules put it; the chain asks the step, never its type's name. A step of no known kind is
an error before anything is planned. A union of stateful steps' outputs has no operator of its
own: the chain plans each input's steps, each by its own type."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import sparkstate.engine.api.stream  # noqa: F401 - every step type the API makes
from sparkstate.engine.plan.aggregate.plan import AggregateStep
from sparkstate.engine.plan.arbitrary.plan import ArbitraryStep
from sparkstate.engine.plan.chain import plan_chain
from sparkstate.engine.plan.dedup import DedupStep
from sparkstate.engine.plan.limit import LimitStep
from sparkstate.engine.plan.stage import StatefulStep, StatelessStep
from sparkstate.exceptions import ConfigurationError


@dataclasses.dataclass(frozen=True)
class SortWithinGroups:
    """A step type that is no step."""

    columns: tuple[str, ...]


def _step_types(cls: type[StatefulStep] = StatefulStep) -> set[type[StatefulStep]]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_step_types(sub)}
    return found


def test_every_stateful_step_type_plans_itself() -> None:
    types = _step_types()
    assert {AggregateStep, ArbitraryStep, DedupStep, LimitStep} <= types
    for cls in types:
        assert not inspect.isabstract(cls), cls
        assert cls.plan is not StatefulStep.plan, cls


def test_a_subclass_of_a_step_is_planned_as_its_base() -> None:
    @dataclasses.dataclass(frozen=True)
    class Distinct(DedupStep):
        pass

    assert Distinct.plan is DedupStep.plan
    assert Distinct(None).carried_watermark_in


def test_an_unknown_step_is_an_error() -> None:
    with pytest.raises(TypeError, match="no planner for the step SortWithinGroups"):
        plan_chain(None, [SortWithinGroups(("k",))], "append", None)  # type: ignore[arg-type, list-item]


def _apply_in_pandas(mode: str) -> ArbitraryStep:
    return ArbitraryStep("applyInPandasWithState", ("k",), None, None, None, mode, "NoTimeout")


def test_a_limit_after_an_aggregation_in_complete_mode_limits_each_result() -> None:
    agg = AggregateStep(("k",), ())
    assert LimitStep(3).checked([agg], "complete") == StatelessStep("limit", (3,))
    assert LimitStep(3).checked([agg], "append") == LimitStep(3)
    with pytest.raises(ConfigurationError, match="Update output mode"):
        LimitStep(3).checked([], "update")
    with pytest.raises(ConfigurationError, match="Java int"):
        LimitStep(2**31).checked([], "append")


def test_what_may_follow_an_arbitrary_state_function() -> None:
    agg = AggregateStep(("k",), ())
    _apply_in_pandas("append").check_next(agg, "append")  # an aggregation after its append mode
    with pytest.raises(ConfigurationError, match="after applyInPandasWithState"):
        _apply_in_pandas("update").check_next(agg, "update")
    with pytest.raises(ConfigurationError, match="after applyInPandasWithState"):
        _apply_in_pandas("append").check_next(DedupStep(None), "append")
    with pytest.raises(ConfigurationError, match="not supported after aggregation"):
        _apply_in_pandas("append").check_after_aggregation("append")
    processor = dataclasses.replace(_apply_in_pandas("append"), api="transformWithState")
    assert processor.passes_watermark
    processor.check_next(DedupStep(None), "append")  # the watermark goes on through it
    processor.check_after_aggregation("append")
