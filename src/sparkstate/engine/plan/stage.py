"""A query's steps and their stages: a :class:`StatefulStep` (each step type a dataclass in its
family's room of :mod:`sparkstate.engine.plan`, which plans it) or a :class:`StatelessStep`, the
:class:`Stage` the driver runs each batch, and what a step's planning takes (:class:`PlanContext`)
and gives back (:class:`Planned`)."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from sparkstate.engine.spark.schema import ColumnSeq, repartition_by
from sparkstate.operators.base import StatefulOperator

__all__ = [
    "ChainPlanner",
    "PlanContext",
    "Planned",
    "Stage",
    "StatefulStep",
    "StatelessStep",
    "Step",
]


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


class StatefulStep(ABC):
    """A stateful step of a query as the user wrote it, before planning. Its type plans it
    (:meth:`plan`) and says where it may stand in a line of steps, as Spark's rules put it
    (:mod:`sparkstate.engine.plan.chain` asks): a new step type is named in its own module."""

    #: A streaming aggregation (``groupBy().agg()``), which Spark's rules of output modes and of
    #: chains name.
    is_aggregation: ClassVar[bool] = False
    #: Spark's refusal of the step after another stateful step, where it may only be the first.
    refused_after_stateful: ClassVar[str | None] = None
    #: Whether the step observes the watermark carried on its input where it is not the first
    #: stateful step (a deduplication's late rows and expiry are the first step's).
    carried_watermark_in: ClassVar[bool] = False
    #: Whether the step's output carries Spark's own watermark metadata (a join's output).
    spark_watermark_out: ClassVar[bool] = False
    #: Whether Spark's operator refuses the step's input with more than one event-time column
    #: when its first batch runs.
    one_event_time: ClassVar[bool] = False

    @abstractmethod
    def plan(self, at: PlanContext) -> Planned:
        """The step's stage at its place ``at`` in the query, and the DataFrame that stands for
        its output."""

    @property
    def passes_watermark(self) -> bool:
        """Whether Spark 4 carries the watermark through the step, so that stateful steps may
        follow it (transformWithState, on its ``eventTimeColumnName``)."""
        return False

    def checked(self, before: Sequence[StatefulStep], mode: str) -> Step:
        """The step as the query runs it in output mode ``mode`` after the stateful steps
        ``before`` (Spark plans a limit after an aggregation in complete mode as a limit of each
        batch's result); an error where Spark refuses it there."""
        return self

    def check_next(self, step: StatefulStep, mode: str) -> None:
        """Refuse, as Spark refuses it, ``step`` right after this one in ``mode`` (any
        step may follow, unless the type says otherwise)."""
        return

    def check_after_aggregation(self, mode: str) -> None:
        """Refuse, as Spark refuses it, the step after an aggregation in ``mode`` (allowed,
        unless the type says otherwise)."""
        return

    def complete_mode_refusal(self) -> str | None:
        """Why the step cannot run in complete output mode in a query without an aggregation
        (None: the query's check says it)."""
        return None


#: A step of a query: stateful, or a DataFrame method applied to a stateful step's output.
Step = StatefulStep | StatelessStep


@dataclasses.dataclass
class Stage:
    """One stateful operator as the driver runs it each batch."""

    op_id: int
    operator: StatefulOperator
    #: Spark schema of the operator's output (the ``mapInArrow`` result schema).
    output_struct: StructType
    #: Columns to shuffle by, so that every row of a key reaches the same partition.
    partition_columns: list[str]
    #: Turns the batch's input DataFrame into the operator's input (e.g. the partial aggregate).
    prepare: Callable[[DataFrame], DataFrame]
    #: Adds the initial-state rows to the operator's input of the query's first batch.
    initial: Callable[[DataFrame], DataFrame] | None = None
    #: Stateless steps the user wrote after this operator, applied to its output.
    after: list[StatelessStep] = dataclasses.field(default_factory=list)
    #: The watermark inputs of an operator with several inputs: the tracker's name of each
    #: input the operator reports its event times by (a join's ``left`` and ``right``).
    inputs: dict[str, str] | None = None
    #: How far this operator's input watermark is behind the query's (Spark 4 propagates a
    #: join's state watermark to the steps after it).
    watermark_lag_ms: int = 0
    #: Where the stage reads a batch, from the query's input and the outputs of the stages
    #: that ran before it, by operator id (a join of stateful steps' outputs); None: the
    #: output of the stage before it, or the input for the first.
    source: Callable[[DataFrame, dict[int, DataFrame]], DataFrame] | None = None
    #: The tracker's names of the watermarks whose event times this operator observes, when
    #: it is not the first stage (the first step of a join's side).
    event_time_inputs: tuple[str, ...] = ()
    #: Spark's types of the columns Spark's operator keys its state by (the grouping keys, the
    #: columns deduplicated, the join keys), for the checks Spark makes of a state key; empty
    #: for a state of no key columns (the limit's).
    key_struct: StructType = dataclasses.field(default_factory=StructType)
    #: What the query's first batch fails with, where Spark's operator refuses its input when
    #: it runs (several event-time columns).
    refusal: Exception | None = None
    #: The output mode the stage's tasks run in, where it is not the rule of a chain (the
    #: query's for its last stage, append for the others): the query's for the last stage of
    #: each input of a union after stateful steps, whose output reaches the sink.
    output_mode: str | None = None
    #: The batch's rows once this stage ran, where they are not its output: the union of its
    #: output with another input's rows or outputs (engine/plan/union.py), from the query's
    #: input and the outputs of the stages that ran, by operator id.
    query_output: Callable[[DataFrame, dict[int, DataFrame]], DataFrame] | None = None
    #: A join's: one side's rows as the operator's input holds them
    #: (:attr:`~sparkstate.engine.plan.join.planned.JoinPlan.side_rows`), for its take-over.
    side_rows: Callable[[str, DataFrame, Sequence[str]], DataFrame] | None = None
    #: ``partition_columns`` as Spark takes them, made at the first batch.
    _shuffle_by: tuple[tuple[str, ...], ColumnSeq] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def shuffled(self, source: DataFrame, batch_id: int, num_partitions: int) -> DataFrame:
        """The operator's input in batch ``batch_id``, shuffled by ``partition_columns`` into
        the state partitions."""
        names = tuple(self.partition_columns)
        if self._shuffle_by is None or self._shuffle_by[0] != names:
            self._shuffle_by = (names, ColumnSeq(names))
        return repartition_by(self.input_of(source, batch_id), num_partitions, self._shuffle_by[1])

    def input_of(self, batch: DataFrame, batch_id: int) -> DataFrame:
        """The operator's input in batch ``batch_id``."""
        prepared = self.prepare(batch)
        if batch_id == 0 and self.initial is not None:
            return self.initial(prepared)
        return prepared

    def output_of(self, output: DataFrame) -> DataFrame:
        """The operator's output after the stateless steps that follow it."""
        for step in self.after:
            output = step.apply(output)
        return output


class ChainPlanner(Protocol):
    """Plans a line of steps over ``df`` (:func:`sparkstate.engine.plan.chain.plan_chain`): the
    stages and the DataFrame standing for the last step's output. A join's sides and a union's
    inputs have lines of their own, planned through it."""

    def __call__(
        self,
        df: DataFrame,
        steps: Sequence[Step],
        output_mode: str,
        event_time: str | None,
        watermark_delay_ms: int | None = None,
        *,
        first_id: int = 0,
    ) -> tuple[list[Stage], DataFrame]: ...


@dataclasses.dataclass(frozen=True)
class PlanContext:
    """Where in the query a step is planned: what every planner takes beside its step."""

    #: The step's operator id (Spark numbers them from the sink: the last is 0).
    op_id: int
    #: The step's input: a DataFrame standing for the output of the steps before it.
    df: DataFrame
    #: The query's output mode.
    output_mode: str
    #: The column whose watermark the step observes (late rows, expiry), if any.
    event_time: str | None
    #: Whether the query has a watermark at all.
    watermark_present: bool
    #: The delay of the query's watermark, if it has one.
    watermark_delay_ms: int | None = None
    #: Whether an aggregation comes after the step (Spark then checks an arbitrary-state step's
    #: output mode against the aggregation, not against the query's).
    aggregation_follows: bool = False

    @property
    def has_event_time(self) -> bool:
        """Whether the step's input has the event-time column."""
        return self.event_time is not None and self.event_time in self.df.columns


@dataclasses.dataclass
class Planned:
    """What a planner gives back: the step's stage and the DataFrame that stands for its output
    (Spark analyses the steps after it against that)."""

    stage: Stage
    output: DataFrame
    #: Stages that run before this one in each batch (a join's sides' own stateful steps).
    input_stages: list[Stage] = dataclasses.field(default_factory=list)
    #: How much further behind the query's watermark the steps after this one see it.
    watermark_lag_ms: int = 0
