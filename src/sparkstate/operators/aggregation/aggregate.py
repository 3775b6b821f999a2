"""Keyed streaming aggregation: merge each batch's partial aggregates into per-key state.

Spark computes, per micro-batch, one row per distinct key holding partial aggregation buffers (a
count, a sum, a min...). This operator merges those rows with the buffers kept in the store, writes
the merged buffers back, and emits final values: the updated keys (update mode) or every key
(complete mode), or the keys the watermark closes (append mode). Types and null rules follow
Spark, per function, in :mod:`sparkstate.operators.aggregation.aggregate_functions`.

A grouping key may be a time window (``window(...)``): Spark assigns each row its windows before
the shuffle, and the state keeps the window as two timestamp key columns, its end first. When the
watermark is on a grouping key (a window or an event-time column), that column leads the state key,
so the rows the watermark closes (``end <= watermark``, Spark's rule) are one range scan from the
start of the key space: eviction reads what it evicts, never the whole state.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.operators._arrow import (
    EventTimeStats,
    conform,
    is_late,
    lookup,
    max_event_time_ms,
    min_event_time_ms,
    scan,
)
from sparkstate.operators.aggregation.aggregate_functions import (
    AGGREGATE_FUNCTIONS,
    AggregateFunction,
    AggregateOverflowError,
    buffer_column,
)
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.operators.spark_state import (
    KEY_NOT_COMPATIBLE,
    VALUE_NOT_COMPATIBLE,
    SparkRows,
    by_name,
    by_position,
    fields_of,
)
from sparkstate.operators.state_views import KeyValueView, StateView
from sparkstate.store.base import DEFAULT_CF, StateStore
from sparkstate.store.schema_json import schema_to_json

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "AggregateFunction",
    "AggregateOverflowError",
    "StreamingAggregate",
    "WindowKey",
    "buffer_column",
]

#: Hidden input column: rows of the raw input behind each partial row (for ``numInputRows``).
ROWS_COLUMN = "__ss_rows"
#: The state key of a global aggregation (``groupBy()`` without keys, ``df.agg(...)``): Spark
#: keeps its one row under an empty key; a store's key has a column at least, so here a constant
#: 0, never in the output.
GLOBAL_KEY = "__ss_global"
#: Hidden input column: largest event time behind each partial row (for the watermark).
EVENT_TIME_COLUMN = "__ss_event_time"
#: Hidden input columns: the earliest event time behind each partial row, the sum of its rows'
#: event times in milliseconds and their count (the progress's ``eventTime`` ``min`` and ``avg``).
EVENT_TIME_MIN_COLUMN = "__ss_event_time_min"
EVENT_TIME_SUM_COLUMN = "__ss_event_time_sum_ms"
EVENT_TIME_COUNT_COLUMN = "__ss_event_time_count"


def partial_event_time_stats(batch: pa.RecordBatch | pa.Table) -> EventTimeStats | None:
    """The event-time statistics of the raw rows behind a batch of partial rows."""
    maximum = max_event_time_ms(batch.column(EVENT_TIME_COLUMN))
    minimum = min_event_time_ms(batch.column(EVENT_TIME_MIN_COLUMN))
    count = int(pc.sum(batch.column(EVENT_TIME_COUNT_COLUMN)).as_py() or 0)
    if maximum is None or minimum is None or count == 0:
        return None
    total = float(pc.sum(batch.column(EVENT_TIME_SUM_COLUMN)).as_py() or 0.0)
    return EventTimeStats(maximum, minimum, total, count)


@dataclasses.dataclass(frozen=True)
class WindowKey:
    """A grouping key that is a time window: an output struct ``name`` of ``start`` and ``end``
    timestamps, kept in state (and in the operator's input) as key columns ``start`` and ``end``."""

    name: str
    start: str
    end: str

    @classmethod
    def of(cls, name: str) -> WindowKey:
        return cls(name, f"__ss_{name}_start", f"__ss_{name}_end")

    def describe(self) -> dict[str, str]:
        return {"window": self.name, "start": self.start, "end": self.end}


class StreamingAggregate(StatefulOperator):
    """``groupBy(keys).agg(...)`` over partial aggregates, one row per key and batch.

    Input batches hold the state key columns (``key_schema``), the buffer columns named by
    :func:`buffer_column`, and optionally ``__ss_rows`` (raw rows behind the partial row) and
    ``__ss_event_time`` (largest event time behind it). ``output_keys`` says how the output's key
    columns come from the state's, in output order: a state key column by name, or a
    :class:`WindowKey` rebuilt as a struct (default: the state key columns as they are).

    ``watermark_key``, when set, is the first state key column and holds event time (a window's
    end, or an event-time grouping column): partial rows at or below the watermark are dropped
    (counted as dropped by watermark) and, in update and append mode, state rows at or below it are
    evicted, as Spark does; append mode emits each evicted row, once.
    """

    kind: ClassVar[str] = "aggregate"
    is_aggregation: ClassVar[bool] = True
    exported_to_spark: ClassVar[bool] = True
    renames_keep_state: ClassVar[bool] = True
    nested_keys: ClassVar[bool] = True
    progress_name: ClassVar[str] = "stateStoreSave"
    spark_plain_store: ClassVar[bool] = True
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append", "update", "complete")

    @classmethod
    def spark_partitioning(
        cls, described: dict[str, Any], store: str, shown_key: list[str]
    ) -> tuple[list[str], list[str]]:
        """Spark hashes the grouping keys, its state's key, a window as its struct; a global
        aggregation's state is in partition 0."""
        if shown_key == [GLOBAL_KEY]:  # Spark's key is empty
            return [], []
        return list(shown_key), list(shown_key)

    def __init__(
        self,
        key_schema: pa.Schema,
        aggregates: list[AggregateFunction],
        *,
        output_schema: pa.Schema | None = None,
        output_keys: list[str | WindowKey] | None = None,
        watermark_key: str | None = None,
        has_event_time: bool = False,
        ansi: bool = True,
        no_data_batches: bool = False,
    ) -> None:
        if not aggregates:
            msg = "an aggregation needs at least one aggregate function"
            raise ConfigurationError(msg)
        if watermark_key is not None and watermark_key not in key_schema.names[:1]:
            msg = (
                f"watermark key {watermark_key!r} must be the first state key column of "
                f"{key_schema.names} (eviction scans the keys in its order)"
            )
            raise ConfigurationError(msg)
        self.aggregates = list(aggregates)
        self.key_schema = key_schema
        self.output_keys: list[str | WindowKey] = (
            list(key_schema.names) if output_keys is None else list(output_keys)
        )
        _check_output_keys(self.output_keys, key_schema)
        self.watermark_key = watermark_key
        self.has_event_time = has_event_time
        #: Whether a watermark move asks for a batch, as Spark's ``StateStoreSaveExec`` does in
        #: append and update mode when the query has a watermark (keys without event time
        #: included: only the batch ids show it there).
        self.no_data_batches = no_data_batches
        #: Spark's ``spark.sql.ansi.enabled``: an overflowing sum fails (True) or wraps (False).
        self.ansi = ansi
        # Per aggregate: its buffers in state, and in each batch's partial rows (name, type).
        self._state_buffers: list[list[pa.Field]] = []
        self._input_buffers: list[list[pa.Field]] = []
        for i, agg in enumerate(self.aggregates):
            for kept, described in (
                (self._state_buffers, agg.buffers()),
                (self._input_buffers, agg.inputs()),
            ):
                kept.append(
                    [
                        pa.field(buffer_column(i, agg.func, part), t)
                        for part, (_, t) in enumerate(described)
                    ]
                )
        self.value_schema = pa.schema([f for fs in self._state_buffers for f in fs])
        fields = list(key_schema) + [f for fs in self._input_buffers for f in fs]
        fields.append(pa.field(ROWS_COLUMN, pa.int64()))
        if has_event_time:
            fields.append(pa.field(EVENT_TIME_COLUMN, pa.timestamp("us", tz="UTC")))
            fields.append(pa.field(EVENT_TIME_MIN_COLUMN, pa.timestamp("us", tz="UTC")))
            fields.append(pa.field(EVENT_TIME_SUM_COLUMN, pa.float64()))
            fields.append(pa.field(EVENT_TIME_COUNT_COLUMN, pa.int64()))
        self.input_schema = pa.schema(fields)
        default_output = pa.schema(
            [_output_key_field(k, key_schema) for k in self.output_keys]
            + [pa.field(a.output_name, a.output_type) for a in self.aggregates]
        )
        self.output_schema = output_schema if output_schema is not None else default_output
        if len(self.output_schema) != len(default_output):
            msg = (
                f"output schema has {len(self.output_schema)} columns, expected "
                f"{len(default_output)} (keys, then one per aggregate)"
            )
            raise ConfigurationError(msg)

    @property
    def state_buffers(self) -> list[list[pa.Field]]:
        """Per aggregate, its buffer columns in state (name, type)."""
        return self._state_buffers

    def time_trigger(self) -> str | None:
        return "event" if self.no_data_batches else None

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["aggregates"] = [a.describe() for a in self.aggregates]
        out["watermark_key"] = self.watermark_key
        if any(isinstance(k, WindowKey) for k in self.output_keys):
            keys = self.output_keys
            out["output_keys"] = [k if isinstance(k, str) else k.describe() for k in keys]
        out["output_schema"] = schema_to_json(self.output_schema)
        return out

    # --- its state, as the reader shows it -------------------------------------------------------

    @classmethod
    def default_view(cls, described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
        """Spark's aggregation state: the grouping keys (a window as its ``start``/``end``
        struct) and the aggregation buffers under Spark's names."""
        shape = _window_keys_shape(described.get("output_keys"))
        return KeyValueView(
            DEFAULT_CF, key, value, key_shape=shape, value_shape=buffers_shape(described)
        )

    @classmethod
    def shown_key(cls, described: dict[str, Any], key_schema: pa.Schema) -> list[tuple[str, str]]:
        """A window's ``start`` and ``end`` as two columns, ``window.start`` and ``window.end``."""
        output_keys = described.get("output_keys")
        if not output_keys:
            return super().shown_key(described, key_schema)
        out: list[tuple[str, str]] = []
        for k in output_keys:
            if isinstance(k, str):
                out.append((k, k))
                continue
            out.extend((f"{k['window']}.{part}", k[part]) for part in ("start", "end"))
        return out

    # --- Spark's own state, taken over ----------------------------------------------------------

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """Spark keeps the grouping keys in the query's order (a window as a ``start``/``end``
        struct) and the aggregation buffers in the aggregates' order, as this operator does."""
        if self.key_schema.names == [GLOBAL_KEY]:  # Spark's key is empty
            by_position(fields_of(key), pa.schema([]), KEY_NOT_COMPATIBLE, "grouping key")
            zeros = pa.array(np.zeros(len(key), np.int32))
            spark_keys: list[tuple[str, pa.Array]] = [(GLOBAL_KEY, zeros)]
        else:
            spark_keys = []
            given = fields_of(key)
            if len(given) != len(self.output_keys):
                shown = pa.schema(
                    [
                        pa.field(k if isinstance(k, str) else k.name, pa.null())
                        for k in self.output_keys
                    ]
                )
                by_position(given, shown, KEY_NOT_COMPATIBLE, "grouping key")
            for k, (_, values) in zip(self.output_keys, given, strict=True):
                if isinstance(k, str):
                    spark_keys.append((k, values))
                    continue
                window = dict(fields_of(values))
                if sorted(window) != ["end", "start"]:
                    msg = f"Spark's state has no window struct where this query groups by {k.name}"
                    raise SchemaMismatchError(msg, KEY_NOT_COMPATIBLE)
                spark_keys += [(k.start, window["start"]), (k.end, window["end"])]
        keys = by_name(spark_keys, self.key_schema, KEY_NOT_COMPATIBLE, "grouping key")
        values = by_position(
            fields_of(value), self.value_schema, VALUE_NOT_COMPATIBLE, "aggregation buffer"
        )
        return {DEFAULT_CF: (keys, values)}

    def spark_partitioned(self) -> bool:
        """Spark hashes the grouping keys in the query's order, a window as its struct: the
        same where the state key is the grouping keys in that order (no window, no global key,
        no watermark column moved to the front)."""
        return list(self.key_schema.names) == self.output_keys and self.output_keys != [GLOBAL_KEY]

    # --- processing ------------------------------------------------------------------------------

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        fam = store.column_family()
        mode = ctx.output_mode
        m = ctx.metrics
        evicts = self.watermark_key is not None and ctx.watermark_ms > 0 and mode != "complete"
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if ROWS_COLUMN in batch.schema.names:
                m.num_input_rows += int(pc.sum(batch.column(ROWS_COLUMN)).as_py() or 0)
            if EVENT_TIME_COLUMN in batch.schema.names:
                m.observe_event_times(partial_event_time_stats(batch))
            if self.watermark_key is not None and mode != "complete":
                # Spark's watermark starts at 0: a row at or before the epoch is late at once
                late = is_late(batch.column(self.watermark_key), ctx.watermark_for_late_rows_ms)
                n_late = int(pc.sum(late.cast(pa.int64())).as_py() or 0)
                if n_late:
                    m.num_rows_dropped_by_watermark += n_late
                    batch = batch.filter(pc.invert(late))
                    if batch.num_rows == 0:
                        continue
            started = time.perf_counter()
            keys = conform(batch, self.key_schema)
            kencs, state, found = lookup(store, fam, pa.Table.from_batches([keys]))
            merged = self._kept_where_empty(self._merge(state, batch), state, found, batch)
            values = pa.RecordBatch.from_arrays(merged, schema=self.value_schema)
            store.put_encoded_many(kencs, fam.value_codec.encode_many(values))
            m.num_rows_updated += len(kencs)
            m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
            if mode == "update":
                out = self._finish(keys, values)
                m.num_output_rows += out.num_rows
                yield out
        if evicts:
            yield from self._evict(store, ctx, emit=mode == "append")
        if mode == "complete":
            for _kencs, keys_table, values_table in scan(store, fam):
                out = self._finish(keys_table, values_table)
                m.num_output_rows += out.num_rows
                yield out

    def _merge(self, state: pa.Table, batch: pa.RecordBatch) -> list[pa.Array]:
        out: list[pa.Array] = []
        for agg, kept, sent in zip(
            self.aggregates, self._state_buffers, self._input_buffers, strict=True
        ):
            current = [state.column(f.name).combine_chunks() for f in kept]
            partial = [_as_type(batch, f.name, f.type) for f in sent]
            out += agg.merge(current, partial, ansi=self.ansi)
        return out

    def _kept_where_empty(
        self, merged: list[pa.Array], state: pa.Table, found: pa.Array, batch: pa.RecordBatch
    ) -> list[pa.Array]:
        """The state as it was where a partial row stands for no rows: a global aggregation's
        (Spark's aggregate without keys gives its one row for a batch without any), which
        Spark's merge of an empty buffer leaves unchanged (``last`` included)."""
        if ROWS_COLUMN not in batch.schema.names:
            return merged
        empty = pc.and_(pc.equal(batch.column(ROWS_COLUMN), 0), found)
        if not pc.any(empty).as_py():
            return merged
        return [
            pc.if_else(empty, state.column(f.name).combine_chunks(), column)
            for f, column in zip(self.value_schema, merged, strict=True)
        ]

    def _evict(
        self, store: StateStore, ctx: BatchContext, *, emit: bool
    ) -> Iterator[pa.RecordBatch]:
        """Remove the state rows whose event-time key is at or below the watermark (emitting their
        final values when ``emit``): one range scan over the keys that lead with such a time."""
        started = time.perf_counter()
        fam = store.column_family()
        # Present (marker 0x01) times up to the watermark; null event times are never late.
        # The scan starts past what the evictions before this one emptied.
        end = fam.key_codec.encode_prefix((ctx.watermark_ms * 1000 + 1,))
        doomed: list[bytes] = []
        start = store.scan_start(b"\x01")
        for kencs, keys_table, values_table in scan(store, fam, start=start, end=end):
            doomed.extend(kencs)
            if emit:
                out = self._finish(keys_table, values_table)
                ctx.metrics.num_output_rows += out.num_rows
                ctx.metrics.all_removals_time_ms += int((time.perf_counter() - started) * 1000)
                yield out
                started = time.perf_counter()
        if doomed:
            store.remove_encoded_many(doomed)
            ctx.metrics.num_rows_removed += len(doomed)
        store.mark_removed(b"\x01", end)
        ctx.metrics.all_removals_time_ms += int((time.perf_counter() - started) * 1000)

    def _finish(
        self, keys: pa.Table | pa.RecordBatch, values: pa.Table | pa.RecordBatch
    ) -> pa.RecordBatch:
        """Final output rows: the keys, then each aggregate's result from its buffers."""
        columns = _output_key_columns(self.output_keys, keys)
        for agg, kept in zip(self.aggregates, self._state_buffers, strict=True):
            buffers = [values.column(f.name) for f in kept]
            columns.append(agg.result(buffers, ansi=self.ansi))
        table = pa.Table.from_arrays(columns, names=self.output_schema.names)
        return conform(table, self.output_schema)


def _as_type(batch: pa.RecordBatch, name: str, typ: pa.DataType) -> pa.Array:
    col = batch.column(name)
    return col if col.type == typ else col.cast(typ)


def _output_key_field(key: str | WindowKey, key_schema: pa.Schema) -> pa.Field:
    if isinstance(key, str):
        return key_schema.field(key)
    return pa.field(key.name, _window_type(key_schema.field(key.start).type))


def _window_type(time_type: pa.DataType) -> pa.DataType:
    return pa.struct([pa.field("start", time_type), pa.field("end", time_type)])


def _check_output_keys(output_keys: list[str | WindowKey], key_schema: pa.Schema) -> None:
    used = [c for k in output_keys for c in ([k] if isinstance(k, str) else [k.start, k.end])]
    if sorted(used) != sorted(n for n in key_schema.names if n != GLOBAL_KEY):
        msg = f"output keys {output_keys} do not use each state key column of {key_schema.names}"
        raise ConfigurationError(msg)


def _output_key_columns(
    output_keys: list[str | WindowKey], keys: pa.Table | pa.RecordBatch
) -> list[pa.Array | pa.ChunkedArray]:
    """The output's key columns from the state's: windows rebuilt as ``start``/``end`` structs."""
    columns: list[pa.Array | pa.ChunkedArray] = []
    for key in output_keys:
        if isinstance(key, str):
            columns.append(keys.column(key))
            continue
        start, end = keys.column(key.start), keys.column(key.end)
        if isinstance(start, pa.ChunkedArray):
            start, end = start.combine_chunks(), end.combine_chunks()
        columns.append(pa.StructArray.from_arrays([start, end], names=["start", "end"]))
    return columns


# --- the state as Spark shows it -----------------------------------------------------------------

#: Our aggregation buffer suffixes that Spark names otherwise.
_SPARK_BUFFER_NAMES = {"empty": "isEmpty", "set": "valueSet"}
_BUFFER = re.compile(r"^__ss_agg\d+_(.+)$")


def _window_keys_shape(output_keys: list[Any] | None) -> Callable[[pa.Table], pa.Table]:
    """The state's key columns in the output's order, a window's two as one struct."""

    def key_shape(table: pa.Table) -> pa.Table:
        if not output_keys:
            return table
        arrays, fields = [], []
        for k in output_keys:
            if isinstance(k, str):
                arrays.append(table.column(k).combine_chunks())
                fields.append(table.schema.field(k))
                continue
            start, end = table.column(k["start"]), table.column(k["end"])
            window = pa.StructArray.from_arrays(
                [start.combine_chunks(), end.combine_chunks()],
                fields=[pa.field("start", start.type), pa.field("end", end.type)],
            )
            arrays.append(window)
            fields.append(pa.field(k["window"], window.type))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    return key_shape


def buffers_shape(
    described: dict[str, Any], taken: Sequence[str] = ()
) -> Callable[[pa.Table], pa.Table]:
    """Aggregation buffers under Spark's names (after the names in ``taken``)."""
    funcs = [a.get("func") for a in described.get("aggregates", [])]

    def value_shape(table: pa.Table) -> pa.Table:
        table = _avg_sums_from_zero(table, funcs)
        names: list[str] = list(taken)
        for name in table.schema.names:
            m = _BUFFER.match(name)
            suffix = m.group(1) if m else name
            names.append(_unique(_SPARK_BUFFER_NAMES.get(suffix, suffix), names))
        return table.rename_columns(names[len(taken) :])

    return value_shape


def _avg_sums_from_zero(table: pa.Table, funcs: list[Any]) -> pa.Table:
    """An ``avg`` buffer's sum as Spark keeps it: 0 before the first value, where ours is null
    (the same average: its count is 0)."""
    for i, func in enumerate(funcs):
        name = f"__ss_agg{i}_sum"
        if func != "avg" or name not in table.schema.names:
            continue
        at = table.schema.get_field_index(name)
        column = table.column(at)
        zero = pa.scalar(0, column.type)
        table = table.set_column(at, table.schema.field(at), pc.fill_null(column, zero))
    return table


def _unique(name: str, taken: list[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... when taken: Spark names the buffers of two
    aggregates alike (``count`` of ``count()`` and of ``avg()``), which no reader can return."""
    found, n = name, 1
    while found in taken:
        n += 1
        found = f"{name}_{n}"
    return found
