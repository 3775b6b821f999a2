"""Streaming deduplication: emit the first row of each key ever seen, drop the rest.

The state holds one entry per key seen so far (an empty value). Within a batch the first row of a
key in the partition's input order wins, as in Spark's ``StreamingDeduplicateExec``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import conform, max_event_time_ms
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.store.base import StateStore

__all__ = ["Deduplicate"]

#: State value of a deduplication key: no columns are needed, but some codecs want one.
DEDUP_VALUE_SCHEMA = pa.schema([pa.field("seen", pa.bool_())])


class Deduplicate(StatefulOperator):
    """``dropDuplicates(columns)`` without a watermark: every key is remembered forever."""

    kind: ClassVar[str] = "dedup"
    progress_name: ClassVar[str] = "dedupe"
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
        self.input_schema = input_schema
        self.output_schema = input_schema
        self.key_schema = pa.schema(
            [input_schema.field(c).with_nullable(True) for c in self.columns]
        )
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

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        fam = store.column_family()
        seen_value = fam.value_codec.encode_many(
            pa.RecordBatch.from_pylist([{"seen": True}], schema=DEDUP_VALUE_SCHEMA)
        )[0]
        m = ctx.metrics
        for batch in batches:
            if batch.num_rows == 0:
                continue
            m.num_input_rows += batch.num_rows
            if self.event_time is not None:
                m.observe_event_time(max_event_time_ms(batch.column(self.event_time)))
            started = time.perf_counter()
            keys, first_rows = _first_rows(
                fam.key_codec.encode_many(conform(batch, self.key_schema))
            )
            stored = store.get_encoded_many(keys)
            fresh = [i for i, raw in enumerate(stored) if raw is None]
            if fresh:
                store.put_encoded_many([keys[i] for i in fresh], [seen_value] * len(fresh))
            m.num_rows_updated += len(fresh)
            m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
            if fresh:
                out = batch.take(pa.array(first_rows[fresh]))
                m.num_output_rows += out.num_rows
                yield conform(out, self.output_schema)


def _first_rows(keys: list[bytes]) -> tuple[list[bytes], np.ndarray]:
    """The distinct keys in order of first appearance, and the row where each first appears
    (hashed in Arrow: a Python dict over every row costs twice as much)."""
    encoded = pa.array(keys, pa.large_binary()).dictionary_encode()
    _, first_rows = np.unique(encoded.indices.to_numpy(), return_index=True)
    distinct: list[bytes] = encoded.dictionary.to_pylist()
    return distinct, first_rows
