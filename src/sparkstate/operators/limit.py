"""The streaming limit: at most ``limit`` rows over the life of the query, in append mode.

The state is one key holding how many rows were emitted so far, so a query restarted on its
checkpoint goes on counting. Every row reaches one partition (the engine shuffles by a constant
column, :data:`LIMIT_KEY`), and the rows are taken in the order they arrive there, as Spark's
``StreamingGlobalLimitExec`` takes them after its single-partition shuffle.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import conform, event_time_stats
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.operators.spark_state import (
    KEY_NOT_COMPATIBLE,
    VALUE_NOT_COMPATIBLE,
    SparkRows,
    by_position,
    fields_of,
)
from sparkstate.operators.state_views import KeyValueView, StateView
from sparkstate.store.base import DEFAULT_CF, StateStore

__all__ = ["LIMIT_KEY", "StreamingLimit"]

#: The input column every row is shuffled by (always null: one partition gets every row) and the
#: state key's only column, as Spark's limit keeps its count under a single null key.
LIMIT_KEY = "__ss_limit"
#: State value: the number of rows emitted so far.
LIMIT_VALUE_SCHEMA = pa.schema([pa.field("count", pa.int64(), nullable=False)])
_KEY = (None,)


class StreamingLimit(StatefulOperator):
    """``limit(n)`` on a stream in append mode: the first ``limit`` rows the query ever sees."""

    kind: ClassVar[str] = "limit"
    exported_to_spark: ClassVar[bool] = True
    progress_name: ClassVar[str] = "globalLimit"
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append",)
    output_in_state: ClassVar[bool] = False
    unkeyed: ClassVar[str | None] = "is a streaming limit: its state has no keys to look up"

    @classmethod
    def spark_partitioning(
        cls, described: dict[str, Any], store: str, shown_key: list[str]
    ) -> tuple[list[str], list[str]]:
        """Spark's limit runs in one partition: its count is in partition 0."""
        return list(shown_key), []

    @classmethod
    def default_view(cls, described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
        """Spark's limit keeps its count under one null key named ``key``, as ``value``."""
        return KeyValueView(DEFAULT_CF, key, value, key_shape=_null_key, value_shape=_count_value)

    def __init__(
        self, input_schema: pa.Schema, limit: int, *, event_time: str | None = None
    ) -> None:
        """``input_schema`` has the :data:`LIMIT_KEY` column, which the output leaves out;
        ``event_time`` is observed for the watermark when the limit is the query's first step."""
        if LIMIT_KEY not in input_schema.names:
            msg = f"limit: the input has no {LIMIT_KEY!r} column to shuffle by: {input_schema}"
            raise ConfigurationError(msg)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            msg = f"limit: the number of rows must be an int >= 0, got {limit!r}"
            raise ConfigurationError(msg)
        self.limit = limit
        self.input_schema = input_schema
        self.output_schema = pa.schema([f for f in input_schema if f.name != LIMIT_KEY])
        self.key_schema = pa.schema([input_schema.field(LIMIT_KEY).with_nullable(True)])
        self.value_schema = LIMIT_VALUE_SCHEMA
        self.event_time = event_time

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """Spark keeps its count under one null key."""
        by_position(
            fields_of(key), pa.schema([pa.field("key", pa.null())]), KEY_NOT_COMPATIBLE, "key"
        )
        counts = by_position(fields_of(value), self.value_schema, VALUE_NOT_COMPATIBLE, "count")
        keys = pa.table([pa.nulls(len(key), self.key_schema.field(0).type)], schema=self.key_schema)
        return {DEFAULT_CF: (keys, counts)}

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        m = ctx.metrics
        stored = store.get(_KEY)
        before = 0 if stored is None else int(stored[0])
        emitted = before
        for batch in batches:
            if batch.num_rows == 0:
                continue
            started = time.perf_counter()
            m.num_input_rows += batch.num_rows
            if self.event_time is not None:
                m.observe_event_times(event_time_stats(batch.column(self.event_time)))
            take = min(batch.num_rows, self.limit - emitted)
            m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
            if take > 0:
                emitted += take
                yield conform(batch.slice(0, take), self.output_schema)
        if emitted > before:
            store.put(_KEY, (emitted,))
            m.num_rows_updated += 1
            m.num_output_rows += emitted - before


def _null_key(table: pa.Table) -> pa.Table:
    return pa.table({"key": pa.nulls(table.num_rows)})


def _count_value(table: pa.Table) -> pa.Table:
    return table.rename_columns(["value"])
