"""Streaming deduplication: emit the first row of each key, drop the rest.

Within a batch the first row of a key in the partition's input order wins, as in Spark's
``StreamingDeduplicateExec``. With a watermark, rows at or below the previous batch's watermark
are late and dropped first (Spark's rule), and state is evicted after the batch's input:

* ``dropDuplicates(cols)``: a key is remembered until the watermark passes its event time, when
  the event-time column is among ``cols`` (it leads the state key, so the expired keys are one
  range scan from the start of the key space); forever otherwise.
* ``dropDuplicatesWithinWatermark(cols)``: a key is remembered until the watermark reaches its
  first row's event time plus the watermark's delay (Spark's ``expiresAtMicros``), found by a
  range scan of an ``(expiry, key)`` index.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import conform, event_time_stats, is_late, to_epoch_micros
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
from sparkstate.operators.ts_index import MARKER_SCHEMA, TimestampIndex, index_key_schema
from sparkstate.store.base import DEFAULT_CF, StateStore

__all__ = ["Deduplicate", "DeduplicateWithinWatermark"]

#: State value of a deduplication key: no columns are needed, but some codecs want one.
DEDUP_VALUE_SCHEMA = pa.schema([pa.field("seen", pa.bool_())])
#: State value of ``dropDuplicatesWithinWatermark``: when the key may be seen again (Spark's).
EXPIRY_VALUE_SCHEMA = pa.schema([pa.field("expiresAtMicros", pa.int64(), nullable=False)])
#: Spark's custom metric of a deduplication: the rows dropped as duplicates (not as late).
DROPPED_DUPLICATES = "numDroppedDuplicateRows"
#: The ``(expiresAtMicros, key)`` index of ``dropDuplicatesWithinWatermark``.
EXPIRY_CF = "$expires"


class Deduplicate(StatefulOperator):
    """``dropDuplicates(columns)``; with ``event_time`` among them, keys expire by watermark."""

    kind: ClassVar[str] = "dedup"
    exported_to_spark: ClassVar[bool] = True
    renames_keep_state: ClassVar[bool] = True
    nested_keys: ClassVar[bool] = True
    progress_name: ClassVar[str] = "dedupe"
    spark_plain_store: ClassVar[bool] = True
    output_in_state: ClassVar[bool] = False
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append", "update")

    def __init__(
        self,
        input_schema: pa.Schema,
        columns: list[str],
        *,
        event_time: str | None = None,
        no_data_batches: bool = False,
    ) -> None:
        missing = [c for c in columns if c not in input_schema.names]
        if missing:
            msg = f"dropDuplicates: no column(s) {missing} in {input_schema.names}"
            raise ConfigurationError(msg)
        if not columns:
            columns = list(input_schema.names)
        self.columns = list(columns)
        #: Whether keys expire: the event-time column is one of them, and leads the state key.
        self.expires = event_time is not None and event_time in self.columns
        key_order = self.columns
        if event_time is not None and self.expires:
            key_order = [event_time, *[c for c in self.columns if c != event_time]]
        self.input_schema = input_schema
        self.output_schema = input_schema
        self.key_schema = pa.schema([input_schema.field(c).with_nullable(True) for c in key_order])
        self.value_schema = DEDUP_VALUE_SCHEMA
        self.event_time = event_time
        #: Whether a watermark move asks for a batch (Spark's ``StreamingDeduplicateExec`` does
        #: whenever the query has a watermark).
        self.no_data_batches = no_data_batches

    def time_trigger(self) -> str | None:
        return "event" if self.no_data_batches else None

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["columns"] = self.columns
        return out

    # --- its state, as the reader shows it -------------------------------------------------------

    def spark_partitioned(self) -> bool:
        """Spark hashes the deduplicated columns in the order given, as the engine does."""
        return True

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """Spark keeps the deduplicated columns, in the order given, and no value."""
        keys = by_name(fields_of(key), self.key_schema, KEY_NOT_COMPATIBLE, "column")
        seen = pa.table([pa.repeat(True, keys.num_rows)], schema=self.value_schema)
        return {DEFAULT_CF: (keys, seen)}

    @classmethod
    def default_view(cls, described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
        """Spark's deduplication state: the keys in the query's order, ``__dummy__`` null."""
        order = _key_order(described)
        return KeyValueView(DEFAULT_CF, key, value, key_shape=order, value_shape=_empty_value)

    @classmethod
    def shown_key(cls, described: dict[str, Any], key_schema: pa.Schema) -> list[tuple[str, str]]:
        """The keys in the order the query gave its columns."""
        columns = described.get("columns") or []
        if sorted(columns) == sorted(key_schema.names):
            return [(c, c) for c in columns]
        return super().shown_key(described, key_schema)

    @classmethod
    def shuffle_columns(cls, described: dict[str, Any], key_schema: pa.Schema) -> list[str]:
        """The query's columns, in its order."""
        return list(described.get("columns") or key_schema.names)

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        fam = store.column_family()
        m = ctx.metrics
        m.custom.setdefault(DROPPED_DUPLICATES, 0)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            m.num_input_rows += batch.num_rows
            started = time.perf_counter()
            batch = self._drop_late(batch, ctx)
            if batch.num_rows == 0:
                continue
            keys, first_rows = _first_rows(
                fam.key_codec.encode_many(conform(batch, self.key_schema))
            )
            stored = store.get_encoded_many(keys)
            fresh = np.flatnonzero(np.fromiter((raw is None for raw in stored), bool, len(keys)))
            if len(fresh):
                rows = batch.take(pa.array(first_rows[fresh]))
                self._remember(store, [keys[i] for i in fresh], rows)
                m.num_rows_updated += len(fresh)
            m.custom[DROPPED_DUPLICATES] += batch.num_rows - len(fresh)
            m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
            if len(fresh):
                m.num_output_rows += rows.num_rows
                yield conform(rows, self.output_schema)
        started = time.perf_counter()
        self._evict(store, ctx)
        m.all_removals_time_ms += int((time.perf_counter() - started) * 1000)

    def _drop_late(self, batch: pa.RecordBatch, ctx: BatchContext) -> pa.RecordBatch:
        """The batch without its late rows (counted); the event time observed first, as Spark's
        watermark sees every input row."""
        if self.event_time is None:
            return batch
        times = batch.column(self.event_time)
        ctx.metrics.observe_event_times(event_time_stats(times))
        late = is_late(times, ctx.watermark_for_late_rows_ms)
        dropped = pc.sum(late).as_py() or 0
        if not dropped:
            return batch
        ctx.metrics.num_rows_dropped_by_watermark += dropped
        return batch.filter(pc.invert(late))

    def _remember(self, store: StateStore, keys: list[bytes], rows: pa.RecordBatch) -> None:
        seen = store.column_family().value_codec.encode((True,))
        store.put_encoded_many(keys, [seen] * len(keys))

    def _evict(self, store: StateStore, ctx: BatchContext) -> None:
        """Remove the keys whose event time is at or below the watermark: the keys from the start
        of the key space up to it (null event times, marker 0x00, never expire)."""
        if not self.expires:
            return
        end = store.column_family().key_codec.encode_prefix((ctx.watermark_ms * 1000 + 1,))
        ctx.metrics.num_rows_removed += store.remove_range(b"\x01", end)  # one range deletion


class DeduplicateWithinWatermark(Deduplicate):
    """``dropDuplicatesWithinWatermark(columns)``: a key's first row is emitted and the key
    remembered until the watermark reaches that row's event time plus ``delay_ms``."""

    kind: ClassVar[str] = "dedup_within_watermark"
    progress_name: ClassVar[str] = "dedupeWithinWatermark"
    rows_are_keys: ClassVar[bool] = False

    def __init__(
        self,
        input_schema: pa.Schema,
        columns: list[str],
        *,
        event_time: str,
        delay_ms: int,
        no_data_batches: bool = True,
    ) -> None:
        super().__init__(
            input_schema, columns, event_time=event_time, no_data_batches=no_data_batches
        )
        self.expires = False  # by the expiry index, not by the key
        self.key_schema = pa.schema(
            [input_schema.field(c).with_nullable(True) for c in self.columns]
        )
        self.value_schema = EXPIRY_VALUE_SCHEMA
        self.delay_ms = delay_ms

    def column_families(self) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        return {EXPIRY_CF: (index_key_schema(self.key_schema, "expires_us"), MARKER_SCHEMA)}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["delay_ms"] = self.delay_ms
        return out

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """Spark keeps the deduplicated columns and each key's ``expiresAtMicros``; the expiry
        index beside them is made from those."""
        keys = by_name(fields_of(key), self.key_schema, KEY_NOT_COMPATIBLE, "column")
        expiry = by_position(fields_of(value), self.value_schema, VALUE_NOT_COMPATIBLE, "value")
        index_schema, marker_schema = self.column_families()[EXPIRY_CF]
        index = pa.table([expiry.column(0), *keys.columns], schema=index_schema)
        markers = pa.table([pa.repeat(True, keys.num_rows)], schema=marker_schema)
        return {DEFAULT_CF: (keys, expiry), EXPIRY_CF: (index, markers)}

    @classmethod
    def default_view(cls, described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
        """The keys in the query's order, each with its expiry."""
        return KeyValueView(DEFAULT_CF, key, value, key_shape=_key_order(described))

    @classmethod
    def rows_in_state(cls, store: StateStore) -> int:
        """The keys, as Spark counts them: each has one entry in the expiry index beside it."""
        return max(0, store.total_keys()) // 2

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        yield from super().process(store, batches, ctx)
        m = ctx.metrics
        m.num_rows_total = (m.num_rows_total or 0) + self.rows_in_state(store)

    def _remember(self, store: StateStore, keys: list[bytes], rows: pa.RecordBatch) -> None:
        """Each key's expiry: its row's event time plus the delay (a null time counts as 0, as
        Spark reads it)."""
        assert self.event_time is not None
        micros = pc.fill_null(to_epoch_micros(rows.column(self.event_time)), 0)
        expires = pc.add(micros.cast(pa.int64()), self.delay_ms * 1000)
        values = store.column_family().value_codec.encode_many(
            pa.RecordBatch.from_arrays([expires], schema=EXPIRY_VALUE_SCHEMA)
        )
        store.put_encoded_many(keys, values)
        index = TimestampIndex(EXPIRY_CF)
        index.add_many(keys, expires.to_pylist())
        index.flush(store)

    def _evict(self, store: StateStore, ctx: BatchContext) -> None:
        """Remove the keys whose expiry is at or below the watermark (Spark's
        ``watermark >= expiresAtMicros``)."""
        index = TimestampIndex(EXPIRY_CF)
        up_to = ctx.watermark_ms * 1000
        due = index.due_keys(store, up_to)
        if due:
            store.remove_encoded_many(due)
            index.remove_due(store, up_to)  # the index's entries: one range deletion
            ctx.metrics.num_rows_removed += len(due)
        else:
            index.removed_due(store, up_to)


def _first_rows(keys: list[bytes]) -> tuple[list[bytes], np.ndarray]:
    """The distinct keys in order of first appearance, and the row where each first appears
    (hashed in Arrow: a Python dict over every row costs twice as much)."""
    encoded = pa.array(keys, pa.large_binary()).dictionary_encode()
    _, first_rows = np.unique(encoded.indices.to_numpy(), return_index=True)
    distinct: list[bytes] = encoded.dictionary.to_pylist()
    return distinct, first_rows


def _key_order(described: dict[str, Any]) -> Callable[[pa.Table], pa.Table]:
    """Deduplication keys in the order the query gave its columns (ours lead with the event
    time, for eviction by range scans; Spark's keep the order given)."""
    columns = described.get("columns") or []

    def in_order(table: pa.Table) -> pa.Table:
        if sorted(columns) != sorted(table.schema.names):
            return table
        return table.select(columns)

    return in_order


def _empty_value(table: pa.Table) -> pa.Table:
    """Spark's deduplication value: ``__dummy__``, null."""
    return pa.table({"__dummy__": pa.nulls(table.num_rows)})
