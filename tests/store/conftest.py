"""Fixtures of the store tests: a real S3 endpoint on loopback (``moto_server``), started once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests import s3_server
from tests.s3_server import BUCKET as BUCKET
from tests.s3_server import S3Endpoint as S3Endpoint

from sparkstate.testing.factory import ProviderFactory


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """``moto_server`` from this environment on a free loopback port, with a bucket and creds."""
    server = s3_server.moto_server()
    if server is None:
        pytest.skip("moto_server is not installed next to this Python (pip install moto[server])")
    pytest.importorskip("boto3")
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3_server.CLIENT_ENV.items():
            mp.setenv(name, value)
        proc, endpoint = s3_server.start(server, log)
        try:
            yield endpoint
        finally:
            s3_server.stop(proc)


@pytest.fixture
def s3_root(s3_endpoint: S3Endpoint) -> str:
    """A fresh, empty checkpoint root on the loopback S3 endpoint."""
    return s3_endpoint.uri(f"checkpoints/{uuid.uuid4().hex}")


@pytest.fixture
def rocksdb_factory(tmp_path: Path) -> Iterator[ProviderFactory]:
    """A factory of rocksdb providers of one store, in this test's directories."""
    f = ProviderFactory("rocksdb", str(tmp_path / "ckpt"), str(tmp_path / "local"))
    yield f
    f.close_all()
