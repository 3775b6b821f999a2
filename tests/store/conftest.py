"""Fixtures of the store tests: a real S3 endpoint on loopback (``moto_server``), started once."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkstate.testing.factory import ProviderFactory

BUCKET = "sparkstate-tests"


@dataclasses.dataclass(frozen=True)
class S3Endpoint:
    """A loopback S3 endpoint with one bucket; ``uri(prefix)`` names a directory in it."""

    host: str
    port: int
    bucket: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}?endpoint_override={self.host}:{self.port}&scheme=http"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_until_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"moto_server exited with {proc.returncode} before answering on {url}"
            raise RuntimeError(msg)
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers, even if with an error status
        except OSError:
            time.sleep(0.1)
    msg = f"moto_server did not answer on {url} within {timeout_s} s"
    raise RuntimeError(msg)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """``moto_server`` from this environment on a free loopback port, with a bucket and creds."""
    server = Path(sys.executable).with_name("moto_server")
    if not server.exists():
        pytest.skip(
            f"moto_server not installed next to {sys.executable} (pip install moto[server])"
        )
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    endpoint = S3Endpoint("127.0.0.1", port, BUCKET)
    try:
        _wait_until_up(endpoint.url, proc)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AWS_ACCESS_KEY_ID", "testing")
            mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
            mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
            client = boto3.client("s3", endpoint_url=endpoint.url, region_name="us-east-1")
            client.create_bucket(Bucket=BUCKET)
            yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
