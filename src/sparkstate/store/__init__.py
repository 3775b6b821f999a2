"""The state store layer: contract, codecs, durable files and providers. Imports no pyspark.

Its public names are imported on first use, so that a module of the layer (the durable files)
can be imported without the codecs and their pandas."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkstate.store.base import (
        DEFAULT_CF,
        StateStore,
        StateStoreProvider,
        StoreConf,
        StoreId,
        StoreMetrics,
    )
    from sparkstate.store.families import ColumnFamily
    from sparkstate.store.registry import PROVIDERS, provider_class

__all__ = [
    "DEFAULT_CF",
    "PROVIDERS",
    "ColumnFamily",
    "StateStore",
    "StateStoreProvider",
    "StoreConf",
    "StoreId",
    "StoreMetrics",
    "provider_class",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        msg = f"module 'sparkstate.store' has no attribute {name!r}"
        raise AttributeError(msg)
    registry = name in ("PROVIDERS", "provider_class")
    home = "sparkstate.store.registry" if registry else "sparkstate.store.base"
    return getattr(importlib.import_module(home), name)
