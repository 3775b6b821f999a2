"""Rescaling state, against Spark's own repartition.

Each query (an aggregation, a deduplication, a transformWithState, a stream-stream join) runs
three times with ``availableNow`` over three new files each (one batch per file), the session's
shuffle partitions 3, then 5, then 2. Spark's query is rescaled between runs by its own
``StreamingCheckpointManager.repartition``, and ours by ``ss.repartition`` (on each provider):
each rescale is a batch of its own, in both. Ours is rescaled again by a restart that asks for
the new count (the session's shuffle partitions, or ``numPartitions``): that takes no batch id,
as Spark's restart with another count (which keeps the checkpoint's) takes none. Every batch's
output must equal Spark's, batch ids included; and Spark's rescaled run must give what its
unchanged query gives.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import CheckpointInUseError, ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .helpers import shuffle_partitions, spark_rocksdb

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long, ts timestamp"
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
#: The partition count of each run.
COUNTS = [3, 5, 2]
KEYS = [f"k{i}" for i in range(12)]


def _batch(run: int, batch: int) -> list[dict[str, Any]]:
    """Rows over many keys, some repeating (a key's second row in a batch, rows of earlier
    batches again: duplicates), event time moving 20 s a batch, one row late."""
    n = run * 3 + batch
    rows = []
    for i in range(9):
        k = KEYS[(n * 5 + i * 7) % len(KEYS)]
        ts = T0 + datetime.timedelta(seconds=n * 20 + i)
        rows.append({"k": k, "v": n * 10 + i, "ts": ts.isoformat()})
    rows.append(
        {"k": KEYS[n % 4], "v": n * 10, "ts": (T0 + datetime.timedelta(seconds=n * 20)).isoformat()}
    )
    rows.append({"k": "late", "v": -n, "ts": T0.isoformat()})
    return rows


class Counter:
    """A ``StatefulProcessor`` with value, list and map state."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))
        self.seen = handle.getListState("seen", StructType([StructField("v", LongType())]))
        self.named = handle.getMapState(
            "named",
            StructType([StructField("v", LongType())]),
            StructType([StructField("text", StringType())]),
        )

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:  # noqa: N802, N803
        n = self.count.get()[0] if self.count.exists() else 0
        total = 0
        for pdf in rows:
            n += len(pdf)
            values = [int(v) for v in pdf["v"]]
            self.seen.appendList([(v,) for v in values])
            for v in values:
                self.named.updateValue((v % 3,), (f"v{v}",))
        for (v,) in self.seen.get():
            total += v
        self.count.update((n,))
        names = sorted(t for _, (t,) in self.named.iterator())
        yield pd.DataFrame({"k": [key[0]], "n": [n], "total": [total], "names": [",".join(names)]})

    def close(self) -> None:
        pass


def _processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return type("CounterProcessor", (Counter, StatefulProcessor), {})()


#: name -> (the query on a DataFrame with its functions module, output mode, watermark)
QUERIES: dict[str, tuple[Callable[[Any, Any], Any], str, bool]] = {
    "aggregate": (
        lambda df, fn: df.groupBy("k").agg(fn.count("*").alias("n"), fn.sum("v"), fn.max("ts")),
        "update",
        False,
    ),
    "dedup": (lambda df, fn: df.dropDuplicates(["k", "ts"]), "append", True),
    "transformWithState": (
        lambda df, fn: df.groupBy("k").transformWithStateInPandas(
            _processor(), "k string, n long, total long, names string", "update", "None"
        ),
        "update",
        False,
    ),
    # A left outer stream-stream join of the input with its own rows of odd v, a key's rows in
    # the 10 s after: both sides' buffered rows move by the join key.
    "join": (lambda df, fn: df, "append", True),
}
#: The join's condition, over the input and its second stream's renamed columns.
JOIN_CONDITION = "rk = k AND rts >= ts AND rts <= ts + interval 10 seconds"
#: sparkstate's runs: (query, provider, how it rescales).
#: The aggregation and the join rescaled by ``ss.repartition`` on memory and by a restart on
#: rocksdb; the deduplication only the first way, transformWithState only the second: the two
#: ways run the same job, which reads and writes through either provider (CI time is kept for
#: what differs). The aggregation's restart asks by the session's shuffle partitions, as
#: Spark's unchanged query is restarted; the others by ``numPartitions``.
OURS = [
    ("aggregate", "memory", "repartition"),
    ("aggregate", "rocksdb", "restart"),
    ("dedup", "memory", "repartition"),
    ("transformWithState", "rocksdb", "restart"),
    ("join", "memory", "repartition"),
    ("join", "rocksdb", "restart"),
]


def _start(
    spark: SparkSession,
    feed: FileFeed,
    name: str,
    system: str,
    chk: Path,
    collector: Collector,
    **options: str,
) -> None:
    build, mode, watermark = QUERIES[name]
    df = feed.stream(spark, SCHEMA)
    if watermark:
        df = df.withWatermark("ts", "30 seconds")
    wrapped = df if system == "spark" else ss.stream(df)
    query = build(wrapped, F if system == "spark" else SF)
    if name == "join":
        right = feed.stream(spark, SCHEMA).where("v % 2 = 1")
        right = right.select(
            F.col("k").alias("rk"), F.col("v").alias("rv"), F.col("ts").alias("rts")
        )
        right = right.withWatermark("rts", "30 seconds")
        query = query.join(right, F.expr(JOIN_CONDITION), "left_outer")
    writer = query.writeStream
    for k, v in options.items():
        writer = writer.option(k, v)
    q = (
        writer.outputMode(mode)
        .foreachBatch(collector)
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()


@pytest.fixture(scope="module")
def runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    """Every system's three runs over the same files; the collectors and checkpoints."""
    root = tmp_path_factory.mktemp("rescale")
    feed = FileFeed(root / "input")
    out: dict[Any, Any] = {"feed": feed}
    with spark_rocksdb(spark):
        for run, count in enumerate(COUNTS):
            with shuffle_partitions(spark, count):
                _run(spark, feed, root, out, run, count)
    return out


def _run(
    spark: SparkSession, feed: FileFeed, root: Path, out: dict[Any, Any], run: int, count: int
) -> None:
    """Run ``run`` of every system, on ``count`` partitions."""
    for batch in range(3):
        feed.add(_batch(run, batch))
    for name in QUERIES:
        for system in ("spark", "spark-unchanged"):
            if system == "spark-unchanged" and name != "aggregate":
                continue
            chk = root / f"{name}-{system}"
            collector = out.setdefault((name, system), Collector())
            if run and system == "spark":
                spark._streamingCheckpointManager.repartition(str(chk), count)
            _start(spark, feed, name, "spark", chk, collector)
            out[(name, system, "chk")] = chk
        for name_, provider, how in OURS:
            if name_ != name:
                continue
            chk = root / f"{name}-{provider}-{how}"
            collector = out.setdefault((name, provider, how), Collector())
            options = {"stateStore": provider}
            if how == "repartition" and run:
                ss.repartition(spark, str(chk), count)
            if how == "restart" and name != "aggregate":
                options["numPartitions"] = str(count)
            _start(spark, feed, name, "ours", chk, collector, **options)
            out[(name, provider, how, "chk")] = chk


def _without_rescales(batches: dict[int, Any]) -> dict[int, Any]:
    """Spark's batches after its repartitions as its restarts without them number them: the
    ids of the two rescale batches (which reach no sink) taken out."""
    rescales = [b for b in range(max(batches) + 1) if b not in batches]
    assert len(rescales) == len(COUNTS) - 1
    return {b - sum(r < b for r in rescales): rows for b, rows in batches.items()}


@pytest.mark.parametrize(("name", "provider", "how"), OURS)
def test_output_equals_sparks_after_its_repartition(
    runs: dict[Any, Any], name: str, provider: str, how: str
) -> None:
    """Rescaled by ``ss.repartition``: Spark's batches after its own repartition, whose rescale
    batches took ids. Rescaled by a restart: Spark's batches, ids included, after the same
    restart (the aggregation: Spark's own run; the others: as Spark numbers them without the
    rescale batches, which for the aggregation is its own run)."""
    theirs = runs[(name, "spark")].batches
    ours = runs[(name, provider, how)].batches
    assert len(theirs) >= 9
    if how == "restart":
        unchanged = runs.get((name, "spark-unchanged"))
        theirs = unchanged.batches if unchanged else _without_rescales(theirs)
        assert sorted(ours) == list(range(len(ours)))  # the rescales took no id
    assert ours == theirs


def test_sparks_rescaled_run_equals_its_unchanged_one(runs: dict[Any, Any]) -> None:
    """Spark's rescaled query gives what its restarted unchanged one gives, batch for batch,
    but for the ids the rescale batches take: so ours does too."""
    rescaled = runs[("aggregate", "spark")].batches
    unchanged = runs[("aggregate", "spark-unchanged")].batches
    assert _without_rescales(rescaled) == unchanged
    assert sorted(rescaled) != sorted(unchanged)  # the two rescale batches took ids


@pytest.mark.parametrize(("name", "provider", "how"), OURS)
def test_the_state_is_in_the_new_partitions(
    runs: dict[Any, Any], name: str, provider: str, how: str
) -> None:
    chk = runs[(name, provider, how, "chk")]
    engine = chk / "sparkstate"
    assert json.loads((engine / "metadata.json").read_text())["num_partitions"] == COUNTS[-1]
    commits = sorted(int(p.stem) for p in (engine / "commits").glob("*.json"))
    rescales = [
        b
        for b in commits
        if json.loads((engine / "commits" / f"{b}.json").read_text()).get("repartition")
    ]
    assert len(rescales) == 2
    last = json.loads((engine / "commits" / f"{commits[-1]}.json").read_text())
    assert [len(o["checkpoint_ids"]) for o in last["operators"].values()] == [COUNTS[-1]]
    progress = [json.loads(line) for line in (engine / "progress.jsonl").read_text().splitlines()]
    assert progress[-1]["stateOperators"][0]["numShufflePartitions"] == COUNTS[-1]
    if how == "restart":  # each rescale rewrote the outcome of the batch before the restart
        assert set(rescales) <= set(runs[(name, provider, how)].batches)
        return
    offsets = chk / "offsets" / str(rescales[-1])
    conf = json.loads(offsets.read_text().splitlines()[1])["conf"]
    assert conf["spark.sql.shuffle.partitions"] == str(COUNTS[-1])


def test_the_reader_reads_the_rescaled_state(spark: SparkSession, runs: dict[Any, Any]) -> None:
    """The reader on the last batch and on a batch before the rescales: the same keys. (The
    state after batch 2 is in 5 partitions: the restart after it rescaled it in place.)"""
    chk = str(runs[("aggregate", "rocksdb", "restart", "chk")])
    ss.register(spark)
    now = spark.read.format("sparkstate").load(chk)
    assert {r["partition_id"] for r in now.collect()} <= set(range(COUNTS[-1]))
    first = spark.read.format("sparkstate").option("batchId", 1).load(chk).collect()
    assert {r["partition_id"] for r in first} <= set(range(COUNTS[0]))
    keys_then = {r["key"]["k"] for r in first}
    assert keys_then <= {r["key"]["k"] for r in now.collect()}


def test_refusals(spark: SparkSession, runs: dict[Any, Any], tmp_path: Path) -> None:
    chk = str(runs[("aggregate", "memory", "repartition", "chk")])
    with pytest.raises(ConfigurationError, match="already has 2 state partitions"):
        ss.repartition(spark, chk, 2)
    with pytest.raises(ConfigurationError, match="at least 1"):
        ss.repartition(spark, chk, 0)
    with pytest.raises(ConfigurationError, match="not a sparkstate checkpoint"):
        ss.repartition(spark, str(runs[("aggregate", "spark", "chk")]), 4)
    feed = FileFeed(tmp_path / "input")
    feed.add(_batch(0, 0))
    df = feed.stream(spark, SCHEMA)
    query = (
        ss.stream(df)
        .groupBy("k")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.processAllAvailable()
        with pytest.raises(CheckpointInUseError):
            ss.repartition(spark, str(tmp_path / "chk"), 3)
    finally:
        query.stop()


def test_the_command_says_what_it_moved_once(runs: dict[Any, Any], tmp_path: Path) -> None:
    """``sparkstate repartition``: the rescale's line (keys moved, time) once, on stdout."""
    import shutil

    chk = tmp_path / "chk"
    shutil.copytree(runs[("aggregate", "memory", "repartition", "chk")], chk)
    command = [str(Path(sys.executable).parent / "sparkstate"), "repartition", str(chk)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [*command, "--partitions", "3", "--master", "local[2]"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "from 2 to 3 partitions" in done.stdout
    assert (done.stdout + done.stderr).count("rescaled the state of") == 1
    # stderr is no terminal: no bars, and not Spark's own either
    assert "operator 0" not in done.stderr and "[Stage" not in done.stderr


def test_the_bars_count_the_partitions_read_and_written(
    spark: SparkSession, runs: dict[Any, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``progress=True``: a bar per operator's old partitions read (and their rows) and new
    partitions written, on stderr; drawn once, as they ended, where stderr is no terminal."""
    import shutil

    chk = tmp_path / "chk"
    shutil.copytree(runs[("aggregate", "memory", "repartition", "chk")], chk)
    capsys.readouterr()
    ss.repartition(spark, str(chk), 4, progress=True)
    err = capsys.readouterr().err
    old = COUNTS[-1]
    assert re.search(rf"operator 0 \(aggregate\) read .* {old}/{old} .* [\d,]+ rows", err), err
    assert re.search(r"operator 0 \(aggregate\) write .* 4/4 ", err), err


def test_a_start_before_any_commit_takes_the_new_count(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    feed = FileFeed(tmp_path / "input")
    df = feed.stream(spark, SCHEMA)
    chk = tmp_path / "chk"

    def start(n: str) -> Any:
        return (
            ss.stream(df)
            .groupBy("k")
            .count()
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(chk))
            .option("numPartitions", n)
            .start()
        )

    start("3").stop()
    with caplog.at_level(logging.WARNING, "sparkstate"):
        query = start("6")
    try:
        feed.add(_batch(0, 0))
        query.processAllAvailable()
    finally:
        query.stop()
    assert json.loads((chk / "sparkstate" / "metadata.json").read_text())["num_partitions"] == 6
    assert "state starts with 6 partitions" in caplog.text


#: A child process that rescales and is killed at ``POINT``: before the commit (the state
#: written, the commit not), or after it (before Spark's logs have the batch); or that rescales
#: in place, as a start does, killed before the commit (``start-commit``).
KILLED = textwrap.dedent(
    """
    import importlib, os, signal, sys
    from pyspark.sql import SparkSession
    import sparkstate as ss
    from sparkstate.runtime import rescale

    rep = importlib.import_module("sparkstate.engine.jobs.rescale")

    chk, count, point = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if point in ("commit", "start-commit"):
        rep.commit_rescale = die
    else:
        rescale.copy_spark_batch = die
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = builder.getOrCreate()
    if point.startswith("start-"):
        rep.rescale_at_start(spark, chk, count)
    else:
        ss.repartition(spark, chk, count)
    """
)


def _kill_halfway(chk: Path, count: int, point: str) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(chk), str(count), point],
        env=env,
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]


def test_a_killed_repartition_leaves_the_checkpoint_or_completes(
    spark: SparkSession, runs: dict[Any, Any], tmp_path: Path
) -> None:
    """Killed before its commit: the checkpoint is as it was (Spark's logs, the count, the
    last batch's outcome), and running it again completes it (``ss.repartition``, or the start
    that asks for the count, in place); killed after: the next start finishes it. Either way
    the next run gives Spark's output, after a rescale batch (``ss.repartition``) or none (in
    place)."""
    import shutil

    source = runs[("aggregate", "rocksdb", "restart", "chk")]
    expected = runs[("aggregate", "spark-unchanged")]  # the batches of the restarts' rescales
    last = max(expected.batches)
    for batch in range(3):  # a fourth run's files, read by the checkpoints copied below
        runs["feed"].add(_batch(len(COUNTS), batch))
    for point in ("commit", "spark-logs", "start-commit"):
        chk = tmp_path / point
        shutil.copytree(source, chk)
        engine = chk / "sparkstate"
        offsets_before = sorted(os.listdir(chk / "offsets"))
        outcome = (engine / "commits" / f"{last}.json").read_text()
        _kill_halfway(chk, 4, point)
        metadata = json.loads((engine / "metadata.json").read_text())
        in_place = point == "start-commit"
        if point.endswith("commit"):
            assert sorted(os.listdir(chk / "offsets")) == offsets_before
            assert (engine / "commits" / f"{last}.json").read_text() == outcome
            assert metadata["num_partitions"] == 2
        if point == "commit":
            ss.repartition(spark, str(chk), 4)
        ours = Collector()
        options = {"stateStore": "rocksdb", **({"numPartitions": "4"} if in_place else {})}
        _start(spark, runs["feed"], "aggregate", "ours", chk, ours, **options)
        assert json.loads((engine / "metadata.json").read_text())["num_partitions"] == 4
        new = {b: rows for b, rows in ours.batches.items() if b > last}
        first = last + 1 if in_place else last + 2  # after the rescale batch, if any
        assert sorted(new) == [first, first + 1, first + 2], point
        for j, b in enumerate(sorted(new)):
            assert [r[:3] for r in new[b]] == _totals(len(COUNTS), j), (point, b)


def _totals(run: int, batch: int) -> list[tuple[Any, ...]]:
    """What ``groupBy("k").agg(count, sum(v))`` emits in update mode for batch ``batch`` of
    run ``run``: each key of the batch with its count and sum over every batch up to it."""
    rows = [r for n in range(run * 3 + batch + 1) for r in _batch(n // 3, n % 3)]
    now = {r["k"] for r in _batch(run, batch)}
    out = [
        (k, sum(1 for r in rows if r["k"] == k), sum(r["v"] for r in rows if r["k"] == k))
        for k in now
    ]
    return sorted(out)


def test_a_failed_last_batch_is_refused_or_skipped(
    spark: SparkSession, runs: dict[Any, Any], tmp_path: Path
) -> None:
    """A last batch that did not commit: refused, as Spark refuses it, unless
    ``enforce_exactly_once_sink=False``, which skips it; the next run reads its input again."""
    import shutil

    chk = tmp_path / "chk"
    shutil.copytree(runs[("aggregate", "memory", "repartition", "chk")], chk)
    last = max(runs[("aggregate", "spark")].batches)
    (chk / "commits" / str(last)).unlink()  # the query died before Spark's commit...
    (chk / "sparkstate" / "commits" / f"{last}.json").unlink()  # ... and before ours
    with pytest.raises(ConfigurationError, match=f"batch {last} was planned but did not commit"):
        ss.repartition(spark, str(chk), 4)
    batch = ss.repartition(spark, str(chk), 4, enforce_exactly_once_sink=False)
    assert batch == last  # the failed batch was rolled back: the rescale took its id
    ours = Collector()
    with shuffle_partitions(spark, 4):  # what it was rescaled to: no rescale at this start
        _start(spark, runs["feed"], "aggregate", "ours", chk, ours, stateStore="memory")
    assert min(ours.batches) == last + 1
    # The skipped batch's file is read again (with what Spark's file source plans next): every
    # key ends at its count and sum over all files, none counted twice, none lost.
    latest = {r[0]: r[1:3] for _, rows in sorted(ours.batches.items()) for r in rows}
    files = runs["feed"].count
    rows = [r for n in range(files) for r in _batch(n // 3, n % 3)]
    again = {r["k"] for n in range(len(COUNTS) * 3 - 1, files) for r in _batch(n // 3, n % 3)}
    assert set(latest) == again
    for k in again:
        mine = [r for r in rows if r["k"] == k]
        assert latest[k] == (len(mine), sum(r["v"] for r in mine)), k


@pytest.mark.parametrize("how", ["repartition", "restart"])
def test_a_rescaled_join_counts_the_rows_it_holds(
    spark: SparkSession, runs: dict[Any, Any], how: str
) -> None:
    """Each new partition of a join counted the rows it received: after the rescales, the
    progress's rows in state are the rows the state reader finds on both sides."""
    provider = "memory" if how == "repartition" else "rocksdb"
    chk = runs[("join", provider, how, "chk")]
    engine = chk / "sparkstate"
    progress = [json.loads(line) for line in (engine / "progress.jsonl").read_text().splitlines()]
    ss.register(spark)
    rows = sum(
        spark.read.format("sparkstate").option("joinSide", side).load(str(chk)).count()
        for side in ("left", "right")
    )
    assert rows > 0
    assert progress[-1]["stateOperators"][0]["numRowsTotal"] == rows
