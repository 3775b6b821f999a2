"""A stateful task: one operator partition of one batch, run from the worker-level provider cache.

:func:`run_task` is the body of the engine's Spark task, :func:`commit_untouched` commits a
partition Spark ran no task for; both go through :func:`run_partition` and end in a
:class:`TaskReport` handed to ``publish`` (the engine writes it where the driver reads it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.runtime.partition import Committed, run_partition
from sparkstate.runtime.providers import PROVIDERS, PartitionKey, StoreSettings
from sparkstate.runtime.records import StoreReport, TaskReport
from sparkstate.store.base import StateStoreProvider

__all__ = ["Attempt", "TaskSpec", "commit_untouched", "run_task"]

log = logging.getLogger("sparkstate.runtime")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything a stateful task of one operator needs for one batch."""

    op_id: int
    operator: StatefulOperator
    batch_id: int
    output_mode: str
    watermark_ms: int
    batch_timestamp_ms: int
    num_partitions: int
    store: StoreSettings
    #: Checkpoint id of version ``batch_id`` per partition (from the previous commit).
    lineage: dict[int, str | None]
    #: Re-deliver the output of a committed batch: run on version ``batch_id``, then abort.
    replay: bool = False
    #: The watermark late input rows are judged by (the previous batch's); None: ``watermark_ms``.
    late_watermark_ms: int | None = None
    #: Which start of the query this batch runs in: each start gets providers of its own.
    run: str = ""
    #: The state home holding version ``batch_id`` per partition (from the previous commit).
    owners: dict[int, str] = dataclasses.field(default_factory=dict)

    def batch_fields(self) -> dict[str, Any]:
        """What changes from batch to batch, as JSON holds it (:meth:`for_batch` reads it back);
        the rest of a spec is fixed for a run of the query."""
        return {
            "batch_id": self.batch_id,
            "watermark_ms": self.watermark_ms,
            "late_watermark_ms": self.late_watermark_ms,
            "batch_timestamp_ms": self.batch_timestamp_ms,
            "lineage": {str(p): c for p, c in self.lineage.items()},
            "replay": self.replay,
            "owners": {str(p): a for p, a in self.owners.items()},
        }

    def for_batch(self, fields: dict[str, Any]) -> TaskSpec:
        """This spec in the batch of ``fields`` (:meth:`batch_fields`)."""
        return dataclasses.replace(
            self,
            batch_id=int(fields["batch_id"]),
            watermark_ms=int(fields["watermark_ms"]),
            late_watermark_ms=fields["late_watermark_ms"],
            batch_timestamp_ms=int(fields["batch_timestamp_ms"]),
            lineage={int(p): c for p, c in fields["lineage"].items()},
            replay=bool(fields["replay"]),
            owners={int(p): a for p, a in fields["owners"].items()},
        )

    def key(self, partition: int) -> PartitionKey:
        return (self.store.state_root, self.op_id, partition)

    def context(self, partition: int) -> BatchContext:
        return BatchContext(
            batch_id=self.batch_id,
            output_mode=self.output_mode,
            partition_id=partition,
            num_partitions=self.num_partitions,
            watermark_ms=self.watermark_ms,
            batch_timestamp_ms=self.batch_timestamp_ms,
            late_watermark_ms=self.late_watermark_ms,
        )

    def provider(self, partition: int) -> StateStoreProvider:
        """The partition's cached provider (the caller holds its lock)."""
        op = self.operator
        return PROVIDERS.provider(
            self.key(partition),
            self.store,
            self.num_partitions,
            op.key_schema,
            op.value_schema,
            op.column_families(),
            widening=op.value_widening,
            run=self.run,
        )


@dataclasses.dataclass(frozen=True)
class Attempt:
    """Which attempt of a task this is (Spark's numbers; -1 outside a Spark task)."""

    number: int = 0
    task_attempt_id: int = -1
    pid: int = dataclasses.field(default_factory=os.getpid)
    #: The address of the state home running the attempt (None: its Python worker).
    home: str | None = None
    #: The state homes the attempt saw (:attr:`~sparkstate.runtime.records.TaskReport.
    #: homes_seen`).
    homes_seen: tuple[tuple[str, str, int], ...] = ()


def run_task(
    spec: TaskSpec,
    partition: int,
    batches: Iterator[pa.RecordBatch],
    publish: Callable[[TaskReport], None],
    attempt: Attempt | None = None,
    before_commit: Callable[[], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The operator's output for one partition; the report is published after the commit
    (``before_commit``: see :func:`run_partition`)."""
    attempt = attempt or Attempt()
    key = spec.key(partition)
    ctx = spec.context(partition)
    started = time.perf_counter()
    done: list[Committed] = []
    with PROVIDERS.holding(key, spec.store.conf.lock_timeout_s):
        yield from run_partition(
            spec.operator,
            spec.provider(partition),
            ctx,
            batches,
            checkpoint_id=spec.lineage.get(partition),
            commit=not spec.replay,
            on_commit=done.append,
            before_commit=before_commit,
        )
    if spec.replay:
        return
    (committed,) = done
    task_ms = (time.perf_counter() - started) * 1000
    publish(_report(spec, partition, ctx, committed, attempt, task_ms))
    PROVIDERS.maintain_later(key, spec.store.maintenance_interval_s)


def commit_untouched(spec: TaskSpec, partition: int) -> TaskReport:
    """Commit version ``b + 1`` of a partition that received no task in batch ``b``.

    An operator with time-driven work (timeouts, timers, TTL: ``time_trigger()``) runs its pass
    over no input first, so its state advances as in a partition that ran; the rows it emits are
    dropped (the sink consumed the batch already, and only a sink that reads part of the output,
    e.g. the console, skips partitions) and counted in ``num_output_rows_dropped``.
    """
    ctx = spec.context(partition)
    timed = spec.operator.time_trigger() is not None
    done: list[Committed] = []
    with PROVIDERS.holding(spec.key(partition), spec.store.conf.lock_timeout_s):
        output = run_partition(
            spec.operator if timed else None,
            spec.provider(partition),
            ctx,
            iter(()),
            checkpoint_id=spec.lineage.get(partition),
            on_commit=done.append,
        )
        dropped = sum(b.num_rows for b in output)
    if dropped:
        log.warning(
            "batch %d: partition %d of operator %d emitted %d row(s) in its timeout pass after "
            "the sink had consumed the batch; dropped",
            spec.batch_id,
            partition,
            spec.op_id,
            dropped,
        )
    (committed,) = done
    return _report(spec, partition, ctx, committed, Attempt(), 0.0, dropped)


def _report(
    spec: TaskSpec,
    partition: int,
    ctx: BatchContext,
    committed: Committed,
    attempt: Attempt,
    task_ms: float,
    dropped: int = 0,
) -> TaskReport:
    return TaskReport(
        op=spec.op_id,
        partition=partition,
        checkpoint_id=committed.checkpoint_id,
        version=committed.version,
        operator=ctx.metrics,
        store=StoreReport.of(
            committed.metrics,
            load_time_ms=committed.load_time_ms,
            commit_time_ms=committed.commit_time_ms,
            task_time_ms=task_ms,
        ),
        attempt=attempt.number,
        task_attempt_id=attempt.task_attempt_id,
        pid=attempt.pid,
        num_output_rows_dropped=dropped,
        home=attempt.home,
        homes_seen=attempt.homes_seen,
    )
