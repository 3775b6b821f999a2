"""Planning a stream-stream join: Spark's analysis of ``left.join(right, on, how)``, read back.

Spark analyses the join the user wrote (the same ``on`` and ``how``), so column resolution, the
``USING`` output and implicit casts are Spark's own. From its condition:

- equalities between one side's expression and the other's are the join keys: each side
  computes its key in Spark, and the tagged union of both sides is shuffled by them; a ``<=>``
  is two keys, as Spark makes them: the expression (its type's default for null) and whether
  it is null, so that a null matches a null;
- conjuncts over one side only are filtered in Spark before the join (Spark's optimizer pushes
  them down), except on an outer join's preserved side, whose rows that fail them are emitted
  at once with nulls (Spark's pre-join filter): the side computes them as a flag; so are the
  filters Spark's optimizer infers for a side from the condition and the other side's filters
  (``leftId = rightId`` with a right side of even ids: even left ids), on no preserved side;
- the other conjuncts are evaluated in the worker over candidate pairs: every sub-expression
  over one side only is computed by that side in Spark, so the worker compares columns and
  combines the comparisons with ``AND`` / ``OR`` / ``NOT``.

Each side's state watermark is Spark's (``StreamingJoinHelper.getStateValueWatermark``, or the
join key when it carries a watermark), and so are the rules for which joins are allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkstate.engine.plan.join.analysis import JoinAnalysis
from sparkstate.engine.plan.join.planned import JoinPlan
from sparkstate.engine.plan.stage import (
    ChainPlanner,
    PlanContext,
    Planned,
    Stage,
    StatefulStep,
    StatelessStep,
)
from sparkstate.engine.spark.connect_analysis import connect_stateful_step, stand_in_join
from sparkstate.engine.spark.errors import SparkAnalysisError
from sparkstate.engine.spark.expressions import quoted, stateful_side
from sparkstate.engine.spark.session import is_connect
from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime.watermark import WatermarkSpec

__all__ = [
    "INPUT_COLUMN",
    "JoinInput",
    "JoinPlan",
    "plan_join",
    "plan_join_after",
    "plan_join_step",
    "tagged_inputs",
]

#: Spark's ``JoinType`` names by the spellings PySpark accepts (lower case, no underscores).
_JOIN_TYPES = {
    "inner": "inner",
    "outer": "fullOuter",
    "full": "fullOuter",
    "fullouter": "fullOuter",
    "leftouter": "leftOuter",
    "left": "leftOuter",
    "rightouter": "rightOuter",
    "right": "rightOuter",
    "leftsemi": "leftSemi",
    "semi": "leftSemi",
    "leftanti": "leftAnti",
    "anti": "leftAnti",
    "cross": "cross",
}


def join_type_of(how: str | None) -> str:
    """Spark's join type for PySpark's ``how`` (any case, underscores ignored)."""
    if how is None:
        return "inner"
    if not isinstance(how, str):
        msg = f"join: how must be a string, got {type(how).__name__}"
        raise ConfigurationError(msg)
    found = _JOIN_TYPES.get(how.lower().replace("_", ""))
    if found is None:
        msg = (
            f"Unsupported join type '{how}'. Supported join types include: 'inner', 'outer', "
            "'full', 'fullouter', 'full_outer', 'leftouter', 'left', 'left_outer', "
            "'rightouter', 'right', 'right_outer', 'leftsemi', 'left_semi', 'semi', "
            "'leftanti', 'left_anti', 'anti', 'cross'."
        )
        raise ConfigurationError(msg)
    if found == "leftAnti":
        msg = "LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported"
        raise ConfigurationError(msg)
    if found == "cross":
        msg = "Stream-stream join without equality predicate is not supported (a cross join)"
        raise ConfigurationError(msg)
    return found


def plan_join(
    left: DataFrame,
    right: DataFrame,
    on: Any,
    how: str | None,
    upstream: frozenset[str] = frozenset(),
) -> JoinPlan:
    """Plan ``left.join(right, on, how)`` over two streaming DataFrames (watermarks applied).

    ``upstream``: the sides that are the output of a stateful step, whose watermark that step
    observes on its own input; the join finds the side's event time (for late rows) in the
    column that carries the watermark, a window of it included, as Spark's join does."""
    join_type = join_type_of(how)
    if isinstance(on, str) and not (on in left.columns and on in right.columns):
        on = F.expr(on)  # a SQL condition rather than the name of a column of both sides
    for name, df in (("left", left), ("right", right)):
        if not df.isStreaming:
            msg = f"join: the {name} side must be a streaming DataFrame (a stream-stream join)"
            raise ConfigurationError(msg)
        if len(set(df.columns)) != len(df.columns):
            msg = f"join: the {name} side has duplicate column names {df.columns}; rename them"
            raise ConfigurationError(msg)
    if is_connect(left.sparkSession):
        for name, df in (("left", left), ("right", right)):
            stateful = None if name in upstream else connect_stateful_step(df)
            if stateful is not None:
                raise ConfigurationError(stateful_side(name, stateful))
        analysed = stand_in_join(left, right, on, how or "inner")
        return JoinAnalysis(left, right, analysed.plan, join_type, upstream, analysed).plan()
    try:
        plan = left.join(right, on, how or "inner")._jdf.queryExecution().analyzed()  # noqa: SLF001
    except Exception as exc:
        msg = f"join: {exc}"
        raise ConfigurationError(msg) from exc
    return JoinAnalysis(left, right, plan, join_type, upstream).plan()


@dataclasses.dataclass(frozen=True)
class JoinStep(StatefulStep):
    """``left.join(right, on, how)`` of two streams, planned when it was called (Spark analyses
    it over both inputs): a :class:`~sparkstate.engine.plan.join.planned.JoinPlan`."""

    join: JoinPlan
    refused_after_stateful: ClassVar[str | None] = (
        "a stream-stream join after another stateful step is not supported yet"
    )
    spark_watermark_out: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return "join"

    def plan(self, at: PlanContext) -> Planned:
        return plan_join_step(self, at)


def plan_join_step(step: JoinStep, at: PlanContext) -> Planned:
    """The join's stage: its input is the stream itself (the tagged union of both sides); its
    output is renamed to Spark's columns of the join. Its sides' own stateful steps run before
    it, and the steps after it see the watermark as far behind as Spark 4 puts it."""
    if at.output_mode != "append":
        msg = (
            "Join between two streaming DataFrames/Datasets is not supported in "
            f"{at.output_mode.title()} output mode, only in Append output mode"
        )
        raise ConfigurationError(msg)
    plan: JoinPlan = step.join
    if plan.refused is not None:
        raise plan.refused
    rename = StatelessStep("select", tuple(plan.output_columns))
    stage = Stage(
        at.op_id,
        plan.operator,
        plan.output_struct,
        plan.partition_columns,
        lambda batch: batch,
        after=[rename],
        inputs=dict(plan.tracker_inputs),
        source=plan.source(at.op_id),
        key_struct=plan.key_struct,
        side_rows=plan.side_rows,
    )
    names = [f.name for f in plan.output_struct.fields]
    output = plan.union.select(*names).select(*plan.output_columns)
    return Planned(stage, output, plan.input_stages(at.op_id), plan.output_lag_ms)


#: The condition of Spark's streaming checks (``UnsupportedOperationChecker``), which refuse a
#: query at ``start()``.
STREAMING_CHECK = "_LEGACY_ERROR_TEMP_3102"

#: The query input's column telling a join's left input's rows (0) from its right's (1), when
#: a side has a stateful step before the join (or a union's, engine/plan/union.py).
INPUT_COLUMN = "__ss_input"


@dataclasses.dataclass(frozen=True)
class JoinInput:
    """One side of a join as the user wrote it: its input stream (watermarks applied) and the
    stateful steps between that input and the join."""

    df: DataFrame
    steps: tuple[Any, ...]
    watermark: WatermarkSpec | None


def plan_join_after(
    left: JoinInput, right: JoinInput, on: Any, how: str | None, plan_line: ChainPlanner
) -> tuple[JoinPlan, DataFrame, tuple[WatermarkSpec, ...]]:
    """Plan a join whose inputs have stateful steps of their own (a deduplication, a windowed
    aggregation in append mode), as Spark 4 runs it: each side's steps run on that side's
    rows, their output is the join's input on that side, and every operator uses the query's
    watermark (Spark's propagation: deduplication and aggregation pass their input watermark
    on). The query's input is the tagged union of both inputs as they come; the watermarks are
    each side's, observed by the first step that reads that side.

    ``plan_line`` plans each side's steps. Returns the plan, the query's input and its watermarks
    (left's first)."""
    join_type_of(how)
    sides = {"left": left, "right": right}
    names: dict[str, str] = {}
    specs: list[WatermarkSpec] = []
    source, side_of, columns = tagged_inputs(left.df, right.df)
    chains: dict[str, list[Stage]] = {}
    outputs: dict[str, DataFrame] = {}
    refused: SparkAnalysisError | None = None
    for s, side in sides.items():
        wm = side.watermark
        if wm is not None:
            names[s] = "input" if not specs else f"input.{len(specs)}"
            specs.append(WatermarkSpec(columns[s][wm.column], wm.delay))
        outputs[s] = side.df
        if side.steps:
            column = wm.column if wm else None
            delay = wm.delay_ms if wm else None
            try:
                chains[s], outputs[s] = plan_line(side.df, side.steps, "append", column, delay)
            except SparkAnalysisError as exc:
                if exc.getCondition() != STREAMING_CHECK:
                    raise
                refused = refused or exc  # Spark's streaming checks refuse it at start()
    try:
        plan = plan_join(outputs["left"], outputs["right"], on, how, frozenset(chains))
    except ConfigurationError:
        if refused is not None:  # a side's output is not its input: the join needs it
            raise refused from None
        raise
    plan.refused = refused
    for s, chain in chains.items():
        chain[-1] = _with_pushed_filters(chain[-1], plan.pushed.get(s, []))
    plan.tracker_inputs = {s: n for s, n in names.items() if s not in chains}
    plan.chain_inputs = {s: (n,) for s, n in names.items() if s in chains}
    plan.chains = chains
    plan.side_of = side_of
    return plan, source, tuple(specs)


def _with_pushed_filters(stage: Stage, pushed: list[tuple[frozenset[str], str]]) -> Stage:
    """An aggregation before the join with the filters Spark pushes below it: those over its
    grouping columns alone (Spark's optimizer moves a filter over an aggregation's grouping
    keys before it), applied to each key's partial aggregate, which has those columns. A
    deduplication keeps them above it, as Spark does."""
    from sparkstate.operators.aggregation.aggregate import StreamingAggregate

    operator = stage.operator
    if not isinstance(operator, StreamingAggregate):
        return stage
    plain = {k for k in operator.output_keys if isinstance(k, str)}
    filters = [sql for names, sql in pushed if names <= plain]
    if not filters:
        return stage
    predicate = F.expr(" AND ".join(f"({sql})" for sql in filters))
    prepare = stage.prepare

    def filtered(batch: DataFrame) -> DataFrame:
        return prepare(batch).where(predicate)

    return dataclasses.replace(stage, prepare=filtered)


def tagged_inputs(
    left: DataFrame, right: DataFrame
) -> tuple[DataFrame, dict[str, Callable[[DataFrame], DataFrame]], dict[str, dict[str, str]]]:
    """Both inputs as one stream: :data:`INPUT_COLUMN`, the left's columns, the right's (null
    on the other side's rows); how to read each side back from a batch of it; the stream's
    name of each side's columns. A join's or a union's (engine/plan/union.py) of inputs with
    stateful steps."""
    frames = {"left": left, "right": right}
    columns = {
        s: {f.name: f"__ss_{s[0]}in{i}" for i, f in enumerate(df.schema.fields)}
        for s, df in frames.items()
    }

    def tagged(s: str, tag: int) -> DataFrame:
        selected = [F.lit(tag).cast("tinyint").alias(INPUT_COLUMN)]
        for other, df in frames.items():
            for f in df.schema.fields:
                name = columns[other][f.name]
                if other == s:
                    selected.append(F.col(quoted(f.name)).alias(name))
                else:
                    selected.append(F.lit(None).cast(f.dataType).alias(name))
        return frames[s].select(*selected)

    source = tagged("left", 0).unionByName(tagged("right", 1))

    def reader(s: str, tag: int) -> Callable[[DataFrame], DataFrame]:
        back = [F.col(name).alias(original) for original, name in columns[s].items()]

        def side_of(batch: DataFrame) -> DataFrame:
            return batch.where(F.col(INPUT_COLUMN) == tag).select(*back)

        return side_of

    return source, {"left": reader("left", 0), "right": reader("right", 1)}, columns
