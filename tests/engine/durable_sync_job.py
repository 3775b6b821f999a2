"""A driver of its own for ``test_durable_sync.py``: a local session whose every Python process
records its syncs and renames (``tests/sync_recorder.py``, set up by the caller's environment),
and two queries that write every kind of durable file sparkstate has.

    python durable_sync_job.py WORKDIR

A windowed count with a watermark on the memory provider into a JSON file sink (changelogs,
snapshots, the engine's logs, the clock, the sink's part files and manifests), and a
deduplication on the RocksDB provider (its changelogs, snapshots and SST files), each over four
batches with maintenance after every one, then restarted for a batch more.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.testing import FileFeed

SCHEMA = "k string, v long, ts timestamp"
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)


def rows(batch: int) -> list[dict[str, object]]:
    return [
        {
            "k": f"k{(batch + i) % 3}",
            "v": i,
            "ts": (T0 + datetime.timedelta(seconds=batch * 20 + i)).isoformat(),
        }
        for i in range(6)
    ]


def main(work: Path) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sparkstate-durable-sync")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    feed = FileFeed(work / "input")
    options = {
        "stateStore.min_deltas_for_snapshot": "2",
        "stateStore.min_versions_to_retain": "2",
        "stateStore.maintenanceIntervalSeconds": "0",
    }

    def run() -> None:
        df = ss.stream(feed.stream(spark, SCHEMA)).withWatermark("ts", "10 seconds")
        counts = df.groupBy(SF.window("ts", "20 seconds"), "k").agg(SF.count("*").alias("n"))
        writer = counts.select("window.start", "k", "n").writeStream.outputMode("append")
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.format("json").option("path", str(work / "out")).option(
            "checkpointLocation", str(work / "chk-memory")
        ).option("stateStore", "memory").trigger(availableNow=True).start().awaitTermination()
        writer = df.dropDuplicates(["k", "v"]).writeStream.outputMode("append")
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.format("noop").option("checkpointLocation", str(work / "chk-rocksdb")).option(
            "stateStore", "rocksdb"
        ).trigger(availableNow=True).start().awaitTermination()

    for batch in range(4):
        feed.add(rows(batch))
    run()
    feed.add(rows(4))
    run()
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
