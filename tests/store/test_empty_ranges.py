"""Ranges a version emptied (``StateStore.mark_removed``) and where the next version's scans
start (``scan_start``).

An eviction removes every key of a family from its start up to the watermark; the next
eviction's scan starts past them, so that RocksDB's tombstones of the keys removed are not
walked again. These tests pin that a scan never skips a key that is there: a key written into
a range narrows it, in the same version or a later one, a version opened elsewhere knows no
range, and an aborted version's ranges are not handed on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from sparkstate.store.base import StateStore
from sparkstate.testing import ProviderFactory

PROVIDERS = ["memory", "rocksdb"]

KEY = pa.schema([("t", pa.int64())])
VALUE = pa.schema([("v", pa.int64())])
INDEX = "index"


@pytest.fixture(params=PROVIDERS)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProviderFactory]:
    factory = ProviderFactory(
        request.param,
        str(tmp_path / "checkpoint"),
        str(tmp_path / "local"),
        key_schema=KEY,
        value_schema=VALUE,
        column_families={INDEX: (KEY, VALUE)},
    )
    yield factory
    factory.close_all()


def _k(store: StateStore, t: int) -> bytes:
    return store.column_family().key_codec.encode((t,))


def _put(store: StateStore, times: list[int], cf: str = "default") -> None:
    fam = store.column_family(cf)
    keys = fam.key_codec.encode_many([(t,) for t in times])
    store.put_encoded_many(keys, fam.value_codec.encode_many([(t,) for t in times]), cf)


def _evict(store: StateStore, up_to: int, cf: str = "default") -> list[int]:
    """What an operator's eviction does: scan from the family's start (where the store says),
    remove what it found, say the range is empty. The times it removed."""
    fam = store.column_family(cf)
    end = fam.key_codec.encode((up_to + 1,))
    found = [
        k
        for keys, _ in store.range_scan_encoded_chunks(store.scan_start(None, cf), end, cf)
        for k in keys
    ]
    store.remove_encoded_many(found, cf)
    store.mark_removed(None, end, cf)
    return [fam.key_codec.decode(k)[0] for k in found]


def _all(store: StateStore, cf: str = "default") -> list[int]:
    fam = store.column_family(cf)
    return [
        fam.key_codec.decode(k)[0]
        for keys, _ in store.range_scan_encoded_chunks(cf=cf)
        for k in keys
    ]


def test_the_next_version_scans_past_what_an_eviction_emptied(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    _put(store, list(range(10)))
    assert _evict(store, 4) == [0, 1, 2, 3, 4]
    assert store.scan_start(None) == _k(store, 5)
    store.commit()

    store = provider.get_store(1)
    assert store.scan_start(None) == _k(store, 5)  # handed on with the version
    assert store.scan_start(b"\x00") == b"\x00"  # only a scan from where the range starts
    assert store.scan_start(None, INDEX) is None  # and only in its family
    _put(store, [12])
    assert _evict(store, 7) == [5, 6, 7]
    store.commit()

    store = provider.get_store(2)
    assert store.scan_start(None) == _k(store, 8)
    assert _all(store) == [8, 9, 12]
    store.abort()


def test_a_key_written_into_an_empty_range_is_scanned(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    _put(store, [1, 2, 3, 8])
    assert _evict(store, 5) == [1, 2, 3]
    _put(store, [4])  # the same version, after the eviction
    assert store.scan_start(None) == _k(store, 4)
    store.commit()

    store = provider.get_store(1)
    assert store.scan_start(None) == _k(store, 4)
    _put(store, [0])  # a later version, below every key
    assert store.scan_start(None) == _k(store, 0)
    assert _evict(store, 5) == [0, 4]
    store.commit()
    assert _all(provider.get_read_store(2)) == [8]


def test_only_the_version_committed_hands_its_ranges_on(factory: ProviderFactory) -> None:
    provider = factory.open()
    store = provider.get_store(0)
    _put(store, [1, 2, 9])
    _evict(store, 5)
    store.commit()

    store = provider.get_store(1)  # an attempt that fails: its eviction is not kept
    _put(store, [3])
    _evict(store, 8)
    store.abort()
    store = provider.get_store(1)
    assert store.scan_start(None) == _k(store, 6)
    assert _evict(store, 8) == []
    store.abort()

    other = factory.reopen().get_store(1)  # a worker that loads the version from the files
    assert other.scan_start(None) is None
    assert _all(other) == [9]
    other.abort()
