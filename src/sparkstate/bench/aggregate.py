"""``sparkstate bench aggregate``: a keyed streaming count, sparkstate against Spark's built-in.

``groupBy(key).count()`` over the ``rate-micro-batch`` source, ``key = value % keys`` (full: 1M
rows and 1M distinct keys per batch, so every batch updates every key, 8 batches; ``--quick``:
200k, 6 batches; ``--rows``, ``--keys`` and ``--batches`` set them, e.g. small batches for their
latency), on ``local[2]`` with 4 shuffle partitions, update mode, ``noop`` output. The first
batch is a warm-up. Systems, each in a fresh subprocess with its own SparkSession:

- ``spark-hdfs``: Spark's aggregation with the default ``HDFSBackedStateStoreProvider``;
- ``spark-rocksdb``: the same with ``RocksDBStateStoreProvider``;
- ``sparkstate-rocksdb`` / ``sparkstate-memory``: ``ss.stream(df).groupBy(key).count()`` with
  ``.option("stateStore", "rocksdb" | "memory")``.

See :mod:`sparkstate.bench._spark` for how batches are timed.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from sparkstate.bench._spark import (
    HDFS_PROVIDER,
    PROVIDER_CONF,
    ROCKSDB_PROVIDER,
    BenchSpec,
    NotAvailable,
    measure_query,
    rate_keys,
    run_bench,
    spark_session,
)

__all__ = ["SYSTEMS", "measure", "params_for", "run"]

SYSTEMS = ["spark-hdfs", "spark-rocksdb", "sparkstate-rocksdb", "sparkstate-memory"]
RATIO_PAIRS = [
    ("sparkstate-rocksdb", "spark-rocksdb"),
    ("sparkstate-memory", "spark-hdfs"),
    ("sparkstate-rocksdb", "spark-hdfs"),
    ("sparkstate-memory", "spark-rocksdb"),
    ("spark-rocksdb", "spark-hdfs"),
]
SPARK_PROVIDERS = {"spark-hdfs": HDFS_PROVIDER, "spark-rocksdb": ROCKSDB_PROVIDER}
FULL = {"rows_per_batch": 1_000_000, "keys": 1_000_000, "batches": 8, "warmup": 1}
QUICK = {"rows_per_batch": 200_000, "keys": 200_000, "batches": 6, "warmup": 1}


def params_for(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes from ``--quick``; ``--rows`` / ``--keys`` / ``--batches`` override them."""
    params = dict(QUICK if getattr(args, "quick", False) else FULL)
    for name, key in (("rows", "rows_per_batch"), ("keys", "keys"), ("batches", "batches")):
        value = getattr(args, name, None)
        if value is not None:
            params[key] = int(value)
    return params


def _start_spark(system: str, df: Any, checkpoint: str) -> Any:
    return (
        df.groupBy("key")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .queryName(system.replace("-", "_"))
        .start()
    )


def _start_sparkstate(system: str, df: Any, checkpoint: str) -> Any:
    try:
        import sparkstate as ss

        stream = ss.stream
    except (ImportError, AttributeError) as exc:
        msg = f"the sparkstate engine is not importable ({exc})"
        raise NotAvailable(msg) from exc
    provider = system.removeprefix("sparkstate-")
    return (
        stream(df)
        .groupBy("key")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .option("stateStore", provider)
        .queryName(system.replace("-", "_"))
        .start()
    )


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run ``system`` in this process (a fresh one: the parent made it) and summarize it."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    conf = {PROVIDER_CONF: SPARK_PROVIDERS[system]} if system in SPARK_PROVIDERS else {}
    if system.startswith("sparkstate-"):
        try:
            import sparkstate.engine  # noqa: F401 - fail early, before a JVM starts
        except ImportError as exc:
            msg = f"the sparkstate engine is not importable ({exc})"
            raise NotAvailable(msg) from exc
    started = time.perf_counter()
    spark = spark_session(f"bench-aggregate-{system}", conf)
    session_s = time.perf_counter() - started
    try:
        df = rate_keys(spark, params["rows_per_batch"], params["keys"])
        checkpoint = os.path.join(params["workdir"], "checkpoint")
        start = _start_sparkstate if system.startswith("sparkstate-") else _start_spark
        query = start(system, df, checkpoint)
        result = measure_query(spark, query, params, system, session_s)
        if system.startswith("sparkstate-"):
            result["state_store"] = system.removeprefix("sparkstate-")
        return result
    finally:
        spark.stop()


def run(args: argparse.Namespace) -> int:
    params = params_for(args)
    if params["batches"] <= params["warmup"]:
        print(f"[bench aggregate] --batches must exceed the {params['warmup']} warm-up batch")
        return 2
    timeout = 300.0 if getattr(args, "quick", False) else 1800.0
    spec = BenchSpec("aggregate", __name__, SYSTEMS, RATIO_PAIRS, params, timeout)
    return run_bench(spec, args)
