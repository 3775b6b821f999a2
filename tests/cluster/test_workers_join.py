"""State partitions spread over the executors, and an executor that joins takes its share.

On the two-executor cluster (one core each), a query's four state partitions stay in the state
homes that hold them; left alone, they stay where batch 0's tasks happened to land. Before each
batch the driver moves partitions from an executor that holds more than its share to one that
holds less (:mod:`sparkstate.engine.run.placement`): from batch 2 on, the executors hold two
partitions each. Then a third worker starts: before the next batch the driver sees Spark list
an executor it knows no state home on and runs a small job to find it
(:mod:`sparkstate.engine.run.joined_homes`), so the joined executor holds its share within
three batches (in the runs measured: from the batch it joined at). The output equals that of
Spark's own aggregation over the same files throughout (a partition that moves restores its
state from the checkpoint, fenced as any move). Live reads of
the state after each batch equal Spark's output so far, from the homes, and after the third
worker is killed (its executor lost), from the checkpoint for the partitions it held.

Then an executor's JVM is killed between two batches, and its worker starts another in its
place: as many executors as before, one of them new. The driver sees an executor it listed
before gone, finds a home on each executor listed, drops the lost one's and gives its
partitions to the new executor before the next batch, so that it holds its share within three
batches of being listed (in the runs measured: from the first), and the output stays Spark's.

The last module of the cluster's package: it leaves a third worker's executor behind it, ended,
and one executor in place of a killed one.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.run.joined_homes import executors_listed
from sparkstate.observe.live import LiveState

from .conftest import HOST, START_TIMEOUT_S, Cluster, Worker, wait_for_executors
from .helpers import (
    LOCAL_DIR,
    SCHEMA,
    Collector,
    FileFeed,
    final_state,
    make_batches,
    read_commit,
)

pytestmark = pytest.mark.cluster

BATCHES = make_batches(seed=11, num_batches=10, rows_per_batch=800, num_keys=1500)
#: The batch before which the third worker starts.
JOIN_AT = 5
#: The batch before which an executor's JVM is killed, and its worker starts another.
REPLACE_AT = 4


def held(checkpoint: Path, batch_id: int) -> dict[str, int]:
    """Executor -> the partitions its homes hold after batch ``batch_id`` (the commit says)."""
    executors = read_commit(checkpoint, batch_id)["operators"]["0"].get("executors", {})
    assert len(executors) == 4, executors
    return dict(collections.Counter(executors.values()))


def read_live(live: LiveState, theirs: Collector, batch_id: int) -> set[str]:
    """Read every key live: the state after ``batch_id``, each key's count and sum as Spark's
    output so far has them; where the reads came from."""
    live.refresh()
    want = final_state({b: theirs.batches[b] for b in range(batch_id + 1)})
    keys = [{"k": k, "g": g} for k, g in want]
    found = live.get_many(keys)
    assert {f.batch_id for f in found} == {batch_id}
    # (the aggregation buffers under Spark's names, as the state reader shows them)
    got = {(f.key["k"], f.key["g"]): (f.value["count"], f.value["sum"]) for f in found}
    assert got == {key: (row[2], row[3]) for key, row in want.items()}
    return {f.source for f in found}


def start_both(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, ours: Collector, theirs: Collector
) -> tuple[StreamingQuery, StreamingQuery]:
    """Our aggregation (state in the executors' homes) and Spark's, over the same files."""
    q_ours = (
        ss.stream(feed.stream(spark, SCHEMA))
        .groupBy("k", "g")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(ours)
        .option("checkpointLocation", str(tmp_path / "ours"))
        .option("stateStore", "rocksdb")
        .option("stateStore.local_dir", LOCAL_DIR)
        .start()
    )
    q_spark = (
        feed.stream(spark, SCHEMA)
        .groupBy("k", "g")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(theirs)
        .option("checkpointLocation", str(tmp_path / "spark"))
        .start()
    )
    return q_ours, q_spark


def test_partitions_spread_over_executors_and_a_new_one_takes_its_share(
    cluster: Cluster, cluster_spark: SparkSession, tmp_path: Path
) -> None:
    feed = FileFeed(tmp_path / "input")
    ours, theirs = Collector(), Collector()
    checkpoint = tmp_path / "ours"
    q_ours, q_spark = start_both(cluster_spark, feed, tmp_path, ours, theirs)
    joined = Worker("w-joined", tmp_path / "w-joined")
    spread: dict[int, dict[str, int]] = {}
    sources: dict[int, set[str]] = {}
    live: LiveState | None = None
    try:
        for b, rows in enumerate(BATCHES):
            if b == JOIN_AT:
                cluster.workers.append(joined)
                cluster.start_worker(joined)
                wait_for_executors(cluster_spark, 3)
            feed.add(rows)
            q_ours.processAllAvailable()
            q_spark.processAllAvailable()
            spread[b] = held(checkpoint, b)
            live = live or ss.state(q_ours)
            sources[b] = read_live(live, theirs, b)
        # The joined executor lost: its partitions are read from the checkpoint, the same.
        # (its homes end within a second of their executor; until then they answer, the same)
        cluster.kill_worker(joined)
        deadline = time.monotonic() + 30
        lost = read_live(live, theirs, len(BATCHES) - 1)
        while "checkpoint" not in lost and time.monotonic() < deadline:
            time.sleep(0.5)
            lost = read_live(live, theirs, len(BATCHES) - 1)
        direct = {
            int(p["batchId"]): "directState" in p["durationMs"]
            for p in (json.loads(x.json) for x in q_ours.recentProgress)
            if p["numInputRows"]
        }
    finally:
        if live is not None:
            live.close()
        q_ours.stop()
        q_spark.stop()
        if joined.proc is not None:
            cluster.kill_worker(joined)
        if joined in cluster.workers:
            cluster.workers.remove(joined)
    print("\npartitions per executor, per batch (and whether it ran from the driver):")
    for b, counts in spread.items():
        print(f"  batch {b}: {dict(sorted(counts.items()))} {direct.get(b)}")
    for b in range(2, JOIN_AT):
        assert sorted(spread[b].values()) == [2, 2], spread
    # The joined executor's home is looked for before the batch: it holds its share within
    # three batches, and keeps it.
    shared = [b for b in range(JOIN_AT, len(BATCHES)) if sorted(spread[b].values()) == [1, 1, 2]]
    print(f"the joined executor holds its share from batch {min(shared, default=None)}")
    assert shared and shared[0] <= JOIN_AT + 2, spread
    last = spread[len(BATCHES) - 1]
    assert len(last) == 3 and max(last.values()) - min(last.values()) <= 1, spread
    assert all(sources[b] == {"home"} for b in sources), sources
    assert lost == {"home", "checkpoint"}, lost
    assert sorted(ours.batches) == list(range(len(BATCHES)))
    for b in range(len(BATCHES)):
        assert ours.batches[b] == theirs.batches[b], f"batch {b}: our output differs from Spark's"


def executor_pid(worker: Worker) -> int:
    """The pid of the executor JVM ``worker`` runs (in a working directory under the worker's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in cmdline and cwd.startswith(str(worker.work_dir)):
            found.append(int(entry))
    assert len(found) == 1, found
    return found[0]


def wait_for_replacement(spark: SparkSession, before: frozenset[str]) -> str:
    """The id of the executor Spark lists in place of one of ``before``, once the lost one is
    listed no more."""
    context = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = executors_listed(context) or frozenset()
        if len(listed) == len(before) and len(listed - before) == 1:
            (new,) = listed - before
            return new
        time.sleep(0.3)
    msg = f"timed out after {START_TIMEOUT_S:.0f} s waiting for an executor in place of a lost one"
    raise RuntimeError(msg)


def test_an_executor_replaced_between_batches_takes_the_lost_ones_share(
    cluster: Cluster, cluster_spark: SparkSession, tmp_path: Path
) -> None:
    feed = FileFeed(tmp_path / "input")
    ours, theirs = Collector(), Collector()
    checkpoint = tmp_path / "ours"
    batches = BATCHES[:8]
    q_ours, q_spark = start_both(cluster_spark, feed, tmp_path, ours, theirs)
    victim = cluster.workers[-1]
    spread: dict[int, dict[str, int]] = {}
    try:
        for b, rows in enumerate(batches):
            if b == REPLACE_AT:
                before = executors_listed(cluster_spark.sparkContext._jsc.sc())
                assert before is not None and len(before) == 2, before
                os.kill(executor_pid(victim), signal.SIGKILL)
                new = f"{HOST}/{wait_for_replacement(cluster_spark, before)}"
            feed.add(rows)
            q_ours.processAllAvailable()
            q_spark.processAllAvailable()
            spread[b] = held(checkpoint, b)
    finally:
        q_ours.stop()
        q_spark.stop()
    print("\npartitions per executor, per batch:")
    for b, counts in spread.items():
        print(f"  batch {b}: {dict(sorted(counts.items()))}")
    for b in range(2, REPLACE_AT):
        assert sorted(spread[b].values()) == [2, 2], spread
    # The new executor's home is found before the batch and the lost one's dropped: it holds
    # its share within three batches of being listed, and keeps it.
    shared = [
        b
        for b in range(REPLACE_AT, len(batches))
        if new in spread[b]
        and max(spread[b].values()) - min(spread[b].values()) <= 1
        and len(spread[b]) == 2
    ]
    print(f"the new executor {new} holds its share from batch {min(shared, default=None)}")
    assert shared and shared[0] <= REPLACE_AT + 2, spread
    assert shared == list(range(shared[0], len(batches))), spread
    assert sorted(ours.batches) == list(range(len(batches)))
    for b in range(len(batches)):
        assert ours.batches[b] == theirs.batches[b], f"batch {b}: our output differs from Spark's"
