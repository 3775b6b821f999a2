"""``transformWithState`` / ``transformWithStateInPandas``: a ``StatefulProcessor`` over Arrow.

One partition, one batch, in Spark's order (``TransformWithStateExec``):

1. ``init(handle)``;
2. in batch 0 only, ``handleInitialState`` for every initial-state row (rows mode) or frame
   (pandas mode) of each key;
3. ``handleInputRows`` once per key of the input, in key order (with ``EventTime`` and a
   watermark, rows at or before the watermark are dropped first); in pandas mode the key's rows
   come as frames of at most ``max_records_per_batch`` rows and about ``max_bytes_per_batch``
   bytes (Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch`` / ``maxBytesPerBatch``);
4. ``handleExpiredTimer`` for every timer due (``expiry <= processing time`` or ``<= watermark``),
   each timer deleted after its call;
5. TTL cleanup (``ProcessingTime`` mode), then ``close()``.

State is read through per-batch caches (value state of all input keys in one multi-get) and
written in bulk at the end of each phase. Initial state reaches the operator inside the input:
rows whose ``INITIAL_STATE_MARKER`` column is true carry the columns of ``initial_state_schema``.

Under Spark's Avro state encoding (``state_encoding="avro"``) every top-level field of a state
variable's schema must be nullable, as Spark requires; its stores may then widen a field's type
across restarts (:mod:`sparkstate.store.evolution`).

``numRowsTotal`` is the state variables' rows as Spark's RocksDB store counts them (a value or
list state's keys, a map state's entries; no timer or TTL index entry), kept in ``$rows_count``
(:mod:`.state_rows`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary import processor_views
from sparkstate.operators.arbitrary.processor import (
    CLOSED,
    DATA_PROCESSED,
    INITIALIZED,
    TIMER_PROCESSED,
    ProcessorSession,
    StatefulProcessorHandle,
    declare_state,
)
from sparkstate.operators.arbitrary.processor_input import (
    UNLIMITED,
    check_nullable,
    frame_rows,
    frames_of,
    not_older_than,
    select_columns,
)
from sparkstate.operators.arbitrary.schemas import SchemaLike, to_arrow_schema
from sparkstate.operators.arbitrary.spark_processor_state import processor_reads, processor_state
from sparkstate.operators.arbitrary.state_collections import map_rows
from sparkstate.operators.arbitrary.state_rows import (
    ROWS_CF,
    ROWS_KEY_SCHEMA,
    ROWS_SCHEMA,
    RowsOfValue,
    counted_rows,
)
from sparkstate.operators.arbitrary.state_vars import MAP_VALUE_SCHEMA, VarSpec, elements_cf_name
from sparkstate.operators.arbitrary.timers import (
    TIMER_INDEX_CF,
    TIMERS_CF,
    TIMERS_VALUE_SCHEMA,
    ExpiredTimerInfo,
    TimeMode,
    TimerValues,
)
from sparkstate.operators.arbitrary.timers import time_mode as parse_time_mode
from sparkstate.operators.arbitrary.user_types import (
    DEFAULT_TIME_ZONE,
    GroupFrames,
    rebuilt_from_rows,
)
from sparkstate.operators.base import BatchContext, Phase, StatefulOperator, timed_phase
from sparkstate.operators.grouping import (
    ROW_FORMATS,
    KeyGroups,
    OutputCollector,
    concat_batches,
    group_by_key,
    key_schema_of,
    on_time_rows,
    rows_of,
)
from sparkstate.operators.spark_state import SparkRows
from sparkstate.operators.state_layout import DeriveFamilies, Families, ShownStore
from sparkstate.operators.state_views import StateView
from sparkstate.operators.ts_index import MARKER_SCHEMA, index_key_schema
from sparkstate.store.base import DEFAULT_CF, StateStore

__all__ = ["INITIAL_STATE_MARKER", "MODES", "TransformWithState"]

#: Input column that flags initial-state rows (batch 0 only).
INITIAL_STATE_MARKER = "__sparkstate_initial_state__"
_TIME_TRIGGERS = {TimeMode.PROCESSING_TIME: "processing", TimeMode.EVENT_TIME: "event"}
#: ``rows``: ``transformWithState`` (Row iterators); ``pandas``: ``transformWithStateInPandas``.
MODES = ("rows", "pandas")
#: Where a description records a state encoding other than the default (Spark's
#: ``spark.sql.streaming.stateStore.encodingFormat``), and the encodings.
STATE_ENCODING = "state_encoding"
DEFAULT_ENCODING = "unsaferow"
AVRO = "avro"
ENCODINGS = (DEFAULT_ENCODING, AVRO)
#: Spark's defaults of ``spark.sql.execution.arrow.maxRecordsPerBatch`` / ``maxBytesPerBatch``.
MAX_RECORDS_PER_BATCH = 10_000


class TransformWithState(StatefulOperator):
    """Runs a ``StatefulProcessor`` on one partition's keys, batch after batch."""

    kind: ClassVar[str] = "transformWithState"
    calls_user_code: ClassVar[bool] = True
    progress_name: ClassVar[str] = "transformWithStateInPySparkExec"
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append", "update")
    #: Its rows are its state variables' as Spark counts them (:mod:`.state_rows`).
    rows_are_keys: ClassVar[bool] = False

    @property
    def operator_name(self) -> str:
        """Spark's: PySpark's ``transformWithStateInPandas`` and ``transformWithState`` run
        as two operators of their own names."""
        return "transformWithStateInPandasExec" if self.mode == "pandas" else self.progress_name

    def __init__(
        self,
        processor: Any,
        input_schema: pa.Schema,
        key_columns: Sequence[str],
        output_schema: SchemaLike,
        output_mode: str = "update",
        time_mode: str = TimeMode.NONE,
        *,
        mode: str = "rows",
        row_format: str = "row",
        watermark_present: bool = False,
        event_time_column: str | None = None,
        initial_state_schema: SchemaLike | None = None,
        initial_state_key_columns: Sequence[str] | None = None,
        initial_state_columns: Sequence[str] | None = None,
        output_event_time_column: str | None = None,
        time_zone: str = DEFAULT_TIME_ZONE,
        state_encoding: str = DEFAULT_ENCODING,
        max_records_per_batch: int = MAX_RECORDS_PER_BATCH,
        max_bytes_per_batch: int = UNLIMITED,
    ) -> None:
        api = self.kind
        #: The session time zone (``spark.sql.session.timeZone``) user functions see times in.
        self.time_zone = time_zone
        if not hasattr(processor, "handleInputRows") or not hasattr(processor, "init"):
            msg = f"{api}: {processor!r} is not a StatefulProcessor (no init/handleInputRows)"
            raise ConfigurationError(msg)
        if mode not in MODES:
            msg = f"{api}: mode must be one of {MODES}, got {mode!r}"
            raise ConfigurationError(msg)
        if row_format not in ROW_FORMATS:
            msg = f"{api}: row_format must be one of {ROW_FORMATS}, got {row_format!r}"
            raise ConfigurationError(msg)
        self.processor = processor
        self.mode = mode
        self.row_format = row_format
        self.input_schema = input_schema
        self.key_schema = key_schema_of(input_schema, key_columns, api)
        self.output_schema = to_arrow_schema(output_schema, f"{api} output schema")
        self.output_mode = output_mode.lower()
        self.check_output_mode(self.output_mode)
        self.time_mode = parse_time_mode(time_mode)
        if self.time_mode == TimeMode.EVENT_TIME and not watermark_present:
            msg = f"{api}: time mode 'EventTime' needs a watermark (withWatermark) on the input"
            raise ConfigurationError(msg)
        if event_time_column is not None and event_time_column not in input_schema.names:
            msg = f"{api}: no event-time column {event_time_column!r} in {input_schema.names}"
            raise ConfigurationError(msg)
        self.watermark_present = watermark_present
        self.event_time_column = event_time_column
        #: ``eventTimeColumnName``: the output column that carries event time onwards; as in
        #: Spark, a row older than the batch's watermark there fails the batch.
        self.output_event_time_column = output_event_time_column
        if output_event_time_column is not None:
            self._check_output_event_time(api, output_event_time_column, watermark_present)
        self.initial_state_schema = (
            None
            if initial_state_schema is None
            else to_arrow_schema(initial_state_schema, f"{api} initial state schema")
        )
        init_keys = list(initial_state_key_columns or key_columns)
        if self.initial_state_schema is not None:
            init_key_schema = key_schema_of(self.initial_state_schema, init_keys, api)
            if init_key_schema.types != self.key_schema.types:
                msg = (
                    f"{api}: initial state keys {init_keys} ({init_key_schema.types}) do not "
                    f"match the grouping keys ({self.key_schema.types})"
                )
                raise ConfigurationError(msg)
        self.initial_state_key_columns = init_keys
        #: The input columns that carry the initial state's fields (default: the same names).
        self.initial_state_columns = list(
            initial_state_columns
            or ([] if self.initial_state_schema is None else self.initial_state_schema.names)
        )
        if self.initial_state_schema is not None and len(self.initial_state_columns) != len(
            self.initial_state_schema
        ):
            msg = (
                f"{api}: initial_state_columns {self.initial_state_columns} do not match the "
                f"initial state schema {self.initial_state_schema.names}"
            )
            raise ConfigurationError(msg)
        if state_encoding not in ENCODINGS:
            msg = f"{api}: state_encoding must be one of {ENCODINGS}, got {state_encoding!r}"
            raise ConfigurationError(msg)
        #: Spark's ``spark.sql.streaming.stateStore.encodingFormat``.
        self.state_encoding = state_encoding
        #: Pandas mode: the most rows of a frame of a key's rows (<= 0: no limit).
        self.max_records_per_batch = max_records_per_batch
        #: Pandas mode: about the most bytes of Arrow input of a frame of a key's rows.
        self.max_bytes_per_batch = max_bytes_per_batch
        self.value_schema = MARKER_SCHEMA
        self.state_specs: dict[str, VarSpec] = declare_state(processor, self.time_mode)
        if state_encoding == AVRO:
            check_nullable(self.state_specs)

    def column_families(self) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        out: dict[str, tuple[pa.Schema, pa.Schema]] = {}
        for spec in self.state_specs.values():
            out.update(spec.column_families(self.key_schema))
        if self.time_mode != TimeMode.NONE:
            out[TIMERS_CF] = (self.key_schema, TIMERS_VALUE_SCHEMA)
            out[TIMER_INDEX_CF] = (index_key_schema(self.key_schema), MARKER_SCHEMA)
        out[ROWS_CF] = (ROWS_KEY_SCHEMA, ROWS_SCHEMA)
        return out

    @property
    def value_widening(self) -> bool:
        """Spark's Avro encoding reads old state values through Avro's schema resolution."""
        return self.state_encoding == AVRO

    def time_trigger(self) -> str | None:
        """As Spark's: every trigger in ProcessingTime; otherwise after a batch that moved the
        watermark, where the query has one (time mode None included)."""
        if self.time_mode != TimeMode.PROCESSING_TIME and self.watermark_present:
            return "event"
        return _TIME_TRIGGERS.get(self.time_mode)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["time_mode"] = self.time_mode
        out["state"] = {n: s.describe() for n, s in sorted(self.state_specs.items())}
        if self.state_encoding != DEFAULT_ENCODING:  # earlier checkpoints record none
            out[STATE_ENCODING] = self.state_encoding
        return out

    # --- its state, as the reader shows it (:mod:`.processor_views`) -----------------------------

    @classmethod
    def store_view(
        cls, described: dict[str, Any], families: Families, store_name: str | None, flatten: bool
    ) -> StateView:
        return processor_views.variable_view(described, families, store_name, flatten)

    @classmethod
    def timers_view(cls, described: dict[str, Any], families: Families) -> StateView:
        found = processor_views.timers_view(families)
        return super().timers_view(described, families) if found is None else found

    @classmethod
    def shown_stores(
        cls, described: dict[str, Any], store_name: str | None, join_side: str | None
    ) -> list[ShownStore]:
        if store_name is None:  # every state variable
            return [(name, name, None) for name in described.get("state", {})]
        return super().shown_stores(described, store_name, join_side)

    @classmethod
    def spark_properties(cls, described: dict[str, Any], output_mode: str) -> str | None:
        return processor_views.processor_properties(described, output_mode)

    @classmethod
    def summary(cls, described: dict[str, Any]) -> dict[str, Any]:
        return {"time_mode": described.get("time_mode")}

    @classmethod
    def store_summary(cls, described: dict[str, Any], store: str) -> dict[str, Any]:
        return processor_views.variable_summary(described, store)

    @classmethod
    def rows_in_state(cls, store: StateStore) -> int:
        """The state variables' rows, as Spark counts them: a map's entries, a value's or a
        list's keys, no timer or TTL index entry (a store that does not count its keys
        reports 0)."""
        if store.total_keys() <= 0:
            return 0
        return sum(counted_rows(store, name, rows)[0] for name, rows in _variables(store))

    @classmethod
    def derived_families(cls) -> tuple[tuple[str, ...], DeriveFamilies | None]:
        """The variables' rows: not moved, a new partition counts them once."""
        return (ROWS_CF,), None

    # --- Spark's state of the processor, taken over (:mod:`.spark_processor_state`) --------------

    def spark_reads(self) -> dict[str, dict[str, str]] | None:
        """Each state variable, and the registered timers."""
        timers = self.time_mode != TimeMode.NONE
        return processor_reads(self.state_specs, timers)

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        return processor_state(self.key_schema, self.state_specs, key, value)

    # --- the batch -------------------------------------------------------------------------------

    def _check_output_event_time(self, api: str, column: str, watermark_present: bool) -> None:
        if not watermark_present:
            msg = (
                f"{api}: [CANNOT_ASSIGN_EVENT_TIME_COLUMN_WITHOUT_WATERMARK] eventTimeColumnName "
                f"{column!r} needs a watermark (withWatermark) on the input"
            )
            raise ConfigurationError(msg)
        if column not in self.output_schema.names:
            msg = f"{api}: eventTimeColumnName {column!r} is not in the output schema"
            raise ConfigurationError(msg)
        typ = self.output_schema.field(column).type
        if not pa.types.is_timestamp(typ):
            msg = (
                f"{api}: [EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE] the event time {column!r} has the "
                f"invalid type {typ}, but expected a timestamp"
            )
            raise ConfigurationError(msg)

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        output = self._process(store, batches, ctx)
        column = self.output_event_time_column
        if column is None:
            return output
        return not_older_than(output, column, ctx.watermark_ms)

    def _process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        m = ctx.metrics
        started = time.perf_counter()
        table, initial = self._split_input(batches, ctx)
        phase = m.add_phase(Phase.INPUT_READ, started)
        fam = store.column_family()
        session = ProcessorSession(store, self.time_mode, ctx.batch_timestamp_ms)
        handle = StatefulProcessorHandle(session, self.state_specs)
        self.processor.init(handle)
        handle.stage = INITIALIZED
        values = self._timer_values(ctx)
        out = OutputCollector(self.output_schema, f"{self.kind} processor", self.time_zone)
        emit = self._emitter(out)
        if initial is not None and initial.num_rows and ctx.batch_id == 0:
            self._initial_state(initial, fam.key_codec, session, values)
            phase = m.add_phase(Phase.INITIAL_STATE, phase)
        groups = group_by_key(table, self.key_schema, fam.key_codec)
        if len(groups):
            data = self._data_of(groups)
            phase = m.add_phase(Phase.GROUPING, phase)
            session.prefetch(groups.key_bytes)
            m.add_phase(Phase.STATE_READ, phase)
            calls = self._input_rows(groups, data, session, values, emit, out)
            yield from timed_phase(calls, m, Phase.USER_FUNCTION)
        phase = time.perf_counter()
        self._flush(session, m)
        m.add_phase(Phase.STATE_WRITE, phase)
        m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
        handle.stage = DATA_PROCESSED
        if self.time_mode != TimeMode.NONE:
            expired = self._expired_timers(session, values, emit, out, ctx)
            yield from timed_phase(expired, m, Phase.TIMERS)
        if self.time_mode == TimeMode.PROCESSING_TIME:
            m.observe_timer(session.timers.index.earliest(store))
        handle.stage = TIMER_PROCESSED
        started = time.perf_counter()
        m.num_rows_removed += session.evict_expired()
        self._flush(session, m)
        m.add_phase(Phase.TTL_EVICTION, started)
        m.all_removals_time_ms += int((time.perf_counter() - started) * 1000)
        self.processor.close()
        handle.stage = CLOSED
        for name, count in handle.counts.items():
            m.custom[name] = m.custom.get(name, 0.0) + count
        yield from out.drain(final=True)
        m.num_output_rows += out.num_rows
        m.num_rows_total = (m.num_rows_total or 0) + self.rows_in_state(store)

    @staticmethod
    def _flush(session: ProcessorSession, m: Any) -> None:
        updated, removed = session.flush()
        m.num_rows_updated += updated
        m.num_rows_removed += removed

    def _timer_values(self, ctx: BatchContext) -> TimerValues:
        if self.time_mode == TimeMode.NONE:
            return TimerValues(-1, -1)
        watermark = ctx.watermark_ms if self.watermark_present else -1
        return TimerValues(ctx.batch_timestamp_ms, watermark)

    def _split_input(
        self, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> tuple[pa.Table, pa.Table | None]:
        """The input rows (with ``EventTime``, rows behind the watermark dropped) and the
        initial-state rows among them (None when there are none)."""
        whole = concat_batches(batches, self.input_schema)
        initial = None
        if INITIAL_STATE_MARKER in whole.column_names:
            flag = pc.fill_null(whole.column(INITIAL_STATE_MARKER), False)
            if self.initial_state_schema is None:
                msg = f"{self.kind}: initial state rows given but no initial_state_schema declared"
                raise ConfigurationError(msg)
            initial = select_columns(
                whole.filter(flag), self.initial_state_schema, self.initial_state_columns
            )
            whole = whole.filter(pc.invert(flag))
        table = select_columns(whole, self.input_schema)
        event_time = self.time_mode == TimeMode.EVENT_TIME
        watermark = ctx.watermark_for_late_rows_ms if event_time else None
        return on_time_rows(table, ctx.metrics, self.event_time_column, watermark), initial

    def _data_of(self, groups: KeyGroups) -> Callable[[int, int], Any]:
        if self.mode == "pandas":
            frames = GroupFrames(
                groups.table, groups.starts, self.time_zone, per_group_integers=False
            )
            cut = frames.frame
            size = frame_rows(groups.table, self.max_records_per_batch, self.max_bytes_per_batch)
            return lambda s, e: frames_of(cut(s, e), size)
        rows = rows_of(groups.table, self.row_format, self.time_zone)
        return lambda s, e: iter(rows[s:e])

    def _emitter(self, out: OutputCollector) -> Callable[[Any], None]:
        return out.sink() if self.mode == "rows" else out.frame_sink()

    def _initial_state(
        self, initial: pa.Table, codec: Any, session: ProcessorSession, values: TimerValues
    ) -> None:
        init_keys = pa.schema(
            [initial.schema.field(c).with_nullable(True) for c in self.initial_state_key_columns]
        )
        groups = group_by_key(initial, init_keys, codec)
        handler, ctx = self.processor.handleInitialState, session.ctx
        pandas = self.mode == "pandas"
        frames = None
        if pandas:
            frames = GroupFrames(
                groups.table, groups.starts, self.time_zone, per_group_integers=False
            )
        rows = None if pandas else rows_of(groups.table, self.row_format, self.time_zone)
        for i, (kenc, key) in enumerate(zip(groups.key_bytes, groups.keys, strict=True)):
            ctx.kenc, ctx.key = kenc, key
            s, e = groups.starts[i], groups.starts[i + 1]
            try:
                if frames is not None:
                    handler(key, rebuilt_from_rows(frames.frame(s, e)), values)
                else:
                    for row in rows[s:e]:  # type: ignore[index]
                        handler(key, row, values)
            except Exception as exc:
                exc.add_note(f"sparkstate: raised by handleInitialState for key {key!r}")
                raise
        ctx.kenc = ctx.key = None

    def _input_rows(
        self,
        groups: KeyGroups,
        data: Callable[[int, int], Any],
        session: ProcessorSession,
        values: TimerValues,
        emit: Callable[[Any], None],
        out: OutputCollector,
    ) -> Iterator[pa.RecordBatch]:
        handler, ctx = self.processor.handleInputRows, session.ctx
        starts, keys = groups.starts, groups.keys
        i = 0
        try:
            for i, kenc in enumerate(groups.key_bytes):
                ctx.kenc = kenc
                ctx.key = key = keys[i]
                result = handler(key, data(starts[i], starts[i + 1]), values)
                if result is not None:
                    emit(result)
                if not i & 4095 and out.ready():
                    yield from out.drain()
        except Exception as exc:
            out.check_result(exc)
            exc.add_note(f"sparkstate: raised by handleInputRows for key {keys[i]!r}")
            raise
        ctx.kenc = ctx.key = None

    def _expired_timers(
        self,
        session: ProcessorSession,
        values: TimerValues,
        emit: Callable[[Any], None],
        out: OutputCollector,
        ctx: BatchContext,
    ) -> Iterator[pa.RecordBatch]:
        """Call ``handleExpiredTimer`` for each timer due, then flush the state changes."""
        if self.time_mode == TimeMode.PROCESSING_TIME:
            threshold = ctx.batch_timestamp_ms
        else:
            threshold = ctx.watermark_ms
        store = session.store
        due = session.timers.due(store, threshold)
        ctx.metrics.custom["numExpiredTimers"] = ctx.metrics.custom.get("numExpiredTimers", 0.0)
        if not due:
            self._flush(session, ctx.metrics)
            return
        ctx.metrics.custom["numExpiredTimers"] += len(due)
        kencs = [k for _, k in due]
        keys = store.column_family().key_codec.decode_many(kencs)
        session.prefetch(list(dict.fromkeys(kencs)))
        handler, kctx = self.processor.handleExpiredTimer, session.ctx
        for (expiry, kenc), key in zip(due, keys, strict=True):
            kctx.kenc, kctx.key = kenc, key
            try:
                result = handler(key, values, ExpiredTimerInfo(expiry))
                if result is not None:
                    emit(result)
            except Exception as exc:
                out.check_result(exc)
                exc.add_note(f"sparkstate: raised by handleExpiredTimer for key {key!r}")
                raise
            session.timers.delete(store, kenc, expiry)
            if out.has_batches:
                yield from out.drain()
        kctx.kenc = kctx.key = None
        self._flush(session, ctx.metrics)


def _variables(store: StateStore) -> list[tuple[str, RowsOfValue]]:
    """The state variables' families in ``store``, each with the rows of one of its values
    (None: one; a map's: its entries)."""
    out: list[tuple[str, RowsOfValue]] = []
    for name in store.column_family_names():
        if name == DEFAULT_CF or name.startswith("$"):
            continue  # the operator's own, unused, and internal families: no rows of Spark's
        fam = store.column_family(name)
        is_map = store.has_column_family(elements_cf_name(name)) and (
            fam.value_schema.names == MAP_VALUE_SCHEMA.names
        )
        out.append((name, map_rows(fam.value_codec) if is_map else None))
    return out
