"""The RocksDB provider: a local database per partition, its changelogs and snapshots.

``sparkstate.store.rocksdb`` names the provider and its store, as before the package; they
load on first use, and rocksdict with them."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "RocksDBStateStore",
    "RocksDBStateStoreProvider",
    "mark_opened",
    "opened_in_process",
]

#: Whether this process, or one it was forked from, opened a RocksDB database.
_opened = False


def mark_opened() -> None:
    """Record that this process opens a RocksDB database: opening starts RocksDB's background
    threads (its flushes and compactions), which a child forked from this process does not
    have while RocksDB there believes it does, so that a database the child opens would wait
    for its first flush forever."""
    global _opened  # noqa: PLW0603 - one fact about the process
    _opened = True


def opened_in_process() -> bool:
    """Whether a child forked from this process could not run RocksDB (:func:`mark_opened`)."""
    return _opened


_WHERE = {
    "RocksDBStateStoreProvider": "sparkstate.store.rocksdb.provider",
    "RocksDBStateStore": "sparkstate.store.rocksdb.store",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
