"""The provider contract suite (``sparkstate.testing.StateStoreContract``) for both providers."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from sparkstate.exceptions import MissingVersionError
from sparkstate.store.memory import MemoryStateStoreProvider
from sparkstate.testing import StateStoreContract, expected_failure

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb") is not None


# Store bugs this suite found and that are still open. The xfails are strict: once a fix lands
# the test passes, pytest reports XPASS(strict) as a failure, and the entry goes.
ROCKSDB_ABANDONED_LINEAGE = (
    "store/versioned.py VersionedProvider._retention_base walks the lineage of the newest attempt "
    "of the highest version, which after a replay can be an abandoned attempt; and "
    "store/rocksdb.py uploads the abandoned attempt's pending checkpoint (taken at commit) as a "
    "snapshot, which also makes _snapshot_due skip the replayed lineage. Retention then deletes "
    "the parents of the replayed version: it no longer restores on another executor"
)

RETENTION_DELETES_NEW_COMMIT = (
    "store/versioned.py VersionedProvider._retention_base derives min_keep and the lineage to "
    "keep from the newest attempt of the highest version on durable storage, not from the attempt "
    "this provider committed last: after a restart from an older version, the maintenance after "
    "a commit deletes that very commit (and the parents of the versions built on it)"
)


def retention_xfail(
    name: str = "test_maintenance_keeps_the_version_just_committed",
) -> Callable[..., Any]:
    return expected_failure(name, RETENTION_DELETES_NEW_COMMIT, raises=MissingVersionError)


OTHER_INSTANCE = "test_maintenance_by_another_instance_keeps_the_version_just_committed"


class TestMemoryProvider(StateStoreContract):
    provider = "memory"

    test_maintenance_keeps_the_version_just_committed = retention_xfail()
    test_maintenance_by_another_instance_keeps_the_version_just_committed = retention_xfail(
        OTHER_INSTANCE
    )


class ThirdPartyProvider(MemoryStateStoreProvider):
    """A provider from outside the registry, as a user would write one."""

    name = "tests.third-party"


class TestThirdPartyProvider(StateStoreContract):
    """How another package runs the contract: subclass, name the provider (class or path)."""

    provider = ThirdPartyProvider

    test_maintenance_keeps_the_version_just_committed = retention_xfail()
    test_maintenance_by_another_instance_keeps_the_version_just_committed = retention_xfail(
        OTHER_INSTANCE
    )


@pytest.mark.skipif(not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb has not landed yet")
class TestRocksDBProvider(StateStoreContract):
    provider = "rocksdb"

    test_maintenance_keeps_the_version_just_committed = retention_xfail()
    test_maintenance_by_another_instance_keeps_the_version_just_committed = retention_xfail(
        OTHER_INSTANCE
    )

    test_retention_keeps_a_replay_behind_an_abandoned_attempt = expected_failure(
        "test_retention_keeps_a_replay_behind_an_abandoned_attempt",
        ROCKSDB_ABANDONED_LINEAGE,
        raises=MissingVersionError,
    )
