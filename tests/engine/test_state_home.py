"""State homes: each partition's state stays open in one long-lived process of its executor.

A task's Python worker streams its input to the partition's home and the output back; the home
runs the task against the state it keeps open. Killing a home (in the middle of a task or of a
commit) or the worker streaming to it loses nothing and counts nothing twice; two applications
never share a home, and a home ends with its application.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.runtime.home import PROCESS_NAME
from sparkstate.runtime.home_client import home_dir
from sparkstate.testing.differential import Collector

from .conftest import PARTITIONS, PROVIDERS, FileFeed
from .faults import KILLING, arm
from .helpers import batches_to_parquet, normalize, oracle_update, read_batches, run_batches, source

SCHEMA = "k string, v int"
BATCHES: list[list[dict[str, Any]]] = [
    [{"k": f"k{(i * 7) % 13}", "v": i} for i in range(40 + 10 * b)] for b in range(5)
]
FOUND = ("stateFoundOpen", "stateFoundLocal", "stateCaughtUp", "stateRestored")


def spark_aggs() -> list[Any]:
    return [F.count("*").alias("n"), F.sum("v").alias("total")]


def start(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str, **options: str
) -> Any:
    writer = (
        ss.stream(source(spark, feed, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(batches_to_parquet(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("stateStore", provider)
        .option("stateStore.state_home", "true")
    )
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def assert_output_is_sparks(spark: SparkSession, tmp_path: Path) -> None:
    assert_output_is_sparks_upto(spark, tmp_path, len(BATCHES))


def assert_output_is_sparks_upto(spark: SparkSession, tmp_path: Path, batches: int) -> None:
    expected = oracle_update(spark, SCHEMA, BATCHES[:batches], ["k"], spark_aggs)
    want = normalize([r for b in sorted(expected) for r in expected[b]])
    got = read_batches(spark, tmp_path / "out", "k string, n long, total long")
    assert normalize(got) == want


def found(query: Any) -> dict[int, dict[str, int]]:
    """Per batch, where the partitions' state was found (progress custom metrics)."""
    return {
        p["batchId"]: {k: p["stateOperators"][0]["customMetrics"].get(k, 0) for k in FOUND}
        for p in query.recentProgress
        if p["stateOperators"]
    }


def homes(jvm: int) -> dict[int, str]:
    """The running state homes of the executor whose JVM is ``jvm``: pid -> socket (from the
    homes' pid files; each process is named ``sparkstate-home``)."""
    out: dict[int, str] = {}
    for pid_file in Path(home_dir()).glob(f"{jvm}-*.pid"):
        try:
            pid = int(pid_file.read_text())
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):  # a home ending right now
            continue
        assert name == PROCESS_NAME, (pid, name)
        out[pid] = str(pid_file.with_suffix(".sock"))
    return out


def jvm_pid(spark: SparkSession) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_state_stays_open_in_its_home_and_a_killed_home_loses_nothing(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    state = tmp_path / "chk" / "sparkstate"
    # batch 3 (version 4): the home dies right after loading partition 0's store; batch 4
    # (version 5): the home of partition 1 dies after its version is durable, before the
    # task's output reached Spark.
    markers = [arm(state, "open", 4, 0), arm(state, "commit", 5, 1)]
    q = start(spark, feed, tmp_path, KILLING[provider])
    run_batches(feed, q, BATCHES)
    assert not any(m.exists() for m in markers), "the faults did not fire"
    assert_output_is_sparks(spark, tmp_path)
    where = found(q)
    # Batches 1 and 2: every partition's state was open in its home at the version asked for.
    for batch in (1, 2):
        assert where[batch]["stateFoundOpen"] == PARTITIONS, where
        assert where[batch]["stateRestored"] + where[batch]["stateCaughtUp"] == 0, where
    # Batch 3: the retried task's new home restored partition 0 from the checkpoint.
    assert where[3]["stateRestored"] >= 1, where
    slots = {socket.rsplit("-", 1)[1] for socket in homes(jvm_pid(spark)).values()}
    assert slots == {"0.sock", "1.sock"}  # a home per task slot of the executor


def _kill_workers_when_stalled(marker: Path, jvm: int, killed: list[int]) -> None:
    """Once a task is in flight in a home, SIGKILL the executor's Python workers (PySpark's
    daemon's children): the one streaming to the home dies in the middle of its task."""
    at = marker.with_name(marker.name + ".at")
    deadline = time.monotonic() + 120
    while not at.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemons = [p for p in _children(jvm) if b"pyspark.daemon" in _cmdline(p)]
    unix = _unix_socket_inodes()
    for daemon in daemons:
        for worker in _children(daemon):
            # Only a worker in a task (connected to a home): an idle pooled worker killed here
            # would fail the retry that Spark hands it next, and the task with it.
            if _socket_inodes(worker) & unix:
                os.kill(worker, signal.SIGKILL)
                killed.append(worker)


def _unix_socket_inodes() -> set[str]:
    """The inodes of this machine's Unix sockets (``/proc/net/unix``)."""
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {fields[6] for fields in (line.split() for line in lines) if len(fields) > 6}


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    out = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:[") : -1])
    return out


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):  # a JVM's children are its threads'
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("provider", PROVIDERS)
def test_worker_killed_while_its_task_runs_in_the_home(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    state = tmp_path / "chk" / "sparkstate"
    marker = arm(state, "stall", 3, 1)  # batch 2, partition 1: the home holds the task
    jvm = jvm_pid(spark)
    before: dict[int, str] = {}
    killed: list[int] = []
    killer = threading.Thread(target=_kill_workers_when_stalled, args=(marker, jvm, killed))
    killer.start()
    # Every batch in Spark's tasks (a small one runs from the driver, with no worker).
    q = start(spark, feed, tmp_path, KILLING[provider], **{"stateStore.direct_batch_rows": "0"})
    try:
        run_batches(feed, q, BATCHES, on_batch=lambda b: b or before.update(homes(jvm)))
    finally:
        killer.join()
    assert killed, "no Python worker was killed"
    assert_output_is_sparks(spark, tmp_path)
    assert before
    assert homes(jvm) == before  # the homes outlived the workers; the retry found its state


APP = textwrap.dedent(
    """
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    import sparkstate as ss

    feed, chk = sys.argv[1], sys.argv[2]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.readStream.schema("k string, v int").json(feed)
    q = (ss.stream(df).groupBy("k").count().writeStream.outputMode("update").format("noop")
         .option("checkpointLocation", chk).option("stateStore", "rocksdb")
         .option("stateStore.state_home", "true").start())
    q.processAllAvailable()
    q.stop()
    import glob, tempfile
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    where = os.path.join(tempfile.gettempdir(), f"sparkstate-homes-{os.getuid()}")
    print("JVM", jvm, "HOMES", len(glob.glob(os.path.join(where, f"{jvm}-*.sock"))), flush=True)
    """
)


def test_applications_keep_their_own_homes_and_none_outlives_its_application(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    q = start(spark, feed, tmp_path, "rocksdb")
    run_batches(feed, q, BATCHES[:1])
    ours = homes(jvm_pid(spark))
    assert ours
    script = tmp_path / "app.py"
    script.write_text(APP)
    done = subprocess.run(
        [sys.executable, str(script), str(feed.path), str(tmp_path / "other")],
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    words = done.stdout.decode().split("JVM")[-1].split()
    other, started = int(words[0]), int(words[2])
    assert started == 2, "the other application ran no homes"
    assert other != jvm_pid(spark)
    deadline = time.monotonic() + 10
    while homes(other) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert homes(other) == {}, "a home outlived its application"
    assert not list(Path(next(iter(ours.values()))).parent.glob(f"{other}-*")), "files left"
    assert homes(jvm_pid(spark)) == ours  # ours were not touched by the other application


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_clean_stop_leaves_a_snapshot_to_restore_and_nothing_to_replay(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    """A query that stops cleanly has each home snapshot its partitions' newest versions; a
    restart on a new executor (no home, no local copy) restores them and replays nothing."""
    local = tmp_path / "local"

    def started() -> Any:
        return start(spark, feed, tmp_path, provider, **{"stateStore.local_dir": str(local)})

    run_batches(feed, started(), BATCHES[:3])  # versions 1-3; snapshots every 10 by default
    state = tmp_path / "chk" / "sparkstate" / "state" / "0"
    for part in range(PARTITIONS):
        assert [p.name.split("_")[0] for p in (state / str(part)).glob("*.snapshot*")] == ["3"]
    jvm = jvm_pid(spark)
    for pid in homes(jvm):  # a new executor: its homes and local copies are gone
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while homes(jvm) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert homes(jvm) == {}
    if local.exists():
        shutil.rmtree(local)
    q = started()
    run_batches(feed, q, BATCHES[3:4])
    metrics = q.lastProgress["stateOperators"][0]["customMetrics"]
    assert metrics["stateRestored"] == PARTITIONS, metrics
    if provider == "rocksdb":
        assert metrics["changelogsReplayed"] == 0, metrics
    assert_output_is_sparks_upto(spark, tmp_path, 4)


def _stop_the_home_when_stalled(marker: Path, stopped: list[int]) -> None:
    """Once the home runs the marked task, SIGSTOP it: it hangs, its heartbeat stops."""
    at = marker.with_name(marker.name + ".at")
    deadline = time.monotonic() + 120
    while not at.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if at.exists():
        pid = int(at.read_text())
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)


def test_a_hung_home_fails_its_task_and_a_slow_one_does_not(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """With a 2 s silence limit: a task that takes longer in its home (stalled 4 s, its home's
    heartbeat going) succeeds where it is; a home that hangs (SIGSTOPped in a task) is given
    up and killed, and the retry's new home restores the state."""
    state = tmp_path / "chk" / "sparkstate"
    slow = arm(state, "stall", 2, 0)  # batch 1, partition 0: slow, alive
    hung = arm(state, "stall", 4, 1)  # batch 3, partition 1: its home is stopped
    stopped: list[int] = []
    stopper = threading.Thread(target=_stop_the_home_when_stalled, args=(hung, stopped))
    stopper.start()
    jvm = jvm_pid(spark)
    seen: dict[int, dict[int, str]] = {}
    q = start(spark, feed, tmp_path, KILLING["rocksdb"], **{"stateStore.home_timeout_s": "2"})
    try:
        run_batches(feed, q, BATCHES, on_batch=lambda b: seen.update({b: homes(jvm)}))
    finally:
        stopper.join()
    assert not slow.exists() and stopped, "the stalls did not happen"
    assert_output_is_sparks(spark, tmp_path)
    where = found(q)
    assert seen[1] == seen[0] and where[1]["stateFoundOpen"] == PARTITIONS, (seen, where)
    assert stopped[0] in seen[2] and stopped[0] not in seen[3], (stopped, seen)
    assert not Path(f"/proc/{stopped[0]}").exists() or _state(stopped[0]) in ("Z", "X")
    assert len(seen[3]) == 2, seen  # the slot got a new home
    assert where[3]["stateRestored"] >= 1, where


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


def test_the_users_function_sees_the_context_of_its_task_as_in_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """In a home, ``TaskContext.get()`` answers the task the function runs for (not None, and
    not the task that started the home), as in Spark's own ``applyInPandasWithState``: the same
    partition per key, attempt and local property."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count_with_task_context(key: Any, pdfs: Any, state: Any) -> Any:
        """A count per key that also says which task ran it (``TaskContext.get()``)."""
        import pandas as pd
        from pyspark import TaskContext

        n = sum(len(pdf) for pdf in pdfs) + (state.get[0] if state.exists else 0)
        state.update((n,))
        context = TaskContext.get()
        yield pd.DataFrame(
            {
                "k": [key[0]],
                "n": [n],
                "part": [context.partitionId()],
                "attempt": [context.attemptNumber()],
                "pool": [context.getLocalProperty("spark.scheduler.pool") or ""],
            }
        )

    schema = "k string, n long, part int, attempt int, pool string"
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", "counts")
    queries = {}
    sinks = {"spark": Collector(), "ours": Collector()}
    try:
        for name, wrap in (("spark", lambda df: df), ("ours", ss.stream)):
            queries[name] = (
                wrap(source(spark, feed, SCHEMA))
                .groupBy("k")
                .applyInPandasWithState(
                    count_with_task_context,
                    schema,
                    "n long",
                    "update",
                    GroupStateTimeout.NoTimeout,
                )
                .writeStream.outputMode("update")
                .foreachBatch(sinks[name])
                .option("checkpointLocation", str(tmp_path / name / "chk"))
                .start()
            )
        for rows in BATCHES[:3]:
            feed.add(rows)
            for q in queries.values():
                q.processAllAvailable()
    finally:
        for q in queries.values():
            q.stop()
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)
    got = {name: sorted(r for b in c.batches.values() for r in b) for name, c in sinks.items()}
    assert len(got["spark"]) > 13
    assert {r[2] for r in got["spark"]} == set(range(PARTITIONS))
    assert {r[4] for r in got["spark"]} == {"counts"}
    assert got["ours"] == got["spark"]
