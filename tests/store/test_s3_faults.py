"""State on an S3 endpoint that misbehaves as real ones do (``tests/s3_fault_proxy.py`` in front
of the loopback server): throttling (``503 SlowDown``), ``500``, slow answers, connections reset
in the middle of an upload or a download, by a seeded schedule.

Both providers commit a history of versions with maintenance after each (snapshots, retention)
through the faults; a provider on the server directly, without faults, then reads every version
kept and must find what a run without faults committed. An endpoint that never recovers makes a
write give up after its bounded retries with an error that says so, and an upload cut off in the
middle never becomes a file a reader sees.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.s3_fault_proxy import KINDS, FaultProxy
from tests.store.conftest import S3Endpoint

from sparkstate.exceptions import StateFileError
from sparkstate.files import durable
from sparkstate.files.durable import DurableDir
from sparkstate.store.base import StateStoreProvider
from sparkstate.testing.factory import ProviderFactory, apply_changes, read_all

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb.provider") is not None
PROVIDERS = ["memory", *(["rocksdb"] if HAVE_ROCKSDB else [])]
pytestmark = pytest.mark.s3

VERSIONS = 12
CONF = {"min_deltas_for_snapshot": 3, "min_versions_to_retain": 4}


def _changes(version: int) -> tuple[dict[tuple, tuple], list[tuple]]:
    puts = {
        (f"k{(version * 7 + i) % 40}", i): (version * 100 + i, f"v{version}") for i in range(30)
    }
    removes = [(f"k{(version * 3 + i) % 40}", i) for i in range(3)]
    return puts, removes


@pytest.fixture
def proxy(s3_endpoint: S3Endpoint) -> Iterator[FaultProxy]:
    p = FaultProxy((s3_endpoint.host, s3_endpoint.port), seed=7, rate=0.3, delay_s=0.2)
    yield p
    p.close()


def _through(s3_endpoint: S3Endpoint, uri: str, proxy: FaultProxy) -> str:
    return uri.replace(f"{s3_endpoint.host}:{s3_endpoint.port}", proxy.endpoint())


def _commit_history(provider: StateStoreProvider) -> dict[int, dict[tuple, tuple]]:
    models: dict[int, dict[tuple, tuple]] = {0: {}}
    for version in range(1, VERSIONS + 1):
        store = provider.get_store(version - 1)
        puts, removes = _changes(version)
        for key, value in puts.items():
            store.put(key, value)
        for key in removes:
            store.remove(key)
        assert store.commit() == version
        models[version] = apply_changes(models[version - 1], puts, removes)
        provider.do_maintenance()
    return models


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_history_committed_through_faults_reads_back_whole(
    s3_endpoint: S3Endpoint, s3_root: str, proxy: FaultProxy, tmp_path: Path, provider: str
) -> None:
    faulty = ProviderFactory(
        provider, _through(s3_endpoint, s3_root, proxy), str(tmp_path / "local"), conf=CONF
    )
    try:
        models = _commit_history(faulty.open())
    finally:
        faulty.close_all()
    assert set(proxy.faults) == set(KINDS), proxy.faults
    direct = ProviderFactory(provider, s3_root, str(tmp_path / "fresh-local"), conf=CONF)
    try:
        reader = direct.open()
        assert reader.latest_version() == VERSIONS
        for version in range(VERSIONS - CONF["min_versions_to_retain"] + 1, VERSIONS + 1):
            store = reader.get_read_store(version)
            assert read_all(store)["default"] == models[version], version
            store.abort()
    finally:
        direct.close_all()


@pytest.fixture
def fewer_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two attempts of sparkstate's (each with the S3 client's own retries), not six."""
    monkeypatch.setattr(durable, "REMOTE_ATTEMPTS", 2)


@pytest.mark.usefixtures("fewer_attempts")
def test_an_endpoint_that_never_recovers_makes_a_write_give_up_and_say_so(
    s3_endpoint: S3Endpoint, s3_root: str
) -> None:
    proxy = FaultProxy((s3_endpoint.host, s3_endpoint.port), rate=1.0, kinds=["503"])
    try:
        directory = DurableDir(_through(s3_endpoint, s3_root, proxy))
        started = time.monotonic()
        with pytest.raises(StateFileError) as failed:
            directory.write_atomic("1.delta", b"x" * 100)
        took = time.monotonic() - started
    finally:
        proxy.close()
    message = str(failed.value)
    assert "1.delta" in message and "gave up after 2 attempts" in message, message
    assert "SlowDown" in message or "503" in message, message
    assert took < 60, took


@pytest.mark.usefixtures("fewer_attempts")
def test_an_upload_cut_off_never_becomes_a_file(s3_endpoint: S3Endpoint, s3_root: str) -> None:
    proxy = FaultProxy((s3_endpoint.host, s3_endpoint.port), rate=1.0, kinds=["reset-upload"])
    try:
        with pytest.raises(StateFileError):
            DurableDir(_through(s3_endpoint, s3_root, proxy)).write_atomic("1.delta", b"x" * 4096)
    finally:
        proxy.close()
    assert proxy.faults["reset-upload"] > 1  # retried
    assert not DurableDir(s3_root).exists("1.delta")
