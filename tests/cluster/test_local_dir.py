"""Where an executor keeps its local RocksDB copies: its own ``SPARKSTATE_LOCAL_DIR``."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import Cluster
from .helpers import SCHEMA, FileFeed, make_batches

pytestmark = pytest.mark.cluster


def test_executors_keep_local_copies_in_their_own_local_dir(
    cluster: Cluster,
    cluster_spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The driver's own setting (were it used by executors, their copies would land here).
    driver_dir = tmp_path / "driver-local"
    monkeypatch.setenv("SPARKSTATE_LOCAL_DIR", str(driver_dir))
    feed = FileFeed(tmp_path / "input")
    checkpoint = tmp_path / "checkpoint"
    q = (
        ss.stream(feed.stream(cluster_spark, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .option("stateStore", "rocksdb")
        .start()
    )
    try:
        for rows in make_batches(seed=11, num_batches=1, rows_per_batch=200, num_keys=100):
            feed.add(rows)
            q.processAllAvailable()
    finally:
        q.stop()
    found = {
        w.name: sorted(d.name for d in w.local_dir.glob("*-op0-p*")) if w.local_dir.exists() else []
        for w in cluster.workers
    }
    on_driver_dir = (
        sorted(d.name for d in driver_dir.glob("*-op0-p*")) if driver_dir.exists() else []
    )
    print(
        f"\nlocal copies per worker's SPARKSTATE_LOCAL_DIR: {found}"
        f"\nin the driver's: {on_driver_dir}"
    )
    assert not on_driver_dir, f"executors used the driver's SPARKSTATE_LOCAL_DIR: {on_driver_dir}"
    # Every partition's copy is in the local dir of some executor's worker.
    parts = {name.split("-")[2] for names in found.values() for name in names}
    assert parts == {f"p{i}" for i in range(4)}, found
