"""A lazy restore: a partition opened where it has no local copy starts at once, reading the keys
its batches ask for from the snapshot's SST files on durable storage, while the snapshot
downloads in the background (:mod:`sparkstate.store.rocksdb.lazy`).

A gate holds the background download, so that each test decides whether the database is still
lazy. Every read is checked against the state the writing worker saw: point reads of present,
overwritten, deleted and range-removed keys while lazy, versions committed while lazy, a scan
(which waits for the download), the next load after the download (the database complete), and a
worker that died while its database was lazy (its partial database is never taken for its
version). On a local checkpoint and on S3.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.store.base import StateStore, StateStoreProvider
from sparkstate.store.rocksdb.lazy import MAX_LAZY_KEYS
from sparkstate.store.rocksdb.provider import RocksDBStateStoreProvider
from sparkstate.testing import ProviderFactory

KEY = pa.schema([("k", pa.int64())])
VALUE = pa.schema([("v", pa.string())])
N = 4000


class Gate:
    """Holds every snapshot download until opened."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.downloads = 0


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    download = RocksDBStateStoreProvider._download

    def held(self: RocksDBStateStoreProvider, *args: Any, **kwargs: Any) -> Any:
        gate.downloads += 1
        assert gate.open.wait(60), "the test never opened the gate"
        return download(self, *args, **kwargs)

    monkeypatch.setattr(RocksDBStateStoreProvider, "_download", held)
    return gate


def _factory(root: str, local: Path) -> ProviderFactory:
    return ProviderFactory(
        "rocksdb",
        root,
        str(local),
        key_schema=KEY,
        value_schema=VALUE,
        conf={"min_deltas_for_snapshot": 2, "lazy_restore_min_mb": 0},
    )


def _write(store: StateStore, puts: dict[int, str], removes: list[int]) -> None:
    for k, v in puts.items():
        store.put((k,), (v,))
    for k in removes:
        store.remove((k,))


def _read(store: StateStore, keys: list[int]) -> dict[int, str]:
    got = store.get_many([(k,) for k in keys])
    return {k: row[0] for k, row in zip(keys, got, strict=True) if row is not None}


@pytest.fixture
def written(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[ProviderFactory, dict[int, str], int]]:
    """A partition's state over 6 versions, a snapshot among them and changelogs after it:
    (factory, the state at the last version, that version)."""
    root = request.getfixturevalue("s3_root") if request.param == "s3" else str(tmp_path / "ckpt")
    factory = _factory(root, tmp_path / "local")
    model: dict[int, str] = {}
    provider = factory.open(lazy_restore=False)
    for version in range(6):
        store = provider.get_store(version)
        puts = {k: f"v{version}-{k}-" + "x" * (k % 50) for k in range(version * 500, N, 3)}
        removes = list(range(version * 7, N, 11)) if version else []
        _write(store, puts, removes)
        model.update(puts)
        for k in removes:
            model.pop(k, None)
        if version == 4:  # a range removed after the snapshot
            codec = store.column_family().key_codec
            store.remove_range(codec.encode((1000,)), codec.encode((1300,)))
            model = {k: v for k, v in model.items() if not 1000 <= k < 1300}
        store.commit()
        if version == 2:
            provider.do_maintenance()  # the snapshot, of version 3
    factory.close_all()
    yield factory, model, 6
    factory.close_all()


def _fresh(factory: ProviderFactory, **conf: Any) -> StateStoreProvider:
    return factory.open(local_dir=factory.fresh_local_dir(), **conf)


@pytest.mark.parametrize(
    "written", ["local", pytest.param("s3", marks=pytest.mark.s3)], indirect=True
)
def test_reads_and_commits_while_lazy_then_complete(
    written: tuple[ProviderFactory, dict[int, str], int], gate: Gate
) -> None:
    factory, model, version = written
    provider = _fresh(factory)
    store = provider.get_store(version)
    metrics = store.metrics().custom
    assert metrics["lazyRestores"] == 1
    assert metrics["filesDownloaded"] == 0
    keys = list(range(-5, N + 5))
    assert _read(store, keys) == model  # present, overwritten, deleted and removed keys
    assert store.metrics().custom["lazyBytesRead"] > 0

    # A version committed while lazy, then read again while still lazy.
    puts = {k: f"new-{k}" for k in range(0, N, 97)}
    removes = list(range(5, N, 89))
    _write(store, puts, removes)
    store.commit()
    model.update(puts)
    for k in removes:
        model.pop(k, None)
    store = provider.get_store(version + 1)
    assert _read(store, keys) == model
    assert gate.downloads == 1

    # Keys above every key the snapshot holds (new keys that grow, more of them than a lazy
    # read takes) are not looked up: the read does not wait for the download.
    opened = threading.Timer(2.0, gate.open.set)
    opened.start()
    fetched = store.metrics().custom["lazyBytesRead"]
    assert _read(store, list(range(N + 100, N + 100 + 2 * MAX_LAZY_KEYS))) == {}
    assert store.metrics().custom["filesDownloaded"] == 0
    assert store.metrics().custom["lazyBytesRead"] == fetched

    # A scan needs every key: it waits for the download, then reads the completed database.
    assert {k[0]: v[0] for k, v in store.iterator()} == model
    store.abort()

    # Loaded again: complete, and a snapshot can be taken of it.
    store = provider.get_store(version + 1)
    assert {k[0]: v[0] for k, v in store.iterator()} == model
    store.put((N + 1,), ("after",))
    store.commit()
    model[N + 1] = "after"
    assert provider.snapshot_now()
    factory.close_all()
    store = _fresh(factory, lazy_restore=False).get_read_store(version + 2)
    assert {k[0]: v[0] for k, v in store.iterator()} == model
    store.abort()


@pytest.mark.parametrize("written", ["local"], indirect=True)
def test_a_worker_that_dies_while_lazy_leaves_no_partial_version(
    written: tuple[ProviderFactory, dict[int, str], int], gate: Gate
) -> None:
    factory, model, version = written
    local = factory.fresh_local_dir()
    provider = factory.open(local_dir=local)
    store = provider.get_store(version)
    store.put((7,), ("while lazy",))
    store.commit()
    model[7] = "while lazy"
    factory.close_all()  # its database holds the keys it read and wrote, and a lazy marker

    gate.open.set()
    provider = factory.open(local_dir=local, lazy_restore=False)
    store = provider.get_read_store(version + 1)
    assert store.found == "restored"  # not the partial database found on disk
    assert {k[0]: v[0] for k, v in store.iterator()} == model
    store.abort()


@pytest.mark.parametrize("written", ["local"], indirect=True)
def test_a_range_removal_while_lazy_and_stale_downloads(
    written: tuple[ProviderFactory, dict[int, str], int], gate: Gate
) -> None:
    factory, model, version = written
    provider = _fresh(factory)
    # The download of a lazy restore whose process was killed goes with the next one.
    stale = Path(provider.local.scratch_path("lazy-3_killed-0"))  # type: ignore[attr-defined]
    stale.mkdir(parents=True)
    (stale / "000009.sst").write_bytes(b"x" * 4096)
    store = provider.get_store(version)
    assert not stale.exists()
    gate.open.set()
    codec = store.column_family().key_codec
    store.remove_range(codec.encode((2000,)), codec.encode((2500,)))
    store.commit()
    model = {k: v for k, v in model.items() if not 2000 <= k < 2500}
    store = provider.get_read_store(version + 1)
    assert _read(store, list(range(N))) == model
    store.abort()


@pytest.mark.parametrize("written", ["local"], indirect=True)
def test_small_snapshots_and_the_switch_restore_whole(
    written: tuple[ProviderFactory, dict[int, str], int], gate: Gate
) -> None:
    factory, model, version = written
    gate.open.set()
    for conf in ({"lazy_restore_min_mb": 1024}, {"lazy_restore": False}):
        store = _fresh(factory, **conf).get_read_store(version)
        metrics = store.metrics().custom
        assert metrics["lazyRestores"] == 0
        assert metrics["filesDownloaded"] > 0
        assert _read(store, list(range(N))) == model
        store.abort()


@pytest.mark.parametrize("written", ["local"], indirect=True)
def test_a_reader_kept_open_restores_lazily_once_and_catches_up(
    written: tuple[ProviderFactory, dict[int, str], int], gate: Gate
) -> None:
    """A reader that follows later versions (a live reader of the checkpoint) keeps its
    provider's local copy open: the next version is caught up on the lazy database by its
    changelog, not restored again; with the copy closed between loads it is."""
    factory, model, version = written
    for keep_open, then in ((True, "caught_up"), (False, "restored")):
        provider = _fresh(factory, keep_local_open=keep_open)
        store = provider.get_read_store(version - 1)
        assert store.found == "restored"
        assert store.metrics().custom["lazyRestores"] == 1
        store.abort()
        store = provider.get_read_store(version)
        assert store.found == then
        assert _read(store, list(range(-5, N + 5))) == model
        store.abort()
        provider.close()
    gate.open.set()
