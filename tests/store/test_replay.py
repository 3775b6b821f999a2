"""A load that catches up replays its changelogs one at a time.

Every changelog the load needs is checked first (lineage, checksum), so a missing or damaged file
fails before anything is applied; then each is read, applied and dropped before the next is read.
A changelog whose rows turn out unreadable during the replay (its checksum right) fails the load
with the versions before it applied: the rocksdb local copy says it holds the last of those, the
memory provider caches nothing of the failed load, and the next load gives the right state.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkstate.exceptions import CorruptStateFileError
from sparkstate.store.base import StateStoreProvider
from sparkstate.store.families import Row
from sparkstate.store.frames import decode_frame, encode_frame
from sparkstate.store.versions.changelog import (
    CHUNK_ROWS,
    ChangelogReader,
    decode_changelog,
    encode_changelog,
)
from sparkstate.testing.factory import ProviderFactory, apply_changes, durable_files, read_all

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb.provider") is not None
PROVIDERS = [
    "memory",
    pytest.param(
        "rocksdb",
        marks=pytest.mark.skipif(
            not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb.provider not landed"
        ),
    ),
]
VERSIONS = 6


def _changes(v: int) -> tuple[dict[Row, Row], list[Row]]:
    puts: dict[Row, Row] = {("k", i): (v * 100 + i, f"v{v}") for i in range(v, v + 40)}
    return puts, [("k", v - 1), ("k", v + 7)]


def _states() -> list[dict[Row, Row]]:
    states: list[dict[Row, Row]] = [{}]
    for v in range(1, VERSIONS + 1):
        states.append(apply_changes(states[-1], *_changes(v)))
    return states


@pytest.fixture(params=PROVIDERS)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProviderFactory]:
    """A checkpoint of versions 1..6 without snapshots: a load replays changelogs only."""
    conf = {"min_deltas_for_snapshot": 100}
    made = ProviderFactory(
        request.param, str(tmp_path / "root"), str(tmp_path / "local"), conf=conf
    )
    writer = made.open()
    for v in range(1, VERSIONS + 1):
        store = writer.get_store(v - 1)
        puts, removes = _changes(v)
        store.put_many(list(puts), list(puts.values()))
        store.remove_many(removes)
        store.commit()
    made.close_all()
    yield made
    made.close_all()


def _worker_at(factory: ProviderFactory, version: int) -> StateStoreProvider:
    """A provider of another worker whose copy of the state (local DB, cache) is at ``version``."""
    provider = factory.open(local_dir=factory.fresh_local_dir())
    assert read_all(provider.get_read_store(version))["default"] == _states()[version]
    return provider


def _load(provider: StateStoreProvider, version: int) -> dict[Row, Row]:
    return read_all(provider.get_read_store(version))["default"]


def _replayed(provider: StateStoreProvider) -> float:
    """Changelogs the rocksdb provider replayed so far (the memory provider does not count)."""
    counters = getattr(provider, "custom_metrics", None)
    return float(counters()["changelogsReplayed"]) if counters is not None else 0.0


def _changelog_path(factory: ProviderFactory, version: int) -> str:
    ext = "delta" if factory.provider_cls.name == "memory" else "changelog"
    (name,) = [n for v, _, n in durable_files(factory.store_id, ext) if v == version]
    return os.path.join(factory.checkpoint_root, factory.store_id.relative_dir, name)


def _cut_rows_after_first_batch(factory: ProviderFactory, version: int) -> bytes:
    """Rewrite a changelog as two record batches with the second cut short, its checksum right
    (as a faulty writer would leave it); returns the original bytes."""
    path = _changelog_path(factory, version)
    kind = factory.provider_cls.delta_kind  # type: ignore[attr-defined]
    original = Path(path).read_bytes()
    log = decode_changelog(kind, original, path)
    half = (len(log.keys) + 1) // 2
    split = encode_changelog(kind, log.header, log.keys, log.values, "none", batch_rows=half)
    payload = decode_frame(kind, split, path)
    Path(path).write_bytes(encode_frame(kind, payload[:-40], "zstd"))  # into the second batch
    return original


@pytest.mark.parametrize("start", [0, 1])
def test_catch_up_decodes_one_changelog_at_a_time(
    factory: ProviderFactory, start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = _worker_at(factory, start)
    chunks = ChangelogReader.chunks
    decoding: list[str] = []
    most = 0
    decoded: list[str] = []

    def counted(self: ChangelogReader, max_rows: int | None = CHUNK_ROWS) -> Iterator[object]:
        nonlocal most
        decoding.append(self.where)
        decoded.append(self.where)
        most = max(most, len(decoding))
        try:
            yield from chunks(self, max_rows)
        finally:
            decoding.remove(self.where)

    monkeypatch.setattr(ChangelogReader, "chunks", counted)
    assert _load(provider, VERSIONS) == _states()[VERSIONS]
    assert most == 1
    replayed = [_changelog_path(factory, v) for v in range(start + 1, VERSIONS + 1)]
    assert [os.path.basename(w) for w in decoded] == [os.path.basename(p) for p in replayed]


def test_damaged_later_changelog_fails_before_anything_is_applied(
    factory: ProviderFactory,
) -> None:
    provider = _worker_at(factory, 1)
    path = _changelog_path(factory, 4)
    data = bytearray(Path(path).read_bytes())
    data[-5] ^= 0x10
    Path(path).write_bytes(bytes(data))
    before = _replayed(provider)
    with pytest.raises(CorruptStateFileError, match=os.path.basename(path)):
        _load(provider, 5)
    assert _replayed(provider) == before  # found by the checks before the replay
    assert _load(provider, 3) == _states()[3]


def test_changelog_unreadable_during_replay_leaves_the_last_good_version(
    factory: ProviderFactory,
) -> None:
    provider = _worker_at(factory, 1)
    path = _changelog_path(factory, 4)
    original = _cut_rows_after_first_batch(factory, 4)
    for _ in range(2):  # a retry fails the same way: nothing holds or claims version 4 or 5
        with pytest.raises(CorruptStateFileError, match=os.path.basename(path)):
            _load(provider, 5)
    replayed = _replayed(provider)
    assert _load(provider, 3) == _states()[3]
    if factory.provider_cls.name == "rocksdb":  # the local copy held version 3 already
        assert _replayed(provider) == replayed
    assert _load(provider, 1) == _states()[1]  # the memory provider's cached base is intact
    Path(path).write_bytes(original)
    assert _load(provider, 5) == _states()[5]
    assert _load(factory.open(local_dir=factory.fresh_local_dir()), 5) == _states()[5]
