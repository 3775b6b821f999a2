"""A real S3 endpoint on loopback: ``moto_server`` from this environment, with one bucket.

Used by the store tests' fixture (``tests/store/conftest.py``) and by the chaos run.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

BUCKET = "sparkstate-tests"
#: What the clients need in their environment (the server takes any credentials).
CLIENT_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


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


def moto_server() -> Path | None:
    """The ``moto_server`` installed next to this Python, if it is."""
    server = Path(sys.executable).with_name("moto_server")
    return server if server.exists() else None


def free_port() -> int:
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


def start(server: Path, log: Path) -> tuple[subprocess.Popen[bytes], S3Endpoint]:
    """``server`` on a free loopback port, answering, with the bucket made (the client's
    environment must hold ``CLIENT_ENV``); stop it with :func:`stop`."""
    import boto3

    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    endpoint = S3Endpoint("127.0.0.1", port, BUCKET)
    try:
        _wait_until_up(endpoint.url, proc)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint.url,
            region_name="us-east-1",
            aws_access_key_id=CLIENT_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CLIENT_ENV["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=BUCKET)
    except BaseException:
        stop(proc)
        raise
    return proc, endpoint


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def client_env() -> None:
    """Give this process (and the processes it starts) the clients' environment."""
    os.environ.update(CLIENT_ENV)
