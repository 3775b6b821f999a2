"""Fault injection for the engine tests: providers whose Python worker kills itself on cue.

A test drops a marker file ``<state root>/kill-<when>-<version>-p<partition>``; the task that
reaches that point deletes the marker and SIGKILLs its own Python worker, so Spark retries the
task (the session runs ``local[2,2]``). ``when`` is ``open`` (right after loading the store) or
``commit`` (right after the version became durable, before the task's output reached Spark).
``stall`` does not kill: the task writes its process id to ``<marker>.at`` and waits
``STALL_S`` seconds after loading, so that a test can act while the task is in flight.
Workers import this module by its dotted name: ``.option("stateStore", "tests.engine.faults:...")``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from sparkstate.store.base import StateStore
from sparkstate.store.memory import MemoryStateStoreProvider
from sparkstate.store.rocksdb.provider import RocksDBStateStoreProvider


def _marker(provider: Any, when: str, version: int) -> Path:
    sid = provider.id
    return Path(sid.checkpoint_root) / f"kill-{when}-{version}-p{sid.partition_id}"


def _die_if_marked(provider: Any, when: str, version: int) -> None:
    marker = _marker(provider, when, version)
    if marker.exists():
        marker.unlink()
        os.kill(os.getpid(), signal.SIGKILL)


STALL_S = 4.0


def _stall_if_marked(provider: Any, version: int) -> None:
    marker = _marker(provider, "stall", version)
    if marker.exists():
        marker.unlink()
        at = marker.with_name(marker.name + ".at")
        written = at.with_name(at.name + ".tmp")
        written.write_text(str(os.getpid()))
        written.rename(at)  # whole when it appears: a test reads it as soon as it exists
        time.sleep(STALL_S)


def _arm(provider: Any, store: StateStore) -> StateStore:
    _die_if_marked(provider, "open", store.version + 1)
    _stall_if_marked(provider, store.version + 1)
    commit = store._commit

    def commit_then_maybe_die() -> None:
        commit()
        _die_if_marked(provider, "commit", store.version + 1)

    store._commit = commit_then_maybe_die  # type: ignore[method-assign]
    return store


class KillingMemoryProvider(MemoryStateStoreProvider):
    def get_store(self, version: int, checkpoint_id: str | None = None) -> Any:
        return _arm(self, super().get_store(version, checkpoint_id))


class KillingRocksDBProvider(RocksDBStateStoreProvider):
    def get_store(self, version: int, checkpoint_id: str | None = None) -> Any:
        return _arm(self, super().get_store(version, checkpoint_id))


KILLING = {
    "memory": "tests.engine.faults:KillingMemoryProvider",
    "rocksdb": "tests.engine.faults:KillingRocksDBProvider",
}


def arm(state_root: Path, when: str, version: int, partition: int) -> Path:
    marker = state_root / f"kill-{when}-{version}-p{partition}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return marker
