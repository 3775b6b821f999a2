"""Damaged durable files: truncated and bit-flipped changelogs, deltas, snapshots and SST files.

A damaged changelog (rocksdb) or delta (memory) fails the load with ``CorruptStateFileError``
naming the file. A damaged snapshot, or a damaged SST file of a rocksdb snapshot, is skipped in
favour of an older snapshot plus changelogs: the load succeeds with the right data, and the skip is
reported (the ``corruptSnapshotsSkipped`` custom metric and a warning naming the file). Every load
here runs on a new provider instance with an empty local directory, so it reads durable files.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkstate.exceptions import CorruptStateFileError, MissingVersionError, StateFileError
from sparkstate.store.base import StateStoreProvider
from sparkstate.store.families import Row
from sparkstate.store.frames import HEADER_SIZE
from sparkstate.testing.factory import ProviderFactory, apply_changes, durable_files, read_all

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb.provider") is not None
ROCKSDB = pytest.param(
    "rocksdb",
    marks=pytest.mark.skipif(
        not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb.provider not landed"
    ),
)
PROVIDERS = ["memory", ROCKSDB]
CONF = {"min_deltas_for_snapshot": 2}
VERSIONS = 6  # snapshots at 2, 4 and 6


def _truncate_half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _truncate_header(data: bytes) -> bytes:
    return data[: HEADER_SIZE - 1]


def _empty(data: bytes) -> bytes:
    return b""


def _flip_payload_bit(data: bytes) -> bytes:
    i = max(HEADER_SIZE, len(data) * 2 // 3)
    return data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1 :]


def _flip_header_bit(data: bytes) -> bytes:
    return bytes([data[0] ^ 0x01]) + data[1:]


def _append_garbage(data: bytes) -> bytes:
    return data + b"\x00garbage"


def _not_utf8(data: bytes) -> bytes:
    return data[:4] + b"\xc3\x28" + data[6:]


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated-half": _truncate_half,
    "truncated-header": _truncate_header,
    "empty": _empty,
    "bit-flip-payload": _flip_payload_bit,
    "bit-flip-header": _flip_header_bit,
    "trailing-garbage": _append_garbage,
    "not-utf8": _not_utf8,
}


def _damage(path: str, how: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(DAMAGE[how](data))


def _states() -> list[dict[Row, Row]]:
    states: list[dict[Row, Row]] = [{}]
    for v in range(1, VERSIONS + 1):
        states.append(apply_changes(states[-1], *_changes(v)))
    return states


def _changes(v: int) -> tuple[dict[Row, Row], list[Row]]:
    puts: dict[Row, Row] = {("k", i): (v * 100 + i, f"v{v}") for i in range(v, v + 30)}
    return puts, [("k", v - 1), ("k", v + 5)]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per provider, a checkpoint with versions 1..6 and snapshots at 2, 4 and 6, made once."""
    out = {}
    for provider in ("memory", "rocksdb") if HAVE_ROCKSDB else ("memory",):
        base = tmp_path_factory.mktemp(f"pristine-{provider}")
        factory = ProviderFactory(provider, str(base / "root"), str(base / "local"), conf=CONF)
        p = factory.open()
        for v in range(1, VERSIONS + 1):
            store = p.get_store(v - 1)
            puts, removes = _changes(v)
            store.put_many(list(puts), list(puts.values()))
            store.remove_many(removes)
            store.commit()
            p.do_maintenance()
        factory.close_all()
        snapshots = [v for v, _, _ in durable_files(factory.store_id, "snapshot")]
        assert snapshots == [2, 4, 6], snapshots
        out[provider] = base / "root"
    return out


@pytest.fixture
def checkpoint(
    request: pytest.FixtureRequest, pristine: dict[str, Path], tmp_path: Path
) -> Iterator[ProviderFactory]:
    """A copy of the pristine checkpoint of the provider under test, to damage."""
    provider: str = request.param
    shutil.copytree(pristine[provider], tmp_path / "root")
    factory = ProviderFactory(provider, str(tmp_path / "root"), str(tmp_path / "local"), conf=CONF)
    yield factory
    factory.close_all()


def _path(factory: ProviderFactory, name: str) -> str:
    return os.path.join(factory.checkpoint_root, factory.store_id.relative_dir, name)


def _file(factory: ProviderFactory, version: int, ext: str) -> str:
    (name,) = [n for v, _, n in durable_files(factory.store_id, ext) if v == version]
    return name


def _delta_ext(factory: ProviderFactory) -> str:
    return "delta" if factory.provider_cls.name == "memory" else "changelog"


def _load(factory: ProviderFactory, version: int) -> tuple[dict[Row, Row], dict[str, float]]:
    provider = factory.reopen(local_dir=factory.fresh_local_dir())
    store = provider.get_read_store(version)
    return read_all(store)["default"], store.metrics().custom


@pytest.mark.parametrize("checkpoint", PROVIDERS, indirect=True)
@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_changelog_fails_naming_the_file(checkpoint: ProviderFactory, how: str) -> None:
    name = _file(checkpoint, 5, _delta_ext(checkpoint))
    _damage(_path(checkpoint, name), how)
    with pytest.raises(CorruptStateFileError) as info:
        _load(checkpoint, 5)
    assert name in str(info.value)
    # Versions that do not need the damaged file still load.
    states = _states()
    assert _load(checkpoint, 4)[0] == states[4]
    assert _load(checkpoint, 6)[0] == states[6]


@pytest.mark.parametrize("checkpoint", PROVIDERS, indirect=True)
@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_snapshot_is_skipped(
    checkpoint: ProviderFactory, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = _file(checkpoint, 6, "snapshot")
    _damage(_path(checkpoint, name), how)
    with caplog.at_level(logging.WARNING, logger="sparkstate"):
        data, custom = _load(checkpoint, 6)
    assert data == _states()[6]
    assert custom["corruptSnapshotsSkipped"] >= 1
    assert any(name in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("checkpoint", PROVIDERS, indirect=True)
def test_every_snapshot_damaged_falls_back_to_changelogs(
    checkpoint: ProviderFactory, caplog: pytest.LogCaptureFixture
) -> None:
    for v in (2, 4, 6):
        _damage(_path(checkpoint, _file(checkpoint, v, "snapshot")), "bit-flip-payload")
    with caplog.at_level(logging.WARNING, logger="sparkstate"):
        data, custom = _load(checkpoint, 6)
    assert data == _states()[6]
    assert custom["corruptSnapshotsSkipped"] == 3


@pytest.mark.parametrize("checkpoint", PROVIDERS, indirect=True)
def test_damaged_snapshot_without_fallback_names_the_file(checkpoint: ProviderFactory) -> None:
    """With the changelogs before the snapshot gone (retention), the error names the snapshot."""
    snapshot = _file(checkpoint, 4, "snapshot")
    _damage(_path(checkpoint, snapshot), "bit-flip-payload")
    for v in (1, 2, 3):
        os.remove(_path(checkpoint, _file(checkpoint, v, _delta_ext(checkpoint))))
        if v == 2:
            os.remove(_path(checkpoint, _file(checkpoint, v, "snapshot")))
    with pytest.raises(StateFileError) as info:
        _load(checkpoint, 5)
    assert isinstance(info.value, CorruptStateFileError), repr(info.value)
    assert snapshot in str(info.value)


def _sst_objects(factory: ProviderFactory) -> list[str]:
    sst_dir = _path(factory, "sst")
    return sorted(os.listdir(sst_dir))


def _snapshot_objects(factory: ProviderFactory, version: int) -> set[str]:
    """The SST objects the (only) rocksdb snapshot of ``version`` names."""
    ((_, ckpt, _),) = [f for f in durable_files(factory.store_id, "snapshot") if f[0] == version]
    return _snapshot_objects_of(factory, version, ckpt)


@pytest.mark.parametrize("checkpoint", [ROCKSDB], indirect=True)
@pytest.mark.parametrize("how", ["truncated-half", "bit-flip-payload", "empty", "trailing-garbage"])
def test_damaged_sst_file_is_skipped(
    checkpoint: ProviderFactory, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every SST object damaged in turn: the load skips the snapshots that use it."""
    states = _states()
    used_by_6 = _snapshot_objects(checkpoint, 6)
    for obj in _sst_objects(checkpoint):
        path = Path(_path(checkpoint, f"sst/{obj}"))
        saved = path.read_bytes()
        _damage(str(path), how)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sparkstate"):
            data, custom = _load(checkpoint, 6)
        assert data == states[6], obj
        if obj in used_by_6:
            assert custom["corruptSnapshotsSkipped"] >= 1, obj
            assert any(obj in r.getMessage() for r in caplog.records), caplog.text
        path.write_bytes(saved)


@pytest.mark.parametrize("checkpoint", [ROCKSDB], indirect=True)
def test_damaged_sst_without_fallback_names_the_file(checkpoint: ProviderFactory) -> None:
    for v in range(1, 6):
        os.remove(_path(checkpoint, _file(checkpoint, v, "changelog")))
    for v in (2, 4):
        os.remove(_path(checkpoint, _file(checkpoint, v, "snapshot")))
    for obj in _sst_objects(checkpoint):
        _damage(_path(checkpoint, f"sst/{obj}"), "bit-flip-payload")
    with pytest.raises(CorruptStateFileError) as info:
        _load(checkpoint, 6)
    assert any(obj in str(info.value) for obj in _sst_objects(checkpoint)), str(info.value)


RESTORE = "Restore it from a backup of the checkpoint, or start the query from a new checkpoint"


@pytest.mark.parametrize("checkpoint", PROVIDERS, indirect=True)
@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("truncated-half", "is not valid JSON (it ends too early: truncated?)"),
        ("empty", "is empty"),
        ("trailing-garbage", "is not valid JSON: Extra data"),
        ("not-utf8", "is not UTF-8 (byte 0xc3 at offset 4)"),
    ],
)
def test_damaged_schema_file_names_the_file(
    checkpoint: ProviderFactory, how: str, says: str
) -> None:
    path = _path(checkpoint, "_schema.json")
    _damage(path, how)
    with pytest.raises(CorruptStateFileError) as info:
        checkpoint.open()
    assert f"corrupt state file {path}: {says}" in str(info.value)
    assert RESTORE in str(info.value)


@pytest.mark.parametrize("checkpoint", ["memory"], indirect=True)
@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["column_families"]["default"].pop("key"), "lacks field 'key'"),
        (lambda d: d.update(column_families=[]), "'column_families' is not a JSON object"),
        (
            lambda d: d["column_families"]["default"].update(value=[["v", 1]]),
            "malformed state schema description",
        ),
    ],
)
def test_schema_file_of_the_wrong_shape_names_the_file(
    checkpoint: ProviderFactory, edit: Callable[[dict[str, Any]], object], says: str
) -> None:
    path = Path(_path(checkpoint, "_schema.json"))
    described = json.loads(path.read_text())
    edit(described)
    path.write_text(json.dumps(described))
    with pytest.raises(CorruptStateFileError) as info:
        checkpoint.open()
    assert f"corrupt state file {path}: " in str(info.value)
    assert says in str(info.value) and RESTORE in str(info.value)


@pytest.mark.parametrize("checkpoint", PROVIDERS, indirect=True)
def test_lost_schema_file_is_not_made_anew_over_committed_versions(
    checkpoint: ProviderFactory,
) -> None:
    """Without it, values of an evolved schema cannot be read: refused, naming the file."""
    path = _path(checkpoint, "_schema.json")
    os.remove(path)
    with pytest.raises(MissingVersionError) as info:
        checkpoint.open()
    assert f"{path} is missing, but the store holds committed versions" in str(info.value)
    assert RESTORE in str(info.value) and not os.path.exists(path)


@pytest.mark.skipif(not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb.provider not landed")
def test_snapshot_uploaded_after_a_restore_keeps_its_own_sst_files(tmp_path: Path) -> None:
    conf = {"min_deltas_for_snapshot": 3, "compression": "none"}
    factory = ProviderFactory("rocksdb", str(tmp_path / "root"), str(tmp_path / "a"), conf=conf)

    def commit(provider: StateStoreProvider, version: int, value: int) -> str:
        store = provider.get_store(version)
        store.put_many([("k", i) for i in range(20)], [(value, "x")] * 20)
        store.commit()
        assert store.checkpoint_id is not None
        return store.checkpoint_id

    try:
        first = factory.open()
        commit(first, 0, 1)
        commit(first, 1, 2)
        mine = commit(first, 2, 3)  # a snapshot is due: checkpoint taken, upload at maintenance
        other = factory.open(local_dir=factory.fresh_local_dir())  # another executor
        theirs = commit(other, 2, 4)  # re-commits version 3, uploads its snapshot
        other.do_maintenance()
        first.get_store(3).abort()  # the newest attempt of 3 is theirs: restored from it
        first.do_maintenance()  # uploads the checkpoint taken at "mine"
    finally:
        factory.close_all()
    # The two databases have SST files of the same number and size (compression "none"): the
    # snapshot of each must still name only its own uploads.
    shared = _snapshot_objects_of(factory, 3, mine) & _snapshot_objects_of(factory, 3, theirs)
    assert not shared
    provider = factory.reopen(local_dir=factory.fresh_local_dir())
    want = {("k", i): (3, "x") for i in range(20)}
    assert read_all(provider.get_read_store(3, mine))["default"] == want
    want = {("k", i): (4, "x") for i in range(20)}
    assert read_all(provider.get_read_store(3, theirs))["default"] == want
    factory.close_all()


def _snapshot_objects_of(factory: ProviderFactory, version: int, checkpoint_id: str) -> set[str]:
    """The SST objects the rocksdb snapshot of ``version`` attempt ``checkpoint_id`` names."""
    from sparkstate.files.durable import DurableDir
    from sparkstate.store.rocksdb.snapshot import read_manifest
    from sparkstate.store.versions.layout import VersionRef

    directory = DurableDir(factory.checkpoint_root).child(factory.store_id.relative_dir)
    manifest = read_manifest(directory, VersionRef(version, checkpoint_id))
    return {e["object"] for e in manifest["sst"].values()}
