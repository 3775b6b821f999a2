"""Look up a state store provider by short name or by ``"package.module:Class"``."""

from __future__ import annotations

import importlib

from sparkstate.exceptions import ConfigurationError
from sparkstate.store.base import StateStoreProvider

__all__ = ["PROVIDERS", "provider_class", "provider_name"]

#: Short names of the built-in providers and where they live (imported on first use).
PROVIDERS = {
    "memory": "sparkstate.store.memory:MemoryStateStoreProvider",
    "rocksdb": "sparkstate.store.rocksdb.provider:RocksDBStateStoreProvider",
}


def provider_class(name: str) -> type[StateStoreProvider]:
    """The provider class for ``name``: a short name or ``"package.module:Class"``."""
    path = PROVIDERS.get(name, name)
    module_name, sep, class_name = path.partition(":")
    if not sep or not module_name or not class_name:
        msg = (
            f"unknown state store provider {name!r}: use one of {sorted(PROVIDERS)} "
            "or 'package.module:Class'"
        )
        raise ConfigurationError(msg)
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except (ImportError, AttributeError) as exc:
        msg = f"cannot load state store provider {name!r} from {path!r}: {exc}"
        raise ConfigurationError(msg) from exc
    if not (isinstance(cls, type) and issubclass(cls, StateStoreProvider)):
        msg = f"{path!r} is not a StateStoreProvider subclass"
        raise ConfigurationError(msg)
    return cls


def provider_name(cls: type[StateStoreProvider]) -> str:
    """The name a provider class is recorded under in ``_schema.json``."""
    return getattr(cls, "name", None) or f"{cls.__module__}:{cls.__qualname__}"
