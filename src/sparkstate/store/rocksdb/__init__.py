"""The RocksDB provider: a local database per partition, its changelogs and snapshots.

``sparkstate.store.rocksdb`` names the provider and its store, as before the package; they
load on first use, and rocksdict with them."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RocksDBStateStore", "RocksDBStateStoreProvider"]

_WHERE = {
    "RocksDBStateStoreProvider": "sparkstate.store.rocksdb.provider",
    "RocksDBStateStore": "sparkstate.store.rocksdb.store",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
