"""The provider contract suite against ``s3://`` on a real S3 endpoint (moto server, loopback)."""

from __future__ import annotations

import importlib.util

import pytest

from sparkstate.testing import StateStoreContract

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb.provider") is not None

pytestmark = pytest.mark.s3


class TestMemoryProviderOnS3(StateStoreContract):
    provider = "memory"

    @pytest.fixture
    def checkpoint_root(self, s3_root: str) -> str:
        return s3_root


@pytest.mark.skipif(not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb.provider has not landed yet")
class TestRocksDBProviderOnS3(StateStoreContract):
    provider = "rocksdb"

    @pytest.fixture
    def checkpoint_root(self, s3_root: str) -> str:
        return s3_root
