"""The provider contract suite (``sparkstate.testing.StateStoreContract``) for both providers."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from sparkstate.exceptions import MissingVersionError
from sparkstate.testing import StateStoreContract

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb") is not None


def known_bug(name: str, reason: str, raises: type[BaseException]) -> Callable[..., Any]:
    """The contract test ``name``, expected to fail (strictly) while a store bug is open."""
    test = getattr(StateStoreContract, name)

    @functools.wraps(test)
    def run(self: StateStoreContract, *args: Any, **kwargs: Any) -> Any:
        return test(self, *args, **kwargs)

    return pytest.mark.xfail(strict=True, reason=reason, raises=raises)(run)


# Store bugs this suite found and that are still open. The xfails are strict: once a fix lands
# the test passes, pytest reports XPASS(strict) as a failure, and the entry goes.
ROCKSDB_ABANDONED_LINEAGE = (
    "store/versioned.py VersionedProvider._retention_base walks the lineage of the newest attempt "
    "of the highest version, which after a replay can be an abandoned attempt; and "
    "store/rocksdb.py uploads the abandoned attempt's pending checkpoint (taken at commit) as a "
    "snapshot, which also makes _snapshot_due skip the replayed lineage. Retention then deletes "
    "the parents of the replayed version: it no longer restores on another executor"
)


class TestMemoryProvider(StateStoreContract):
    provider = "memory"


@pytest.mark.skipif(not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb has not landed yet")
class TestRocksDBProvider(StateStoreContract):
    provider = "rocksdb"

    test_retention_keeps_a_replay_behind_an_abandoned_attempt = known_bug(
        "test_retention_keeps_a_replay_behind_an_abandoned_attempt",
        ROCKSDB_ABANDONED_LINEAGE,
        raises=MissingVersionError,
    )
