"""The operator interface: a stateful step over Arrow record batches and one partition's store.

The engine owns the store's life cycle (load version ``b``, commit ``b + 1`` or abort); an operator
only reads and writes the store while it turns input batches into output batches. Operators do not
depend on pyspark, so they can be tested, and reused, without a Spark session.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.spark_state import SparkRows
from sparkstate.operators.state_layout import StateLayout
from sparkstate.store.base import StateStore
from sparkstate.store.schema_json import schema_to_json

if TYPE_CHECKING:
    from sparkstate.operators._arrow import EventTimeStats

__all__ = [
    "OUTPUT_MODES",
    "BatchContext",
    "OperatorMetrics",
    "Phase",
    "StatefulOperator",
    "timed_phase",
]

T = TypeVar("T")

#: The output modes of Structured Streaming.
OUTPUT_MODES = ("append", "update", "complete")


class Phase:
    """Names of the phases of a task in :attr:`OperatorMetrics.phase_ms`, as they appear in
    the progress's ``customMetrics`` (milliseconds, summed over partitions)."""

    #: Taking the partition's input from Spark (shuffle read, Arrow batches in).
    INPUT_READ = "inputReadTimeMs"
    #: Sorting the input by key, encoding keys, converting rows for the user's function.
    GROUPING = "groupingTimeMs"
    #: Reading and decoding the states of the batch's keys.
    STATE_READ = "stateReadTimeMs"
    #: The user's function (or processor) over the input groups, state calls and output included.
    USER_FUNCTION = "userFunctionTimeMs"
    #: Encoding the changed states and writing them into the store's batch.
    STATE_WRITE = "stateWriteTimeMs"
    #: Finding timed-out keys and calling the function for them (GroupState timeouts).
    TIMEOUTS = "timeoutProcessingTimeMs"
    #: Finding expired timers and calling ``handleExpiredTimer`` (Spark's name).
    TIMERS = "timerProcessingTimeMs"
    #: Applying the initial state (Spark's name).
    INITIAL_STATE = "initialStateProcessingTimeMs"
    #: Removing state whose TTL expired.
    TTL_EVICTION = "ttlEvictionTimeMs"


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
    #: Earliest event time seen in the input, and the sum and count of the input's event times
    #: (Spark's ``eventTime`` ``min`` and ``avg`` in the progress).
    min_event_time_ms: int | None = None
    event_time_sum_ms: float = 0.0
    event_time_count: int = 0
    #: Earliest processing-time timeout or timer left after the batch (None: none pending).
    next_timer_ms: int | None = None
    #: Per named input of an operator with several (a join's sides): its largest event time.
    max_event_time_by_input: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Rows in state after the batch, where the operator counts them itself (a join keeps many
    #: rows under one key); None: the store's key count is the row count.
    num_rows_total: int | None = None
    #: Wall time of the operator's phases in milliseconds, by progress name (``groupingTimeMs``,
    #: ``userFunctionTimeMs``, ...): where a task's time went, shown in ``customMetrics``.
    phase_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Counts of the operator's own in ``customMetrics``, summed over partitions.
    custom: dict[str, float] = dataclasses.field(default_factory=dict)

    def observe_event_time(self, millis: int | None) -> None:
        if millis is not None and (
            self.max_event_time_ms is None or millis > self.max_event_time_ms
        ):
            self.max_event_time_ms = millis

    def observe_event_times(self, stats: EventTimeStats | None) -> None:
        """The event times of input rows: their largest, earliest, sum and count."""
        if stats is None:
            return
        self.observe_event_time(stats.max_ms)
        self._observe_min_event_time(stats.min_ms)
        self.event_time_sum_ms += stats.sum_ms
        self.event_time_count += stats.count

    def _observe_min_event_time(self, millis: int | None) -> None:
        if millis is not None and (
            self.min_event_time_ms is None or millis < self.min_event_time_ms
        ):
            self.min_event_time_ms = millis

    def observe_input_event_time(self, name: str, millis: int | None) -> None:
        """The largest event time of input ``name`` (and of the whole input)."""
        if millis is None:
            return
        self.observe_event_time(millis)
        old = self.max_event_time_by_input.get(name)
        if old is None or millis > old:
            self.max_event_time_by_input[name] = millis

    def observe_timer(self, millis: int | None) -> None:
        if millis is not None and (self.next_timer_ms is None or millis < self.next_timer_ms):
            self.next_timer_ms = millis

    def add_phase(self, name: str, started: float) -> float:
        """Add the time since ``started`` (a ``time.perf_counter()``) to phase ``name``; now."""
        now = time.perf_counter()
        self.phase_ms[name] = self.phase_ms.get(name, 0.0) + (now - started) * 1000
        return now

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OperatorMetrics:
        names = {f.name for f in dataclasses.fields(cls)}
        out = cls(**{k: v for k, v in data.items() if k in names})
        out.phase_ms = dict(out.phase_ms)  # never shared with ``data``
        out.max_event_time_by_input = dict(out.max_event_time_by_input)
        out.custom = dict(out.custom)
        return out

    def merge(self, other: OperatorMetrics) -> None:
        """Add ``other`` (another partition's metrics) into this one."""
        for field in dataclasses.fields(self):
            if field.name == "max_event_time_ms":
                self.observe_event_time(other.max_event_time_ms)
            elif field.name == "min_event_time_ms":
                self._observe_min_event_time(other.min_event_time_ms)
            elif field.name == "next_timer_ms":
                self.observe_timer(other.next_timer_ms)
            elif field.name == "max_event_time_by_input":
                for name, at in other.max_event_time_by_input.items():
                    self.observe_input_event_time(name, at)
            elif field.name == "num_rows_total":
                if other.num_rows_total is not None:
                    self.num_rows_total = (self.num_rows_total or 0) + other.num_rows_total
            elif field.name == "phase_ms":
                for name, ms in other.phase_ms.items():
                    self.phase_ms[name] = self.phase_ms.get(name, 0.0) + ms
            elif field.name == "custom":
                for name, value in other.custom.items():
                    self.custom[name] = self.custom.get(name, 0.0) + value
            else:
                setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


@dataclasses.dataclass
class BatchContext:
    """Everything an operator may know about the batch it runs in.

    ``watermark_ms`` is the event-time watermark in force for this batch (chosen before the batch
    started, Spark's rule), 0 when there is none yet: state is evicted by it. Input rows are late
    by ``late_watermark_ms``, the previous batch's watermark (Spark's watermark for late events;
    None means ``watermark_ms``). ``metrics`` is filled in by the operator.
    """

    batch_id: int
    output_mode: str
    partition_id: int = 0
    num_partitions: int = 1
    watermark_ms: int = 0
    batch_timestamp_ms: int = 0
    metrics: OperatorMetrics = dataclasses.field(default_factory=OperatorMetrics)
    late_watermark_ms: int | None = None

    @property
    def watermark_for_late_rows_ms(self) -> int:
        return self.watermark_ms if self.late_watermark_ms is None else self.late_watermark_ms

    def __post_init__(self) -> None:
        if self.output_mode not in OUTPUT_MODES:
            msg = f"output mode must be one of {OUTPUT_MODES}, got {self.output_mode!r}"
            raise ConfigurationError(msg)


class StatefulOperator(StateLayout, ABC):
    """One stateful step of a query: keyed state in a store, Arrow batches in and out.

    Subclasses set the four schemas in their constructor. The engine shuffles the input by the
    columns of ``key_schema`` (so every row of a key reaches the same partition and store), calls
    ``process`` once per partition and batch, and commits the store when the output is consumed.
    How its stored state is read back without running it (the reader's views, the columns it is
    shuffled by, ...) the class answers from its ``describe()`` (:class:`StateLayout`).
    """

    #: Short name recorded in the checkpoint's ``metadata.json``.
    kind: ClassVar[str]
    #: ``operatorName`` in Spark's ``stateOperators`` progress.
    progress_name: ClassVar[str]
    #: Output modes this operator supports.
    supported_output_modes: ClassVar[tuple[str, ...]]
    #: Whether the output's schema is part of the state: False where the output rows are the
    #: input rows passed through and the state keeps none of their columns (deduplication,
    #: limit), so a source column added between runs is accepted, as Spark accepts it.
    output_in_state: ClassVar[bool] = True
    #: Whether the operator is a streaming aggregation (``groupBy().agg()``), which Spark's
    #: rules for output modes and for chaining stateful steps name.
    is_aggregation: ClassVar[bool] = False
    #: How Spark's streaming checks name the operation where they refuse an output mode of the
    #: operator as an ``UnsupportedOperation`` (None: the operator's own error stands).
    spark_operation: ClassVar[str | None] = None
    #: Whether the state may be keyed by lists and structs, which the key codec keeps equal by
    #: their bytes but does not order by value: True where keys are only looked up (grouping
    #: keys, deduplicated columns), never scanned in the order of such a column.
    nested_keys: ClassVar[bool] = False
    #: Whether the operator calls the user's own functions (which may ask Spark's
    #: ``TaskContext`` where they run): such a step runs in Spark's tasks only.
    calls_user_code: ClassVar[bool] = False
    #: Whether Spark's own operator of this kind keeps its state in one store of whole-row keys
    #: (no prefix key, no column families), whose RocksDB checkpoint files a take-over reads
    #: itself (:mod:`sparkstate.store.rocksdb.spark_checkpoint`) rather than through Spark's
    #: state data source.
    spark_plain_store: ClassVar[bool] = False

    input_schema: pa.Schema
    key_schema: pa.Schema
    value_schema: pa.Schema
    output_schema: pa.Schema

    @property
    def operator_name(self) -> str:
        """``operatorName`` of this operator's line in the progress (``progress_name``)."""
        return self.progress_name

    @property
    def key_columns(self) -> list[str]:
        return list(self.key_schema.names)

    def column_families(self) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        """Extra named keyspaces beside the default one (key schema, value schema)."""
        return {}

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """This operator's state from Spark's own (the ``key`` and ``value`` of Spark's state
        data source, for a query that ran with Spark's operator): per column family, its keys and
        values. Raises :class:`SchemaMismatchError` with Spark's condition where the rows are not
        the state of this query; an operator that cannot take Spark's state over says so."""
        msg = (
            f"taking over the state Spark's own {self.progress_name} operator wrote is not "
            f"supported for sparkstate's {self.kind} yet: run the query from a new checkpoint "
            "location"
        )
        raise ConfigurationError(msg)

    def spark_reads(self) -> dict[str, dict[str, str]] | None:
        """The reads of Spark's state data source a take-over of this operator makes, by name
        (each its reader options), where it is not one read of the operator's state: their
        rows reach :meth:`from_spark_state` in one ``value`` struct, a field per read and the
        name of the read a row is of
        (:data:`~sparkstate.operators.spark_state.READ`)."""
        return None

    def spark_partitioned(self) -> bool:
        """Whether the engine's shuffle sends each key to the partition Spark's own operator of
        the same query keeps it in (the same columns, in the same order), so that a take-over
        writes each partition of Spark's state where it was read."""
        return False

    @property
    def value_widening(self) -> bool:
        """Whether this operator's stores may widen a value field's type across restarts
        (:attr:`sparkstate.store.conf.StoreConf.value_widening`)."""
        return False

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


def timed_phase(items: Iterator[T], metrics: OperatorMetrics, name: str) -> Iterator[T]:
    """``items``, with the time spent producing them (not in their consumer) added to phase
    ``name`` of ``metrics``."""
    started = time.perf_counter()
    for item in items:
        metrics.add_phase(name, started)
        yield item
        started = time.perf_counter()
    metrics.add_phase(name, started)
