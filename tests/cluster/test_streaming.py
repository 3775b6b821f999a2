"""Streaming aggregation on a two-executor standalone cluster.

The oracle is Spark's built-in streaming aggregation run over the same files on the same cluster
(update mode, so every batch's output is compared). Our queries keep their local RocksDB copies in
a directory per executor (``stateStore.local_dir`` relative to the executor's working directory),
so a partition that moves to another executor must restore from the durable state under the
checkpoint. Where each partition ran is read back from those local copies after every batch.

One fault run (module fixture ``fault_run``) serves most tests below: a worker is SIGKILLed (with
its executor and Python workers) while a batch runs, the stream continues on the other worker, the
worker comes back (a new executor with an empty local directory), and the query is restarted from
its checkpoint; from the restarted run's second batch the new executor holds its share of the
partitions. Two queries go through it side by side, one per provider
(``tests.cluster.observed``: each provider as it is, plus one log line per load: which executor,
how long, the provider's counters before and after). Each one's output, and its state read back,
must equal the reference run without faults; where the rocksdb query's partitions ran and what each
move cost (restores, changelogs replayed, bytes downloaded, load time) is printed.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import Cluster, Worker, wait_for_executors
from .helpers import (
    LOCAL_DIR,
    SCHEMA,
    Batches,
    Collector,
    FileFeed,
    executor_of,
    final_state,
    make_batches,
    placement,
    read_observed,
    read_progress,
)

pytestmark = pytest.mark.cluster

BATCHES = make_batches(seed=7, num_batches=7, rows_per_batch=1500, num_keys=3000)
BATCHES[1] = []  # an empty batch
#: The fault run: a worker is killed while batch KILL_AT runs; the stream goes on with the other
#: one; after batch BACK_AFTER the worker comes back and the query restarts from its checkpoint.
KILL_AT, BACK_AFTER = 2, 4
OBSERVED = "tests.cluster.observed:ObservedRocksDB"
OBSERVED_MEMORY = "tests.cluster.observed:ObservedMemory"
STORE_OPTIONS = {
    "stateStore.local_dir": LOCAL_DIR,
    # Snapshots often and uploaded right away, so that moves restore from snapshots too.
    "stateStore.min_deltas_for_snapshot": "2",
    "stateStore.maintenanceIntervalSeconds": "0",
}


def ours_aggregates() -> list[Any]:
    return [
        SF.count("*").alias("n"),
        SF.count("v").alias("nv"),
        SF.sum("v").alias("total"),
        SF.min("v").alias("lo"),
        SF.max("v").alias("hi"),
        SF.avg("v").alias("mean"),
        SF.max("s").alias("smax"),
    ]


def spark_aggregates() -> list[Any]:
    return [
        F.count("*").alias("n"),
        F.count("v").alias("nv"),
        F.sum("v").alias("total"),
        F.min("v").alias("lo"),
        F.max("v").alias("hi"),
        F.avg("v").alias("mean"),
        F.max("s").alias("smax"),
    ]


def start_ours(
    spark: SparkSession, feed: FileFeed, checkpoint: Path, sink: Collector, provider: str
) -> Any:
    writer = (
        ss.stream(feed.stream(spark, SCHEMA))
        .groupBy("k", "g")
        .agg(*ours_aggregates())
        .writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .option("stateStore", provider)
    )
    for k, v in STORE_OPTIONS.items():
        writer = writer.option(k, v)
    return writer.start()


def assert_same_batches(ours: Batches, theirs: Batches, upto: int) -> None:
    assert sorted(ours) == list(range(upto)), sorted(ours)
    for b in range(upto):
        assert ours[b] == theirs[b], f"batch {b}: our output differs from Spark's"
    assert final_state({b: ours[b] for b in range(upto)}) == final_state(
        {b: theirs[b] for b in range(upto)}
    )


def describe(placements: dict[int, dict[int, str]]) -> str:
    return "\n".join(f"  batch {b}: {dict(sorted(p.items()))}" for b, p in placements.items())


# --------------------------------------------------------------------------- 1. differential


@dataclasses.dataclass
class CleanRun:
    ours: Batches
    spark: Batches
    placements: dict[int, dict[int, str]]
    #: The two queries' checkpoints.
    checkpoints: dict[str, Path]


@pytest.fixture(scope="module")
def clean_run(
    cluster: Cluster, cluster_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> CleanRun:
    """Our query (the rocksdb provider) and Spark's built-in aggregation, side by side over
    the same files, update mode, batch by batch; no faults. Spark's output is the reference of
    the fault run too."""
    root = tmp_path_factory.mktemp("clean-run")
    feed = FileFeed(root / "input")
    checkpoint = root / "ours"
    ours, theirs = Collector(), Collector()
    q_ours = start_ours(cluster_spark, feed, checkpoint, ours, "rocksdb")
    q_spark = (
        feed.stream(cluster_spark, SCHEMA)
        .groupBy("k", "g")
        .agg(*spark_aggregates())
        .writeStream.outputMode("update")
        .foreachBatch(theirs)
        .option("checkpointLocation", str(root / "spark"))
        .start()
    )
    placements: dict[int, dict[int, str]] = {}
    try:
        for b, rows in enumerate(BATCHES):
            feed.add(rows)
            q_ours.processAllAvailable()
            q_spark.processAllAvailable()
            placements[b] = placement(checkpoint, b, cluster.executor_dirs(LOCAL_DIR))
    finally:
        q_ours.stop()
        q_spark.stop()
    assert sorted(theirs.batches) == list(range(len(BATCHES)))
    return CleanRun(
        ours.batches, theirs.batches, placements, {"ours": checkpoint, "spark": root / "spark"}
    )


def test_aggregation_on_cluster_matches_spark(clean_run: CleanRun) -> None:
    print(f"\npartition -> executor that ran it:\n{describe(clean_run.placements)}")
    assert_same_batches(clean_run.ours, clean_run.spark, len(BATCHES))
    assert len(final_state(clean_run.ours)) > 1000
    # Every committed attempt is in exactly one executor's own local directory.
    where = clean_run.placements
    unknown = [(b, p) for b, pl in where.items() for p, e in pl.items() if e == "?"]
    assert not unknown, where


def test_state_reader_on_cluster_reads_what_spark_reads(
    clean_run: CleanRun, cluster_spark: SparkSession
) -> None:
    """The state reader on the cluster: one Spark partition per state partition, read on the
    executors, and the same rows as Spark's reader of Spark's checkpoint."""
    ours = cluster_spark.read.format("sparkstate").load(str(clean_run.checkpoints["ours"]))
    theirs = cluster_spark.read.format("statestore").load(str(clean_run.checkpoints["spark"]))
    assert ours.rdd.getNumPartitions() == int(
        cluster_spark.conf.get("spark.sql.shuffle.partitions")
    )
    placed = ours.select("partition_id", F.spark_partition_id().alias("task")).distinct()
    assert all(r["partition_id"] == r["task"] for r in placed.collect())
    expected = state_rows(theirs)
    assert len(expected) > 1000
    assert state_rows(ours) == expected


def state_rows(df: Any) -> list[Any]:
    """A state reader's rows: (key, value, partition), sorted."""
    return sorted(((tuple(r.key), tuple(r.value), r.partition_id) for r in df.collect()), key=repr)


# --------------------------------------------------------------------------- the fault run


@dataclasses.dataclass
class FaultRun:
    outputs: Batches
    placements: dict[int, dict[int, str]]
    progress: dict[int, dict[str, Any]]
    observed: list[dict[str, Any]]
    victim: str
    survivor: str
    events: list[str]
    #: The memory provider's query, run beside the rocksdb one through the same faults.
    memory_outputs: Batches
    #: Each provider's checkpoint.
    checkpoints: dict[str, Path]


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _choose_victim(cluster: Cluster, last: dict[int, str]) -> tuple[Worker, Worker]:
    """The worker whose executor ran the most partitions in the last batch, and the other."""
    counts = {w.name: 0 for w in cluster.workers}
    for e in last.values():
        if e != "?":
            counts[e.split("/")[0]] += 1
    victim_name = max(counts, key=lambda n: counts[n])
    victim = next(w for w in cluster.workers if w.name == victim_name)
    survivor = next(w for w in cluster.workers if w.name != victim_name)
    return victim, survivor


@pytest.fixture(scope="module")
def fault_run(
    cluster: Cluster, cluster_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> FaultRun:
    """Our query on each provider, side by side over the same files, through one worker kill,
    the worker's return and a restart of both queries."""
    root = tmp_path_factory.mktemp("fault-run")
    feed = FileFeed(root / "input")
    checkpoints = {"rocksdb": root / "checkpoint", "memory": root / "checkpoint-memory"}
    providers = {"rocksdb": OBSERVED, "memory": OBSERVED_MEMORY}
    outs = {name: Collector() for name in checkpoints}
    events: list[str] = []
    placements: dict[int, dict[int, str]] = {}
    started = time.monotonic()

    def event(text: str) -> None:
        events.append(f"{time.monotonic() - started:6.1f}s  {text}")

    def start_all() -> dict[str, Any]:
        return {
            name: start_ours(cluster_spark, feed, checkpoints[name], outs[name], providers[name])
            for name in checkpoints
        }

    def stop_all(queries: dict[str, Any]) -> None:
        for q in queries.values():
            q.stop()

    def loaded(version: int) -> bool:
        return all(
            any(o["version"] == version for o in read_observed(c)) for c in checkpoints.values()
        )

    queries = start_all()
    victim = survivor = None
    try:
        for b, rows in enumerate(BATCHES):
            feed.add(rows)
            if b == KILL_AT:
                victim, survivor = _choose_victim(cluster, placements[b - 1])
                # Kill once a stateful task of this batch has loaded its store, in each query.
                running = _wait_for(lambda: loaded(KILL_AT), 60)
                cluster.kill_worker(victim)
                event(
                    f"batch {b}: SIGKILLed worker {victim.name} (executor and Python workers) "
                    + ("while the stateful stages ran" if running else "(no task seen yet)")
                )
            for q in queries.values():
                q.processAllAvailable()
            placements[b] = placement(checkpoints["rocksdb"], b, cluster.executor_dirs(LOCAL_DIR))
            event(f"batch {b} done")
            if b == BACK_AFTER:
                assert victim is not None
                stop_all(queries)
                cluster.start_worker(victim, wait=False)
                queries = start_all()  # no data yet
                cluster.wait_for_worker(victim)
                wait_for_executors(cluster_spark, len(cluster.workers))
                event(f"worker {victim.name} back (a new executor); queries restarted")
    finally:
        stop_all(queries)
        if victim is not None and victim.proc is None:  # leave the cluster whole
            cluster.start_worker(victim)
            wait_for_executors(cluster_spark, len(cluster.workers))
    assert victim is not None and survivor is not None
    return FaultRun(
        outputs=outs["rocksdb"].batches,
        placements=placements,
        progress=read_progress(checkpoints["rocksdb"]),
        observed=read_observed(checkpoints["rocksdb"]),
        victim=victim.name,
        survivor=survivor.name,
        events=events,
        memory_outputs=outs["memory"].batches,
        checkpoints=checkpoints,
    )


# --------------------------------------------------------------------------- 2. movement, loss


def test_worker_loss_and_restarts_keep_output_equal_to_spark(
    fault_run: FaultRun, clean_run: CleanRun
) -> None:
    print("\n" + "\n".join(fault_run.events))
    assert_same_batches(fault_run.outputs, clean_run.spark, len(BATCHES))
    assert_same_batches(fault_run.memory_outputs, clean_run.spark, len(BATCHES))


@pytest.mark.parametrize("provider", ["rocksdb", "memory"])
def test_worker_loss_and_restarts_keep_the_state_of_a_run_without_faults(
    fault_run: FaultRun, clean_run: CleanRun, cluster_spark: SparkSession, provider: str
) -> None:
    """The state the fault run left, read back, is the state Spark's own run left without
    faults (its state reader over its checkpoint)."""
    read = cluster_spark.read
    ours = read.format("sparkstate").load(str(fault_run.checkpoints[provider]))
    theirs = read.format("statestore").load(str(clean_run.checkpoints["spark"]))
    expected = state_rows(theirs)
    assert len(expected) > 1000
    assert state_rows(ours) == expected


def test_partitions_move_between_executors(fault_run: FaultRun) -> None:
    pl = fault_run.placements
    print(f"\nvictim {fault_run.victim}, survivor {fault_run.survivor}\n{describe(pl)}")
    executors_of: dict[int, set[str]] = {}
    for where in pl.values():
        for p, e in where.items():
            if e != "?":
                executors_of.setdefault(p, set()).add(e)
    ran = set().union(*executors_of.values())
    workers = {e.split("/")[0] for e in ran}
    assert workers == {fault_run.victim, fault_run.survivor}, ran
    assert any(len(es) >= 2 for es in executors_of.values()), executors_of
    # While the victim is down, the survivor runs every partition.
    for b in range(KILL_AT + 1, BACK_AFTER + 1):
        assert {e.split("/")[0] for e in pl[b].values()} == {fault_run.survivor}, (b, pl[b])
    # The restarted run's first batch leaves each partition in the state home that holds it;
    # before its second, the driver finds the victim's new executor (an empty local directory)
    # and gives it its share (engine/run/joined_homes.py): two partitions each from then on.
    b = BACK_AFTER + 1
    assert {e.split("/")[0] for e in pl[b].values()} == {fault_run.survivor}, (b, pl[b])
    for b in range(BACK_AFTER + 2, len(BATCHES)):
        held = collections.Counter(e.split("/")[0] for e in pl[b].values())
        assert held == {fault_run.victim: 2, fault_run.survivor: 2}, (b, pl[b])


FOUND = ("stateFoundOpen", "stateFoundLocal", "stateCaughtUp", "stateRestored")


def _found(progress: dict[int, dict[str, Any]]) -> dict[int, dict[str, int]]:
    """Per batch, where the partitions' state was found (the progress's custom metrics)."""
    return {
        b: {k: int(p["stateOperators"][0]["customMetrics"].get(k, 0)) for k in FOUND}
        for b, p in progress.items()
    }


def test_state_stays_with_its_executor(clean_run: CleanRun, fault_run: FaultRun) -> None:
    """After the first two batches, at least 95% of partition loads find their state in place
    (open in its home, or its local copy current: no restore, no changelog replayed), though
    Spark runs each batch's tasks on whichever executor is free; after an executor is killed,
    each of its partitions moves once, to the survivor."""
    clean = _found(read_progress(clean_run.checkpoints["ours"]))
    print("\nwhere the state was found, per batch (clean run):")
    for b, f in sorted(clean.items()):
        print(f"  batch {b}: {f}")
    later = [clean[b] for b in clean if b >= 2]
    loads = sum(sum(f.values()) for f in later)
    in_place = sum(f["stateFoundOpen"] + f["stateFoundLocal"] for f in later)
    assert loads >= 4 * (len(BATCHES) - 2), clean
    assert in_place >= 0.95 * loads, clean
    faulty = _found(fault_run.progress)
    print("fault run:")
    for b, f in sorted(faulty.items()):
        print(f"  batch {b}: {f}  ran on {fault_run.placements.get(b)}")
    pl = fault_run.placements
    owned = [p for p, e in pl[KILL_AT - 1].items() if e.startswith(fault_run.victim)]
    assert owned, pl
    for p in pl[KILL_AT - 1]:
        # (a batch whose committed attempt is in no executor's local directory, "?": the
        # executor that ran it was killed as it committed, tells nothing of a move)
        # (until the victim's new executor takes its share back: test above)
        seq = [
            pl[b][p].split("/")[0]
            for b in sorted(pl)
            if KILL_AT - 1 <= b <= BACK_AFTER + 1 and pl[b][p] != "?"
        ]
        moves = sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)
        assert moves == (1 if p in owned else 0), (p, seq)
    # Each moved partition restored its state on the survivor (a task the victim's executor
    # ran for another partition, routed to the survivor's home, may add a restore: it died
    # after that home committed, and its retry loads the version before).
    restored = sum(
        f["stateRestored"] + f["stateCaughtUp"] for b, f in faulty.items() if b >= KILL_AT
    )
    assert restored >= len(owned), (owned, faulty)


# --------------------------------------------------------------------------- 3. what a move costs


def _delta(o: dict[str, Any], name: str) -> float:
    return float(o["after"].get(name, 0)) - float(o["before"].get(name, 0))


def _classify(run: FaultRun) -> list[dict[str, Any]]:
    """Every load of a version > 0 with where the partition's previous winning attempt ran."""
    out = []
    for o in run.observed:
        v, p = int(o["version"]), int(o["partition"])
        if "error" in o or v == 0 or v - 1 not in run.placements:
            continue
        prev = run.placements[v - 1].get(p, "?")
        here = executor_of(o["cwd"])
        if prev == "?":
            kind = "unknown"
        elif prev == here:
            kind = "stay"
        elif _delta(o, "restores") > 0:
            kind = "move: snapshot"  # restored a snapshot (+ changelogs after it)
        else:
            kind = "move: replay"  # changelogs on an older local copy, or from version 0
        out.append(
            {
                **o,
                "kind": kind,
                "from": prev,
                "to": here,
                "restores": _delta(o, "restores"),
                "changelogs": _delta(o, "changelogsReplayed"),
                "downloaded": _delta(o, "bytesDownloaded"),
            }
        )
    return out


def test_cost_of_a_partition_moving_between_executors(fault_run: FaultRun) -> None:
    loads = _classify(fault_run)
    print("\nevery load: version, partition, from -> to executor, kind, load ms, restores,")
    print("changelogs replayed, bytes downloaded (from the provider's own counters):")
    for x in sorted(loads, key=lambda x: (x["version"], x["partition"])):
        print(
            f"  v{x['version']:<2} p{x['partition']}  {x['from']:>9} -> {x['to']:<9} "
            f"{x['kind']:<15} {x['load_ms']:8.1f} ms  {x['restores']:.0f} "
            f"{x['changelogs']:.0f} {x['downloaded']:.0f}"
        )
    print("\nby kind: n, median / max load ms, restores, changelogs replayed, bytes downloaded:")
    medians: dict[str, float] = {}
    for kind in sorted({x["kind"] for x in loads}):
        xs = [x for x in loads if x["kind"] == kind]
        ms = [x["load_ms"] for x in xs]
        medians[kind] = statistics.median(ms)
        print(
            f"  {kind:<15} n={len(xs):<3} {medians[kind]:8.1f} / {max(ms):8.1f} ms  "
            f"restores={sum(x['restores'] for x in xs):.0f}  "
            f"changelogs={sum(x['changelogs'] for x in xs):.0f}  "
            f"bytes={sum(x['downloaded'] for x in xs):.0f}"
        )
    stay = medians.get("stay")
    if stay is not None:
        extra = {k: round(v - stay, 1) for k, v in medians.items() if k.startswith("move")}
        print(f"  median extra load time of a move over a stay: {extra} ms")
    print("\nprogress per batch (stateOperators[0]; loadTimeMs is summed over the 4 partitions):")
    for b, p in sorted(fault_run.progress.items()):
        m = p["stateOperators"][0]["customMetrics"]
        print(
            f"  batch {b}: loadTimeMs={m.get('loadTimeMs')} restores={m.get('restores')} "
            f"changelogsReplayed={m.get('changelogsReplayed')} "
            f"bytesDownloaded={m.get('bytesDownloaded')} "
            f"rows={p['stateOperators'][0]['numRowsTotal']}"
        )
    failed = [o for o in fault_run.observed if "error" in o]
    assert not failed, "loads failed (the task was retried):\n" + "\n".join(
        f"  v{o['version']} p{o['partition']} on {executor_of(o['cwd'])}: {o['error']}"
        for o in failed
    )
    moves = [x for x in loads if x["kind"].startswith("move")]
    assert moves, "no partition moved between executors"
    # A move never finds the state in the new executor's local directory at the version it
    # needs: it restores a snapshot or replays changelogs from the checkpoint.
    for x in moves:
        assert x["restores"] > 0 or x["changelogs"] > 0, x
    assert any(x["kind"] == "move: snapshot" and x["downloaded"] > 0 for x in moves), moves


# --------------------------------------------------------------------------- bugs found


def test_progress_custom_metrics_describe_their_own_batch(fault_run: FaultRun) -> None:
    counters = ("restores", "changelogsReplayed", "bytesDownloaded")
    b = BACK_AFTER  # the second batch in a row on the survivor alone: nothing moves
    loads = [o for o in fault_run.observed if int(o["version"]) == b and "error" not in o]
    if any(_delta(o, c) for o in loads for c in counters):
        pytest.skip(f"a load of batch {b} restored or replayed (per the store): not quiet")
    # Providers that served this batch had restored or replayed in earlier batches.
    if not any(o["before"].get(c, 0) for o in loads for c in counters):
        pytest.skip(f"no provider that served batch {b} had restored or replayed before")
    metrics = fault_run.progress[b]["stateOperators"][0]["customMetrics"]
    print(f"\nbatch {b}: the stores did no restore work; progress says {metrics}")
    for c in counters:
        assert metrics[c] == 0, (c, metrics)
