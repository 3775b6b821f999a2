"""The worker-level provider cache: one provider per (state root, operator, partition) in a
Python worker process, an in-process lock per partition, and maintenance off the task's path.

A partition that runs in the same worker again starts warm; maintenance (snapshots, retention)
runs on a background thread of the worker after the task is done, at most every
``maintenance_interval_s`` seconds per partition.
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

import pyarrow as pa

from sparkstate.exceptions import StoreLockedError
from sparkstate.store.base import StateStoreProvider, StoreConf, StoreId
from sparkstate.store.capabilities import SnapshotsNow
from sparkstate.store.registry import provider_class

__all__ = ["PROVIDERS", "PartitionKey", "ProviderCache", "StoreSettings"]

log = logging.getLogger("sparkstate.runtime")

#: (state root, operator id, partition id)
PartitionKey = tuple[str, int, int]


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    """Where and how an operator's stores live: shipped to every task."""

    state_root: str
    provider: str
    conf: StoreConf
    maintenance_interval_s: float = 30.0


class ProviderCache:
    """One provider per (state root, operator, partition) in this Python process, made for one
    run of the query."""

    def __init__(self) -> None:
        self._providers: dict[PartitionKey, StateStoreProvider] = {}
        #: The query run each provider was made for.
        self._runs: dict[PartitionKey, str] = {}
        self._locks: dict[PartitionKey, threading.Lock] = {}
        self._last_maintenance: dict[PartitionKey, float] = {}
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def lock(self, key: PartitionKey) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    @contextlib.contextmanager
    def holding(self, key: PartitionKey, timeout_s: float) -> Iterator[None]:
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

    def provider(
        self,
        key: PartitionKey,
        settings: StoreSettings,
        num_partitions: int,
        key_schema: pa.Schema,
        value_schema: pa.Schema,
        column_families: dict[str, tuple[pa.Schema, pa.Schema]],
        *,
        widening: bool = False,
        run: str = "",
    ) -> StateStoreProvider:
        """The cached provider of a partition (caller holds ``lock(key)``) for the query's run
        ``run`` (one provider per run); ``widening``: the operator's value schemas may widen a
        field's type (``StoreConf.value_widening``)."""
        found = self._providers.get(key)
        if found is not None:
            if self._runs.get(key) == run:
                return found
            # A new run of the query (a restart) may bring new schemas, column families or
            # partitions: it gets a provider of its own, as Spark's StateStoreProviderId
            # carries the query's run id. The local state stays: the new one reopens it.
            del self._providers[key]
            found.close()
        provider = provider_class(settings.provider)()
        conf = dataclasses.replace(
            settings.conf,
            num_partitions=num_partitions,
            value_widening=widening or settings.conf.value_widening,
        )
        provider.init(
            StoreId(settings.state_root, key[1], key[2]),
            key_schema,
            value_schema,
            conf,
            column_families or None,
        )
        self._providers[key] = provider
        self._runs[key] = run
        return provider

    def live(self, root: str, operator: int, partition: int) -> StateStoreProvider | None:
        """The provider of a partition, for a live read (which takes no partition lock: see
        :class:`~sparkstate.store.capabilities.ReadsLive`), if this process holds it."""
        wanted = _same_root(root)
        # (a task's thread may add a provider meanwhile: the items are copied in one step)
        for key, provider in list(self._providers.items()):
            if key[1:] == (operator, partition) and _same_root(key[0]) == wanted:
                return provider
        return None

    def maintain_later(self, key: PartitionKey, interval_s: float) -> None:
        """Run ``do_maintenance`` for the partition on a background thread, at most every
        ``interval_s`` seconds."""
        now = time.monotonic()
        last = self._last_maintenance.get(key)
        if last is not None and now - last < interval_s:
            return
        self._last_maintenance[key] = now
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="sparkstate-maintenance")
            pool = self._pool
        pool.submit(self._maintain, key)

    def _maintain(self, key: PartitionKey) -> None:
        with self.lock(key):
            provider = self._providers.get(key)
            if provider is None:
                return
            try:
                provider.do_maintenance()
            except Exception:  # maintenance is retried next time; a batch never fails for it
                log.exception("state store maintenance failed for %s", key)

    def snapshot_now(self, key: PartitionKey, timeout_s: float) -> bool:
        """Snapshot the partition's newest version if its provider here holds it (a query that
        stops cleanly); whether a snapshot was written."""
        with self.holding(key, timeout_s):
            provider = self._providers.get(key)
            capable = SnapshotsNow.of(provider) if provider is not None else None
            return capable is not None and capable.snapshot_now()

    def empty(self) -> bool:
        """Whether this cache holds nothing open (no provider, no maintenance thread)."""
        with self._guard:
            return not self._providers and self._pool is None

    def close_all(self) -> None:
        with self._guard:
            keys = list(self._providers)
        for key in keys:
            with self.lock(key):
                provider = self._providers.pop(key, None)
                if provider is not None:
                    provider.close()


def _same_root(root: str) -> str:
    """A state root as a path or URI that names it one way (no ``file:`` scheme, no trailing
    slash, an absolute local path)."""
    root = root.removeprefix("file://").removeprefix("file:").rstrip("/")
    return root if "://" in root else os.path.abspath(root)


#: The process-wide cache (one per Python worker process).
PROVIDERS = ProviderCache()
