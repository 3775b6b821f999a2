"""The rocksdb provider's row counting switch (Spark's ``trackTotalNumberOfRows``)."""

from __future__ import annotations

import pytest

from sparkstate.testing.factory import ProviderFactory


@pytest.fixture
def factory(rocksdb_factory: ProviderFactory) -> ProviderFactory:
    return rocksdb_factory


def test_untracked_rows_are_reported_as_minus_one_and_counted_again_when_tracked(
    factory: ProviderFactory,
) -> None:
    untracked = factory.open(track_total_rows=False)
    store = untracked.get_store(0)
    store.put_many([(f"k{i}", i) for i in range(100)], [(i, None) for i in range(100)])
    store.remove(("k0", 0))
    version = store.commit()
    assert store.metrics().num_keys == -1
    store = untracked.get_store(version, store.checkpoint_id)
    store.put(("k1", 1), (10, "again"))  # an update, not a new row: no read needed
    store.put(("new", 0), (0, None))
    version = store.commit()
    assert store.metrics().num_keys == -1

    # Tracking turned on at a restart: the rows are counted once, then tracked.
    tracked = factory.reopen()
    store = tracked.get_store(version, store.checkpoint_id)
    assert store.metrics().num_keys == 100
    store.put(("k2", 2), (0, None))
    store.put(("k0", 0), (0, None))
    assert store.commit() == version + 1
    assert store.metrics().num_keys == 101


def test_keys_a_writer_knows_stored_or_not_are_counted_without_reads(
    factory: ProviderFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stored=`` on an encoded write spares the row count its reads; the count stays exact,
    with a key range removed and written into again in the same version."""
    provider = factory.open()
    store = provider.get_store(0)
    store.put_many([(f"k{i}", i) for i in range(10)], [(i, None) for i in range(10)])
    version = store.commit()
    store = provider.get_store(version, store.checkpoint_id)
    codec, value = store.column_family().key_codec, store.column_family().value_codec
    keys = [codec.encode((f"k{i}", i)) for i in range(12)]
    reads: list[int] = []
    multi_get = type(store._db).multi_get  # type: ignore[attr-defined]

    def counting(db: object, keys: list[bytes], **kwargs: object) -> list[bytes | None]:
        reads.append(len(keys))
        return multi_get(db, keys, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store._db), "multi_get", counting)  # type: ignore[attr-defined]
    store.remove_encoded_many(keys[:2], stored=True)  # two go
    store.put_encoded_many(keys[2:4], [value.encode((0, "x"))] * 2, stored=True)  # updates
    store.put_encoded_many(keys[10:], [value.encode((0, "y"))] * 2, stored=False)  # two come
    assert store.remove_range(keys[6], keys[8]) == 2  # k6, k7 go
    store.put_encoded_many([keys[6]], [value.encode((6, None))], stored=False)  # k6 back
    assert store.total_keys() == 10 - 2 + 2 - 2 + 1
    assert not [n for n in reads if n]
    store.commit()
    assert store.metrics().num_keys == 9
    recount = provider.get_store(version + 1, store.checkpoint_id)
    assert len(list(recount.iterator())) == 9
    recount.abort()
