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
from pyspark.sql.types import (
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sparkstate.engine.aggregate_plan import (
    aggregate_function,
    input_types,
    partial_columns,
    recognise,
    spark_twin,
)
from sparkstate.engine.initial_state import InitialState, plan_initial_state
from sparkstate.engine.spark_conf import arrow_batch_limits, state_encoding_format
from sparkstate.engine.user_state import SPARK_GROUP_STATES
from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression, SessionWindow, TimeWindow, WindowTime
from sparkstate.operators.aggregate import (
    EVENT_TIME_COLUMN,
    ROWS_COLUMN,
    StreamingAggregate,
    WindowKey,
)
from sparkstate.operators.base import StatefulOperator
from sparkstate.operators.dedup import Deduplicate, DeduplicateWithinWatermark
from sparkstate.operators.flat_map_groups import ApplyInPandasWithState, FlatMapGroupsWithState
from sparkstate.operators.limit import LIMIT_KEY, StreamingLimit
from sparkstate.operators.schemas import PickledState
from sparkstate.operators.session_window import SessionWindowAggregate
from sparkstate.operators.transform_with_state import TransformWithState
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY
from sparkstate.store.base import DEFAULT_CF, ColumnFamily

#: Spark's metadata marks on the column of a ``window()`` and a ``session_window()`` key.
TIME_WINDOW_MARKER = "spark.timeWindow"
SESSION_WINDOW_MARKER = "spark.sessionWindow"
#: The operators of ``groupBy().agg()``.
AGGREGATIONS = (StreamingAggregate, SessionWindowAggregate)

__all__ = [
    "PROCESSOR_APIS",
    "AggregateStep",
    "ArbitraryStep",
    "DedupStep",
    "LimitStep",
    "Stage",
    "StatelessStep",
    "Step",
    "plan_chain",
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
    it over both inputs): a ``sparkstate.engine.join_plan.JoinPlan``."""

    plan: Any

    @property
    def name(self) -> str:
        return "join"


Step = AggregateStep | DedupStep | ArbitraryStep | LimitStep | JoinStep | StatelessStep

#: The APIs of ``ArbitraryStep`` that run a ``StatefulProcessor``.
PROCESSOR_APIS = ("transformWithStateInPandas", "transformWithState")
#: The APIs of ``ArbitraryStep`` that run a function with a ``GroupState``.
ARBITRARY_FUNCTION_APIS = ("applyInPandasWithState", "flatMapGroupsWithState")


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
    if isinstance(col, WindowTime):
        return F.window_time(_as_column(col.window_column))
    return quote(col) if isinstance(col, str) else col


def grouping_column(key: Any) -> Column:
    """A grouping key as Spark's Column: ``SF.window``/``SF.session_window`` become Spark's."""
    if isinstance(key, TimeWindow):
        out = F.window(
            _as_column(key.time_column), key.window_duration, key.slide_duration, key.start_time
        )
    elif isinstance(key, SessionWindow):
        gap = key.gap_duration
        out = F.session_window(_as_column(key.time_column), gap)
    else:
        return _as_column(key)
    return out.alias(key.name) if key.name else out


def _plan_aggregate(
    op_id: int,
    df: DataFrame,
    step: AggregateStep,
    event_time: str | None,
    watermark_present: bool,
    query_mode: str,
    watermark_delay_ms: int | None = None,
) -> tuple[Stage, DataFrame]:
    keys = [grouping_column(k) for k in step.keys]
    aggs = [recognise(agg) for agg in step.aggregates]
    in_types = input_types(df, aggs)
    analysed = _with_watermark(df, event_time, watermark_delay_ms)
    final = analysed.groupBy(*keys).agg(*[spark_twin(a) for a in aggs])
    struct = final.schema
    nkeys = len(keys)
    key_fields = struct.fields[:nkeys]
    layout = _key_layout(key_fields, event_time)
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
    ansi = str(df.sparkSession.conf.get("spark.sql.ansi.enabled", "true")).lower() == "true"
    operator: StatefulOperator
    if layout.session is not None:
        operator = SessionWindowAggregate(
            arrow_schema(StructType(layout.state_fields), nullable=True),
            layout.session,
            aggregates,
            output_schema=arrow_schema(struct),
            output_keys=layout.output_keys,
            watermarked=layout.session_watermarked,
            has_event_time=has_event_time,
            ansi=ansi,
            no_data_batches=watermark_present and query_mode != "complete",
        )
    else:
        operator = StreamingAggregate(
            arrow_schema(StructType(layout.state_fields), nullable=True),
            aggregates,
            output_schema=arrow_schema(struct),
            output_keys=layout.output_keys,
            watermark_key=layout.watermark_key,
            has_event_time=has_event_time,
            ansi=ansi,
            no_data_batches=watermark_present and query_mode != "complete",
        )

    partial_names = analysed.groupBy(*keys).agg(*partials).columns[nkeys:]
    flat = [*layout.columns, *[quote(c) for c in partial_names]]

    def prepare(batch: DataFrame) -> DataFrame:
        return batch.groupBy(*keys).agg(*partials).select(*flat)

    return Stage(op_id, operator, struct, [f.name for f in layout.state_fields], prepare), final


@dataclasses.dataclass
class _KeyLayout:
    """How an aggregation's grouping keys are kept in state (see :class:`StreamingAggregate`)."""

    #: State key fields, in state key order: the watermark's column first, when there is one.
    state_fields: list[StructField]
    #: The output's keys in output order: state column names, or windows.
    output_keys: list[str | WindowKey]
    #: The partial aggregate's key columns, as the state key columns (windows split in two).
    columns: list[Column]
    watermark_key: str | None
    #: The session window key, if there is one (kept per key, not in the state key's columns).
    session: WindowKey | None = None
    session_watermarked: bool = False


def _key_layout(key_fields: Sequence[StructField], event_time: str | None) -> _KeyLayout:
    """State layout of the grouping keys: a time window as its ``end`` and ``start`` columns;
    the key the watermark is on (by Spark's metadata, as Spark finds it) leading the state key."""
    fields: list[StructField] = []
    output_keys: list[str | WindowKey] = []
    columns: list[Column] = []
    watermark_key = None
    windows = [
        f.name
        for f in key_fields
        if (f.metadata or {}).get(SESSION_WINDOW_MARKER)
        or (f.metadata or {}).get(TIME_WINDOW_MARKER)
    ]
    if len(windows) > 1:
        msg = (
            f"group by one window() or session_window() at most, got {windows} (as in Spark: "
            "several would multiply every row)"
        )
        raise ConfigurationError(msg)
    session = None
    session_watermarked = False
    for f in key_fields:
        meta = f.metadata or {}
        watermarked = WATERMARK_DELAY_KEY in meta or f.name == event_time
        if meta.get(SESSION_WINDOW_MARKER) and isinstance(f.dataType, StructType):
            session = WindowKey.of(f.name)
            columns += [
                quote(f.name).getField("start").alias(session.start),
                quote(f.name).getField("end").alias(session.end),
            ]
            output_keys.append(session)
            session_watermarked = watermarked
            continue
        if meta.get(TIME_WINDOW_MARKER) and isinstance(f.dataType, StructType):
            window = WindowKey.of(f.name)
            time_type = f.dataType.fields[0].dataType
            fields += [StructField(window.end, time_type), StructField(window.start, time_type)]
            columns += [
                quote(f.name).getField("end").alias(window.end),
                quote(f.name).getField("start").alias(window.start),
            ]
            output_keys.append(window)
            if watermarked and watermark_key is None:
                watermark_key = window.end
            continue
        fields.append(StructField(f.name, f.dataType))
        columns.append(quote(f.name))
        output_keys.append(f.name)
        if watermarked and watermark_key is None and _is_time(f.dataType):
            watermark_key = f.name
    if session is not None:  # sessions evict by their own index; keys keep their order
        return _KeyLayout(fields, output_keys, columns, None, session, session_watermarked)
    if watermark_key is not None:  # eviction is a range scan from the start of the key space
        first = next(i for i, f in enumerate(fields) if f.name == watermark_key)
        fields.insert(0, fields.pop(first))
    return _KeyLayout(fields, output_keys, columns, watermark_key)


def _is_time(data_type: Any) -> bool:
    return isinstance(data_type, TimestampType | TimestampNTZType)


def _with_watermark(df: DataFrame, event_time: str | None, delay_ms: int | None) -> DataFrame:
    """``df`` with the query's watermark as Spark records it (on the event-time column's metadata,
    which the analyzer carries to a ``window()`` of it), for planning only."""
    if event_time is None or delay_ms is None or event_time not in df.columns:
        return df
    meta = df.schema[event_time].metadata or {}
    if WATERMARK_DELAY_KEY in meta:
        return df
    return df.withWatermark(event_time, f"{delay_ms} milliseconds")


def _plan_dedup(
    op_id: int,
    df: DataFrame,
    step: DedupStep,
    event_time: str | None,
    watermark_present: bool,
    delay_ms: int | None,
) -> tuple[Stage, DataFrame]:
    columns = list(step.columns) if step.columns else list(df.columns)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        msg = f"{step.api}: no column(s) {missing}; the stream has {df.columns}"
        raise ConfigurationError(msg)
    schema = arrow_schema(df.schema)
    has_event_time = event_time is not None and event_time in df.columns
    operator: Deduplicate
    if step.within_watermark:
        if not has_event_time or delay_ms is None:
            msg = (
                "dropDuplicatesWithinWatermark is not supported on streaming DataFrames/Datasets "
                "without a watermark (as in Spark): call withWatermark() on the input first"
            )
            raise ConfigurationError(msg)
        assert event_time is not None
        operator = DeduplicateWithinWatermark(
            schema, columns, event_time=event_time, delay_ms=delay_ms
        )
    else:
        operator = Deduplicate(
            schema,
            columns,
            event_time=event_time if has_event_time else None,
            no_data_batches=watermark_present,
        )
    # Downstream steps find the event time as Spark's analyzer does, by the column's metadata.
    planned = _with_watermark(df, event_time, delay_ms)
    return Stage(op_id, operator, df.schema, columns, lambda batch: batch), planned


def _event_time_of(df: DataFrame) -> str | None:
    """The column of ``df`` the watermark is on (its delay in the column's metadata, where
    Spark carries it through the operators), if any."""
    for f in df.schema.fields:
        if WATERMARK_DELAY_KEY in (f.metadata or {}) and _is_time(f.dataType):
            return f.name
    return None


#: Spark's limit takes a Java int.
MAX_LIMIT = 2**31 - 1


def _check_limit(step: LimitStep) -> int:
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


def _with_limits_checked(steps: Sequence[Step], mode: str) -> list[Step]:
    """``steps`` with every ``limit()`` checked as Spark checks it; one right after an
    aggregation in complete mode becomes a limit of each batch's result, as Spark plans it (no
    state). The others are stateful steps of their own."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, LimitStep):
            num = _check_limit(step)
            if mode == "update":
                msg = (
                    "Limits are not supported on streaming DataFrames/Datasets in Update output "
                    "mode (as in Spark); use outputMode('append'), or outputMode('complete') for "
                    "a limit after an aggregation"
                )
                raise ConfigurationError(msg)
            before = [s for s in out if not isinstance(s, StatelessStep)]
            if mode == "complete" and before and isinstance(before[-1], AggregateStep):
                step = StatelessStep("limit", (num,))
        out.append(step)
    return out


def _plan_limit(
    op_id: int, df: DataFrame, step: LimitStep, event_time: str | None
) -> tuple[Stage, DataFrame]:
    """The streaming limit: every row to the one partition whose store keeps the count (the
    input shuffled by a constant column, the key of that count)."""
    num = _check_limit(step)
    if LIMIT_KEY in df.columns:
        msg = f"limit(): the column name {LIMIT_KEY!r} is taken by sparkstate; rename the column"
        raise ConfigurationError(msg)

    def prepare(batch: DataFrame) -> DataFrame:
        return batch.withColumn(LIMIT_KEY, F.lit(None).cast("int"))

    has_event_time = event_time is not None and event_time in df.columns
    operator = StreamingLimit(
        arrow_schema(prepare(df).schema),
        num,
        event_time=event_time if has_event_time else None,
    )
    return Stage(op_id, operator, df.schema, [LIMIT_KEY], prepare), df


def session_time_zone(df: DataFrame) -> str:
    """``spark.sql.session.timeZone``: the zone user functions see timestamps in."""
    return str(df.sparkSession.conf.get("spark.sql.session.timeZone"))


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
    if query_mode != mode and api in ARBITRARY_FUNCTION_APIS:
        # Spark checks the *GroupsWithState operators' mode against the query's; a
        # transformWithState's outputMode is not checked (any pairing runs).
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
        max_records, max_bytes = arrow_batch_limits(df.sparkSession)
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
            time_zone=session_time_zone(df),
            state_encoding=state_encoding_format(df.sparkSession),
            max_records_per_batch=max_records,
            max_bytes_per_batch=max_bytes,
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
            time_zone=session_time_zone(df),
            state_classes=SPARK_GROUP_STATES,
            **extra,
        )
    add_initial = None if initial is None else initial.add_to
    stage = Stage(op_id, operator, out_struct, keys, lambda batch: batch, add_initial)
    return stage, _output_shape(df, out_struct)


def _output_shape(df: DataFrame, struct: StructType) -> DataFrame:
    """A DataFrame of the operator's output schema, as the driver's ``mapInArrow`` makes it
    each batch, for Spark to analyse the steps after it against (it never runs)."""
    return df.mapInArrow(_planned_only, struct)


def _planned_only(batches: Any) -> Any:
    msg = "a planning placeholder ran: the driver replaces it with the operator's task"
    raise AssertionError(msg)


def _plan_join(op_id: int, step: JoinStep) -> tuple[Stage, DataFrame]:
    """The join's stage: its input is the stream itself (the tagged union of both sides); its
    output is renamed to Spark's columns of the join."""
    plan = step.plan
    rename = StatelessStep("select", tuple(plan.output_columns))
    stage = Stage(
        op_id,
        plan.operator,
        plan.output_struct,
        plan.partition_columns,
        lambda batch: batch,
        after=[rename],
        inputs=dict(plan.tracker_inputs),
        source=plan.source(op_id),
    )
    names = [f.name for f in plan.output_struct.fields]
    return stage, plan.union.select(*names).select(*plan.output_columns)


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
    return plan_chain(df, steps, output_mode, event_time, watermark_delay_ms)[0]


def plan_chain(
    df: DataFrame,
    steps: Sequence[Step],
    output_mode: str,
    event_time: str | None,
    watermark_delay_ms: int | None = None,
) -> tuple[list[Stage], DataFrame]:
    """:func:`plan_stages`, and the DataFrame that stands for the last step's output."""
    if not steps:
        msg = (
            "the query has no stateful step; add groupBy().agg() or dropDuplicates(), or use "
            "df.writeStream directly"
        )
        raise ConfigurationError(msg)
    stages: list[Stage] = []
    current = df
    lag = 0  # how far the watermark of the steps after a join is behind the query's
    steps = _with_limits_checked(steps, output_mode)
    stateful = [s for s in steps if not isinstance(s, StatelessStep)]
    for step in steps:
        if isinstance(step, StatelessStep):
            current = _plan_stateless(stages[-1], current, step, output_mode)
            continue
        position = len(stages)
        op_id = len(stateful) - 1 - position  # Spark numbers them from the sink: the last is 0
        if position:
            _check_chain(stateful[:position], step, output_mode)
        watermark = event_time if position == 0 else None
        if position > 0 and isinstance(step, DedupStep) and event_time is not None:
            watermark = _event_time_of(current)  # late rows and expiry as the first step's
        if position > 0 and _is_processor(stateful[position - 1]) and event_time is not None:
            # Spark 4 carries the watermark through transformWithState (its output watermark
            # is its input's) on the output column named by eventTimeColumnName.
            watermark = _event_time_of(current)
        if isinstance(step, JoinStep):
            if position:
                msg = "a stream-stream join after another stateful step is not supported yet"
                raise ConfigurationError(msg)
            if output_mode != "append":
                msg = (
                    "Join between two streaming DataFrames/Datasets is not supported in "
                    f"{output_mode.title()} output mode, only in Append output mode"
                )
                raise ConfigurationError(msg)
            stage, current = _plan_join(op_id, step)
            stages += step.plan.input_stages(op_id)  # its sides' stateful steps, if any
            lag = step.plan.output_lag_ms
        elif isinstance(step, ArbitraryStep):
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
                op_id,
                current,
                step,
                watermark,
                event_time is not None,
                output_mode,
                watermark_delay_ms,
            )
        elif isinstance(step, LimitStep):
            stage, current = _plan_limit(op_id, current, step, watermark)
        else:
            stage, current = _plan_dedup(
                op_id, current, step, watermark, event_time is not None, watermark_delay_ms
            )
        if not isinstance(step, JoinStep):
            stage.watermark_lag_ms = lag
        stages.append(stage)
    aggs = [s.operator for s in stages if isinstance(s.operator, AGGREGATIONS)]
    has_agg = bool(aggs)
    if output_mode == "append" and not all(map(_closes_by_watermark, aggs)):
        msg = (
            "Append output mode not supported when there are streaming aggregations on streaming "
            "DataFrames/DataSets without watermark (as in Spark): group by a window() of the "
            "watermarked column, or by that column, or use outputMode('update') or "
            "outputMode('complete')"
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
        if not has_agg or isinstance(stage.operator, AGGREGATIONS):
            stage.operator.check_output_mode(output_mode)
        _check_storable(stage)
    return stages, current


#: Spark's error for a stateful step after one that may emit rows behind the watermark.
CORRECTNESS_ERROR = (
    "Detected pattern of possible 'correctness' issue due to global watermark. The query "
    "contains stateful operation which can emit rows older than the current watermark plus "
    'allowed late record delay, which are "late rows" in downstream stateful operations and '
    "these rows can be discarded. (as in Spark: an aggregation emits such rows in {mode} output "
    "mode; chain stateful steps after an aggregation in append mode)"
)


def _is_processor(step: Step) -> bool:
    """A transformWithState(InPandas) step: Spark 4 lets stateful steps follow it."""
    return isinstance(step, ArbitraryStep) and step.api in PROCESSOR_APIS


def _check_chain(before: Sequence[Step], step: Step, mode: str) -> None:
    """Spark 4's rules for a stateful ``step`` after the stateful steps ``before``: in append
    mode, anything after a deduplication or an aggregation but ``applyInPandasWithState`` /
    ``flatMapGroupsWithState`` after an aggregation; in update mode, nothing after an
    aggregation (its updates are "late rows" downstream). After transformWithState anything
    (the watermark goes on in its eventTimeColumnName); after applyInPandasWithState /
    flatMapGroupsWithState the output has no watermark Spark could carry: not supported here."""
    previous = before[-1]
    if isinstance(previous, ArbitraryStep) and not _is_processor(previous):
        msg = (
            f"a stateful step after {previous.api} is not supported yet; "
            "make the arbitrary-state step the last one"
        )
        raise ConfigurationError(msg)
    if not any(isinstance(s, AggregateStep) for s in before):
        return
    if isinstance(step, ArbitraryStep) and step.api in ARBITRARY_FUNCTION_APIS:
        how = "after" if mode == "append" else "with"
        msg = (
            f"{step.api} in {mode} mode is not supported {how} aggregation on a streaming "
            "DataFrame/Dataset (as in Spark)"
        )
        raise ConfigurationError(msg)
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
)
_SORTS = ("orderBy", "sort")


def _plan_stateless(stage: Stage, output: DataFrame, step: StatelessStep, mode: str) -> DataFrame:
    """Attach ``step`` to ``stage``'s output; Spark analyses it here, so a bad column fails at
    ``start()``."""
    if step.method in _SORTS and not (
        mode == "complete" and isinstance(stage.operator, AGGREGATIONS)
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


def _closes_by_watermark(op: StatefulOperator) -> bool:
    """Whether an aggregation's rows close when the watermark passes them (append mode)."""
    if isinstance(op, SessionWindowAggregate):
        return op.watermarked
    return isinstance(op, StreamingAggregate) and op.watermark_key is not None


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
                f"{exc}. Group or deduplicate by plain columns or window() keys (struct, array "
                "and map keys are not supported)"
            )
            raise ConfigurationError(msg) from exc
