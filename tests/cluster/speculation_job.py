"""Streaming aggregations on a two-worker cluster with ``spark.speculation`` on: a job of its
own, since Spark reads speculation's settings once, when its context starts.

The workers listen on two loopback addresses, so Spark takes them for two machines (it never
runs a speculative copy on the host of the attempt it copies). One attempt of one partition of
our query is slow at its commit (``tests.cluster.slow_attempt``), and Spark starts a copy of it
on the other worker. Spark's own aggregation runs over the same files on the same cluster, with
the same stop and restart in the middle, as the reference.

Usage: ``speculation_job.py WORK`` writes ``WORK/result.json``: per case (a provider, with or
without state homes) each query's batches, the lineage each batch committed, and every attempt's
commit; and under ``tasks`` every task attempt's outcome as Spark's status store holds it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from tests.cluster.conftest import HOST, SESSION_CONF, Cluster, wait_for_executors  # noqa: E402
from tests.cluster.helpers import SCHEMA, Collector, FileFeed, make_batches  # noqa: E402
from tests.cluster.slow_attempt import SLOW_ENV, read_attempts  # noqa: E402

import sparkstate as ss  # noqa: E402
from sparkstate import functions as SF  # noqa: E402
from sparkstate.runtime.logs import CheckpointLog  # noqa: E402

#: (provider, state homes on): the cases run, one query each. Each provider once, and each way a
#: task reaches its store (in the Python worker, through a state home) once: which attempt's
#: report counts is chosen by the driver, the same for every provider.
CASES = [("memory", False), ("rocksdb", True)]
PROVIDERS = {
    "memory": "tests.cluster.slow_attempt:SlowMemory",
    "rocksdb": "tests.cluster.slow_attempt:SlowRocksDB",
}
#: The slow attempt: the first attempt of partition 1 in batch 1 (it loads version 1).
SLOW_PARTITION, SLOW_BATCH = 1, 1
#: Batches before the stop, and in all.
STOP_AFTER, NUM_BATCHES = 2, 4
SECOND_HOST = "127.0.0.2"


def session(cluster: Cluster) -> SparkSession:
    return (
        SparkSession.builder.master(cluster.master_url)
        .appName("sparkstate-speculation")
        .config(map=SESSION_CONF)
        # A copy of a task that runs 1.5 times the median, once half the stage's tasks are done.
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.minTaskRuntime", "300ms")
        .config("spark.speculation.efficiency.enabled", "false")
        .getOrCreate()
    )


def ours(
    spark: SparkSession, feed: FileFeed, checkpoint: Path, sink: Collector, case: tuple[str, bool]
) -> Any:
    provider, homes = case
    return (
        ss.stream(feed.stream(spark, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .option("stateStore", PROVIDERS[provider])
        .option("stateStore.local_dir", "sparkstate-local")
        .option("stateStore.state_home", str(homes).lower())
        .option("stateStore.direct_batch_rows", "0")  # every batch in Spark's tasks, speculated
        .start()
    )


def theirs(spark: SparkSession, feed: FileFeed, checkpoint: Path, sink: Collector) -> Any:
    return (
        feed.stream(spark, SCHEMA)
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def run_case(spark: SparkSession, root: Path, case: tuple[str, bool]) -> dict[str, Any]:
    feed = FileFeed(root / "input")
    batches = make_batches(seed=11, num_batches=NUM_BATCHES, rows_per_batch=400, num_keys=300)
    mine, reference = Collector(), Collector()
    for first, last in ((0, STOP_AFTER), (STOP_AFTER, NUM_BATCHES)):  # a stop in the middle
        queries = [
            ours(spark, feed, root / "ours", mine, case),
            theirs(spark, feed, root / "spark", reference),
        ]
        try:
            for rows in batches[first:last]:
                feed.add(rows)
                for q in queries:
                    q.processAllAvailable()
        finally:
            for q in queries:
                q.stop()
    log = CheckpointLog.of_checkpoint(str(root / "ours"))
    lineage = {}
    for b in range(NUM_BATCHES):
        commit = log.read_commit(b)
        lineage[b] = None if commit is None else commit.lineage()
    return {
        "ours": mine.batches,
        "spark": reference.batches,
        "lineage": lineage,
        "attempts": read_attempts(root / "ours"),
    }


def task_outcomes(spark: SparkSession) -> dict[int, dict[str, Any]]:
    """Every task attempt Spark's status store holds: its status (``SUCCESS``, ``KILLED``...)
    and when it finished (epoch ms), by task attempt id."""
    store = spark.sparkContext._jsc.sc().statusStore()
    out: dict[int, dict[str, Any]] = {}
    empty = 0
    stage = 0
    while empty < 50:
        found = False
        for attempt in (0, 1):
            tasks = store.taskList(stage, attempt, 100000)
            for i in range(tasks.size()):
                t = tasks.apply(i)
                duration = t.duration()
                finished = (
                    t.launchTime().getTime() + duration.get() if duration.isDefined() else None
                )
                out[t.taskId()] = {"status": t.status(), "finished_ms": finished}
                found = True
        empty = 0 if found else empty + 1
        stage += 1
    return out


def main(work: Path) -> None:
    os.environ[SLOW_ENV] = f"{SLOW_PARTITION}:{SLOW_BATCH}"  # the executors inherit it
    cluster = Cluster(work / "cluster", hosts=[HOST, SECOND_HOST])
    cluster.start()
    try:
        spark = session(cluster)
        spark.sparkContext.setLogLevel("ERROR")
        wait_for_executors(spark, 2)
        results = {
            f"{provider}-{'homes' if homes else 'workers'}": run_case(
                spark, work / f"{provider}-{homes}", (provider, homes)
            )
            for provider, homes in CASES
        }
        results["tasks"] = task_outcomes(spark)
        spark.stop()
    finally:
        cluster.stop()
    (work / "result.json").write_text(json.dumps(results, default=list))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
