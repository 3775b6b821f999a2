"""Arbitrary per-key state with timeouts: ``flatMapGroupsWithState`` and ``applyInPandasWithState``.

One partition, one batch (Spark's ``FlatMapGroupsWithStateExec`` /
``FlatMapGroupsInPandasWithStateExec``):

1. the input is sorted by key and cut into groups (Arrow); with an event-time timeout and a
   watermark, rows at or before the watermark are dropped first;
2. the states of all keys of the batch are read with one multi-get;
3. the user function runs once per key, in key order, with the key's rows and a ``GroupState``;
4. state changes are written in one batch, together with the timeout index;
5. then keys whose timeout is before the batch's processing time (``ProcessingTimeTimeout``) or
   watermark (``EventTimeTimeout``) are found with one range scan of the timeout index (ordered
   by ``(timeout, key)``, so no full scan) and the function runs for each with no rows and
   ``hasTimedOut`` true.

Layout: the default column family maps a key to its state fields plus ``__timeout_ms`` and
``__defined`` (a removed state can keep a timeout); ``$timeout_index`` maps
``(timeout_ms, key...)`` to a marker (see :mod:`.ts_index`), and ``$timeout_count`` keeps
its number of entries; ``$state_schema`` holds nothing and records the declared state schema.
``numRowsTotal`` counts the default family's rows, as Spark counts its state rows (the index is
ours, not rows): the store's keys less the index's, known without a scan. Stored states of an
earlier state schema read back under the current one (:mod:`sparkstate.store.evolution`); a
``sparkstate.PICKLED`` state is stored pickled.
"""

from __future__ import annotations

import functools
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.operators.arbitrary.group_state import (
    NO_TIMESTAMP,
    GroupState,
    GroupStateClock,
    GroupStateTimeout,
    PickledGroupState,
    timeout_conf,
)
from sparkstate.operators.arbitrary.nested_values import user_converter
from sparkstate.operators.arbitrary.schemas import SchemaLike, state_schema_of, to_arrow_schema
from sparkstate.operators.arbitrary.user_types import (
    DEFAULT_TIME_ZONE,
    empty_timed_out_frame,
    state_instant,
    state_wall_clock,
)
from sparkstate.operators.base import (
    BatchContext,
    OperatorMetrics,
    Phase,
    StatefulOperator,
    timed_phase,
)
from sparkstate.operators.grouping import (
    ROW_FORMATS,
    KeyGroups,
    OutputCollector,
    concat_batches,
    decode_present,
    group_by_key,
    key_schema_of,
    on_time_rows,
    pandas_groups,
    rows_of,
)
from sparkstate.operators.spark_state import (
    KEY_NOT_COMPATIBLE,
    VALUE_NOT_COMPATIBLE,
    SparkRows,
    by_position,
    fields_of,
)
from sparkstate.operators.state_layout import DeriveFamilies
from sparkstate.operators.state_views import KeyValueView, StateView, as_struct
from sparkstate.operators.ts_index import (
    COUNT_KEY_SCHEMA,
    COUNT_SCHEMA,
    MARKER_SCHEMA,
    TimestampIndex,
    index_key_schema,
)
from sparkstate.store.base import DEFAULT_CF, StateStore
from sparkstate.store.families import ColumnFamily
from sparkstate.store.schema_json import schema_to_json

__all__ = [
    "STATE_SCHEMA_CF",
    "TIMEOUT_COUNT_CF",
    "TIMEOUT_INDEX_CF",
    "ApplyInPandasWithState",
    "FlatMapGroupsWithState",
]

TIMEOUT_INDEX_CF = "$timeout_index"
#: The number of entries of ``$timeout_index`` (one row; none before it was kept).
TIMEOUT_COUNT_CF = "$timeout_count"
#: Holds no data: records the state schema as declared (nullability included), so that the store
#: refuses an incompatible change of it (the default family's state fields are all nullable).
STATE_SCHEMA_CF = "$state_schema"
TIMEOUT_FIELD = "__timeout_ms"
DEFINED_FIELD = "__defined"
_TIME_TRIGGERS = {
    GroupStateTimeout.ProcessingTimeTimeout: "processing",
    GroupStateTimeout.EventTimeTimeout: "event",
}


def _timeout_index() -> TimestampIndex:
    return TimestampIndex(TIMEOUT_INDEX_CF, TIMEOUT_COUNT_CF)


class _Pending:
    """State writes of one phase: puts, deletes and timeout-index moves, applied in one go."""

    def __init__(self) -> None:
        self.put_keys: list[bytes] = []
        self.put_values: list[tuple[Any, ...]] = []
        self.deletes: list[bytes] = []
        self.index = _timeout_index()


class FlatMapGroupsWithState(StatefulOperator):
    """Row-based arbitrary state: ``func(key, rows, state) -> iterable of output rows``.

    ``rows`` is a list of the key's input rows as tuples (``row_format="tuple"``, the fastest),
    dicts or ``Row`` objects; the function returns tuples (positional), dicts or Rows. The write
    rule is Scala's ``flatMapGroupsWithState`` (the stored timeout is the old timeout).

    The state schema may gain nullable fields, lose fields or reorder them across restarts (old
    states read back with the new fields null); ``sparkstate.PICKLED`` as the state schema keeps
    any picklable object instead of a tuple (``state.get`` returns the object itself).
    """

    kind: ClassVar[str] = "flatMapGroupsWithState"
    exported_to_spark: ClassVar[bool] = True
    calls_user_code: ClassVar[bool] = True
    progress_name: ClassVar[str] = "flatMapGroupsWithState"
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append", "update")
    #: Whether the old timeout of Spark's write rule is the stored one (Scala) or -1 (PySpark).
    compare_with_stored_timeout: ClassVar[bool] = True
    rows_are_keys: ClassVar[bool] = False

    def __init__(
        self,
        func: Callable[..., Any],
        input_schema: pa.Schema,
        key_columns: Sequence[str],
        output_schema: SchemaLike,
        state_schema: SchemaLike,
        output_mode: str = "update",
        timeout: str = GroupStateTimeout.NoTimeout,
        *,
        watermark_present: bool = False,
        event_time_column: str | None = None,
        row_format: str = "tuple",
        time_zone: str = DEFAULT_TIME_ZONE,
        state_classes: tuple[type[GroupState], type[GroupState]] | None = None,
    ) -> None:
        api = self.kind
        #: The session time zone (``spark.sql.session.timeZone``) user functions see times in.
        self.time_zone = time_zone
        self.func = func
        self.input_schema = input_schema
        self.key_schema = key_schema_of(input_schema, key_columns, api)
        self.output_schema = to_arrow_schema(output_schema, f"{api} output schema")
        self.state_schema, self.pickled = state_schema_of(state_schema, f"{api} state schema")
        plain, pickled = state_classes or (GroupState, PickledGroupState)
        #: What the function's ``state`` is (the engine's are PySpark's ``GroupState`` too).
        self._state_class = pickled if self.pickled else plain
        self.output_mode = output_mode.lower()
        self.check_output_mode(self.output_mode)
        self.timeout = timeout_conf(timeout)
        if self.timeout == GroupStateTimeout.EventTimeTimeout and not watermark_present:
            msg = (
                f"{api}: event-time timeouts need a watermark: call withWatermark() on the "
                "input before grouping"
            )
            raise ConfigurationError(msg)
        if event_time_column is not None and event_time_column not in input_schema.names:
            msg = f"{api}: no event-time column {event_time_column!r} in {input_schema.names}"
            raise ConfigurationError(msg)
        if row_format not in ROW_FORMATS:
            msg = f"{api}: row_format must be one of {ROW_FORMATS}, got {row_format!r}"
            raise ConfigurationError(msg)
        reserved = {TIMEOUT_FIELD, DEFINED_FIELD} & set(self.state_schema.names)
        if reserved:
            msg = f"{api}: state field name(s) {sorted(reserved)} are reserved"
            raise ConfigurationError(msg)
        self.watermark_present = watermark_present
        self.event_time_column = event_time_column
        self.row_format = row_format
        self.value_schema = pa.schema(
            [f.with_nullable(True) for f in self.state_schema]
            + [
                pa.field(TIMEOUT_FIELD, pa.int64(), nullable=False),
                pa.field(DEFINED_FIELD, pa.bool_(), nullable=False),
            ]
        )
        self._width = len(self.state_schema)
        self._index_key_schema = index_key_schema(self.key_schema, "timeout_ms")

    def column_families(self) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        return {
            TIMEOUT_INDEX_CF: (self._index_key_schema, MARKER_SCHEMA),
            TIMEOUT_COUNT_CF: (COUNT_KEY_SCHEMA, COUNT_SCHEMA),
            STATE_SCHEMA_CF: (self.key_schema, self.state_schema),
        }

    def time_trigger(self) -> str | None:
        return _TIME_TRIGGERS.get(self.timeout)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["timeout"] = self.timeout
        out["state_schema"] = schema_to_json(self.state_schema)
        return out

    @classmethod
    def default_view(cls, described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
        """Spark's ``(flatMap|applyInPandas)GroupsWithState`` state: ``groupState``, and with a
        timeout its ``timeoutTimestamp`` (-1 when none is set)."""
        fields = [f.name for f in value if not f.name.startswith("__")]
        with_timeout = described.get("timeout", "NoTimeout") != "NoTimeout"

        def shape(table: pa.Table) -> pa.Table:
            group = as_struct(table.select(fields))
            defined = table.column("__defined").combine_chunks()
            group = pa.StructArray.from_arrays(
                group.flatten(), fields=list(group.type), mask=pc.invert(defined)
            )
            if not with_timeout:
                return pa.table({"groupState": group})
            timeout = table.column("__timeout_ms").combine_chunks()
            return pa.table({"groupState": group, "timeoutTimestamp": timeout})

        return KeyValueView(DEFAULT_CF, key, value, value_shape=shape)

    def spark_partitioned(self) -> bool:
        """Spark hashes the grouping keys in the query's order, as the engine does."""
        return True

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """Spark keeps ``groupState`` (null where the state was removed and a timeout kept)
        and ``timeoutTimestamp`` (-1: none) under the grouping keys; the timeout index is made
        from those."""
        if self.pickled:
            msg = (
                f"{self.kind}: a state kept pickled (sparkstate.PICKLED) is not the state "
                "Spark's operator keeps: declare the state schema Spark's query declared"
            )
            raise ConfigurationError(msg)
        keys = by_position(fields_of(key), self.key_schema, KEY_NOT_COMPATIBLE, "grouping key")
        given = fields_of(value)
        if not given or not pa.types.is_struct(given[0][1].type):
            msg = "Spark's state has no groupState where this query keeps one"
            raise SchemaMismatchError(msg, VALUE_NOT_COMPATIBLE)
        group = given[0][1]
        assert isinstance(group, pa.StructArray)
        fields = [(f.name, a) for f, a in zip(group.type, group.flatten(), strict=True)]
        nullable = pa.schema([f.with_nullable(True) for f in self.state_schema])
        state = by_position(fields, nullable, VALUE_NOT_COMPATIBLE, "state field")
        n = keys.num_rows
        timeout = (
            pc.fill_null(given[1][1].cast(pa.int64()), NO_TIMESTAMP)
            if len(given) > 1
            else pa.array(np.full(n, NO_TIMESTAMP, np.int64))
        )
        defined = group.is_valid()
        values = pa.table([*state.columns, timeout, defined], schema=self.value_schema)
        timed = pc.not_equal(timeout, NO_TIMESTAMP)
        index = pa.table(
            [timeout.filter(timed), *(c.filter(timed) for c in keys.columns)],
            schema=self._index_key_schema,
        )
        markers = pa.table([pa.repeat(True, index.num_rows)], schema=MARKER_SCHEMA)
        return {DEFAULT_CF: (keys, values), TIMEOUT_INDEX_CF: (index, markers)}

    @classmethod
    def rows_in_state(cls, store: StateStore) -> int:
        """The keys' states, as Spark counts them: an entry of the timeout index is not a row
        (a store that does not count its keys reports 0)."""
        stored = store.total_keys()
        if stored <= 0:
            return 0
        return max(0, stored - sum(_timeout_index().stored_keys(store)))

    @classmethod
    def derived_families(cls) -> tuple[tuple[str, ...], DeriveFamilies | None]:
        """The timeout index's count: not moved, a new partition counts its entries once."""
        return (TIMEOUT_COUNT_CF,), None

    # --- the batch -------------------------------------------------------------------------------

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        m = ctx.metrics
        started = time.perf_counter()
        table = self._input_table(batches, ctx)
        phase = m.add_phase(Phase.INPUT_READ, started)
        clock = GroupStateClock(
            timeout=self.timeout,
            processing_time_ms=ctx.batch_timestamp_ms,
            watermark_ms=ctx.watermark_ms if self.watermark_present else NO_TIMESTAMP,
            watermark_present=self.watermark_present,
            api=self.kind,
        )
        out = self._collector()
        fam = store.column_family()
        groups = group_by_key(table, self.key_schema, fam.key_codec)
        if len(groups):
            data = self._group_data(groups)
            phase = m.add_phase(Phase.GROUPING, phase)
            stored = self._decode_states(fam, store.get_encoded_many(groups.key_bytes))
            m.add_phase(Phase.STATE_READ, phase)
            pending = _Pending()
            calls = self._call_groups(groups, data, stored, clock, out, pending)
            yield from timed_phase(calls, m, Phase.USER_FUNCTION)
            phase = time.perf_counter()
            self._apply(store, fam, pending, m)
            m.add_phase(Phase.STATE_WRITE, phase)
        m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
        if self.timeout != GroupStateTimeout.NoTimeout:
            started = time.perf_counter()
            yield from timed_phase(self._time_out(store, fam, clock, out, m), m, Phase.TIMEOUTS)
            m.all_removals_time_ms += int((time.perf_counter() - started) * 1000)
            _timeout_index().flush(store)  # the count, where a version has none yet
        if self.timeout == GroupStateTimeout.ProcessingTimeTimeout:
            m.observe_timer(TimestampIndex(TIMEOUT_INDEX_CF).earliest(store))
        yield from out.drain(final=True)
        m.num_output_rows += out.num_rows
        m.num_rows_total = (m.num_rows_total or 0) + self.rows_in_state(store)

    def _decode_states(
        self, fam: ColumnFamily, raws: Sequence[bytes | None]
    ) -> list[tuple[Any, ...] | None]:
        """Stored rows (state fields, timeout, defined) of a multi-get; PICKLED: unpickled."""
        rows: list[tuple[Any, ...] | None] = decode_present(fam, raws)
        if not self.pickled:
            to_user, w = user_converter(self.state_schema), self._width  # nested: Rows, dicts
            if to_user is None:
                return rows
            return [None if r is None else (*to_user(r[:w]), *r[w:]) for r in rows]
        return [
            None if r is None else (pickle.loads(r[0]) if r[2] else None, r[1], r[2]) for r in rows
        ]

    def _input_table(self, batches: Iterator[pa.RecordBatch], ctx: BatchContext) -> pa.Table:
        """The input as one table; with event-time timeouts, rows behind the watermark dropped."""
        table = concat_batches(batches, self.input_schema)
        drop_late = self.timeout == GroupStateTimeout.EventTimeTimeout and self.watermark_present
        watermark = ctx.watermark_for_late_rows_ms if drop_late else None
        return on_time_rows(table, ctx.metrics, self.event_time_column, watermark)

    def _call_groups(
        self,
        groups: KeyGroups,
        data: Callable[[int, int], Any],
        stored: list[tuple[Any, ...] | None],
        clock: GroupStateClock,
        out: OutputCollector,
        pending: _Pending,
    ) -> Iterator[pa.RecordBatch]:
        """Call the function once per key (the hot loop: the common case is inlined)."""
        func, width, starts, keys = self.func, self._width, groups.starts, groups.keys
        emit = self._emitter(out)
        compare = self.compare_with_stored_timeout
        key_bytes, put_keys, put_values = groups.key_bytes, pending.put_keys, pending.put_values
        new_state = self._state_class
        i = 0
        try:
            for i, row in enumerate(stored):
                if row is None:
                    old_ts, state = NO_TIMESTAMP, new_state(clock, None, width)
                else:
                    old_ts = row[width]
                    value = row[:width] if row[-1] else None
                    state = new_state(clock, value, width, old_timeout_ts=old_ts if compare else -1)
                result = func(keys[i], data(starts[i], starts[i + 1]), state)
                if result is not None:
                    emit(result)
                if state._removed or state._timeout_ts != NO_TIMESTAMP or old_ts != NO_TIMESTAMP:
                    self._record(pending, key_bytes[i], state, old_ts, row is not None, compare)
                elif state._updated:
                    put_keys.append(key_bytes[i])
                    put_values.append((*state._value, NO_TIMESTAMP, True))  # type: ignore[misc]
                if not i & 4095 and out.ready():
                    yield from out.drain()
        except Exception as exc:
            out.check_result(exc)
            exc.add_note(f"sparkstate: raised by the {self.kind} function for key {keys[i]!r}")
            raise

    def _collector(self) -> OutputCollector:
        return OutputCollector(self.output_schema, f"{self.kind} function", self.time_zone)

    def _group_data(self, groups: KeyGroups) -> Callable[[int, int], Any]:
        rows = rows_of(groups.table, self.row_format, self.time_zone)
        return lambda start, end: rows[start:end]

    def _empty_data(self) -> Any:
        return []

    def _emitter(self, out: OutputCollector) -> Callable[[Any], None]:
        return out.sink()

    def _record(
        self,
        pending: _Pending,
        kenc: bytes,
        state: GroupState,
        old_ts: int,
        existed: bool,
        compare_stored: bool,
    ) -> None:
        action, value, ts = state.decision(old_ts if compare_stored else NO_TIMESTAMP)
        if action == "keep":
            return
        if action == "remove":
            if existed:
                pending.deletes.append(kenc)
        else:
            pending.put_keys.append(kenc)
            pending.put_values.append(
                (*value, ts, True) if value is not None else (None,) * self._width + (ts, False)
            )
        pending.index.move(
            kenc, old_ts if existed else NO_TIMESTAMP, ts if action == "put" else NO_TIMESTAMP
        )

    def _apply(self, store: StateStore, fam: ColumnFamily, p: _Pending, m: OperatorMetrics) -> None:
        if p.put_keys:
            values = p.put_values if not self.pickled else _pickle_states(p.put_values)
            store.put_encoded_many(p.put_keys, fam.value_codec.encode_many(values))
            m.num_rows_updated += len(p.put_keys)
        if p.deletes:
            store.remove_encoded_many(p.deletes)
            m.num_rows_removed += len(p.deletes)
        p.index.flush(store)

    def _time_out(
        self,
        store: StateStore,
        fam: ColumnFamily,
        clock: GroupStateClock,
        out: OutputCollector,
        m: OperatorMetrics,
    ) -> Iterator[pa.RecordBatch]:
        """Call the function for every key whose timeout is before the threshold."""
        if self.timeout == GroupStateTimeout.ProcessingTimeTimeout:
            threshold = clock.processing_time_ms
        else:
            threshold = clock.watermark_ms
        pending, emit = _Pending(), self._emitter(out)
        expired = pending.index.due(store, threshold - 1)  # Spark: timeout < threshold
        if not expired:
            return
        key_bytes = [k for _, k in expired]
        stored = self._decode_states(fam, store.get_encoded_many(key_bytes))
        keys = fam.key_codec.decode_many(key_bytes)
        width, compare = self._width, self.compare_with_stored_timeout
        for (index_ts, kenc), key, row in zip(expired, keys, stored, strict=True):
            if row is None or row[width] != index_ts:  # a stale index entry: drop it
                pending.index.remove(kenc, index_ts)
                continue
            value = row[:width] if row[-1] else None
            state = self._state_class(
                clock, value, width, timed_out=True, old_timeout_ts=index_ts if compare else -1
            )
            try:
                result = self.func(key, self._empty_data(), state)
                if result is not None:
                    emit(result)
            except Exception as exc:
                out.check_result(exc)
                exc.add_note(
                    f"sparkstate: raised by the {self.kind} function for timed-out key {key!r}"
                )
                raise
            self._record(pending, kenc, state, index_ts, True, compare)
            if out.has_batches:
                yield from out.drain()
        self._apply(store, fam, pending, m)


def _pickle_states(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows (object, timeout, defined) of a PICKLED state as stored: the object pickled."""
    dumps, protocol = pickle.dumps, pickle.HIGHEST_PROTOCOL
    return [(dumps(r[0], protocol) if r[2] else None, r[1], r[2]) for r in rows]


class ApplyInPandasWithState(FlatMapGroupsWithState):
    """``applyInPandasWithState``: ``func(key, pdf_iter, state) -> iterator of DataFrames``.

    As in PySpark 4.3: the input DataFrame has all input columns; a timed-out key gets one empty
    DataFrame with those columns; ``oldTimeoutTimestamp`` is -1, so the stored timeout only
    changes when the function updates or removes the state or sets a timeout.
    """

    kind: ClassVar[str] = "applyInPandasWithState"
    progress_name: ClassVar[str] = "applyInPandasWithState"
    compare_with_stored_timeout: ClassVar[bool] = False

    def __init__(
        self,
        func: Callable[..., Any],
        input_schema: pa.Schema,
        key_columns: Sequence[str],
        output_schema: SchemaLike,
        state_schema: SchemaLike,
        output_mode: str = "update",
        timeout: str = GroupStateTimeout.NoTimeout,
        *,
        watermark_present: bool = False,
        event_time_column: str | None = None,
        time_zone: str = DEFAULT_TIME_ZONE,
        state_classes: tuple[type[GroupState], type[GroupState]] | None = None,
    ) -> None:
        super().__init__(
            func,
            input_schema,
            key_columns,
            output_schema,
            state_schema,
            output_mode,
            timeout,
            watermark_present=watermark_present,
            event_time_column=event_time_column,
            time_zone=time_zone,
            state_classes=state_classes,
        )

    @functools.cached_property
    def _timestamp_fields(self) -> list[int]:
        """The state fields that are timestamps with a zone (``timestamp``, not ``_ntz``)."""
        if self.pickled:
            return []
        return [i for i, f in enumerate(self.state_schema) if _zoned(f.type)]

    def _decode_states(
        self, fam: ColumnFamily, raws: Sequence[bytes | None]
    ) -> list[tuple[Any, ...] | None]:
        """As PySpark's state gives them: timestamps naive, in the session time zone."""
        rows = super()._decode_states(fam, raws)
        fields, tz = self._timestamp_fields, self.time_zone
        if not fields:
            return rows
        return [None if r is None else _mapped(r, fields, state_wall_clock, tz) for r in rows]

    def _apply(self, store: StateStore, fam: ColumnFamily, p: _Pending, m: OperatorMetrics) -> None:
        fields, tz = self._timestamp_fields, self.time_zone
        if fields:
            p.put_values = [_mapped(r, fields, state_instant, tz) for r in p.put_values]
        super()._apply(store, fam, p, m)

    def _collector(self) -> OutputCollector:
        where = f"{self.kind} function"
        return OutputCollector(self.output_schema, where, self.time_zone, exact_width=True)

    def _group_data(self, groups: KeyGroups) -> Callable[[int, int], Any]:
        return pandas_groups(groups, self.time_zone)

    def _empty_data(self) -> Any:
        return iter([empty_timed_out_frame(self.input_schema.names)])

    def _emitter(self, out: OutputCollector) -> Callable[[Any], None]:
        return out.frame_sink()


def _zoned(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) and t.tz is not None


def _mapped(
    row: tuple[Any, ...], fields: list[int], convert: Callable[[Any, str], Any], tz: str
) -> tuple[Any, ...]:
    """``row`` with ``convert(value, tz)`` applied to the values at ``fields``."""
    out = list(row)
    for i in fields:
        out[i] = convert(out[i], tz)
    return tuple(out)
