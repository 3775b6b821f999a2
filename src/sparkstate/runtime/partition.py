"""One partition of one batch: open version ``b`` -> run the operator -> commit ``b + 1`` or abort.

This is the single place where a store version is opened, handed to an operator and ended; the
Spark task, the catch-up commit of a partition Spark ran no task for, and the Spark-free harness
all run through :func:`run_partition`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import pyarrow as pa

from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.store.base import StateStore, StateStoreProvider, StoreMetrics

__all__ = ["Committed", "run_partition"]


@dataclasses.dataclass(frozen=True)
class Committed:
    """What :func:`run_partition` committed: the new version, its checkpoint id, the store's
    metrics after the commit, and how long loading and committing took."""

    version: int
    checkpoint_id: str | None
    metrics: StoreMetrics
    load_time_ms: float
    commit_time_ms: float


def run_partition(
    operator: StatefulOperator | None,
    provider: StateStoreProvider,
    ctx: BatchContext,
    batches: Iterator[pa.RecordBatch],
    *,
    checkpoint_id: str | None = None,
    commit: bool = True,
    on_commit: Callable[[Committed], None] | None = None,
    before_commit: Callable[[], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The operator's output for one partition of batch ``ctx.batch_id``.

    The store opens at version ``ctx.batch_id`` on the lineage of ``checkpoint_id`` (None: the
    newest). Once the output is consumed, version ``batch_id + 1`` is committed and ``on_commit``
    told (``before_commit`` is called first, once the output is complete: a state home
    waits there until its worker handed the output to Spark); ``commit=False`` aborts
    instead (a replay of a committed batch changes nothing). Any failure, the consumer's
    included, aborts. ``operator=None`` commits the version unchanged.
    """
    load_started = time.perf_counter()
    store = provider.get_store(ctx.batch_id, checkpoint_id)
    load_ms = (time.perf_counter() - load_started) * 1000
    output = operator.process(store, batches, ctx) if operator is not None else iter(())
    if not commit:
        try:
            yield from output
        finally:
            store.abort()
        return
    try:
        yield from output
        if before_commit is not None:
            before_commit()
        before = store.metrics()
        commit_started = time.perf_counter()
        version = store.commit()
        commit_ms = (time.perf_counter() - commit_started) * 1000
    except BaseException:
        store.abort()
        raise
    if on_commit is not None:
        metrics = _after_commit(store, before)
        on_commit(Committed(version, store.checkpoint_id, metrics, load_ms, commit_ms))


def _after_commit(store: StateStore, before: StoreMetrics) -> StoreMetrics:
    """Metrics read after the commit (some are only known then), else those read before."""
    try:
        return store.metrics()
    except Exception:  # a provider may refuse reads after commit
        return before
