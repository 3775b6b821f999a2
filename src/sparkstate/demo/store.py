"""The state store demo: write, commit and restore a rocksdb store from its durable files, with
no Spark involved."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pyarrow as pa

from sparkstate.store import StoreConf, StoreId, provider_class

__all__ = ["run_store_demo"]


def run_store_demo(out: str | None, versions: int) -> int:
    """Write, commit, restore from durable files in a fresh local directory, and print it all."""
    root = out or tempfile.mkdtemp(prefix="sparkstate-demo-")
    checkpoint = os.path.join(root, "checkpoint")
    key_schema = pa.schema([("user", pa.string())])
    value_schema = pa.schema([("clicks", pa.int64()), ("last_ts", pa.int64())])
    store_id = StoreId(checkpoint, operator_id=0, partition_id=0)
    rows_per_version = 100_000
    print(f"sparkstate store demo: rocksdb provider, checkpoint at {checkpoint}")
    conf = StoreConf(min_deltas_for_snapshot=2, local_dir=os.path.join(root, "local-a"))
    provider = provider_class("rocksdb")()
    provider.init(store_id, key_schema, value_schema, conf)
    version = 0
    for batch in range(versions):
        start = time.perf_counter()
        store = provider.get_store(version)
        users = [(f"user-{(batch * 7919 + i) % 250_000}",) for i in range(rows_per_version)]
        current = store.get_many(users)
        values = [((old[0] if old else 0) + 1, batch * 1000 + i) for i, old in enumerate(current)]
        store.put_many(users, values)
        version = store.commit()
        metrics = store.metrics()
        provider.do_maintenance()
        elapsed = time.perf_counter() - start
        print(
            f"  batch {batch}: {rows_per_version:,} updates -> version {version}, "
            f"{metrics.num_keys:,} keys, commit {metrics.commit_time_ms} ms, "
            f"{rows_per_version / elapsed:,.0f} rows/s"
        )
    provider.close()

    print("restoring the last version into a fresh local directory (as a new executor would)")
    start = time.perf_counter()
    restored = provider_class("rocksdb")()
    restored.init(
        store_id, key_schema, value_schema, StoreConf(local_dir=os.path.join(root, "local-b"))
    )
    store = restored.get_read_store(version)
    count = sum(1 for _ in store.iterator())
    sample = store.get(("user-0",))
    print(
        f"  restored version {version}: {count:,} keys in {time.perf_counter() - start:.2f} s; "
        f"user-0 -> clicks={sample[0] if sample else None}"
    )
    restored.close()
    files = sorted(os.listdir(os.path.join(checkpoint, store_id.relative_dir)))
    print(f"durable files: {', '.join(files)}")
    if out is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0
