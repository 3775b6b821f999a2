"""The state store layer: contract, codecs, durable files and providers. Imports no pyspark."""

from sparkstate.store.base import (
    DEFAULT_CF,
    ColumnFamily,
    StateStore,
    StateStoreProvider,
    StoreConf,
    StoreId,
    StoreMetrics,
)
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
