"""What every part of the provider contract suite shares: the provider under test and its
fixtures, the schemas of the default store, and helpers that commit changes and histories."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from sparkstate.files.durable import DurableDir
from sparkstate.store.base import DEFAULT_CF, StateStore, StateStoreProvider
from sparkstate.store.families import Row
from sparkstate.testing.factory import ProviderFactory, apply_changes

__all__ = [
    "KEY",
    "V",
    "ContractBase",
    "commit",
    "each_provider",
    "history",
    "history_step",
    "store_dir",
]

#: The value schema of the suite's stores, and a key schema like the default one.

V = pa.schema([("count", pa.int64()), ("label", pa.string())])
KEY = pa.schema([("name", pa.string()), ("n", pa.int64())])


def commit(
    provider: StateStoreProvider,
    version: int,
    puts: dict[Row, Row],
    removes: list[Row] | None = None,
    cf: str = DEFAULT_CF,
    checkpoint_id: str | None = None,
) -> StateStore:
    """Open ``version``, apply the changes, commit; returns the committed store."""
    store = provider.get_store(version, checkpoint_id)
    for k, v in puts.items():
        store.put(k, v, cf)
    for k in removes or []:
        store.remove(k, cf)
    assert store.commit() == version + 1
    return store


def history_step(provider: StateStoreProvider, v: int, state: dict[Row, Row]) -> dict[Row, Row]:
    """Commit version ``v`` (from ``v - 1``) of a small evolving state; returns the state at v."""
    puts: dict[Row, Row] = {("k", v % 5): (v, f"v{v}"), ("v", v): (v, None)}
    removes: list[Row] = [("k", (v + 2) % 5), ("v", v - 3)]
    commit(provider, v - 1, puts, removes)
    return apply_changes(state, puts, removes)


def history(provider: StateStoreProvider, n: int) -> list[dict[Row, Row]]:
    """Commit versions 1..n; ``result[v]`` is the state at version v."""
    states: list[dict[Row, Row]] = [{}]
    for v in range(1, n + 1):
        states.append(history_step(provider, v, states[-1]))
    return states


def each_provider(
    factory: ProviderFactory, provider: StateStoreProvider
) -> Iterator[StateStoreProvider]:
    """The provider that wrote, then a new instance on the same and on a fresh local directory.

    Each is yielded only once the previous one is done with (a provider may hold one open store
    at a time, and reopening closes the others).
    """
    yield provider
    yield factory.reopen()
    yield factory.reopen(local_dir=factory.fresh_local_dir())


def store_dir(factory: ProviderFactory) -> DurableDir:
    """The durable directory of the factory's store."""
    return DurableDir(factory.checkpoint_root).child(factory.store_id.relative_dir)


class ContractBase:
    """The provider under test, its options and the fixtures every contract test uses."""

    #: The provider under test: a registered name, ``"package.module:Class"`` or the class.
    provider: ClassVar[str | type[StateStoreProvider]]
    #: Extra ``StoreConf`` options for every provider the suite opens.
    conf_options: ClassVar[dict[str, Any]] = {}
    #: Whether ``metrics().num_keys`` is exact (True) or an estimate.
    exact_num_keys: ClassVar[bool] = True

    @pytest.fixture
    def checkpoint_root(self, tmp_path: Any) -> str:
        """Where durable files go. Override to run the suite on another file system."""
        return str(tmp_path / "checkpoint")

    @pytest.fixture
    def factory(self, checkpoint_root: str, tmp_path: Any) -> Iterator[ProviderFactory]:
        factory = ProviderFactory(
            self.provider, checkpoint_root, str(tmp_path / "local"), conf=dict(self.conf_options)
        )
        yield factory
        factory.close_all()
