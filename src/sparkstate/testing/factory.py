"""Open, reopen and close providers of one store in tests, and compare a store with a dict model.

The contract suite, the state machine and the crash tests share these helpers; so can a third
party's own provider tests. Nothing here imports pytest.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from sparkstate.files.durable import DurableDir
from sparkstate.store.base import DEFAULT_CF, StateStore, StateStoreProvider, StoreConf, StoreId
from sparkstate.store.families import Row
from sparkstate.store.registry import provider_class

__all__ = [
    "KEY_SCHEMA",
    "VALUE_SCHEMA",
    "Model",
    "ProviderFactory",
    "apply_changes",
    "durable_files",
    "read_all",
    "sort_rows",
]

#: The default store of the suite: a composite (string, signed int) key and a nullable value.
KEY_SCHEMA = pa.schema([("name", pa.string()), ("n", pa.int64())])
VALUE_SCHEMA = pa.schema([("count", pa.int64()), ("label", pa.string())])

#: What a store holds, per column family: key row -> value row.
Model = dict[str, dict[Row, Row]]

_VERSIONED = re.compile(r"^(\d+)_([0-9a-zA-Z]+)\.([a-z]+)")


def resolve_provider(provider: str | type[StateStoreProvider]) -> type[StateStoreProvider]:
    return provider_class(provider) if isinstance(provider, str) else provider


class ProviderFactory:
    """Makes providers of one store (one :class:`StoreId`) and closes every one it made.

    ``open()`` binds a fresh provider instance; ``reopen()`` closes the ones still open first, as a
    restarted worker would (the rocksdb provider locks its local directory while open).
    """

    def __init__(
        self,
        provider: str | type[StateStoreProvider],
        checkpoint_root: str,
        local_dir: str,
        *,
        key_schema: pa.Schema = KEY_SCHEMA,
        value_schema: pa.Schema = VALUE_SCHEMA,
        column_families: dict[str, tuple[pa.Schema, pa.Schema]] | None = None,
        conf: dict[str, Any] | None = None,
    ) -> None:
        self.provider_cls = resolve_provider(provider)
        self.checkpoint_root = checkpoint_root
        self.local_dir = local_dir
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.column_families = column_families
        self.conf_options: dict[str, Any] = {
            "lock_timeout_s": 20.0,
            "block_cache_mb": 8,
            "write_buffer_mb": 4,
            **(conf or {}),
        }
        self.store_id = StoreId(checkpoint_root, operator_id=0, partition_id=0)
        self._open: list[StateStoreProvider] = []
        self._local_dirs = 0

    def conf(self, **overrides: Any) -> StoreConf:
        options = {"local_dir": self.local_dir, **self.conf_options, **overrides}
        return StoreConf(**options)

    def fresh_local_dir(self) -> str:
        """A new, empty executor-local directory (a worker on another executor)."""
        self._local_dirs += 1
        path = f"{self.local_dir}-{self._local_dirs}"
        os.makedirs(path, exist_ok=True)
        return path

    def open(
        self,
        *,
        store_id: StoreId | None = None,
        key_schema: pa.Schema | None = None,
        value_schema: pa.Schema | None = None,
        column_families: dict[str, tuple[pa.Schema, pa.Schema]] | None = None,
        provider_cls: type[StateStoreProvider] | None = None,
        **conf: Any,
    ) -> StateStoreProvider:
        provider = (provider_cls or self.provider_cls)()
        provider.init(
            store_id or self.store_id,
            self.key_schema if key_schema is None else key_schema,
            self.value_schema if value_schema is None else value_schema,
            self.conf(**conf),
            column_families=(self.column_families if column_families is None else column_families),
        )
        self._open.append(provider)
        return provider

    def reopen(self, **kwargs: Any) -> StateStoreProvider:
        """Close every provider this factory opened, then open a new one."""
        self.close_all()
        return self.open(**kwargs)

    def close(self, provider: StateStoreProvider) -> None:
        if provider in self._open:
            self._open.remove(provider)
        provider.close()

    def close_all(self) -> None:
        while self._open:
            self._open.pop().close()


def read_all(store: StateStore, cfs: Iterable[str] = (DEFAULT_CF,)) -> Model:
    """Everything a store holds in the given column families, as a model."""
    return {cf: dict(store.iterator(cf)) for cf in cfs}


def apply_changes(
    model: dict[Row, Row], puts: dict[Row, Row], removes: Iterable[Row]
) -> dict[Row, Row]:
    """A copy of ``model`` after ``puts`` then ``removes``."""
    out = dict(model)
    out.update(puts)
    for key in removes:
        out.pop(key, None)
    return out


def _column_key(value: Any, nulls_first: bool) -> tuple[int, Any]:
    if value is None:
        return (0, 0) if nulls_first else (1, 0)
    return (1, value) if nulls_first else (0, value)


def sort_rows(rows: Iterable[Row], *, nulls_first: bool) -> list[Row]:
    """Rows in the order an order-preserving key codec gives them (column by column)."""
    key: Callable[[Row], tuple[tuple[int, Any], ...]] = lambda row: tuple(  # noqa: E731
        _column_key(v, nulls_first) for v in row
    )
    return sorted(rows, key=key)


def durable_files(store_id: StoreId, ext: str | None = None) -> list[tuple[int, str, str]]:
    """``(version, checkpoint id, file name)`` of a store's versioned files, oldest first."""
    directory = DurableDir(store_id.checkpoint_root).child(store_id.relative_dir)
    out = []
    for entry in directory.list():
        m = _VERSIONED.match(entry.name)
        if m is None or (ext is not None and m.group(3) != ext):
            continue
        out.append((int(m.group(1)), m.group(2), entry.name))
    return sorted(out)
