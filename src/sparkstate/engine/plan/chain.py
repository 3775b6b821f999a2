"""From the user's query to stages: the order of its steps and Spark's rules for chaining them.

Planning happens once, at ``start()``, on the streaming DataFrame: Spark's analyzer names and types
every output column (so our results carry exactly the names and types Spark's own operator would),
and unsupported shapes fail here, before anything runs. Each stateful step is planned by its own
type (:meth:`~sparkstate.engine.plan.stage.StatefulStep.plan`); this module walks the steps in
order, gives each its place (operator id, the watermark it observes), checks the chain and the
output mode as Spark checks them, and attaches the stateless steps to the stage before them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import DataFrame

from sparkstate.engine.plan.aggregate.plan import closes_by_watermark
from sparkstate.engine.plan.stage import PlanContext, Stage, StatefulStep, StatelessStep, Step
from sparkstate.engine.plan.union import UnionOutput, UnionStep, plan_union
from sparkstate.engine.spark.errors import SparkAnalysisError, unsupported_operation
from sparkstate.engine.spark.schema import (
    arrow_schema,
    event_time_columns,
    event_time_of,
    is_binary_stable,
    quote,
)
from sparkstate.exceptions import ConfigurationError
from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.families import ColumnFamily

__all__ = [
    "Stage",
    "StatelessStep",
    "Step",
    "arrow_schema",
    "output_of",
    "plan_chain",
    "plan_stages",
    "quote",
]


def plan_stages(
    df: DataFrame,
    steps: Sequence[Step],
    output_mode: str,
    event_time: str | None,
    watermark_delay_ms: int | None = None,
) -> list[Stage]:
    """The stages of a query, checked against ``output_mode`` as Spark would check them, and
    their state as Spark checks it when the query starts (the stream's columns are known
    before, as Spark's are)."""
    stages = plan_chain(df, steps, output_mode, event_time, watermark_delay_ms)[0]
    for stage in stages:
        _check_storable(stage)
    return stages


def plan_chain(
    df: DataFrame,
    steps: Sequence[Step],
    output_mode: str,
    event_time: str | None,
    watermark_delay_ms: int | None = None,
    *,
    first_id: int = 0,
) -> tuple[list[Stage], DataFrame]:
    """:func:`plan_stages`, and the DataFrame that stands for the last step's output.
    ``first_id``: the operator id of the last stateful step (an input's of a union, whose
    steps Spark numbers after the other input's)."""
    if not steps:
        msg = (
            "the query has no stateful step; add groupBy().agg() or dropDuplicates(), or use "
            "df.writeStream directly"
        )
        raise ConfigurationError(msg)
    for step in steps:
        if not isinstance(step, StatefulStep | StatelessStep):
            msg = (
                f"no planner for the step {step!r}: a step is a StatefulStep, which plans "
                "itself, or a StatelessStep"
            )
            raise TypeError(msg)
    stages: list[Stage] = []
    current = df
    lag = 0  # how far the watermark of the steps after a join is behind the query's
    steps = _checked(steps, output_mode)
    stateful = [s for s in steps if isinstance(s, StatefulStep)]
    union: UnionOutput | None = None  # a union of stateful steps' outputs: the first step
    inputs = 0  # the stages of its inputs' steps beyond the one place of the union
    for step in steps:
        if isinstance(step, StatelessStep):
            if union is not None and stages[-1].query_output is union:  # after the union
                aggregated = any(s.operator.is_aggregation for s in stages)
                current = _attach(union.after, current, step, output_mode, aggregated, "union()")
            else:
                current = _plan_stateless(stages[-1], current, step, output_mode)
            continue
        if isinstance(step, UnionStep):  # always the first: union() makes a stream of it
            # Spark numbers the inputs' steps after the steps that follow the union
            chain, union, current = plan_union(
                step.union, output_mode, first_id + len(stateful) - 1, plan_chain
            )
            stages += chain
            inputs = len(chain) - 1
            continue
        assert isinstance(step, StatefulStep)
        position = len(stages) - inputs
        # Spark numbers them from the sink: the last is 0
        op_id = first_id + len(stateful) - 1 - position
        if position:
            for before in _lines_before(stateful, position):
                _check_chain(before, step, output_mode)
            if step.refused_after_stateful:
                raise ConfigurationError(step.refused_after_stateful)
        watermark = event_time if position == 0 else None
        if position > 0 and step.carried_watermark_in and event_time is not None:
            watermark = event_time_of(current)  # late rows and expiry as the first step's
        if position > 0 and stateful[position - 1].passes_watermark and event_time is not None:
            # Spark 4 carries the watermark through transformWithState (its output watermark
            # is its input's) on the output column named by eventTimeColumnName.
            watermark = event_time_of(current)
        at = PlanContext(
            op_id,
            current,
            output_mode,
            watermark,
            event_time is not None,
            watermark_delay_ms,
            any(s.is_aggregation for s in stateful[position + 1 :]),
        )
        after_join = position > 0 and stateful[position - 1].spark_watermark_out
        refusal = _several_event_times(current, step, first=position == 0 or after_join)
        planned = step.plan(at)
        planned.stage.refusal = refusal
        stage, current = planned.stage, planned.output
        stages += planned.input_stages  # a join's sides' stateful steps, if any
        stage.watermark_lag_ms = lag
        lag += planned.watermark_lag_ms
        stages.append(stage)
    aggs = [s.operator for s in stages if s.operator.is_aggregation]
    has_agg = bool(aggs)
    if output_mode == "append" and not all(map(closes_by_watermark, aggs)):
        msg = (
            "Append output mode not supported when there are streaming aggregations on streaming "
            "DataFrames/DataSets without watermark (as in Spark): group by a window() of the "
            "watermarked column, or by that column, or use outputMode('update') or "
            "outputMode('complete')"
        )
        operation = "streaming aggregations without watermark"
        raise unsupported_operation(msg, output_mode, operation)
    refusals = [r for s in stateful if (r := s.complete_mode_refusal())]
    if output_mode == "complete" and refusals and not has_agg:
        raise ConfigurationError(refusals[0])
    if output_mode == "complete" and not has_agg:
        msg = (
            "complete output mode needs a streaming aggregation; use outputMode('append') or "
            "outputMode('update')"
        )
        raise unsupported_operation(msg, output_mode, "no streaming aggregations")
    for stage in stages:
        if not has_agg or stage.operator.is_aggregation:
            _check_output_mode(stage, output_mode)
    return stages, current


def _lines_before(stateful: Sequence[StatefulStep], position: int) -> list[list[StatefulStep]]:
    """The stateful steps before the one at ``position`` that feed it, in order: one line of
    them, or after a union of stateful steps' outputs one per input that has steps."""
    if not isinstance(stateful[0], UnionStep):
        return [list(stateful[:position])]
    lines = [
        [*(s for s in side.steps if isinstance(s, StatefulStep)), *stateful[1:position]]
        for side in stateful[0].union.inputs
    ]
    return [line for line in lines if line]


#: Spark's conf that allows several stateful operators (and with them one event-time column
#: per operator's input only).
ALLOW_MULTIPLE = "spark.sql.streaming.statefulOperator.allowMultiple"


def _several_event_times(
    df: DataFrame, step: StatefulStep, *, first: bool
) -> SparkAnalysisError | None:
    """Spark's error for a deduplication whose input rows have more than one event-time
    column, which the query's first batch fails with (Spark's operator finds them when it
    runs); None where there is one, or ``statefulOperator.allowMultiple`` is off (Spark then
    takes the first). ``first``: the step reads the query's input or a join's output, whose
    columns carry Spark's own watermark metadata (after another stateful step, ``df`` stands
    for that step's output, and its metadata is sparkstate's)."""
    if not step.one_event_time or not first:
        return None
    allowed = str(df.sparkSession.conf.get(ALLOW_MULTIPLE, "true")).lower() == "true"
    columns = event_time_columns(df)
    if not allowed or len(columns) < 2:  # noqa: PLR2004 - one event time per stream
        return None
    listed = "(" + ",".join(columns) + ")"
    msg = (
        "More than one event time columns are available. Please ensure there is at most one "
        f"event time column per stream. event time columns: {listed}"
    )
    return SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_3077", {"eventTimeCols": listed})


#: The output modes :func:`output_of` plans steps in, in turn.
_SHAPE_MODES = ("update", "append", "complete")


def output_of(
    df: DataFrame,
    steps: Sequence[Step],
    event_time: str | None,
    watermark_delay_ms: int | None = None,
) -> DataFrame:
    """The DataFrame that stands for the output of ``steps`` over ``df``, before an output mode
    is chosen: the output's columns and types are the same in every mode the steps run in, so
    they are planned in the first mode Spark takes them in (the error of the first, if none)."""
    first: ConfigurationError | None = None
    for mode in _SHAPE_MODES:
        try:
            return plan_chain(df, steps, mode, event_time, watermark_delay_ms)[1]
        except ConfigurationError as exc:
            first = first or exc
    assert first is not None
    raise first


def _check_output_mode(stage: Stage, mode: str) -> None:
    """The operator's own check of ``mode``; Spark's error where Spark's streaming checks name
    the operator's refusal (:attr:`~sparkstate.operators.base.StatefulOperator.
    spark_operation`)."""
    try:
        stage.operator.check_output_mode(mode)
    except SparkAnalysisError:
        raise
    except ConfigurationError as exc:
        operation = stage.operator.spark_operation
        if operation is not None:
            raise unsupported_operation(str(exc), mode, operation) from None
        raise


def _checked(steps: Sequence[Step], mode: str) -> list[Step]:
    """``steps`` as the query runs them in ``mode``, each stateful one checked where Spark
    checks it (:meth:`~sparkstate.engine.plan.stage.StatefulStep.checked`: a limit right after
    an aggregation in complete mode becomes a limit of each batch's result)."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, StatefulStep):
            step = step.checked([s for s in out if isinstance(s, StatefulStep)], mode)
        out.append(step)
    return out


#: Spark's error for a stateful step after one that may emit rows behind the watermark.
CORRECTNESS_ERROR = (
    "Detected pattern of possible 'correctness' issue due to global watermark. The query "
    "contains stateful operation which can emit rows older than the current watermark plus "
    'allowed late record delay, which are "late rows" in downstream stateful operations and '
    "these rows can be discarded. (as in Spark: an aggregation emits such rows in {mode} output "
    "mode; chain stateful steps after an aggregation in append mode)"
)


def _check_chain(before: Sequence[StatefulStep], step: StatefulStep, mode: str) -> None:
    """Spark 4's rules for a stateful ``step`` after the stateful steps ``before``: what the
    step right before lets follow it (:meth:`~sparkstate.engine.plan.stage.StatefulStep.
    check_next`); after an aggregation, in append mode anything the step itself does not refuse
    (:meth:`~sparkstate.engine.plan.stage.StatefulStep.check_after_aggregation`), in update
    mode nothing (its updates are "late rows" downstream)."""
    before[-1].check_next(step, mode)
    if not any(s.is_aggregation for s in before):
        return
    step.check_after_aggregation(mode)
    if mode != "append":
        raise ConfigurationError(CORRECTNESS_ERROR.format(mode=mode))


#: What a stateless step may be, by the DataFrame method's name.
STATELESS_METHODS = (
    "select",
    "selectExpr",
    "where",
    "filter",
    "withColumn",
    "withColumns",
    "withColumnRenamed",
    "withColumnsRenamed",
    "drop",
    "orderBy",
    "sort",
    "alias",
    "toDF",
    "hint",
    "dropna",
    "fillna",
    "replace",
    "join",
    "crossJoin",
    "withMetadata",
    "sample",
    "repartition",
    "repartitionByRange",
    "coalesce",
    "sortWithinPartitions",
)
_SORTS = ("orderBy", "sort")


def _plan_stateless(stage: Stage, output: DataFrame, step: StatelessStep, mode: str) -> DataFrame:
    """Attach ``step`` to ``stage``'s output; Spark analyses it here, so a bad column fails at
    ``start()``."""
    aggregated = stage.operator.is_aggregation
    where = f"operator {stage.op_id} ({stage.operator.kind})"
    return _attach(stage.after, output, step, mode, aggregated, where)


def _attach(
    after: list[StatelessStep],
    output: DataFrame,
    step: StatelessStep,
    mode: str,
    aggregated: bool,
    where: str,
) -> DataFrame:
    """Attach ``step`` to the steps ``after`` an output (``where``'s, of an aggregation if
    ``aggregated``); Spark analyses it here, so a bad column fails at ``start()``."""
    if step.method in _SORTS and not (mode == "complete" and aggregated):
        msg = (
            f"{step.method}() after a stateful step needs an aggregation in complete output "
            "mode (as in Spark: sorting is not supported on streaming DataFrames otherwise)"
        )
        raise ConfigurationError(msg)
    try:
        result = step.apply(output)
        _ = result.schema  # a lazily analysed plan (Spark Connect) is analysed here
    except ConfigurationError:
        raise
    except Exception as exc:
        msg = f"{step.method}() after {where}: {exc}"
        raise ConfigurationError(msg) from exc
    after.append(step)
    return result


#: Spark's condition for a state key that equal values may spell in other bytes.
BINARY_INEQUALITY = "STATE_STORE_UNSUPPORTED_OPERATION_BINARY_INEQUALITY"


def _check_storable(stage: Stage) -> None:
    """Fail at start, not in a task, when the state's key or value types cannot be stored:
    a key Spark refuses (a collated string: state finds a key by its bytes, which equal strings
    of that collation need not share) with Spark's error, one our codec cannot encode with ours."""
    if not is_binary_stable(stage.key_struct):
        schema = json.dumps(stage.key_struct.jsonValue(), separators=(",", ":"))
        msg = (
            f"Binary inequality column is not supported with state store. Provided schema: "
            f"{schema} (as in Spark: operator {stage.op_id} ({stage.operator.kind}) would keep "
            "state by a collated string, whose equal values need not be equal bytes. Key it by "
            "the string in UTF8_BINARY, e.g. by F.lower(col) for a case-insensitive key)"
        )
        raise SparkAnalysisError(msg, BINARY_INEQUALITY, {"schema": schema})
    op = stage.operator
    families = {DEFAULT_CF: (op.key_schema, op.value_schema), **op.column_families()}
    for name, (key, value) in families.items():
        nested = [f.name for f in key if pa.types.is_nested(f.type)]
        try:
            if nested and not op.nested_keys:
                msg = f"key columns {nested} are of nested types"
                raise ConfigurationError(msg)
            ColumnFamily(name, key, value)
        except ConfigurationError as exc:
            supported = "plain columns, structs and arrays"
            if not op.nested_keys:
                supported = "plain columns (struct, array and map keys are not supported here)"
            msg = (
                f"operator {stage.op_id} ({op.kind}) keeps state by {stage.partition_columns}: "
                f"{exc}. Key it by {supported}"
            )
            raise ConfigurationError(msg) from exc
