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
