"""A query's progress: ``memoryUsedBytes`` grows with the state, and ``customMetrics`` carries
Spark's names for what the stores did."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.store.spark_metrics import HDFS_METRICS, ROCKSDB_METRICS

from .conftest import PARTITIONS, PROVIDERS, FileFeed
from .helpers import run_batches, source

#: Keys 0..n-1 per batch: each batch touches the keys of the one before and four times as many.
SIZES = [3_000, 12_000, 48_000]
#: The rocksdb provider takes a snapshot at version 4: its commit (batch 3) flushes.
SNAPSHOT_AT = len(SIZES) + 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_memory_follows_the_state_and_spark_names_describe_the_batch(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    q = (
        ss.stream(source(spark, feed, "k string"))
        .groupBy("k")
        .agg(SF.count("*").alias("n"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("stateStore", provider)
        .option("stateStore.min_deltas_for_snapshot", str(SNAPSHOT_AT))
        .start()
    )
    ops: list[dict[str, Any]] = []
    batches = [[{"k": f"k{i:06d}"} for i in range(n)] for n in [*SIZES, SIZES[-1]]]
    run_batches(
        feed, q, batches, on_batch=lambda _: ops.append(q.lastProgress["stateOperators"][0])
    )
    growing = ops[: len(SIZES)]
    assert [op["numRowsTotal"] for op in growing] == SIZES
    # Each batch adds keys: memory grows by 20 bytes a key or more. (Not by a ratio: the
    # partitions' share of a Python worker's RocksDB cache includes what other queries' stores
    # left there.)
    memory = [op["memoryUsedBytes"] for op in growing]
    steps = zip(pairwise(memory), pairwise(SIZES), strict=True)
    assert all(m1 - m0 >= 20 * (n1 - n0) for (m0, m1), (n0, n1) in steps), memory
    for op, stored in zip(ops, [0, *SIZES], strict=False):
        custom = op["customMetrics"]
        shown = [f"SnapshotLastUploaded.partition_{p}_default" for p in range(PARTITIONS)]
        assert all(custom[name] == -1 for name in shown)  # no snapshot uploaded yet
        if provider == "memory":
            assert set(HDFS_METRICS) <= set(custom)
            assert custom["stateOnCurrentVersionSizeBytes"] <= op["memoryUsedBytes"]
            continue
        assert set(ROCKSDB_METRICS) <= set(custom)
        assert all(custom[name] >= 0 for name in ROCKSDB_METRICS)
        assert custom["rocksdbPutCount"] == op["numRowsUpdated"]  # the keys the commit wrote
        # The stored keys a batch reads are looked up, no more (none above a partition's
        # largest stored key).
        assert custom["rocksdbGetCount"] == stored
        assert isinstance(custom["rocksdbGetLatency"], int)  # whole milliseconds, as Spark's
    if provider == "rocksdb":
        # (A partition that moves to another Python worker is flushed as well, when its
        # database is closed in the worker it leaves.)
        flushed = ops[-1]["customMetrics"]
        assert flushed["rocksdbSstFileSize"] > 0 and flushed["rocksdbTotalBytesWrittenByFlush"] > 0
