"""Planning the streaming limit: ``limit(num)`` as a stage whose one store keeps the count."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkstate.engine.plan.stage import (
    PlanContext,
    Planned,
    Stage,
    StatefulStep,
    StatelessStep,
    Step,
)
from sparkstate.engine.spark.schema import arrow_schema
from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.limit import LIMIT_KEY, StreamingLimit

__all__ = ["MAX_LIMIT", "LimitStep", "check_limit", "plan_limit"]

#: Spark's limit takes a Java int.
MAX_LIMIT = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class LimitStep(StatefulStep):
    """``limit(num)``: stateful in append mode, a per-batch limit of the result in complete
    mode (as Spark plans it), refused in update mode."""

    num: Any

    def plan(self, at: PlanContext) -> Planned:
        return plan_limit(self, at)

    def checked(self, before: Sequence[StatefulStep], mode: str) -> Step:
        """Checked as Spark checks it; right after an aggregation in complete mode, a limit of
        each batch's result, as Spark plans it (no state)."""
        num = check_limit(self)
        if mode == "update":
            msg = (
                "Limits are not supported on streaming DataFrames/Datasets in Update output "
                "mode (as in Spark); use outputMode('append'), or outputMode('complete') for "
                "a limit after an aggregation"
            )
            raise ConfigurationError(msg)
        if mode == "complete" and before and before[-1].is_aggregation:
            return StatelessStep("limit", (num,))
        return self


def check_limit(step: LimitStep) -> int:
    """The number of rows of ``limit(num)``, refused where Spark refuses it."""
    num = step.num
    if isinstance(num, bool) or not isinstance(num, int) or num > MAX_LIMIT:
        msg = (
            f"limit({num!r}): the number of rows must be an int of at most {MAX_LIMIT} (as in "
            "Spark, whose limit takes a Java int)"
        )
        raise ConfigurationError(msg)
    if num < 0:
        msg = (
            f"limit({num}): the limit expression must be equal to or greater than 0, but got "
            f"{num} (as in Spark)"
        )
        raise ConfigurationError(msg)
    return num


def plan_limit(step: LimitStep, at: PlanContext) -> Planned:
    """The streaming limit: every row to the one partition whose store keeps the count (the
    input shuffled by a constant column, the key of that count)."""
    df, event_time = at.df, at.event_time
    num = check_limit(step)
    if LIMIT_KEY in df.columns:
        msg = f"limit(): the column name {LIMIT_KEY!r} is taken by sparkstate; rename the column"
        raise ConfigurationError(msg)

    def prepare(batch: DataFrame) -> DataFrame:
        return batch.withColumn(LIMIT_KEY, F.lit(None).cast("int"))

    operator = StreamingLimit(
        arrow_schema(prepare(df).schema),
        num,
        event_time=event_time if at.has_event_time else None,
    )
    return Planned(Stage(at.op_id, operator, df.schema, [LIMIT_KEY], prepare), df)
