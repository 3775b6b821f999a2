"""A Spark-free harness to unit-test stateful logic: GroupState functions and StatefulProcessors.

It runs the real operator on one partition's real store (the ``memory`` provider by default, in a
temporary directory), batch after batch, with a clock and a watermark under the test's control::

    h = processor_harness(CountProcessor(), key_columns=["user"],
                          output_schema="user string, count long", time_mode="ProcessingTime")
    assert h.run([{"user": "a"}], processing_time_ms=1_000).rows == [{"user": "a", "count": 1}]
    h.run(processing_time_ms=10_000)        # a batch without data: timers and timeouts fire
    h.restart()                             # reopen the store at the committed version
    assert h.value_state("count", ("a",)) == (1,)

Every batch commits a new version, exactly as the engine does (``commit=False`` aborts it instead,
to test replays). The watermark is either set per batch or derived from an event-time column and a
delay, Spark's way: the maximum event time of earlier batches minus the delay.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import struct
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.flat_map_groups import (
    DEFINED_FIELD,
    ApplyInPandasWithState,
    FlatMapGroupsWithState,
)
from sparkstate.operators.arbitrary.group_state import GroupStateTimeout
from sparkstate.operators.arbitrary.processor_input import UNLIMITED
from sparkstate.operators.arbitrary.schemas import SchemaLike, to_arrow_schema
from sparkstate.operators.arbitrary.state_collections import decode_list, decode_map
from sparkstate.operators.arbitrary.state_vars import VarSpec, elements_cf_name
from sparkstate.operators.arbitrary.timers import TIMERS_CF, TimeMode
from sparkstate.operators.arbitrary.transform_with_state import (
    INITIAL_STATE_MARKER,
    MAX_RECORDS_PER_BATCH,
    TransformWithState,
)
from sparkstate.operators.base import BatchContext, OperatorMetrics, StatefulOperator
from sparkstate.runtime.partition import run_partition
from sparkstate.runtime.watermark import WatermarkTracker
from sparkstate.store.base import StateStore, StateStoreProvider, StoreConf, StoreId
from sparkstate.store.codec import KeyCodec, ValueCodec
from sparkstate.store.registry import provider_class

__all__ = [
    "BatchResult",
    "OperatorHarness",
    "group_state_harness",
    "processor_harness",
]

INPUT = "input"
Rows = Any  # list of dicts, a pandas DataFrame, a pyarrow Table / RecordBatch, or None


@dataclasses.dataclass
class BatchResult:
    """The output and metrics of one batch."""

    batch_id: int
    table: pa.Table
    metrics: OperatorMetrics

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Output rows as dicts, in the order the operator emitted them."""
        out: list[dict[str, Any]] = self.table.to_pylist()
        return out

    def sorted_rows(self, *columns: str) -> list[dict[str, Any]]:
        """Output rows sorted by ``columns`` (all columns when none are given)."""
        names = list(columns) or self.table.column_names
        return sorted(self.rows, key=lambda r: [(r[c] is not None, r[c]) for c in names])

    def to_pandas(self) -> Any:
        return self.table.to_pandas()


def _as_table(rows: Rows, schema: pa.Schema | None) -> pa.Table | None:
    if rows is None:
        return None
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if hasattr(rows, "columns") and hasattr(rows, "iloc"):
        return pa.Table.from_pandas(rows, schema=schema, preserve_index=False)
    if not isinstance(rows, Sequence) or isinstance(rows, str | bytes):
        msg = f"batch rows must be a list of dicts, a DataFrame or an Arrow table; got {rows!r}"
        raise ConfigurationError(msg)
    if not rows:
        return None if schema is None else schema.empty_table()
    return pa.Table.from_pylist(list(rows), schema=schema)


class OperatorHarness:
    """Runs one stateful operator on one partition's store, one batch per ``run``."""

    def __init__(
        self,
        build: Callable[[pa.Schema], StatefulOperator],
        *,
        input_schema: SchemaLike | None = None,
        output_mode: str = "update",
        provider: str = "memory",
        directory: str | Path | None = None,
        store_conf: StoreConf | None = None,
        processing_time_ms: int = 0,
        watermark_delay_ms: int | None = None,
        event_time_column: str | None = None,
    ) -> None:
        self._build = build
        self._owned_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="sparkstate-harness-"))
        self.provider_name = provider
        self.store_conf = store_conf or StoreConf(local_dir=str(self.directory / "local"))
        self.output_mode = output_mode
        #: Processing time of the next batch (``run`` may override it).
        self.clock_ms = processing_time_ms
        self.watermark_delay_ms = watermark_delay_ms
        self.event_time_column = event_time_column
        self.batch_id = 0
        delays = {INPUT: watermark_delay_ms} if watermark_delay_ms is not None else {}
        self._watermarks = WatermarkTracker(delays)
        self._provider: StateStoreProvider | None = None
        self.operator: StatefulOperator | None = None
        if input_schema is not None:
            self._start(to_arrow_schema(input_schema, "input schema"))

    # --- life cycle ---------------------------------------------------------------------------

    def _start(self, input_schema: pa.Schema) -> StatefulOperator:
        self.operator = self._build(input_schema)
        self.batch_id = self._open().latest_version()  # resume a directory used before
        return self.operator

    def _open(self) -> StateStoreProvider:
        op = self.operator
        assert op is not None
        provider = provider_class(self.provider_name)()
        provider.init(
            StoreId(str(self.directory / "checkpoint"), 0, 0),
            op.key_schema,
            op.value_schema,
            self.store_conf,
            op.column_families() or None,
        )
        self._provider = provider
        return provider

    @property
    def provider(self) -> StateStoreProvider:
        if self._provider is None:
            msg = "the harness has no store yet: run a batch with rows or give input_schema"
            raise ConfigurationError(msg)
        return self._provider

    def restart(self) -> None:
        """Close the provider and reopen the store at the committed version (a new worker)."""
        if self._provider is not None:
            self._provider.close()
            self._open()

    def close(self) -> None:
        if self._provider is not None:
            self._provider.close()
            self._provider = None
        if self._owned_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> OperatorHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- batches ------------------------------------------------------------------------------

    @property
    def watermark_ms(self) -> int:
        """The watermark of the next batch: set by ``run(watermark_ms=...)`` or, with a delay,
        the largest event time of earlier batches minus the delay (Spark's rule)."""
        return self._watermarks.watermark_ms

    def advance(self, millis: int) -> None:
        """Move the processing-time clock forward."""
        self.clock_ms += millis

    def run(
        self,
        rows: Rows = None,
        *,
        processing_time_ms: int | None = None,
        watermark_ms: int | None = None,
        commit: bool = True,
        extra: pa.Table | None = None,
    ) -> BatchResult:
        """Run one batch (``rows`` may be None: a batch without data) and commit it."""
        schema = None if self.operator is None else self.operator.input_schema
        table = _as_table(rows, schema)
        op = self.operator
        if op is None:
            if table is None or table.num_rows == 0:
                msg = "the first batch needs rows (or give input_schema) to know the input schema"
                raise ConfigurationError(msg)
            op = self._start(table.schema)
        if processing_time_ms is not None:
            self.clock_ms = processing_time_ms
        if watermark_ms is not None:
            self._watermarks.watermark_ms = watermark_ms
        data = table if table is not None else op.input_schema.empty_table()
        if extra is not None:
            data = pa.concat_tables([data, extra], promote_options="permissive")
        ctx = BatchContext(
            batch_id=self.batch_id,
            output_mode=self.output_mode,
            watermark_ms=self.watermark_ms,
            batch_timestamp_ms=self.clock_ms,
        )
        out = list(run_partition(op, self.provider, ctx, iter(data.to_batches()), commit=commit))
        result = BatchResult(
            self.batch_id, pa.Table.from_batches(out, schema=op.output_schema), ctx.metrics
        )
        if commit:
            self.batch_id += 1
            self._watermarks.observe(INPUT, ctx.metrics.max_event_time_ms)
            self._watermarks.advance()
        return result

    # --- state inspection ---------------------------------------------------------------------

    def _read_store(self) -> StateStore:
        return self.provider.get_read_store(self.batch_id)

    def state_rows(self, cf: str = "default") -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """Every (key, value) of a column family at the committed version, as stored."""
        store = self._read_store()
        try:
            return dict(store.iterator(cf))
        finally:
            store.abort()

    def _get(self, cf: str, key: Any) -> tuple[Any, ...] | None:
        store = self._read_store()
        try:
            return store.get(key if isinstance(key, tuple) else (key,), cf)
        finally:
            store.abort()

    def _codec(self, cf: str) -> ValueCodec:
        """The value codec of a column family (it reads every schema the family had)."""
        store = self._read_store()
        try:
            return store.column_family(cf).value_codec
        finally:
            store.abort()

    def group_state(self, key: Any) -> Any:
        """The committed GroupState value of ``key`` (None when absent or removed; the object
        itself for a ``sparkstate.PICKLED`` state)."""
        op = self.operator
        if not isinstance(op, FlatMapGroupsWithState):
            msg = "group_state() is for applyInPandasWithState / flatMapGroupsWithState"
            raise ConfigurationError(msg)
        row = self._get("default", key)
        names = op.value_schema.names
        if row is None or not row[names.index(DEFINED_FIELD)]:
            return None
        return pickle.loads(row[0]) if op.pickled else row[: len(op.state_schema)]

    def group_state_timeout(self, key: Any) -> int | None:
        """The committed timeout timestamp of ``key`` (None when there is none)."""
        op = self.operator
        assert isinstance(op, FlatMapGroupsWithState)
        row = self._get("default", key)
        ts = None if row is None else row[len(op.state_schema)]
        return None if ts is None or ts == -1 else int(ts)

    def _spec(self, name: str, kind: str) -> Any:
        op = self.operator
        if not isinstance(op, TransformWithState) or name not in op.state_specs:
            msg = f"no {kind} state variable {name!r} in this processor"
            raise ConfigurationError(msg)
        spec = op.state_specs[name]
        if spec.kind != kind:
            msg = f"state variable {name!r} is a {spec.kind} state, not {kind}"
            raise ConfigurationError(msg)
        return spec

    def value_state(self, name: str, key: Any) -> Any:
        """The committed value of a ValueState (expired values included until cleaned up; the
        object itself for a ``sparkstate.PICKLED`` state)."""
        spec = self._spec(name, "value")
        row = self._get(name, key)
        return None if row is None else _user_value(spec, row)

    def list_state(self, name: str, key: Any) -> list[Any]:
        spec = self._spec(name, "list")
        row = self._get(name, key)
        if row is None:
            return []
        codec = self._codec(elements_cf_name(name))
        return [_user_value(spec, r) for r in decode_list(codec, row[0])]

    def map_state(self, name: str, key: Any) -> dict[tuple[Any, ...], Any]:
        spec = self._spec(name, "map")
        row = self._get(name, key)
        if row is None:
            return {}
        codec = self._codec(elements_cf_name(name))
        entries = decode_map(KeyCodec(spec.key_schema), codec, row[0])
        return {k: _user_value(spec, v) for k, v in entries}

    def timers(self, key: Any) -> list[int]:
        """The committed timers of ``key``, earliest first."""
        row = self._get(TIMERS_CF, key)
        if row is None:
            return []
        blob = row[0]
        return list(struct.unpack(f"<{len(blob) // 8}q", blob))


def _user_value(spec: VarSpec, row: tuple[Any, ...]) -> Any:
    """A stored value or element as the processor sees it (without the TTL field)."""
    return pickle.loads(row[0]) if spec.pickled else row[: len(spec.schema)]


def group_state_harness(
    func: Callable[..., Any],
    *,
    key_columns: Sequence[str],
    output_schema: SchemaLike,
    state_schema: SchemaLike,
    timeout: str = GroupStateTimeout.NoTimeout,
    pandas: bool = False,
    row_format: str = "tuple",
    input_schema: SchemaLike | None = None,
    event_time_column: str | None = None,
    watermark: bool = False,
    watermark_delay_ms: int | None = None,
    output_mode: str = "update",
    time_zone: str = "UTC",
    **options: Any,
) -> OperatorHarness:
    """A harness for an ``applyInPandasWithState`` (``pandas=True``) or row-based function.

    ``watermark=True`` (implied by ``watermark_delay_ms``) tells the function a watermark exists;
    ``time_zone`` is the session time zone (``spark.sql.session.timeZone``) the function sees
    timestamps in.
    """
    present = watermark or watermark_delay_ms is not None

    def build(schema: pa.Schema) -> StatefulOperator:
        if pandas:
            return ApplyInPandasWithState(
                func,
                schema,
                key_columns,
                output_schema,
                state_schema,
                output_mode,
                timeout,
                watermark_present=present,
                event_time_column=event_time_column,
                time_zone=time_zone,
            )
        return FlatMapGroupsWithState(
            func,
            schema,
            key_columns,
            output_schema,
            state_schema,
            output_mode,
            timeout,
            watermark_present=present,
            event_time_column=event_time_column,
            row_format=row_format,
            time_zone=time_zone,
        )

    return OperatorHarness(
        build,
        input_schema=input_schema,
        output_mode=output_mode,
        watermark_delay_ms=watermark_delay_ms,
        event_time_column=event_time_column,
        **options,
    )


class _ProcessorHarness(OperatorHarness):
    """Feeds the initial state into the first batch, as marked rows (the engine's way)."""

    def __init__(self, build: Callable[[pa.Schema], StatefulOperator], initial: Rows, **kw: Any):
        self._initial = initial
        super().__init__(build, **kw)

    def run(self, rows: Rows = None, **kw: Any) -> BatchResult:
        extra = kw.pop("extra", None)
        if self._initial is not None and self.batch_id == 0 and kw.get("commit", True):
            op = self.operator
            schema = getattr(op, "initial_state_schema", None)
            initial = _as_table(self._initial, schema)
            if initial is not None:
                n = initial.num_rows
                extra = initial.append_column(INITIAL_STATE_MARKER, pa.array([True] * n))
            self._initial = None
        if extra is not None and self.operator is None:
            table = _as_table(rows, None)
            if table is None or table.num_rows == 0:
                msg = "give input_schema to a processor harness with initial state"
                raise ConfigurationError(msg)
            self._start(table.schema)
        return super().run(rows, extra=extra, **kw)


def processor_harness(
    processor: Any,
    *,
    key_columns: Sequence[str],
    output_schema: SchemaLike,
    time_mode: str = TimeMode.NONE,
    mode: str = "rows",
    row_format: str = "row",
    input_schema: SchemaLike | None = None,
    initial_state: Rows = None,
    initial_state_schema: SchemaLike | None = None,
    initial_state_key_columns: Sequence[str] | None = None,
    event_time_column: str | None = None,
    watermark: bool = False,
    watermark_delay_ms: int | None = None,
    output_mode: str = "update",
    max_records_per_batch: int = MAX_RECORDS_PER_BATCH,
    max_bytes_per_batch: int = UNLIMITED,
    **options: Any,
) -> OperatorHarness:
    """A harness for a ``StatefulProcessor`` (``mode="pandas"`` for transformWithStateInPandas).

    ``initial_state`` (rows with the key columns and the initial-state columns) is handed to
    ``handleInitialState`` in the first batch; its schema is inferred unless given. In pandas
    mode a key's rows come in frames cut by ``max_records_per_batch`` / ``max_bytes_per_batch``
    (Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch`` / ``maxBytesPerBatch``).
    """
    present = watermark or watermark_delay_ms is not None
    init_schema = initial_state_schema
    if initial_state is not None and init_schema is None:
        inferred = _as_table(initial_state, None)
        init_schema = None if inferred is None else inferred.schema

    def build(schema: pa.Schema) -> StatefulOperator:
        return TransformWithState(
            processor,
            schema,
            key_columns,
            output_schema,
            output_mode,
            time_mode,
            mode=mode,
            row_format=row_format,
            watermark_present=present,
            event_time_column=event_time_column,
            initial_state_schema=init_schema,
            initial_state_key_columns=initial_state_key_columns,
            max_records_per_batch=max_records_per_batch,
            max_bytes_per_batch=max_bytes_per_batch,
        )

    return _ProcessorHarness(
        build,
        initial_state,
        input_schema=input_schema,
        output_mode=output_mode,
        watermark_delay_ms=watermark_delay_ms,
        event_time_column=event_time_column,
        **options,
    )
