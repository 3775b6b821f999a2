"""Removing a key range (``StateStore.remove_range``): an eviction up to the watermark as one
range deletion.

The built-in providers record the range as one record of the version's changelog (and the
rocksdb provider applies it as one RocksDB range deletion) instead of a delete per key. These
tests pin that the state is what deleting each key would make: in the version itself (reads,
scans, the row count), after the commit, after an abort, replayed from the changelogs by a
worker that starts from nothing, from a snapshot taken after it, and in the change feed, which
lists each key removed.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from sparkstate.store.base import StateStore, StateStoreProvider
from sparkstate.store.capabilities import ReadsChanges
from sparkstate.store.versions.changelog import ranges_of
from sparkstate.store.versions.versioned import VersionedProvider
from sparkstate.testing import ProviderFactory

KEY = pa.schema([("t", pa.int64())])
VALUE = pa.schema([("v", pa.int64())])
INDEX = "index"

#: (provider, conf): the rocksdb provider with and without its copy of the values in memory.
SETUPS = {
    "memory": ("memory", {}),
    "rocksdb": ("rocksdb", {}),
    "rocksdb-no-copy": ("rocksdb", {"value_copy_mb": 0}),
}


@pytest.fixture(params=list(SETUPS))
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProviderFactory]:
    name, conf = SETUPS[request.param]
    factory = ProviderFactory(
        name,
        str(tmp_path / "checkpoint"),
        str(tmp_path / "local"),
        key_schema=KEY,
        value_schema=VALUE,
        column_families={INDEX: (KEY, VALUE)},
        conf=conf,
    )
    yield factory
    factory.close_all()


def _enc(store: StateStore, t: int) -> bytes:
    return store.column_family().key_codec.encode((t,))


def _put(store: StateStore, times: list[int], cf: str = "default", value: int = 0) -> None:
    fam = store.column_family(cf)
    keys = fam.key_codec.encode_many([(t,) for t in times])
    store.put_encoded_many(keys, fam.value_codec.encode_many([(t + value,) for t in times]), cf)


def _state(store: StateStore, cf: str = "default") -> dict[int, int]:
    return {k[0]: v[0] for k, v in store.iterator(cf)}


def _remove_up_to(store: StateStore, up_to: int, cf: str = "default") -> int:
    return store.remove_range(None, _enc(store, up_to + 1), cf)


def _committed(provider: StateStoreProvider, version: int) -> dict[str, dict[int, int]]:
    store = provider.get_read_store(version)
    try:
        return {cf: _state(store, cf) for cf in ("default", INDEX)}
    finally:
        store.abort()


def test_a_removed_range_is_gone_in_the_version_and_after_its_commit(
    factory: ProviderFactory,
) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    _put(store, list(range(10)))
    _put(store, [1, 2], INDEX)
    store.commit()

    store = provider.get_store(1)
    _put(store, [3], value=100)  # written, then removed by the range
    store.remove_encoded_many([_enc(store, 4)])  # removed twice
    _put(store, [20])
    assert _remove_up_to(store, 5) == 5  # 0..5 but 4, already removed
    _put(store, [2], value=200)  # written into the range after its removal: kept
    assert store.get((3,)) is None and store.get((2,)) == (202,)
    assert store.get_encoded_many([_enc(store, t) for t in (0, 2, 6)]) == [
        None,
        store.column_family().value_codec.encode((202,)),
        store.column_family().value_codec.encode((6,)),
    ]
    assert _state(store) == {2: 202, 6: 6, 7: 7, 8: 8, 9: 9, 20: 20}
    assert list(store.range_scan(None, (7,))) == [((2,), (202,)), ((6,), (6,))]
    assert store.scan_start(None) == _enc(store, 2)  # the key written there narrows the range
    assert _state(store, INDEX) == {1: 1, 2: 2}  # the other family keeps its keys
    assert store.total_keys() == 6 + 2
    assert store.metrics().num_removed == 1 + 5
    store.commit()

    assert _committed(provider, 2) == {
        "default": {2: 202, 6: 6, 7: 7, 8: 8, 9: 9, 20: 20},
        INDEX: {1: 1, 2: 2},
    }
    store = provider.get_store(2)
    assert store.total_keys() == 8
    assert _remove_up_to(store, 100) == 6
    assert _remove_up_to(store, 100, INDEX) == 2
    assert store.total_keys() == 0
    store.commit()
    assert _committed(provider, 3) == {"default": {}, INDEX: {}}


def test_a_version_records_a_range_as_one_record(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    _put(store, list(range(1000)))
    store.commit()
    store = provider.get_store(1)
    _remove_up_to(store, 899)
    _put(store, [5000])
    store.commit()
    assert isinstance(provider, VersionedProvider)
    index = provider.index()
    log = provider.read_changelog(index.resolve(2, None, provider.delta_ext, "test"))
    assert log.header["count"] == 1  # the put, and no row per key removed
    prefix = store.column_family().prefix
    assert log.delete_ranges == [(prefix, prefix + _enc(store, 900))]
    assert ranges_of({}) == []  # a file written before ranges existed removed none
    if "num_keys" in log.header:
        assert log.header["num_keys"] == 101


def test_an_aborted_range_removal_changes_nothing(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    _put(store, [1, 2, 3, 8])
    store.commit()
    store = provider.get_store(1)
    _remove_up_to(store, 5)
    store.abort()
    store = provider.get_store(1)
    assert _state(store) == {1: 1, 2: 2, 3: 3, 8: 8}
    assert store.scan_start(None) is None
    assert store.total_keys() == 4
    store.commit()
    assert _committed(provider, 2)["default"] == {1: 1, 2: 2, 3: 3, 8: 8}


def _three_versions(provider: StateStoreProvider) -> dict[str, dict[int, int]]:
    """Puts; a range removed with a key written back into it; more puts and a second range."""
    store = provider.get_store(0)
    _put(store, list(range(20)))
    _put(store, list(range(5)), INDEX)
    store.commit()
    store = provider.get_store(1)
    _remove_up_to(store, 9)
    _put(store, [4], value=40)
    _remove_up_to(store, 2, INDEX)
    store.commit()
    store = provider.get_store(2)
    _put(store, [30, 31])
    _remove_up_to(store, 12)
    store.commit()
    return {
        "default": {t: t for t in (*range(13, 20), 30, 31)},
        INDEX: {3: 3, 4: 4},
    }


def test_a_worker_with_nothing_replays_ranges_from_the_changelogs(
    factory: ProviderFactory,
) -> None:
    want = _three_versions(factory.open())
    provider = factory.reopen(local_dir=factory.fresh_local_dir())
    assert _committed(provider, 3) == want
    assert _committed(provider, 2)["default"] == {4: 44, **{t: t for t in range(10, 20)}}
    store = provider.get_store(3)
    assert store.total_keys() == 9 + 2
    store.abort()


def test_a_snapshot_taken_after_a_range_removal_holds_the_state(
    factory: ProviderFactory,
) -> None:
    provider = factory.open(min_deltas_for_snapshot=1)
    want = _three_versions(provider)
    provider.do_maintenance()
    assert isinstance(provider, VersionedProvider)
    assert provider.describe_files().snapshots.files >= 1
    # The changelogs of the ranges are gone: version 3 loads from its snapshot.
    for version in (1, 2):
        for path in glob.glob(f"{factory.checkpoint_root}/**/{version}_*.*", recursive=True):
            if path.endswith((".changelog", ".delta")):
                os.remove(path)
    provider = factory.reopen(local_dir=factory.fresh_local_dir())
    assert _committed(provider, 3) == want
    store = provider.get_store(3)
    assert store.total_keys() == 9 + 2
    store.abort()


def test_the_change_feed_lists_each_key_a_range_removed(factory: ProviderFactory) -> None:
    provider = factory.open()
    _three_versions(provider)
    changes = ReadsChanges.of(provider)
    assert changes is not None
    codec = changes.families["default"].value_codec

    def feed(version: int, cf: str = "default") -> dict[int, int | None]:
        fam = changes.families[cf]
        out: dict[int, int | None] = {}
        for keys, values in changes.read_changes(version, None, cf, chunk_rows=3):
            for k, v in zip(keys, values, strict=True):
                t = fam.key_codec.decode(k)[0]
                assert t not in out, f"key {t} listed twice"
                out[t] = None if v is None else codec.decode(v)[0]
        return out

    assert feed(2) == {**dict.fromkeys([0, 1, 2, 3, 5, 6, 7, 8, 9]), 4: 44}
    assert feed(2, INDEX) == dict.fromkeys([0, 1, 2])
    assert feed(3) == {30: 30, 31: 31, **dict.fromkeys([4, 10, 11, 12])}
    assert feed(3, INDEX) == {}
