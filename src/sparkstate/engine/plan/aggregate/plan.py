"""Planning a streaming aggregation: ``groupBy(*keys).agg(*aggregates)`` as a stage.

Spark's analyzer names and types the output (after each aggregate's Spark twin); Spark computes
each batch's partial aggregate per key in the JVM; the operator merges one row per key with the
state. Grouping keys are kept in state as :class:`_KeyLayout` says: a time window as its ``end``
and ``start``, the watermarked key first, so that eviction is a range scan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, cast

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from sparkstate.engine.plan.aggregate.analysis import split_aggregates
from sparkstate.engine.plan.aggregate.partials import (
    aggregate_function,
    input_types,
    partial_columns,
    spark_twin,
)
from sparkstate.engine.plan.aggregate.recognise import recognise
from sparkstate.engine.plan.stage import PlanContext, Planned, Stage, StatefulStep, StatelessStep
from sparkstate.engine.spark.errors import unsupported_operation
from sparkstate.engine.spark.schema import (
    ColumnSeq,
    arrow_safe,
    arrow_schema,
    is_time,
    quote,
    with_watermark,
)
from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression, SessionWindow, TimeWindow, WindowTime
from sparkstate.operators.aggregation.aggregate import (
    EVENT_TIME_COLUMN,
    EVENT_TIME_COUNT_COLUMN,
    EVENT_TIME_MIN_COLUMN,
    EVENT_TIME_SUM_COLUMN,
    GLOBAL_KEY,
    ROWS_COLUMN,
    StreamingAggregate,
    WindowKey,
)
from sparkstate.operators.aggregation.session_window import SessionWindowAggregate
from sparkstate.operators.base import StatefulOperator
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY

__all__ = [
    "aggregate_function",
    "closes_by_watermark",
    "grouping_column",
    "input_types",
    "partial_columns",
    "plan_aggregate",
    "recognise",
    "spark_twin",
]

#: Spark's metadata marks on the column of a ``window()`` and a ``session_window()`` key.
TIME_WINDOW_MARKER = "spark.timeWindow"
SESSION_WINDOW_MARKER = "spark.sessionWindow"


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


@dataclasses.dataclass(frozen=True)
class AggregateStep(StatefulStep):
    """``groupBy(*keys).agg(*aggregates)``."""

    keys: tuple[Any, ...]
    aggregates: tuple[AggregateExpression, ...]
    is_aggregation: ClassVar[bool] = True

    def plan(self, at: PlanContext) -> Planned:
        return plan_aggregate(self, at)


def plan_aggregate(step: AggregateStep, at: PlanContext) -> Planned:
    """``groupBy().agg()``: Spark computes each batch's partial aggregate per key; the operator
    merges it with the state. A session window's key makes it a session window aggregation."""
    op_id, df, event_time = at.op_id, at.df, at.event_time
    watermark_present, query_mode = at.watermark_present, at.output_mode
    keys = [grouping_column(k) for k in step.keys]
    analysed = with_watermark(df, event_time, at.watermark_delay_ms)
    split = split_aggregates(analysed, keys, step.aggregates)
    aggs = split.aggregates
    in_types = input_types(df, aggs)
    final = analysed.groupBy(*keys).agg(*[spark_twin(a) for a in aggs])
    struct = final.schema
    nkeys = len(keys)
    key_fields = struct.fields[:nkeys]
    if len(set(struct.names)) != len(struct.names):
        msg = f"the aggregation's output has duplicate column names {struct.names}; use .alias()"
        raise ConfigurationError(msg)
    layout = _key_layout(key_fields, event_time)
    shipped = cast("StructType", arrow_safe(struct))  # the operator's output, as Arrow takes it
    legacy = df.sparkSession.conf.get("spark.sql.legacy.statisticalAggregate", "false")
    aggregates = [
        aggregate_function(
            agg, field.name, field.dataType, typ, legacy_statistics=str(legacy).lower() == "true"
        )
        for agg, field, typ in zip(aggs, struct.fields[nkeys:], in_types, strict=True)
    ]
    partials = partial_columns(aggs, in_types)
    partials.append(F.count(F.lit(1)).alias(ROWS_COLUMN))
    has_event_time = at.has_event_time
    if event_time is not None and has_event_time:
        times = quote(event_time).cast("timestamp")
        partials += [
            F.max(times).alias(EVENT_TIME_COLUMN),
            F.min(times).alias(EVENT_TIME_MIN_COLUMN),
            F.sum(F.unix_millis(times).cast("double")).alias(EVENT_TIME_SUM_COLUMN),
            F.count(times).alias(EVENT_TIME_COUNT_COLUMN),
        ]
    ansi = str(df.sparkSession.conf.get("spark.sql.ansi.enabled", "true")).lower() == "true"
    operator: StatefulOperator
    if layout.session is not None:
        try:  # Spark's analyzer refuses the mode first, a session window without keys after
            SessionWindowAggregate.refuse_output_mode(query_mode)
        except ConfigurationError as exc:
            operation = "session window streaming aggregations"
            raise unsupported_operation(str(exc), query_mode, operation) from None
        operator = SessionWindowAggregate(
            arrow_schema(StructType(layout.state_fields), nullable=True),
            layout.session,
            aggregates,
            output_schema=arrow_schema(shipped),
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
            output_schema=arrow_schema(shipped),
            output_keys=layout.output_keys,
            watermark_key=layout.watermark_key,
            has_event_time=has_event_time,
            ansi=ansi,
            no_data_batches=watermark_present and query_mode != "complete",
        )

    partial_names = analysed.groupBy(*keys).agg(*partials).columns[nkeys:]
    grouping, flat_keys = keys, layout.columns
    in_state_order = _grouping_in_state_order(keys, key_fields, layout)
    if in_state_order is not None:  # the partial aggregate's shuffle is the state's
        grouping, flat_keys = in_state_order
    flat = [*flat_keys, *[quote(c) for c in partial_names]]

    prepare = _PartialAggregate(grouping, partials, flat)

    stage = Stage(op_id, operator, shipped, [f.name for f in layout.state_fields], prepare)
    stage.key_struct = StructType(key_fields)
    if shipped != struct:  # the keys under their own field names again
        back = [
            quote(f.name) if f == g else quote(f.name).cast(f.dataType).alias(f.name)
            for f, g in zip(struct.fields, shipped.fields, strict=True)
        ]
        stage.after.append(StatelessStep("select", tuple(back)))
    if split.projection is None:
        return Planned(stage, final)
    # Spark evaluates the expressions around the merged aggregates, over the operator's output.
    output, projections = split.output_of(final)
    stage.after += [StatelessStep("select", tuple(p)) for p in projections]
    return Planned(stage, output)


class _PartialAggregate:
    """A batch's partial aggregate per key, ``groupBy(*keys).agg(*partials).select(*flat)``,
    its columns made into the JVM's once (:class:`ColumnSeq`), not at every batch."""

    def __init__(self, keys: list[Column], partials: list[Column], flat: list[Column]) -> None:
        self.keys, self.first = ColumnSeq(keys), partials[0]
        self.rest, self.flat = ColumnSeq(partials[1:]), ColumnSeq(flat)

    def __call__(self, batch: DataFrame) -> DataFrame:
        keys, rest, flat = self.keys.seq(batch), self.rest.seq(batch), self.flat.seq(batch)
        if keys is None or rest is None or flat is None:  # Spark Connect
            aggregated = batch.groupBy(*self.keys.columns()).agg(self.first, *self.rest.columns())
            return aggregated.select(*self.flat.columns())
        jdf: Any = getattr(batch, "_jdf")  # noqa: B009 - classic only
        first: Any = getattr(self.first, "_jc")  # noqa: B009
        out = jdf.groupBy(keys).agg(first, rest).select(flat)
        return type(batch)(out, batch.sparkSession)


def _grouping_in_state_order(
    keys: list[Column], key_fields: list[StructField], layout: _KeyLayout
) -> tuple[list[Column], list[Column]] | None:
    """The partial aggregate's grouping as the state's key columns in the state's order (a
    window's end and start), and those columns of its output in the operator's input order.

    Spark's shuffle of that aggregate then hashes each row as the stage's shuffle by the state
    key columns would, and Spark drops the stage's (one shuffle a batch, not two: grouped by the
    window's struct, the rows were shuffled once by the struct and again by its fields). None
    where a key is not kept in state as Spark groups it: a session window, a key whose type the
    state keeps otherwise.
    """
    if layout.session is not None:
        return None
    by_name: dict[str, Column] = {}
    flat: list[str] = []
    for column, f in zip(keys, key_fields, strict=True):
        if (f.metadata or {}).get(TIME_WINDOW_MARKER) and isinstance(f.dataType, StructType):
            # The struct's fields (Spark's analyzer expands a window() inside them).
            window = WindowKey.of(f.name)
            by_name[window.end] = column.getField("end").alias(window.end)
            by_name[window.start] = column.getField("start").alias(window.start)
            flat += [window.end, window.start]
            continue
        if arrow_safe(f.dataType) != f.dataType:
            return None
        by_name[f.name] = column
        flat.append(f.name)
    if set(by_name) != {f.name for f in layout.state_fields}:  # a global aggregation's key
        return None
    return [by_name[f.name] for f in layout.state_fields], [quote(n) for n in flat]


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
    the key the watermark is on (by Spark's metadata, as Spark finds it) leading the state key;
    no keys at all (a global aggregation), the constant :data:`GLOBAL_KEY`."""
    if not key_fields:
        key = StructField(GLOBAL_KEY, IntegerType(), nullable=False)
        return _KeyLayout([key], [], [F.lit(0).alias(GLOBAL_KEY)], None)
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
        shipped = arrow_safe(f.dataType)  # a struct as the operator keeps it
        fields.append(StructField(f.name, shipped))
        column = quote(f.name)
        columns.append(column if shipped == f.dataType else column.cast(shipped).alias(f.name))
        output_keys.append(f.name)
        if watermarked and watermark_key is None and is_time(f.dataType):
            watermark_key = f.name
    if session is not None:  # sessions evict by their own index; keys keep their order
        return _KeyLayout(fields, output_keys, columns, None, session, session_watermarked)
    if watermark_key is not None:  # eviction is a range scan from the start of the key space
        first = next(i for i, f in enumerate(fields) if f.name == watermark_key)
        fields.insert(0, fields.pop(first))
    return _KeyLayout(fields, output_keys, columns, watermark_key)


def closes_by_watermark(op: StatefulOperator) -> bool:
    """Whether an aggregation's rows close when the watermark passes them (append mode)."""
    if isinstance(op, SessionWindowAggregate):
        return op.watermarked
    return isinstance(op, StreamingAggregate) and op.watermark_key is not None
