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
RETENTION_WITHOUT_A_COMMIT = (
    "store/versioned.py VersionedProvider._retention_base takes the newest attempt of the highest "
    "version on durable storage as the live lineage when this provider instance has not committed "
    "(self._last_ref is None: another worker process, a restarted worker before its first "
    "commit). After a restart from an older version (e.g. a rollback of the commit log), that is "
    "an abandoned attempt, and maintenance deletes the version just committed by another instance"
)


def retention_without_a_commit() -> Callable[..., Any]:
    return expected_failure(
        "test_maintenance_by_another_instance_keeps_the_version_just_committed",
        RETENTION_WITHOUT_A_COMMIT,
        raises=MissingVersionError,
    )


class TestMemoryProvider(StateStoreContract):
    provider = "memory"

    test_maintenance_by_another_instance_keeps_the_version_just_committed = (
        retention_without_a_commit()
    )


class ThirdPartyProvider(MemoryStateStoreProvider):
    """A provider from outside the registry, as a user would write one."""

    name = "tests.third-party"


class TestThirdPartyProvider(StateStoreContract):
    """How another package runs the contract: subclass, name the provider (class or path)."""

    provider = ThirdPartyProvider

    test_maintenance_by_another_instance_keeps_the_version_just_committed = (
        retention_without_a_commit()
    )


@pytest.mark.skipif(not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb has not landed yet")
class TestRocksDBProvider(StateStoreContract):
    provider = "rocksdb"

    test_maintenance_by_another_instance_keeps_the_version_just_committed = (
        retention_without_a_commit()
    )
