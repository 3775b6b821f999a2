"""The provider contract suite (``sparkstate.testing.StateStoreContract``) for both providers."""

from __future__ import annotations

import importlib.util

import pytest

from sparkstate.store.memory import MemoryStateStoreProvider
from sparkstate.testing import StateStoreContract

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb.provider") is not None

# Store bugs this suite found and that are still open. The xfails are strict: once a fix lands
# the test passes, pytest reports XPASS(strict) as a failure, and the entry goes.


class TestMemoryProvider(StateStoreContract):
    provider = "memory"


class ThirdPartyProvider(MemoryStateStoreProvider):
    """A provider from outside the registry, as a user would write one."""

    name = "tests.third-party"


class TestThirdPartyProvider(StateStoreContract):
    """How another package runs the contract: subclass, name the provider (class or path)."""

    provider = ThirdPartyProvider


@pytest.mark.skipif(not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb.provider has not landed yet")
class TestRocksDBProvider(StateStoreContract):
    provider = "rocksdb"
