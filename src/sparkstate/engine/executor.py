"""The executor side: one stateful task = one operator partition of one batch.

A task opens its partition's store at version ``b`` on the lineage the driver names, runs the
operator over the partition's Arrow batches, commits ``b + 1`` once the output is consumed and
reports the attempt (checkpoint id, metrics) through an accumulator. Providers are cached per
Python worker process, so a partition that runs in the same worker again starts warm; maintenance
(snapshots, retention) runs on a background thread of the worker after the task is done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import StoreLockedError
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.operators.group_state import GroupStateTimeout
from sparkstate.operators.timers import TimeMode
from sparkstate.store.base import StateStore, StateStoreProvider, StoreConf, StoreId, StoreMetrics
from sparkstate.store.registry import provider_class

__all__ = [
    "ProviderCache",
    "StoreSettings",
    "TaskSpec",
    "commit_empty",
    "needs_every_batch",
    "run_stateful_task",
]

log = logging.getLogger("sparkstate.engine")


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    """Where and how an operator's stores live: shipped to every task."""

    state_root: str
    provider: str
    conf: StoreConf
    maintenance_interval_s: float = 30.0


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


class ProviderCache:
    """One provider per (state root, operator, partition) in this Python process."""

    def __init__(self) -> None:
        self._providers: dict[tuple[str, int, int], StateStoreProvider] = {}
        self._locks: dict[tuple[str, int, int], threading.Lock] = {}
        self._last_maintenance: dict[tuple[str, int, int], float] = {}
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def lock(self, key: tuple[str, int, int]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    @contextlib.contextmanager
    def holding(self, key: tuple[str, int, int], timeout_s: float) -> Iterator[None]:
        """The partition's in-process lock (tasks and maintenance take turns), with a timeout."""
        lock = self.lock(key)
        if not lock.acquire(timeout=timeout_s):
            msg = (
                f"state partition {key[1]}/{key[2]} under {key[0]} stayed busy in Python worker "
                f"{os.getpid()} for {timeout_s:.0f} s (an abandoned task or a slow maintenance); "
                "the task will be retried. Raise stateStore.lock_timeout_s if this is expected."
            )
            raise StoreLockedError(msg)
        try:
            yield
        finally:
            lock.release()

    def provider(self, spec: TaskSpec, partition: int) -> StateStoreProvider:
        """The cached provider of a partition (caller holds ``lock(key)``)."""
        key = (spec.store.state_root, spec.op_id, partition)
        found = self._providers.get(key)
        if found is not None:
            return found
        op = spec.operator
        provider = provider_class(spec.store.provider)()
        conf = dataclasses.replace(spec.store.conf, num_partitions=spec.num_partitions)
        provider.init(
            StoreId(spec.store.state_root, spec.op_id, partition),
            op.key_schema,
            op.value_schema,
            conf,
            op.column_families() or None,
        )
        self._providers[key] = provider
        return provider

    def maintain_later(self, spec: TaskSpec, partition: int) -> None:
        """Run ``do_maintenance`` for the partition on a background thread, at most every
        ``maintenance_interval_s`` seconds."""
        key = (spec.store.state_root, spec.op_id, partition)
        now = time.monotonic()
        last = self._last_maintenance.get(key)
        if last is not None and now - last < spec.store.maintenance_interval_s:
            return
        self._last_maintenance[key] = now
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="sparkstate-maintenance")
            pool = self._pool
        pool.submit(self._maintain, key)

    def _maintain(self, key: tuple[str, int, int]) -> None:
        with self.lock(key):
            provider = self._providers.get(key)
            if provider is None:
                return
            try:
                provider.do_maintenance()
            except Exception:  # maintenance is retried next time; a batch never fails for it
                log.exception("state store maintenance failed for %s", key)

    def close_all(self) -> None:
        with self._guard:
            keys = list(self._providers)
        for key in keys:
            with self.lock(key):
                provider = self._providers.pop(key, None)
                if provider is not None:
                    provider.close()


#: The process-wide cache (one per Python worker process).
PROVIDERS = ProviderCache()


def _task_identity() -> tuple[int, dict[str, Any]]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:  # called outside Spark (tests): partition 0
        return 0, {"attempt": 0, "task_attempt_id": -1, "pid": os.getpid()}
    return tc.partitionId(), {
        "attempt": tc.attemptNumber(),
        "task_attempt_id": tc.taskAttemptId(),
        "pid": os.getpid(),
    }


def run_stateful_task(
    spec: TaskSpec, batches: Iterator[pa.RecordBatch], report: Any
) -> Iterator[pa.RecordBatch]:
    """The body of the ``mapInArrow`` function of one operator for one batch."""
    partition, attempt = _task_identity()
    key = (spec.store.state_root, spec.op_id, partition)
    ctx = BatchContext(
        batch_id=spec.batch_id,
        output_mode=spec.output_mode,
        partition_id=partition,
        num_partitions=spec.num_partitions,
        watermark_ms=spec.watermark_ms,
        batch_timestamp_ms=spec.batch_timestamp_ms,
    )
    started = time.perf_counter()
    with PROVIDERS.holding(key, spec.store.conf.lock_timeout_s):
        provider = PROVIDERS.provider(spec, partition)
        load_started = time.perf_counter()
        store = provider.get_store(spec.batch_id, spec.lineage.get(partition))
        load_ms = (time.perf_counter() - load_started) * 1000
        if spec.replay:
            try:
                yield from spec.operator.process(store, batches, ctx)
            finally:
                store.abort()  # the batch's state was committed long ago: change nothing
            return
        try:
            yield from spec.operator.process(store, batches, ctx)
            metrics = store.metrics()
            commit_started = time.perf_counter()
            store.commit()
            commit_ms = (time.perf_counter() - commit_started) * 1000
        except BaseException:
            store.abort()
            raise
        metrics = _after_commit(store, metrics)
    report.add(
        [
            {
                "op": spec.op_id,
                "partition": partition,
                "checkpoint_id": store.checkpoint_id,
                "version": spec.batch_id + 1,
                **attempt,
                "operator": ctx.metrics.to_dict(),
                "store": {
                    "num_keys": metrics.num_keys,
                    "memory_used_bytes": metrics.memory_used_bytes,
                    "custom": dict(metrics.custom),
                    "load_time_ms": load_ms,
                    "commit_time_ms": commit_ms,
                    "task_time_ms": (time.perf_counter() - started) * 1000,
                },
            }
        ]
    )
    PROVIDERS.maintain_later(spec, partition)


def _after_commit(store: StateStore, before: StoreMetrics) -> StoreMetrics:
    """Metrics read after the commit (some are only known then), else those read before."""
    try:
        return store.metrics()
    except Exception:  # a provider may refuse reads after commit
        return before


def needs_every_batch(operator: StatefulOperator) -> bool:
    """Whether the operator has time-driven work (timeouts, timers, TTL) in every batch."""
    timing = getattr(operator, "timeout", None) or getattr(operator, "time_mode", None)
    return timing not in (None, GroupStateTimeout.NoTimeout, TimeMode.NONE)


def commit_empty(spec: TaskSpec, partition: int) -> dict[str, Any]:
    """Commit version ``b + 1`` of a partition that received no task in batch ``b``.

    An operator with timeouts, timers or TTL runs its pass over no input first, so its state
    advances as in a partition that ran; the rows it emits are dropped (the sink consumed the
    batch already, and only a sink that reads part of the output, e.g. the console, skips
    partitions) and counted in ``operator.num_output_rows_dropped``.
    """
    key = (spec.store.state_root, spec.op_id, partition)
    ctx = BatchContext(
        batch_id=spec.batch_id,
        output_mode=spec.output_mode,
        partition_id=partition,
        num_partitions=spec.num_partitions,
        watermark_ms=spec.watermark_ms,
        batch_timestamp_ms=spec.batch_timestamp_ms,
    )
    operator_report: dict[str, Any] = {}
    with PROVIDERS.holding(key, spec.store.conf.lock_timeout_s):
        provider = PROVIDERS.provider(spec, partition)
        store = provider.get_store(spec.batch_id, spec.lineage.get(partition))
        try:
            if needs_every_batch(spec.operator):
                dropped = sum(b.num_rows for b in spec.operator.process(store, iter(()), ctx))
                operator_report = ctx.metrics.to_dict()
                operator_report["num_output_rows_dropped"] = dropped
                if dropped:
                    log.warning(
                        "batch %d: partition %d of operator %d emitted %d row(s) in its "
                        "timeout pass after the sink had consumed the batch; dropped",
                        spec.batch_id,
                        partition,
                        spec.op_id,
                        dropped,
                    )
            metrics = store.metrics()
            store.commit()
        except BaseException:
            store.abort()
            raise
        metrics = _after_commit(store, metrics)
    return {
        "op": spec.op_id,
        "partition": partition,
        "checkpoint_id": store.checkpoint_id,
        "version": spec.batch_id + 1,
        "attempt": 0,
        "task_attempt_id": -1,
        "pid": os.getpid(),
        "operator": operator_report,
        "store": {
            "num_keys": metrics.num_keys,
            "memory_used_bytes": metrics.memory_used_bytes,
            "custom": dict(metrics.custom),
            "load_time_ms": 0,
            "commit_time_ms": 0,
            "task_time_ms": 0,
        },
    }
