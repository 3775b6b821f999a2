"""``sparkstate demo``: a real local streaming pipeline over a generated clickstream.

A generator thread writes JSON files of click events into a watched directory; a sparkstate query
counts clicks and sums revenue per user and page category with the rocksdb provider, writing each
batch's updated rows as Parquet (update mode through ``foreachBatch``: Spark's file sinks take
append mode only; a replayed batch writes over its own directory, so the table is exactly-once).
Progress is shown live, and a summary says where everything is.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

__all__ = ["run"]

USERS = 50_000
CATEGORIES = ["home", "search", "product", "cart", "checkout", "account"]


class ClickGenerator(threading.Thread):
    """Writes ``batches`` files of click events into ``path``, one every ``interval_s``."""

    def __init__(self, path: str, batches: int, rows: int, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.path, self.batches, self.rows, self.interval_s = path, batches, rows, interval_s
        self.written = 0
        self.rng = random.Random(42)

    def run(self) -> None:
        start = 1_700_000_000
        for b in range(self.batches):
            lines = []
            for i in range(self.rows):
                ts = start + b * 60 + i * 60 // self.rows
                lines.append(
                    json.dumps(
                        {
                            "user": f"user-{int(self.rng.paretovariate(1.2) * 97) % USERS}",
                            "category": self.rng.choice(CATEGORIES),
                            "amount": round(self.rng.random() * 40, 2)
                            if self.rng.random() < 0.2
                            else None,
                            "ts": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)),
                        }
                    )
                )
            tmp = os.path.join(self.path, f".part-{b:05d}.tmp")
            with open(tmp, "w") as f:
                f.write("\n".join(lines) + "\n")
            os.replace(tmp, os.path.join(self.path, f"part-{b:05d}.json"))
            self.written += self.rows
            time.sleep(self.interval_s)


def _line(p: dict[str, Any]) -> str:
    ops = p.get("stateOperators") or [{}]
    op = ops[0]
    rate = p.get("processedRowsPerSecond") or 0.0
    mem = op.get("memoryUsedBytes", 0) / 1e6
    return (
        f"  batch {p.get('batchId'):>3}  input {p.get('numInputRows', 0):>7,} rows "
        f"({rate:>9,.0f} rows/s)  state {op.get('numRowsTotal', 0):>7,} rows "
        f"updated {op.get('numRowsUpdated', 0):>6,}  state mem {mem:6.1f} MB  "
        f"commit {op.get('commitTimeMs', 0):>4} ms"
    )


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import types as T

    import sparkstate as ss
    from sparkstate import functions as SF

    root = os.path.abspath(args.out or tempfile.mkdtemp(prefix="sparkstate-demo-"))
    batches = args.batches or 8
    rows = 20_000
    inbox, out, chk = (os.path.join(root, d) for d in ("inbox", "output", "checkpoint"))
    for d in (inbox, out, chk):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(inbox)
    print("sparkstate demo: clicks and revenue per (user, category), rocksdb state store")
    from sparkstate.engine.spark.session import REMOTE_ENV

    remote = os.environ.get(REMOTE_ENV)
    where = f"the Spark Connect server {remote}" if remote else "Spark (local[2])"
    print(f"  input files: {inbox}\n  starting {where} ...", flush=True)
    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    else:
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("sparkstate-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    schema = T.StructType(
        [
            T.StructField("user", T.StringType()),
            T.StructField("category", T.StringType()),
            T.StructField("amount", T.DoubleType()),
            T.StructField("ts", T.TimestampType()),
        ]
    )
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(inbox)
    generator = ClickGenerator(inbox, batches, rows, interval_s=0.5)
    generator.start()
    started = time.time()

    def write_batch(df: Any, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(f"{out}/batch={batch_id}")  # a replay: over its own

    query = (
        ss.stream(events)
        .withWatermark("ts", "10 minutes")
        .groupBy("user", "category")
        .agg(SF.count("*").alias("clicks"), SF.sum("amount").alias("revenue"))
        .writeStream.outputMode("update")
        .foreachBatch(write_batch)
        .option("checkpointLocation", chk)
        .option("stateStore", "rocksdb")
        .trigger(processingTime="1 second")
        .start()
    )
    seen, processed, with_data = -1, 0, 0
    deadline = time.time() + 600
    try:
        while time.time() < deadline:
            for p in query.recentProgress:
                if p.get("batchId", -1) > seen:
                    seen = p["batchId"]
                    rows_in = int(p.get("numInputRows", 0))
                    processed += rows_in
                    with_data += rows_in > 0  # not the no-data batches a watermark move adds
                    print(_line(p), flush=True)
            if not generator.is_alive() and processed >= generator.written:
                break
            if query.exception() is not None:
                msg = f"the demo query failed: {query.exception()}"
                raise RuntimeError(msg)
            time.sleep(0.5)
    finally:
        query.stop()
    elapsed = time.time() - started
    result = spark.read.parquet(out)
    top = (
        result.groupBy("user", "category")
        .agg({"clicks": "max"})
        .withColumnRenamed("max(clicks)", "clicks")
        .orderBy("clicks", ascending=False)
        .limit(3)
        .collect()
    )
    last: Any = query.lastProgress or {}
    state_rows = (last.get("stateOperators") or [{}])[0].get("numRowsTotal", 0)
    print(
        f"done: {generator.written:,} events in {with_data} batches, {elapsed:.1f} s; "
        f"{state_rows:,} (user, category) keys in state"
    )
    print(
        "  busiest (user, category): "
        + ", ".join(f"{r['user']}/{r['category']} ({r['clicks']})" for r in top)
    )
    print(f"  output (Parquet, exactly-once): {out}\n  checkpoint and state: {chk}")
    spark.stop()
    return 0
