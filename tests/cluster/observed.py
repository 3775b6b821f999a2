"""The two providers, unchanged, plus a record of every load: where it ran and what it cost.

Used as ``.option("stateStore", "tests.cluster.observed:ObservedRocksDB")`` (or
``ObservedMemory``). Each ``get_store`` appends one JSON line to
``<checkpoint>/observed/<pid>.jsonl`` (one file per process, so lines never interleave): the
version loaded, the partition, the executor's working directory (which names the worker and
executor), the wall time of the load, the provider's counters (``restores``,
``changelogsReplayed``, ``bytesDownloaded``, ...) before and after it, and the error if the load
failed.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, ClassVar

from sparkstate.store.base import StateStore
from sparkstate.store.memory import MemoryStateStore, MemoryStateStoreProvider
from sparkstate.store.rocksdb.provider import RocksDBStateStore, RocksDBStateStoreProvider

OBSERVED_DIR = "observed"


class _Observed:
    """What both observed providers add: the record of each load."""

    id: Any

    def _counters(self) -> dict[str, Any]:
        """The provider's counters (the memory provider has none of its own)."""
        counters = getattr(self, "custom_metrics", None)
        return dict(counters()) if counters is not None else {}

    def _observe(self, load: Any, version: int, checkpoint_id: str | None) -> StateStore:
        before = self._counters()
        started = time.perf_counter()
        entry: dict[str, Any] = {
            "version": version,
            "operator": self.id.operator_id,
            "partition": self.id.partition_id,
            "cwd": os.getcwd(),
            "pid": os.getpid(),
            "before": before,
        }
        try:
            store: StateStore = load(version, checkpoint_id)
        except BaseException as exc:  # recorded, then raised as it was
            entry["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            entry["load_ms"] = (time.perf_counter() - started) * 1000
            entry["after"] = self._counters()
            self._record(entry)
        return store

    def _record(self, entry: dict[str, Any]) -> None:
        root = self.id.checkpoint_root.rstrip("/")
        out = os.path.join(os.path.dirname(root), OBSERVED_DIR)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


class ObservedRocksDB(_Observed, RocksDBStateStoreProvider):
    name: ClassVar[str] = "rocksdb"

    def get_store(self, version: int, checkpoint_id: str | None = None) -> RocksDBStateStore:
        store = self._observe(super().get_store, version, checkpoint_id)
        assert isinstance(store, RocksDBStateStore)
        return store


class ObservedMemory(_Observed, MemoryStateStoreProvider):
    name: ClassVar[str] = "memory"

    def get_store(self, version: int, checkpoint_id: str | None = None) -> MemoryStateStore:
        store = self._observe(super().get_store, version, checkpoint_id)
        assert isinstance(store, MemoryStateStore)
        return store
