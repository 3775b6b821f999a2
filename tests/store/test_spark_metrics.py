"""A store's memory follows its state, and its work is reported in Spark's metric names."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from sparkstate.store.base import StateStoreProvider, StoreMetrics
from sparkstate.store.spark_metrics import HDFS_METRICS, ROCKSDB_METRICS, combine
from sparkstate.testing.factory import ProviderFactory

LAST_SNAPSHOT = "SnapshotLastUploaded.partition_0_default"
SIZES = [1_000, 4_000, 16_000]


def grow(provider: StateStoreProvider, version: int, n: int) -> StoreMetrics:
    """Read-modify-write keys 0..n-1 at ``version`` (the ones of earlier versions exist)."""
    store = provider.get_store(version)
    keys = [(f"k{i:07d}", i) for i in range(n)]
    store.get_many(keys)
    store.put_many(keys, [(version, "v" * 24)] * n)
    store.commit()
    return store.metrics()


@pytest.fixture
def memory_factory(tmp_path: Path) -> Iterator[ProviderFactory]:
    f = ProviderFactory("memory", str(tmp_path / "ckpt"), str(tmp_path / "local"))
    yield f
    f.close_all()


def grows_with(memory: list[int], sizes: list[int], bytes_per_key: int) -> bool:
    """Whether ``memory`` grows from each size of the state to the next by ``bytes_per_key``
    or more per key added. (Not a ratio: a database's share of the process's cache includes
    blocks other databases left there.)"""
    steps = zip(pairwise(memory), pairwise(sizes), strict=True)
    return all(m1 - m0 >= bytes_per_key * (n1 - n0) for (m0, m1), (n0, n1) in steps)


def test_rocksdb_memory_grows_with_the_state_and_spark_names_count_the_work(
    rocksdb_factory: ProviderFactory,
) -> None:
    provider = rocksdb_factory.open(value_copy_mb=0)  # every lookup a read of RocksDB
    metrics = [grow(provider, v, n) for v, n in enumerate(SIZES)]
    # Nothing is flushed yet: the state is in the memtables, reported as they fill.
    assert grows_with([m.memory_used_bytes for m in metrics], SIZES, 20)
    for m, n, stored in zip(metrics, SIZES, [0, *SIZES], strict=False):
        c = m.custom
        assert set(ROCKSDB_METRICS) <= set(c)
        assert all(c[name] >= 0 for name in ROCKSDB_METRICS)
        assert c["rocksdbPutCount"] == n  # each key once, in the commit's write
        # The stored keys are looked up; a key above the largest stored one needs no lookup.
        assert c["rocksdbGetCount"] == stored
        assert (c["rocksdbTotalBytesRead"] > 0) == (stored > 0)
        assert c["rocksdbTotalBytesWritten"] > 0
        assert c["rocksdbSstFileSize"] == 0 and c[LAST_SNAPSHOT] == -1


def test_rocksdb_snapshot_flush_upload_and_restore_in_spark_names(
    rocksdb_factory: ProviderFactory,
) -> None:
    provider = rocksdb_factory.open(min_deltas_for_snapshot=1)
    c = grow(provider, 0, SIZES[1]).custom  # a snapshot is due: the commit flushes
    assert c["rocksdbSstFileSize"] > 0 and c["rocksdbTotalBytesWrittenByFlush"] > 0
    assert c["rocksdbCommitFlushLatency"] > 0 and c["rocksdbCommitCheckpointLatency"] > 0
    provider.do_maintenance()  # uploads it
    c = grow(provider, 1, SIZES[1]).custom  # the upload shows in the next batch
    assert c["rocksdbFilesCopied"] >= 1 and c["rocksdbBytesCopied"] > 0
    assert c[LAST_SNAPSHOT] == 1
    # Another executor restores version 1 and replays the changelog of version 2.
    elsewhere = rocksdb_factory.open(local_dir=rocksdb_factory.fresh_local_dir())
    store = elsewhere.get_store(2)
    store.commit()
    c = store.metrics().custom
    assert c["rocksdbLoadFromSnapshotLatencyMs"] > 0 and c["rocksdbNumReplayChangelogFiles"] == 1
    assert c["rocksdbFilesCopied"] >= 1 and c[LAST_SNAPSHOT] == 1
    assert store.metrics().memory_used_bytes > 0


def test_memory_provider_reports_its_cached_versions_as_spark_does(
    memory_factory: ProviderFactory,
) -> None:
    provider = memory_factory.open()
    metrics = [grow(provider, v, n) for v, n in enumerate(SIZES)]
    memory = [m.memory_used_bytes for m in metrics]
    current = [int(m.custom["stateOnCurrentVersionSizeBytes"]) for m in metrics]
    assert grows_with(memory, SIZES, 50) and grows_with(current, SIZES, 50)
    # Two versions are cached (the default), sharing the key and value objects not rewritten.
    assert all(c < m for c, m in zip(current[1:], memory[1:], strict=True))
    for m, hits in zip(metrics, [0, 1, 2], strict=True):
        assert set(HDFS_METRICS) <= set(m.custom)
        assert m.custom["loadedMapCacheHitCount"] == hits  # since the provider was made
        assert m.custom["loadedMapCacheMissCount"] == 0 and m.custom[LAST_SNAPSHOT] == -1
    restarted = memory_factory.reopen()
    store = restarted.get_store(3)
    assert store.metrics().custom["loadedMapCacheMissCount"] == 1
    reloaded = store.metrics().custom["stateOnCurrentVersionSizeBytes"]
    assert reloaded == pytest.approx(current[-1], rel=0.2)  # a map grown, not copied


def test_progress_sums_partitions_whole_milliseconds_and_the_lowest_instance_metrics() -> None:
    parts = [
        {
            "rocksdbGetCount": 10.0,
            "rocksdbGetLatency": 0.4,
            f"SnapshotLastUploaded.partition_{p}_default": float(p % 4),
        }
        for p in range(8)
    ]
    out = combine(parts)
    assert out["rocksdbGetCount"] == 80 and out["rocksdbGetLatency"] == 3  # 3.2 ms
    shown = sorted(n for n in out if n.startswith("SnapshotLastUploaded"))
    assert len(shown) == 5  # the five lowest: partitions 0, 4, 1, 5 and one of 2, 6
    assert {out[n] for n in shown} == {0.0, 1.0, 2.0}
