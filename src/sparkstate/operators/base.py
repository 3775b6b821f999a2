"""The operator interface: a stateful step over Arrow record batches and one partition's store.

The engine owns the store's life cycle (load version ``b``, commit ``b + 1`` or abort); an operator
only reads and writes the store while it turns input batches into output batches. Operators do not
depend on pyspark, so they can be tested, and reused, without a Spark session.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.store.base import StateStore

__all__ = [
    "OUTPUT_MODES",
    "BatchContext",
    "OperatorMetrics",
    "StatefulOperator",
    "schema_to_json",
]

#: The output modes of Structured Streaming.
OUTPUT_MODES = ("append", "update", "complete")


@dataclasses.dataclass
class OperatorMetrics:
    """What one operator did on one partition in one batch (the engine sums the partitions)."""

    num_input_rows: int = 0
    num_output_rows: int = 0
    num_rows_updated: int = 0
    num_rows_removed: int = 0
    num_rows_dropped_by_watermark: int = 0
    all_updates_time_ms: int = 0
    all_removals_time_ms: int = 0
    #: Largest event time seen in the input, in epoch milliseconds (None: no event time / no rows).
    max_event_time_ms: int | None = None
    #: Earliest processing-time timeout or timer left after the batch (None: none pending).
    next_timer_ms: int | None = None

    def observe_event_time(self, millis: int | None) -> None:
        if millis is not None and (
            self.max_event_time_ms is None or millis > self.max_event_time_ms
        ):
            self.max_event_time_ms = millis

    def observe_timer(self, millis: int | None) -> None:
        if millis is not None and (self.next_timer_ms is None or millis < self.next_timer_ms):
            self.next_timer_ms = millis

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OperatorMetrics:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def merge(self, other: OperatorMetrics) -> None:
        """Add ``other`` (another partition's metrics) into this one."""
        for field in dataclasses.fields(self):
            if field.name == "max_event_time_ms":
                self.observe_event_time(other.max_event_time_ms)
            elif field.name == "next_timer_ms":
                self.observe_timer(other.next_timer_ms)
            else:
                setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


@dataclasses.dataclass
class BatchContext:
    """Everything an operator may know about the batch it runs in.

    ``watermark_ms`` is the event-time watermark in force for this batch (chosen before the batch
    started, Spark's rule), 0 when there is none yet. ``metrics`` is filled in by the operator.
    """

    batch_id: int
    output_mode: str
    partition_id: int = 0
    num_partitions: int = 1
    watermark_ms: int = 0
    batch_timestamp_ms: int = 0
    metrics: OperatorMetrics = dataclasses.field(default_factory=OperatorMetrics)

    def __post_init__(self) -> None:
        if self.output_mode not in OUTPUT_MODES:
            msg = f"output mode must be one of {OUTPUT_MODES}, got {self.output_mode!r}"
            raise ConfigurationError(msg)


class StatefulOperator(ABC):
    """One stateful step of a query: keyed state in a store, Arrow batches in and out.

    Subclasses set the four schemas in their constructor. The engine shuffles the input by the
    columns of ``key_schema`` (so every row of a key reaches the same partition and store), calls
    ``process`` once per partition and batch, and commits the store when the output is consumed.
    """

    #: Short name recorded in the checkpoint's ``metadata.json``.
    kind: ClassVar[str]
    #: ``operatorName`` in Spark's ``stateOperators`` progress.
    progress_name: ClassVar[str]
    #: Output modes this operator supports.
    supported_output_modes: ClassVar[tuple[str, ...]]

    input_schema: pa.Schema
    key_schema: pa.Schema
    value_schema: pa.Schema
    output_schema: pa.Schema

    @property
    def key_columns(self) -> list[str]:
        return list(self.key_schema.names)

    def column_families(self) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        """Extra named keyspaces beside the default one (key schema, value schema)."""
        return {}

    def time_trigger(self) -> str | None:
        """What makes this operator need a batch without new data (Spark's
        ``shouldRunAnotherBatch``): ``"event"`` (a watermark move, for event-time timeouts and
        timers), ``"processing"`` (a processing-time timeout or timer came due, reported in
        :attr:`OperatorMetrics.next_timer_ms`), or None."""
        return None

    def describe(self) -> dict[str, Any]:
        """What must not change across restarts of a checkpoint (compared as JSON)."""
        return {
            "kind": self.kind,
            "key_schema": schema_to_json(self.key_schema),
            "value_schema": schema_to_json(self.value_schema),
            "output_schema": schema_to_json(self.output_schema),
        }

    def check_output_mode(self, mode: str) -> None:
        if mode not in self.supported_output_modes:
            msg = (
                f"{self.kind} does not support output mode {mode!r}; "
                f"use one of {list(self.supported_output_modes)}"
            )
            raise ConfigurationError(msg)

    @abstractmethod
    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        """Consume one partition's input of one batch, update ``store``, yield the output.

        Batches yielded follow ``output_schema`` exactly. Metrics go into ``ctx.metrics``.
        """


def schema_to_json(schema: pa.Schema) -> list[dict[str, Any]]:
    """A JSON form of a schema for ``metadata.json`` (names, types; nullability is not compared)."""
    return [{"name": f.name, "type": str(f.type)} for f in schema]
