"""Planning a union of streams of which an input has stateful steps: ``counts.union(rows)``.

As a join after stateful steps (engine/plan/join/plan.py), the query's input is the tagged union of
both inputs as they come (:func:`~sparkstate.engine.plan.join.plan.tagged_inputs`); each input's
stateful steps, planned at ``start()``, run on its rows of the batch, and the batch's output is
the union (or ``unionByName``) of both inputs' outputs, which Spark resolves and types as it
types the query's union (its analyzer widens the columns' types). The last stage of each input
runs in the query's output mode, its rows reaching the sink (an aggregation's updated keys in
update mode, its whole result in complete mode). Spark numbers the state operators from the sink
down, the left input's before the right's, and so does the plan here. Each input's watermark is
its own: the driver reads each from the batch (engine/plan/input_times.py), the query's being their
min (or max), as for a union before stateful steps. A stateful step after the union reads the
union's rows (its place in the chain is plan.py's, with Spark's rules for a step after each
input's steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkstate.engine.plan.input_times import input_time_column
from sparkstate.engine.plan.join.plan import INPUT_COLUMN, STREAMING_CHECK, JoinStep, tagged_inputs
from sparkstate.engine.plan.stage import (
    ChainPlanner,
    PlanContext,
    Planned,
    Stage,
    StatefulStep,
    StatelessStep,
)
from sparkstate.engine.spark.errors import SparkAnalysisError
from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime.watermark import WatermarkSpec

__all__ = [
    "UnionInput",
    "UnionOutput",
    "UnionPlan",
    "UnionStep",
    "plan_union",
    "union_after",
    "union_of_batch",
]

#: Spark's session setting of shuffle partitions: the state partitions while a batch runs.
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"

#: What a query input reads of a batch: from the query's input and the outputs of the stages
#: that ran, by operator id.
Reader = Callable[[DataFrame, dict[int, DataFrame]], DataFrame]


@dataclasses.dataclass(frozen=True)
class UnionInput:
    """One input of the union as the user wrote it: its rows before its first stateful step
    (watermark applied), its steps and its watermark."""

    df: DataFrame
    steps: tuple[Any, ...]
    watermark: WatermarkSpec | None


@dataclasses.dataclass(frozen=True)
class UnionPlan:
    """``left.<method>(right, **kwargs)`` of two inputs, one of them with stateful steps."""

    method: str
    kwargs: tuple[tuple[str, Any], ...]
    inputs: tuple[UnionInput, UnionInput]
    #: How a batch of the query's input holds each input's rows.
    rows_of: tuple[Callable[[DataFrame], DataFrame], Callable[[DataFrame], DataFrame]]

    def union(self, left: DataFrame, right: DataFrame) -> DataFrame:
        """Spark's union of the two inputs' rows (or of DataFrames standing for them)."""
        result: DataFrame = getattr(left, self.method)(right, **dict(self.kwargs))
        return result


@dataclasses.dataclass(frozen=True)
class UnionStep(StatefulStep):
    """``left.union(right)`` (or ``unionByName``) where an input has stateful steps of its own:
    both inputs' steps planned at ``start()`` (:func:`plan_union`), always the first step of the
    stream it makes. It has no operator of its own."""

    union: UnionPlan

    @property
    def name(self) -> str:
        return "union"

    def plan(self, at: PlanContext) -> Planned:
        msg = "a union is planned by the chain, input by input (plan_union), not as one stage"
        raise TypeError(msg)


@dataclasses.dataclass
class UnionOutput:
    """The batch's rows once both inputs ran: their union, then the steps written after it."""

    plan: UnionPlan
    #: How each input's rows of the batch are read, the left's first.
    readers: tuple[Reader, Reader]
    after: list[StatelessStep] = dataclasses.field(default_factory=list)

    def __call__(self, batch: DataFrame, outputs: dict[int, DataFrame]) -> DataFrame:
        left, right = (read(batch, outputs) for read in self.readers)
        out = self.plan.union(left, right)
        for step in self.after:
            out = step.apply(out)
        return out


def union_after(
    left: UnionInput, right: UnionInput, method: str, kwargs: dict[str, Any]
) -> tuple[UnionPlan, DataFrame, tuple[WatermarkSpec, ...], DataFrame | None]:
    """The union of two inputs of which one has stateful steps: the plan, the query's input
    (the tagged union of both inputs as they come), its watermarks (the left input's first)
    and, where there are watermarks, the input with the event time each reads beside the
    rows (:func:`~sparkstate.engine.plan.input_times.input_time_column`), for the driver."""
    sides = {"left": left, "right": right}
    for name, side in sides.items():
        _check_input(name, side)
    source, rows_of, columns = tagged_inputs(left.df, right.df)
    specs: list[WatermarkSpec] = []
    times = {}
    for tag, (name, side) in enumerate(sides.items()):
        wm = side.watermark
        if wm is None:
            continue
        column = columns[name][wm.column]
        times[input_time_column(len(specs))] = F.when(F.col(INPUT_COLUMN) == tag, F.col(column))
        specs.append(WatermarkSpec(column, wm.delay))
    plan = UnionPlan(
        method, tuple(kwargs.items()), (left, right), (rows_of["left"], rows_of["right"])
    )
    return plan, source, tuple(specs), source.withColumns(times) if times else None


def union_of_batch(left: DataFrame, right: DataFrame) -> SparkAnalysisError | None:
    """Spark's refusal of the union of ``left`` and ``right`` as its streaming checks make it
    (a stream with a batch DataFrame), None if there is none."""
    if left.isStreaming == right.isStreaming:
        return None
    text = "Union between streaming and batch DataFrames/Datasets is not supported"
    return SparkAnalysisError(f"{text} (as in Spark)", STREAMING_CHECK, {"msg": text})


def _check_input(name: str, side: UnionInput) -> None:
    """Refuse what the union of stateful steps' outputs does not take yet."""
    nested = [
        s
        for s in side.steps
        if isinstance(s, UnionStep) or (isinstance(s, JoinStep) and s.join.chains)
    ]
    if nested:
        msg = (
            f"union(): the {name} input is a {nested[0].name} of stateful steps' outputs; a "
            "union of it with another stream is not supported yet"
        )
        raise ConfigurationError(msg)
    wm = side.watermark
    if wm is not None and wm.column not in side.df.columns:
        msg = (
            f"union(): the {name} input's watermark column {wm.column!r} is not among its "
            f"columns before its stateful steps ({side.df.columns}); a union after stateful "
            "steps needs it there (keep it, or write the projection after the stateful step)"
        )
        raise ConfigurationError(msg)


def plan_union(
    plan: UnionPlan, output_mode: str, first_id: int, chain_of: ChainPlanner
) -> tuple[list[Stage], UnionOutput, DataFrame]:
    """The stages of both inputs' steps (the left's first, numbered from ``first_id`` down from
    the sink as Spark numbers them), the union of their outputs (the last stage's
    :attr:`~sparkstate.engine.plan.stage.Stage.query_output`), and the DataFrame standing for it.
    ``chain_of`` plans each input's steps."""
    stages: list[Stage] = []
    readers: list[Reader] = []
    outputs: list[DataFrame] = []
    next_id = first_id
    for i, side in enumerate(plan.inputs):
        if not side.steps:
            readers.append(_rows(plan.rows_of[i]))
            outputs.append(side.df)
            continue
        mode = output_mode
        if mode == "complete" and not any(
            isinstance(s, StatefulStep) and s.is_aggregation for s in side.steps
        ):
            mode = "append"  # complete mode asks the query for an aggregation, not each input
        wm = side.watermark
        column, delay = (wm.column, wm.delay_ms) if wm else (None, None)
        chain, output = chain_of(side.df, side.steps, mode, column, delay, first_id=next_id)
        next_id += len(chain)
        chain[0].source = _rows(plan.rows_of[i])
        chain[-1].output_mode = mode
        readers.append(_output_of(chain[-1], shuffled=i > 0))
        outputs.append(output)
        stages += chain
    union = UnionOutput(plan, (readers[0], readers[1]))
    stages[-1].query_output = union
    return stages, union, plan.union(outputs[0], outputs[1])


def _rows(rows_of: Callable[[DataFrame], DataFrame]) -> Reader:
    def read(batch: DataFrame, outputs: dict[int, DataFrame]) -> DataFrame:
        return rows_of(batch)

    return read


def _output_of(stage: Stage, *, shuffled: bool) -> Reader:
    """What ``stage`` output in the batch (its operator id read when the batch runs: a restart
    numbers the stages as its checkpoint does). ``shuffled``: across a shuffle first, for the
    union's second input: the union's tasks are numbered across its inputs, so the stage's
    tasks, which would run in the union's, would take the state partitions of other ids
    (SPARK-29438); its first input's keep theirs."""

    def read(batch: DataFrame, outputs: dict[int, DataFrame]) -> DataFrame:
        out = outputs[stage.op_id]
        if shuffled:
            out = out.repartition(int(out.sparkSession.conf.get(SHUFFLE_PARTITIONS) or 200))
        return out

    return read
