"""From the user's query to stages: what Spark computes per batch, and the operator after it.

Planning happens once, at ``start()``, on the streaming DataFrame: Spark's analyzer names and types
every output column (so our results carry exactly the names and types Spark's own operator would),
and unsupported shapes fail here, before anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructField, StructType

from sparkstate.engine.aggregate_plan import (
    aggregate_function,
    input_types,
    partial_columns,
    recognise,
    spark_twin,
)
from sparkstate.engine.initial_state import InitialState, plan_initial_state
from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression
from sparkstate.operators.aggregate import (
    EVENT_TIME_COLUMN,
    ROWS_COLUMN,
    StreamingAggregate,
)
from sparkstate.operators.base import StatefulOperator
from sparkstate.operators.dedup import Deduplicate
from sparkstate.operators.flat_map_groups import ApplyInPandasWithState, FlatMapGroupsWithState
from sparkstate.operators.schemas import PickledState
from sparkstate.operators.transform_with_state import TransformWithState
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY
from sparkstate.store.base import DEFAULT_CF, ColumnFamily

__all__ = [
    "PROCESSOR_APIS",
    "AggregateStep",
    "ArbitraryStep",
    "DedupStep",
    "Stage",
    "StatelessStep",
    "Step",
    "plan_stages",
    "quote",
]


@dataclasses.dataclass(frozen=True)
class AggregateStep:
    """``groupBy(*keys).agg(*aggregates)``."""

    keys: tuple[Any, ...]
    aggregates: tuple[AggregateExpression, ...]


@dataclasses.dataclass(frozen=True)
class DedupStep:
    """``dropDuplicates(columns)``; None means every column."""

    columns: tuple[str, ...] | None


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


Step = AggregateStep | DedupStep | ArbitraryStep | StatelessStep

#: The APIs of ``ArbitraryStep`` that run a ``StatefulProcessor``.
PROCESSOR_APIS = ("transformWithStateInPandas", "transformWithState")


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


def quote(name: str) -> Column:
    """A column reference that survives any character in ``name``."""
    return F.col("`" + name.replace("`", "``") + "`")


def arrow_schema(struct: StructType, *, nullable: bool | None = None) -> pa.Schema:
    return pa.schema(
        [
            pa.field(
                f.name,
                to_arrow_type(f.dataType, timezone="UTC"),
                nullable=f.nullable if nullable is None else nullable,
            )
            for f in struct.fields
        ]
    )


def _as_column(col: Any) -> Column:
    return quote(col) if isinstance(col, str) else col


def _plan_aggregate(
    op_id: int,
    df: DataFrame,
    step: AggregateStep,
    event_time: str | None,
    watermark_present: bool,
    query_mode: str,
) -> tuple[Stage, DataFrame]:
    keys = [_as_column(k) for k in step.keys]
    aggs = [recognise(agg) for agg in step.aggregates]
    in_types = input_types(df, aggs)
    final = df.groupBy(*keys).agg(*[spark_twin(a) for a in aggs])
    struct = final.schema
    nkeys = len(keys)
    key_fields = struct.fields[:nkeys]
    key_names = [f.name for f in key_fields]
    if len(set(struct.names)) != len(struct.names):
        msg = f"the aggregation's output has duplicate column names {struct.names}; use .alias()"
        raise ConfigurationError(msg)
    legacy = df.sparkSession.conf.get("spark.sql.legacy.statisticalAggregate", "false")
    aggregates = [
        aggregate_function(
            agg, field.name, field.dataType, typ, legacy_statistics=str(legacy).lower() == "true"
        )
        for agg, field, typ in zip(aggs, struct.fields[nkeys:], in_types, strict=True)
    ]
    partials = partial_columns(aggs, in_types)
    partials.append(F.count(F.lit(1)).alias(ROWS_COLUMN))
    has_event_time = event_time is not None and event_time in df.columns
    if has_event_time:
        assert event_time is not None
        partials.append(F.max(quote(event_time).cast("timestamp")).alias(EVENT_TIME_COLUMN))
    watermark_key = event_time if event_time in key_names else None
    operator = StreamingAggregate(
        arrow_schema(StructType(key_fields), nullable=True),
        aggregates,
        output_schema=arrow_schema(struct),
        watermark_key=watermark_key,
        has_event_time=has_event_time,
        ansi=str(df.sparkSession.conf.get("spark.sql.ansi.enabled", "true")).lower() == "true",
        no_data_batches=watermark_present and query_mode != "complete",
    )

    def prepare(batch: DataFrame) -> DataFrame:
        return batch.groupBy(*keys).agg(*partials)

    return Stage(op_id, operator, struct, key_names, prepare), final


def _plan_dedup(
    op_id: int, df: DataFrame, step: DedupStep, event_time: str | None, watermark_present: bool
) -> tuple[Stage, DataFrame]:
    columns = list(step.columns) if step.columns else list(df.columns)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        msg = f"dropDuplicates: no column(s) {missing}; the stream has {df.columns}"
        raise ConfigurationError(msg)
    if event_time is not None and event_time in columns:
        msg = (
            f"dropDuplicates over the watermark column {event_time!r} is not supported yet; "
            "drop the watermark or deduplicate on other columns"
        )
        raise ConfigurationError(msg)
    schema = arrow_schema(df.schema)
    has_event_time = event_time is not None and event_time in df.columns
    operator = Deduplicate(
        schema,
        columns,
        event_time=event_time if has_event_time else None,
        no_data_batches=watermark_present,
    )
    return Stage(op_id, operator, df.schema, columns, lambda batch: batch), df


def _struct_of(schema: Any, what: str) -> StructType:
    """A Spark ``StructType`` from a StructType or a DDL string (``"key long, count long"``)."""
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        from pyspark.sql.types import _parse_datatype_string

        try:
            parsed = _parse_datatype_string(schema)
        except Exception as exc:
            msg = f"{what}: cannot parse the schema {schema!r}: {exc}"
            raise ConfigurationError(msg) from exc
        if not isinstance(parsed, StructType):
            msg = f"{what}: {schema!r} is not a struct schema (e.g. 'key long, count long')"
            raise ConfigurationError(msg)
        return parsed
    msg = f"{what}: give a StructType or a DDL string, not {type(schema).__name__}"
    raise ConfigurationError(msg)


def _plan_arbitrary(
    op_id: int,
    df: DataFrame,
    step: ArbitraryStep,
    event_time: str | None,
    watermark_present: bool,
    query_mode: str,
    watermark_delay_ms: int | None = None,
) -> tuple[Stage, DataFrame]:
    api = step.api
    keys = [k for k in step.keys if isinstance(k, str)]
    if len(keys) != len(step.keys) or not keys:
        msg = f"{api}: group by column names (strings), got {list(step.keys)}"
        raise ConfigurationError(msg)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        msg = f"{api}: no grouping column(s) {missing}; the stream has {df.columns}"
        raise ConfigurationError(msg)
    mode = str(step.output_mode).lower()
    if mode not in ("append", "update"):
        msg = f"{api}: outputMode is 'append' or 'update' (as in Spark), not {step.output_mode!r}"
        raise ConfigurationError(msg)
    if query_mode != mode:
        msg = (
            f"{api} in {mode} mode is not supported with {query_mode} output mode on a "
            f"streaming DataFrame (as in Spark): use .writeStream.outputMode({mode!r})"
        )
        raise ConfigurationError(msg)
    out_struct = _struct_of(step.output_schema, f"{api} outputStructType")
    if step.output_event_time and step.output_event_time in out_struct.names:
        out_struct = _with_watermark_on(out_struct, step.output_event_time, watermark_delay_ms)
    input_schema = arrow_schema(df.schema)
    has_event_time = event_time is not None and event_time in df.columns
    event_col = event_time if has_event_time else None
    operator: StatefulOperator
    initial = None
    if step.initial_state is not None:
        initial = plan_initial_state(api, df.schema, keys, step.initial_state)
    if api in PROCESSOR_APIS:
        operator = TransformWithState(
            step.func,
            input_schema,
            keys,
            out_struct,
            mode,
            step.timing,
            mode="pandas" if api == "transformWithStateInPandas" else "rows",
            row_format=step.row_format,
            watermark_present=watermark_present,
            event_time_column=event_col,
            initial_state_schema=None if initial is None else arrow_schema(initial.struct),
            initial_state_key_columns=None if initial is None else initial.keys,
            initial_state_columns=None if initial is None else initial.columns,
            output_event_time_column=step.output_event_time or None,
        )
    else:
        state_struct = step.state_schema
        if not isinstance(state_struct, PickledState):  # sparkstate.PICKLED goes through as is
            state_struct = _struct_of(step.state_schema, f"{api} stateStructType")
        cls = ApplyInPandasWithState if api == "applyInPandasWithState" else FlatMapGroupsWithState
        extra = {} if cls is ApplyInPandasWithState else {"row_format": step.row_format}
        operator = cls(
            step.func,
            input_schema,
            keys,
            out_struct,
            state_struct,
            mode,
            step.timing,
            watermark_present=watermark_present,
            event_time_column=event_col,
            **extra,
        )
    add_initial = None if initial is None else initial.add_to
    return Stage(op_id, operator, out_struct, keys, lambda batch: batch, add_initial), df


def _with_watermark_on(struct: StructType, column: str, delay_ms: int | None) -> StructType:
    """``struct`` with the watermark on ``column``, as Spark re-assigns it to the output column of
    ``eventTimeColumnName`` (the delay in the column's metadata, where PySpark records it)."""
    fields = []
    for f in struct.fields:
        if f.name == column and delay_ms is not None:
            metadata = {**(f.metadata or {}), WATERMARK_DELAY_KEY: delay_ms}
            f = StructField(f.name, f.dataType, f.nullable, metadata)
        fields.append(f)
    return StructType(fields)


def plan_stages(
    df: DataFrame,
    steps: Sequence[Step],
    output_mode: str,
    event_time: str | None,
    watermark_delay_ms: int | None = None,
) -> list[Stage]:
    """The stages of a query, checked against ``output_mode`` as Spark would check them."""
    if not steps:
        msg = (
            "the query has no stateful step; add groupBy().agg() or dropDuplicates(), or use "
            "df.writeStream directly"
        )
        raise ConfigurationError(msg)
    stages: list[Stage] = []
    current = df
    stateful = [s for s in steps if not isinstance(s, StatelessStep)]
    for step in steps:
        if isinstance(step, StatelessStep):
            current = _plan_stateless(stages[-1], current, step, output_mode)
            continue
        op_id = len(stages)
        if stages and isinstance(stages[-1].operator, StreamingAggregate):
            msg = (
                "a stateful step after an aggregation is not supported yet; "
                "deduplicate before aggregating"
            )
            raise ConfigurationError(msg)
        previous = stateful[op_id - 1]
        if stages and isinstance(previous, ArbitraryStep):
            msg = (
                f"a stateful step after {previous.api} is not supported yet; "
                "make the arbitrary-state step the last one"
            )
            raise ConfigurationError(msg)
        watermark = event_time if op_id == 0 else None
        if isinstance(step, ArbitraryStep):
            stage, current = _plan_arbitrary(
                op_id,
                current,
                step,
                watermark,
                event_time is not None,
                output_mode,
                watermark_delay_ms,
            )
        elif isinstance(step, AggregateStep):
            stage, current = _plan_aggregate(
                op_id, current, step, watermark, event_time is not None, output_mode
            )
        else:
            stage, current = _plan_dedup(op_id, current, step, watermark, event_time is not None)
        stages.append(stage)
    has_agg = any(isinstance(s.operator, StreamingAggregate) for s in stages)
    if output_mode == "append" and has_agg:
        msg = (
            "append output mode needs an aggregation over an event-time window with a watermark "
            "(not supported yet); use outputMode('update') or outputMode('complete')"
        )
        raise ConfigurationError(msg)
    arbitrary = [s.api for s in steps if isinstance(s, ArbitraryStep)]
    if output_mode == "complete" and arbitrary:
        msg = f"{arbitrary[0]} does not support complete output mode (as in Spark); use update"
        raise ConfigurationError(msg)
    if output_mode == "complete" and not has_agg:
        msg = (
            "complete output mode needs a streaming aggregation; use outputMode('append') or "
            "outputMode('update')"
        )
        raise ConfigurationError(msg)
    for stage in stages:
        if not has_agg or isinstance(stage.operator, StreamingAggregate):
            stage.operator.check_output_mode(output_mode)
        _check_storable(stage)
    return stages


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
)
_SORTS = ("orderBy", "sort")


def _plan_stateless(stage: Stage, output: DataFrame, step: StatelessStep, mode: str) -> DataFrame:
    """Attach ``step`` to ``stage``'s output; Spark analyses it here, so a bad column fails at
    ``start()``."""
    if step.method in _SORTS and not (
        mode == "complete" and isinstance(stage.operator, StreamingAggregate)
    ):
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
        msg = f"{step.method}() after operator {stage.op_id} ({stage.operator.kind}): {exc}"
        raise ConfigurationError(msg) from exc
    stage.after.append(step)
    return result


def _check_storable(stage: Stage) -> None:
    """Fail at start, not in a task, when the state's key or value types cannot be stored."""
    op = stage.operator
    families = {DEFAULT_CF: (op.key_schema, op.value_schema), **op.column_families()}
    for name, (key, value) in families.items():
        try:
            ColumnFamily(name, key, value)
        except ConfigurationError as exc:
            msg = (
                f"operator {stage.op_id} ({op.kind}) keeps state by {stage.partition_columns}: "
                f"{exc}. Group or deduplicate by plain columns (window() keys are not "
                "supported yet)"
            )
            raise ConfigurationError(msg) from exc
