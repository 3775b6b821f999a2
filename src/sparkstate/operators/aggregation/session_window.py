"""Session-window aggregation: ``groupBy(session_window(ts, gap), keys).agg(...)``.

Spark gives each row the session ``[ts, ts + gap)`` and merges a batch's sessions of a key that
overlap (a session joins the one before it when it starts at or before that one's end, Spark's
``MergingSessionsIterator`` rule), one row of partial buffers per merged session. This operator
merges those with the key's sessions already in state, by the same rule, folding the buffers of
each merged session in start order; in append mode it emits and evicts the sessions whose end the
watermark passed, in complete mode it emits every session.

State, in three column families:

* the default one: ``(keys..., start) -> (end, buffers...)``, one row per session;
* ``session_starts``: ``keys -> starts``, the key's session starts (int64 microseconds packed in
  order), so a batch finds every session of its keys with two multi-gets, never a scan;
* ``session_ends``: an ``(end, session key)`` index, so eviction is one range scan up to the
  watermark and reads only what it evicts, and removes the index's entries as one range
  deletion (``StateStore.remove_range``); ``$session_ends_count`` keeps its number of entries.

``numRowsTotal`` counts the sessions, as Spark counts its state rows: the index's entries, one a
session, known without a scan (:mod:`..ts_index`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.operators._arrow import conform, decode_keys, decode_values
from sparkstate.operators._arrow import scan as scan_family
from sparkstate.operators.aggregation.aggregate import (
    EVENT_TIME_COLUMN,
    ROWS_COLUMN,
    AggregateFunction,
    StreamingAggregate,
    WindowKey,
    buffers_shape,
    partial_event_time_stats,
)
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.operators.grouping import concat_batches
from sparkstate.operators.spark_state import (
    KEY_NOT_COMPATIBLE,
    VALUE_NOT_COMPATIBLE,
    SparkRows,
    by_position,
    fields_of,
)
from sparkstate.operators.state_layout import DeriveFamilies
from sparkstate.operators.state_views import KeyValueView, StateView
from sparkstate.operators.ts_index import (
    COUNT_KEY_SCHEMA,
    COUNT_SCHEMA,
    MARKER_SCHEMA,
    TimestampIndex,
    index_key_schema,
)
from sparkstate.store.base import DEFAULT_CF, StateStore
from sparkstate.store.codec import KeyCodec
from sparkstate.store.schema_json import fields_from_json, schema_to_json

__all__ = ["SessionWindowAggregate"]

STARTS_CF = "session_starts"
ENDS_CF = "session_ends"
#: The number of entries of ``session_ends``: the sessions (none before it was kept).
ENDS_COUNT_CF = "$session_ends_count"
_STARTS_SCHEMA = pa.schema([pa.field("starts", pa.binary(), nullable=False)])
_TS = pa.timestamp("us", tz="UTC")


def _ends_index() -> TimestampIndex:
    return TimestampIndex(ENDS_CF, ENDS_COUNT_CF)


class SessionWindowAggregate(StatefulOperator):
    """Session windows of ``window`` (a :class:`WindowKey` naming the input's ``start``/``end``
    columns) per ``key_columns``, with ``aggregates`` merged as :class:`StreamingAggregate` does.

    The input holds the key columns, the session's start and end, the buffer columns, and the
    hidden ``__ss_rows`` / ``__ss_event_time`` columns. ``watermarked`` says whether the session
    window carries the query's watermark (append mode needs it).
    """

    kind: ClassVar[str] = "session_window_aggregate"
    is_aggregation: ClassVar[bool] = True
    spark_operation: ClassVar[str | None] = "session window streaming aggregations"
    exported_to_spark: ClassVar[bool] = True
    progress_name: ClassVar[str] = "sessionWindowStateStoreSaveExec"
    rows_are_keys: ClassVar[bool] = False
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append", "complete")
    #: A key's sessions are looked up by the key, and evicted in the order of their ends.
    nested_keys: ClassVar[bool] = True

    @classmethod
    def spark_partitioning(
        cls, described: dict[str, Any], store: str, shown_key: list[str]
    ) -> tuple[list[str], list[str]]:
        """Spark hashes the grouping keys, not the session's start (``sessionStartTime``, the
        key's last field): a key's sessions are in one partition."""
        return list(shown_key), list(shown_key[:-1])

    def __init__(
        self,
        user_key_schema: pa.Schema,
        window: WindowKey,
        aggregates: list[AggregateFunction],
        *,
        output_schema: pa.Schema,
        output_keys: list[str | WindowKey],
        time_type: pa.DataType = _TS,
        watermarked: bool = False,
        has_event_time: bool = False,
        ansi: bool = True,
        no_data_batches: bool = False,
    ) -> None:
        if not user_key_schema.names:
            msg = (
                "Global aggregation with session window in streaming query is not supported. "
                "(As in Spark: session_window() needs at least one other grouping column)"
            )
            raise ConfigurationError(msg)
        self.window = window
        self.user_key_schema = user_key_schema
        self.watermarked = watermarked
        self.no_data_batches = no_data_batches
        start, end = pa.field(window.start, time_type), pa.field(window.end, time_type)
        # The merge and the final values are StreamingAggregate's, over (keys, start, end).
        self._agg = StreamingAggregate(
            pa.schema([*user_key_schema, start, end]),
            aggregates,
            output_schema=output_schema,
            output_keys=output_keys,
            has_event_time=has_event_time,
            ansi=ansi,
        )
        self.aggregates = self._agg.aggregates
        self.key_schema = pa.schema([*user_key_schema, start])
        self.value_schema = pa.schema([end, *self._agg.value_schema])
        self.input_schema = self._agg.input_schema
        self.output_schema = self._agg.output_schema
        self._user_codec = KeyCodec(user_key_schema)
        self._session_codec = KeyCodec(self.key_schema)
        self._start_width = len(KeyCodec(pa.schema([start])).encode((0,)))

    def column_families(self) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        return {
            STARTS_CF: (self.user_key_schema, _STARTS_SCHEMA),
            ENDS_CF: (index_key_schema(self.key_schema, "end_us"), MARKER_SCHEMA),
            ENDS_COUNT_CF: (COUNT_KEY_SCHEMA, COUNT_SCHEMA),
        }

    def spark_partitioned(self) -> bool:
        """Spark hashes the grouping keys without the session, as the engine does."""
        return True

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """Spark keeps a session under its grouping keys and start (``sessionStartTime``), with
        the session window, the grouping keys and the buffers as its value. Each key's list of
        starts and the index of ends are made from those: the call gets every session of a key
        (Spark keeps them in one partition, and the take-over converts a partition at once)."""
        n_user = len(self.user_key_schema)
        keys = by_position(fields_of(key), self.key_schema, KEY_NOT_COMPATIBLE, "grouping key")
        given = fields_of(value)
        if not given or not pa.types.is_struct(given[0][1].type):
            msg = "Spark's state has no session window where this query groups by one"
            raise SchemaMismatchError(msg, VALUE_NOT_COMPATIBLE)
        end = dict(fields_of(given[0][1])).get("end")
        if end is None:
            msg = "Spark's session window has no end"
            raise SchemaMismatchError(msg, VALUE_NOT_COMPATIBLE)
        values = by_position(
            [("end", end), *given[1 + n_user :]],
            self.value_schema,
            VALUE_NOT_COMPATIBLE,
            "aggregation buffer",
        )
        user = keys.select(self.user_key_schema.names)
        group = self._user_codec.encode_many_arrow(user).dictionary_encode().indices
        starts = _np(_micros(keys.column(self.window.start)))
        order = np.lexsort((starts, np.asarray(group, np.int64)))
        sorted_group = np.asarray(group, np.int64)[order]
        first = np.r_[True, sorted_group[1:] != sorted_group[:-1]] if len(order) else []
        lo = np.flatnonzero(first)  # where each key's sessions start, sorted by key and start
        hi = np.r_[lo[1:], len(order)][: len(lo)].astype(np.int64)
        packed = pa.array(_pack_starts(starts[order], lo, hi), pa.binary())
        index_schema, marker_schema = self.column_families()[ENDS_CF]
        ends = _micros(values.column(self.window.end))
        n = keys.num_rows
        return {
            DEFAULT_CF: (keys, values),
            STARTS_CF: (
                user.take(pa.array(order[lo], pa.int64())),
                pa.table([packed], schema=_STARTS_SCHEMA),
            ),
            ENDS_CF: (
                pa.table([ends, *keys.columns], schema=index_schema),
                pa.table([pa.repeat(True, n)], schema=marker_schema),
            ),
        }

    @classmethod
    def rows_in_state(cls, store: StateStore) -> int:
        """The sessions, as Spark counts them: a key's list of starts and a session's end in
        the index are not rows (a store that does not count its keys reports 0)."""
        if store.total_keys() <= 0:
            return 0
        return _ends_index().size(store)

    @classmethod
    def derived_families(cls) -> tuple[tuple[str, ...], DeriveFamilies | None]:
        """The index's count: not moved, a new partition counts its entries once."""
        return (ENDS_COUNT_CF,), None

    def check_output_mode(self, mode: str) -> None:
        self.refuse_output_mode(mode)

    @classmethod
    def refuse_output_mode(cls, mode: str) -> None:
        """Refuse ``mode`` where a session window does not run in it (Spark's words)."""
        if mode not in cls.supported_output_modes:
            msg = (
                f"Invalid streaming output mode: {mode}. This output mode is not supported for "
                "session window streaming aggregations on streaming DataFrames/DataSets (as in "
                "Spark); use outputMode('append') or outputMode('complete')"
            )
            raise ConfigurationError(msg)

    def time_trigger(self) -> str | None:
        return "event" if self.no_data_batches else None

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["aggregates"] = [a.describe() for a in self.aggregates]
        out["window"] = self.window.describe()
        out["output_schema"] = schema_to_json(self.output_schema)
        return out

    # --- its state, as the reader shows it -------------------------------------------------------

    @classmethod
    def default_view(cls, described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
        """Spark's session window state: the key is the grouping keys and ``sessionStartTime``,
        the value the whole partial row (the grouping keys in the query's order, the session
        window as its ``start``/``end`` struct, then the buffers under Spark's names)."""
        window = described["window"]
        n_keys = len(key.names)  # the user's keys and the session's start
        output = [f[0] for f in fields_from_json(described["output_schema"])]
        grouping = output[:n_keys]  # the window and the user's keys, as grouped

        def key_shape(table: pa.Table) -> pa.Table:
            names = ["sessionStartTime" if n == window["start"] else n for n in table.schema.names]
            return table.rename_columns(names)

        buffers = buffers_shape(described, taken=grouping)

        def value_shape(keys: pa.Table, values: pa.Table) -> pa.Table:
            arrays, fields = [], []
            for name in grouping:
                if name == window["window"]:
                    start = keys.column(window["start"]).combine_chunks()
                    end = values.column(window["end"]).combine_chunks()
                    column: Any = pa.StructArray.from_arrays(
                        [start, end],
                        fields=[pa.field("start", start.type), pa.field("end", end.type)],
                    )
                else:
                    column = keys.column(name).combine_chunks()
                arrays.append(column)
                fields.append(pa.field(name, column.type))
            rest = buffers(values.drop_columns([window["end"]]))
            return pa.Table.from_arrays(
                arrays + rest.columns, schema=pa.schema(fields + list(rest.schema))
            )

        return KeyValueView(DEFAULT_CF, key, value, key_shape=key_shape, row_shape=value_shape)

    @classmethod
    def shuffle_columns(cls, described: dict[str, Any], key_schema: pa.Schema) -> list[str]:
        """The user's keys, not the session's start."""
        start = (described.get("window") or {}).get("start")
        return [n for n in key_schema.names if n != start]

    # --- processing ------------------------------------------------------------------------------

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        m = ctx.metrics
        table = concat_batches(batches, self.input_schema)
        if table.num_rows:
            m.num_input_rows += int(pc.sum(table.column(ROWS_COLUMN)).as_py() or 0)
            if EVENT_TIME_COLUMN in table.schema.names:
                m.observe_event_times(partial_event_time_stats(table))
        if table.num_rows and table.column(self.window.start).null_count:
            table = table.filter(pc.is_valid(table.column(self.window.start)))  # no event time
        late_ms = ctx.watermark_for_late_rows_ms
        # Spark drops late sessions in every output mode (its restore step does, before the save)
        if self.watermarked and table.num_rows:  # the watermark starts at 0, as Spark's
            late = pc.less_equal(_micros(table.column(self.window.end)), late_ms * 1000)
            n_late = int(pc.sum(late.cast(pa.int64())).as_py() or 0)
            if n_late:
                m.num_rows_dropped_by_watermark += n_late
                table = table.filter(pc.invert(late))
        ends = _ends_index()
        if table.num_rows:
            started = time.perf_counter()
            self._merge_sessions(store, table, ends, ctx)
            m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
        ends.flush(store)
        if ctx.output_mode == "complete":
            fam = store.column_family()
            for _k, keys, values in scan_family(store, fam):
                out = self._finish(keys, values)
                m.num_output_rows += out.num_rows
                yield out
        elif self.watermarked and ctx.watermark_ms > 0:
            yield from self._evict(store, ends, ctx)
        m.num_rows_total = (m.num_rows_total or 0) + self.rows_in_state(store)

    def _merge_sessions(
        self, store: StateStore, batch: pa.Table, ends: TimestampIndex, ctx: BatchContext
    ) -> None:
        """Merge the batch's sessions with the state's sessions of the same keys; write back the
        sessions that changed and the keys' start lists."""
        w = self.window
        fam = store.column_family()
        starts_fam = store.column_family(STARTS_CF)
        user_keys = conform(batch, self.user_key_schema)
        ukeys = self._user_codec.encode_many(user_keys)
        slot: dict[bytes, int] = {}
        key_of_row = np.fromiter(
            (slot.setdefault(k, len(slot)) for k in ukeys), np.int64, len(ukeys)
        )
        uniq = list(slot)
        # ids number first appearances: a row whose id is above every one before it is first
        first_row = np.flatnonzero(np.diff(np.maximum.accumulate(key_of_row), prepend=-1) > 0)
        # The state's sessions of these keys: their starts, then the sessions themselves.
        packed = store.get_encoded_many(
            starts_fam.key_codec.encode_many(user_keys.take(pa.array(first_row))), STARTS_CF
        )
        state_key_idx, state_starts = _unpack_starts(decode_values(starts_fam, packed)[0])
        batch_start = _np(_micros(batch.column(w.start)))
        batch_end = _np(_micros(batch.column(w.end)))
        # Only the stored sessions that can merge with the batch's are read; the others are
        # left as they are, but for their starts, kept in their keys' lists.
        near = _may_merge(state_key_idx, state_starts, key_of_row, batch_start, batch_end)
        aside_key_idx, aside_starts = state_key_idx[~near], state_starts[~near]
        state_key_idx, state_starts = state_key_idx[near], state_starts[near]
        n_batch, n_state = batch.num_rows, len(state_starts)
        columns = [n for n in self.value_schema.names if n != w.end]
        if n_state:
            idx = pa.array(first_row[state_key_idx])
            state_keys = user_keys.take(idx)
            start_col = pa.array(state_starts, pa.int64()).cast(_TS)
            state_rows = pa.Table.from_arrays(
                [*state_keys.columns, start_col], schema=self.key_schema
            )
            state_pks = self._session_codec.encode_many(state_rows)
            values, _ = decode_values(fam, store.get_encoded_many(state_pks, fam.name))
            state_end = _micros(values.column(w.end))
        else:
            state_pks = []
            values = self.value_schema.empty_table()
            state_end = pa.array([], pa.int64())
        # All candidate sessions: the batch's then the state's, sorted by (key, start).
        key_idx = np.concatenate([key_of_row, state_key_idx])
        start = np.concatenate([batch_start, state_starts])
        end = np.concatenate([batch_end, _np(state_end)])
        from_state = np.concatenate([np.zeros(n_batch, bool), np.ones(n_state, bool)])
        order = np.lexsort((~from_state, start, key_idx))  # a state session first on a tie
        key_idx, start, end, from_state = (
            key_idx[order],
            start[order],
            end[order],
            from_state[order],
        )
        buffers = pa.concat_tables([self._as_states(batch), values.select(columns)])
        buffers = buffers.take(pa.array(order))
        groups = _session_groups(key_idx, start, end)
        firsts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]]) if len(groups) else groups
        sizes = np.diff(np.r_[firsts, len(groups)])
        merged = self._fold(buffers, groups, firsts, sizes)
        group_end = np.maximum.reduceat(end, firsts) if len(firsts) else end
        group_start = start[firsts]
        group_key = key_idx[firsts]
        # A session left as the state had it (one member, from state) is not written again.
        untouched = (sizes == 1) & from_state[firsts]
        changed = np.flatnonzero(~untouched)
        # Remove the state sessions merged into a changed session, then write the changed ones.
        state_pk_sorted = np.asarray(order) - n_batch  # position in state_pks, or < 0
        members_changed = np.repeat(~untouched, sizes)
        gone = np.flatnonzero(from_state & members_changed)
        gone_pks = [state_pks[state_pk_sorted[i]] for i in gone.tolist()]
        # The index has each stored session's end, and a session new to it is not stored (one
        # stored with its key and start is in its group, removed first): nothing to read back.
        # A changed session with its stored first member's start and end keeps that entry.
        leads = firsts[changed]
        keeps_entry = from_state[leads] & (end[leads] == group_end[changed])
        moved_out = gone[~np.isin(gone, leads[keeps_entry])]
        ends.remove_many(
            [state_pks[state_pk_sorted[i]] for i in moved_out.tolist()],
            end[moved_out].tolist(),
            stored=True,
        )
        if gone_pks:
            store.remove_encoded_many(gone_pks)
        if len(changed):
            rows = pa.array(first_row[group_key[changed]])
            new_keys = user_keys.take(rows)
            new_start = pa.array(group_start[changed], pa.int64()).cast(_TS)
            new_end = pa.array(group_end[changed], pa.int64()).cast(_TS)
            pk_table = pa.Table.from_arrays([*new_keys.columns, new_start], schema=self.key_schema)
            new_pks = self._session_codec.encode_many(pk_table)
            new_values = pa.Table.from_arrays(
                [new_end, *merged.take(pa.array(changed)).columns], schema=self.value_schema
            )
            fresh = ~from_state[firsts][changed]  # begun by the batch, so not stored
            _put_sessions(store, new_pks, fam.value_codec.encode_many(new_values), fresh)
            moved_in = np.flatnonzero(~keeps_entry)
            ends.add_many(
                [new_pks[i] for i in moved_in.tolist()],
                group_end[changed[moved_in]].tolist(),
                stored=False,
            )
            ctx.metrics.num_rows_updated += len(new_pks)
        ctx.metrics.num_rows_removed += len(gone_pks)
        # Each touched key's starts: those of all its sessions (the groups' and those left
        # aside), in order.
        touched = group_key[changed]  # in key order (the groups are)
        touched = touched[np.r_[True, touched[1:] != touched[:-1]]] if len(touched) else touched
        if len(touched):
            list_key = np.concatenate([group_key, aside_key_idx])
            list_start = np.concatenate([group_start, aside_starts])
            in_order = np.lexsort((list_start, list_key))
            list_key, list_start = list_key[in_order], list_start[in_order]
            lo, hi = (
                np.searchsorted(list_key, touched, "left"),
                np.searchsorted(list_key, touched, "right"),
            )
            keys_out = [uniq[k] for k in touched.tolist()]
            _write_starts(store, keys_out, _pack_starts(list_start, lo, hi))

    def _fold(
        self, buffers: pa.Table, groups: np.ndarray, firsts: np.ndarray, sizes: np.ndarray
    ) -> pa.Table:
        """Each group's buffers merged in order: member ``r`` of every group longer than ``r``
        merged into the group's accumulator, one vectorized merge per round."""
        acc = buffers.take(pa.array(firsts))
        if not len(sizes) or int(sizes.max()) == 1:
            return acc
        for r in range(1, int(sizes.max())):
            which = np.flatnonzero(sizes > r)
            members = buffers.take(pa.array(firsts[which] + r))
            merged = self._merge_states(acc.take(pa.array(which)), members)
            # rows of ``acc`` stay, those of ``which`` become the merged ones
            pick = np.arange(acc.num_rows)
            pick[which] = acc.num_rows + np.arange(len(which))
            acc = pa.Table.from_arrays(
                [
                    pa.concat_arrays([_array(acc.column(i)), _array(new).cast(f.type)]).take(
                        pa.array(pick)
                    )
                    for i, (f, new) in enumerate(zip(acc.schema, merged, strict=True))
                ],
                schema=acc.schema,
            )
        return acc

    def _as_states(self, batch: pa.Table) -> pa.Table:
        """A batch's partial rows as state buffers: each merged into an empty state."""
        schema = self._agg.value_schema
        empty = pa.Table.from_arrays(
            [pa.nulls(batch.num_rows, f.type) for f in schema], schema=schema
        )
        partial = batch.combine_chunks().to_batches()[0]
        return pa.Table.from_arrays(self._agg._merge(empty, partial), schema=schema)

    def _merge_states(self, states: pa.Table, later: pa.Table) -> list[pa.Array]:
        """Row by row, each state's buffers with those of the session after it merged in."""
        out: list[pa.Array] = []
        for agg, kept in zip(self.aggregates, self._agg.state_buffers, strict=True):
            names = [f.name for f in kept]
            mine, theirs = [states.column(n) for n in names], [later.column(n) for n in names]
            out += agg.merge_states(mine, theirs, ansi=self._agg.ansi)
        return out

    def _evict(
        self, store: StateStore, ends: TimestampIndex, ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        """Emit and remove the sessions whose end is at or below the watermark."""
        started = time.perf_counter()
        pks = ends.due_keys(store, ctx.watermark_ms * 1000)
        if not pks:
            ends.removed_due(store, ctx.watermark_ms * 1000)
            return
        fam = store.column_family()
        values, _ = decode_values(fam, store.get_encoded_many(pks, fam.name))
        keys = decode_keys(fam, pks)
        out = self._finish(keys, values)
        store.remove_encoded_many(pks)
        ends.remove_due(store, ctx.watermark_ms * 1000)
        # The keys' start lists lose the evicted starts.
        width = self._start_width
        slot: dict[bytes, int] = {}
        owner_of_due = np.fromiter(
            (slot.setdefault(pk[:-width], len(slot)) for pk in pks), np.int64, len(pks)
        )
        ukeys = list(slot)
        starts_fam = store.column_family(STARTS_CF)
        blobs = decode_values(starts_fam, store.get_encoded_many(ukeys, STARTS_CF))[0]
        owner, starts = _unpack_starts(blobs)
        gone = _pairs_in(owner, starts, owner_of_due, _np(_micros(keys.column(self.window.start))))
        owner, starts = owner[~gone], starts[~gone]
        left = np.bincount(owner, minlength=len(ukeys))
        drop_keys = [ukeys[i] for i in np.flatnonzero(left == 0).tolist()]
        if drop_keys:
            store.remove_encoded_many(drop_keys, STARTS_CF)
        kept = np.flatnonzero(left > 0)
        if len(kept):
            lo = np.searchsorted(owner, kept, "left")
            packed = _pack_starts(starts, lo, lo + left[kept])
            _write_starts(store, [ukeys[i] for i in kept.tolist()], packed)
        ctx.metrics.num_rows_removed += len(pks)
        ctx.metrics.num_output_rows += out.num_rows
        ctx.metrics.all_removals_time_ms += int((time.perf_counter() - started) * 1000)
        yield out

    def _finish(self, keys: pa.Table, values: pa.Table) -> pa.RecordBatch:
        both = pa.Table.from_arrays(
            [*keys.columns, values.column(self.window.end)],
            names=[*keys.schema.names, self.window.end],
        )
        return self._agg._finish(both, values)


def _unpack_starts(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The start lists of a ``session_starts`` lookup as (row of the list, start) arrays, in
    list order (an absent list is empty)."""
    col = table.column("starts").combine_chunks()
    counts = np.asarray(pc.binary_length(col).fill_null(0), np.int64) // 8
    data = b"".join(b for b in col.to_pylist() if b)
    return np.repeat(np.arange(len(col)), counts), np.frombuffer(data, "<i8").astype(np.int64)


def _may_merge(
    state_key: np.ndarray,
    state_start: np.ndarray,
    batch_key: np.ndarray,
    batch_start: np.ndarray,
    batch_end: np.ndarray,
) -> np.ndarray:
    """Mask of the stored sessions (by key, in each key's start order) that may merge with the
    batch's sessions of their key. Stored sessions do not overlap: each ends before the next
    one of its key starts. So one that starts after every batch session of its key ends, or
    whose next session starts before every batch session of its key starts, starts after the
    batch's sessions end or ends before they begin, and no chain of merges reaches it."""
    n = len(state_key)
    if n == 0:
        return np.zeros(0, bool)
    if n > 1 and not np.all(
        (state_key[1:] > state_key[:-1])
        | ((state_key[1:] == state_key[:-1]) & (state_start[1:] > state_start[:-1]))
    ):
        return np.ones(n, bool)  # not in order (never written so): read every one
    keys = int(max(state_key.max(), batch_key.max() if len(batch_key) else 0)) + 1
    first = np.full(keys, np.iinfo(np.int64).max)
    last = np.full(keys, np.iinfo(np.int64).min)
    np.minimum.at(first, batch_key, batch_start)
    np.maximum.at(last, batch_key, batch_end)
    following = np.full(n, np.iinfo(np.int64).max)
    same = state_key[1:] == state_key[:-1]
    following[:-1][same] = state_start[1:][same]
    near: np.ndarray = (state_start <= last[state_key]) & (following >= first[state_key])
    return near


def _pack_starts(starts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[bytes]:
    """Start lists as stored: ``starts[lo[i]:hi[i]]`` as packed little-endian int64."""
    data = starts.astype("<i8").tobytes()
    return [data[a * 8 : b * 8] for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]


def _put_sessions(
    store: StateStore, pks: list[bytes], values: list[bytes], fresh: np.ndarray
) -> None:
    """Write sessions; those ``fresh`` (begun by the batch) are not stored, the others were
    read: the store counts its rows without reading them."""
    if not fresh.any():
        store.put_encoded_many(pks, values)
        return
    for stored, which in ((None, np.flatnonzero(~fresh)), (False, np.flatnonzero(fresh))):
        rows = which.tolist()
        if rows:
            store.put_encoded_many([pks[i] for i in rows], [values[i] for i in rows], stored=stored)


def _write_starts(store: StateStore, ukeys: list[bytes], packed: list[bytes]) -> None:
    table = pa.table({"starts": pa.array(packed, pa.binary())}, schema=_STARTS_SCHEMA)
    codec = store.column_family(STARTS_CF).value_codec
    store.put_encoded_many(ukeys, codec.encode_many(table), STARTS_CF)


def _pairs_in(a: np.ndarray, b: np.ndarray, a2: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """Mask of the pairs ``(a[i], b[i])`` found among the pairs ``(a2[j], b2[j])``: both sets
    sorted together, a pair is found where its run of equal pairs holds one of the second."""
    n = len(a)
    firsts = np.r_[np.ones(n, bool), np.zeros(len(a2), bool)]
    aa, bb = np.concatenate([a, a2]), np.concatenate([b, b2])
    order = np.lexsort((bb, aa))
    aa, bb, firsts = aa[order], bb[order], firsts[order]
    new_run = np.r_[True, (aa[1:] != aa[:-1]) | (bb[1:] != bb[:-1])]
    run = np.cumsum(new_run) - 1
    seconds_in = np.zeros(int(run[-1]) + 1 if len(run) else 0, bool)
    seconds_in[run[~firsts]] = True
    found = np.zeros(n, bool)
    found[order[firsts]] = seconds_in[run[firsts]]
    return found


def _session_groups(key_idx: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Group number of each session, sorted by (key, start): a session starts a new group when
    its key changes or it starts after the running end of the sessions of its key before it."""
    import pandas as pd

    n = len(key_idx)
    if n == 0:
        return np.zeros(0, np.int64)
    new_key = np.r_[True, key_idx[1:] != key_idx[:-1]]
    running = pd.Series(end).groupby(np.cumsum(new_key)).cummax().to_numpy()
    new_group = new_key.copy()
    new_group[1:] |= start[1:] > running[:-1]
    return np.cumsum(new_group) - 1


def _array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _micros(col: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if pa.types.is_timestamp(col.type) and col.type.unit != "us":
        col = col.cast(pa.timestamp("us", tz=col.type.tz))
    return col.cast(pa.int64())


def _np(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return np.asarray(col.fill_null(0))
