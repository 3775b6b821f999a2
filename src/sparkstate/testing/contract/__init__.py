"""The state store provider contract, as a pytest suite any provider can run.

Subclass :class:`StateStoreContract` in a test module, name the provider, and pytest runs every
test of the contract against it::

    from sparkstate.testing import StateStoreContract

    class TestMyProvider(StateStoreContract):
        provider = "mypackage.store:MyProvider"     # or the class itself, or "memory" / "rocksdb"

Override the ``checkpoint_root`` fixture to run the suite on another file system (the project runs
it against ``s3://`` on a loopback S3 endpoint). The suite starts no Spark and needs only pytest.

Each theme is a mixin in a module of its own: reads and writes, key order and scans, column
families, encoded keys, versions, maintenance, schema checks on restart, metrics; :mod:`._base`
holds the provider under test, the fixtures and the helpers they share.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from sparkstate.testing.contract._encoded import EncodedKeyContract
from sparkstate.testing.contract._families import ColumnFamilyContract
from sparkstate.testing.contract._maintenance import MaintenanceContract
from sparkstate.testing.contract._metrics import MetricsContract
from sparkstate.testing.contract._reads_writes import ReadWriteContract
from sparkstate.testing.contract._scans import ScanContract
from sparkstate.testing.contract._schemas import SchemaContract
from sparkstate.testing.contract._versions import VersionContract

__all__ = ["StateStoreContract", "expected_failure"]


class StateStoreContract(
    ReadWriteContract,
    ScanContract,
    ColumnFamilyContract,
    EncodedKeyContract,
    VersionContract,
    MaintenanceContract,
    SchemaContract,
    MetricsContract,
):
    """Every behaviour a state store provider promises. Subclass and set ``provider``.

    Each theme of the contract is a mixin of its own module; this class is all of them.
    """


def expected_failure(
    name: str, reason: str, *, raises: type[BaseException] | None = None
) -> Callable[..., Any]:
    """Contract test ``name``, marked as failing (strictly) for a provider, e.g. for a known bug::

        class TestMyProvider(StateStoreContract):
            provider = "mypackage.store:MyProvider"
            test_metrics = expected_failure("test_metrics", "num_keys is an estimate", raises=...)

    Strict: when the provider is fixed, the test passes and pytest reports it, so the mark goes.
    """
    test = getattr(StateStoreContract, name)

    @functools.wraps(test)
    def run(self: StateStoreContract, *args: Any, **kwargs: Any) -> Any:
        return test(self, *args, **kwargs)

    mark = pytest.mark.xfail(strict=True, reason=reason, raises=raises)
    return mark(run)  # type: ignore[no-any-return]
