"""The engine with its state on S3 (a loopback ``moto_server``): an aggregation run three times
with ``availableNow`` over files added between the runs, the third time by new Python workers
with an empty local directory, which restore the state from S3 (the rocksdb provider lazily:
reading the snapshot's SST files on S3 a block at a time while they download); Spark's own
aggregation over the same files, on a local checkpoint, is the oracle. Then the state reader (a
Spark job whose tasks read S3) and ``sparkstate inspect`` on the checkpoint.

Spark's own checkpoint (``checkpointLocation``) stays local, since Spark reaches S3 only with
``hadoop-aws`` on its class path; the state goes to ``stateLocation``. The Python workers reach
S3 as pyarrow does, with the credentials in their environment: here the SparkContext's executor
environment (what ``spark.executorEnv.AWS_...`` sets), for this module's queries and reader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from tests.s3_fault_proxy import FaultProxy
from tests.store.conftest import S3Endpoint
from tests.store.conftest import s3_endpoint as s3_endpoint  # the loopback S3 server fixture

import sparkstate as ss
from sparkstate import cli
from sparkstate import functions as SF
from sparkstate.files.durable import DurableDir, join_uri
from sparkstate.testing import FileFeed

from .conftest import PARTITIONS, PROVIDERS
from .helpers import Collector

pytestmark = [pytest.mark.spark, pytest.mark.s3]

SCHEMA = "k string, v long"
#: Three runs of a file (a batch) or two; keys repeat across runs.
RUNS: list[list[list[tuple[str, int]]]] = [
    [[("a", 1), ("b", 2), ("a", 3)], [("c", 4), ("a", 5)]],
    [[("b", 6), ("d", 7)]],
    [[("a", 8), ("e", 9), ("d", 10)], [("f", 11)]],
]
#: The batches of the last run, the first of which the new workers run.
LAST_RUN = (3, 4)


def _add(feed: FileFeed, run: list[list[tuple[str, int]]]) -> None:
    for batch in run:
        feed.add([{"k": k, "v": v} for k, v in batch])


@pytest.fixture(scope="module")
def s3(spark: SparkSession, s3_endpoint: S3Endpoint) -> Iterator[S3Endpoint]:  # noqa: F811
    """The endpoint, its credentials and address in the environment of this process and of
    the Python workers of the UDFs made from now on (the reader is registered again to carry
    them): a plain ``s3://bucket/path`` then names a directory on it."""
    env = {
        k: os.environ[k]
        for k in (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "AWS_EC2_METADATA_DISABLED",
        )
    }
    env["AWS_ENDPOINT_URL"] = s3_endpoint.url
    executor_env = spark.sparkContext.environment
    before = {k: executor_env.get(k) for k in env}
    executor_env.update(env)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AWS_ENDPOINT_URL", s3_endpoint.url)
            ss.register(spark)
            yield s3_endpoint
    finally:
        for k, v in before.items():
            if v is None:
                executor_env.pop(k, None)
            else:
                executor_env[k] = v
        ss.register(spark)


@pytest.fixture(scope="module")
def oracle(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Collector:
    """Spark's own aggregation over the runs' files, run as ours is, on a local checkpoint."""
    root = tmp_path_factory.mktemp("oracle")
    feed = FileFeed(root / "input")
    collector = Collector()
    for run in RUNS:
        _add(feed, run)
        q = (
            feed.stream(spark, SCHEMA)
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
            .writeStream.outputMode("update")
            .foreachBatch(collector)
            .option("checkpointLocation", str(root / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
    return collector


def _python_workers(spark: SparkSession) -> list[int]:
    """The session's Python workers: the children of the ``pyspark.daemon`` processes of its
    JVM."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    parents: dict[int, int] = {}
    daemons = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        parents[int(entry)] = parent
        if parent == jvm_pid and b"pyspark.daemon" in command:
            daemons.add(int(entry))
    return [pid for pid, parent in parents.items() if parent in daemons]


def _end_python_workers(spark: SparkSession) -> None:
    """Kill the session's Python workers, as if the executor were new: Spark starts others."""
    for pid in _python_workers(spark):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _python_workers(spark):
        assert time.monotonic() < deadline, "the Python workers did not end"
        time.sleep(0.05)


def _start(
    spark: SparkSession, feed: FileFeed, chk: Path, state: str, local: Path, provider: str
) -> tuple[Any, Collector]:
    collector = Collector()
    q = (
        ss.stream(feed.stream(spark, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(collector)
        .option("checkpointLocation", str(chk))
        .option("stateLocation", state)
        .option("stateStore", provider)
        .option("stateStore.local_dir", str(local))
        .option("stateStore.min_deltas_for_snapshot", "1")  # snapshots to restore from
        .option("stateStore.lazy_restore_min_mb", "0")  # rocksdb: a restore is a lazy one
        .option("stateStore.maintenanceIntervalSeconds", "0")
        .trigger(availableNow=True)
        .start()
    )
    return q, collector


def _restored(provider: str, metrics: dict[str, float]) -> None:
    """Every partition's first task of the last run loaded its state from S3."""
    if provider == "rocksdb":
        assert metrics["localOpens"] == 0  # no local database to open
        assert metrics["restores"] + metrics["changelogsReplayed"] >= PARTITIONS
        # (a restore starts from the snapshot's files on S3, downloaded in the background)
        assert metrics["lazyRestores"] == metrics["restores"] > 0
    else:
        assert metrics["loadedMapCacheHitCount"] == 0
        assert metrics["loadedMapCacheMissCount"] == PARTITIONS


@dataclasses.dataclass
class Run:
    """A query's three runs on S3, as the tests look at them."""

    provider: str
    checkpoint: Path
    state: str
    #: Batch id -> its output, over the three runs.
    batches: dict[int, list[tuple[Any, ...]]]
    #: The progress of the last run (on new workers).
    progress: list[dict[str, Any]]


@pytest.fixture(scope="module", params=PROVIDERS)
def run(
    request: pytest.FixtureRequest,
    spark: SparkSession,
    s3: S3Endpoint,
    oracle: Collector,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    """The query run three times on one checkpoint, the last time by new Python workers with
    an empty local directory."""
    provider = request.param
    root = tmp_path_factory.mktemp(f"s3-{provider}")
    feed = FileFeed(root / "input")
    chk, local = root / "chk", root / "local"
    # rocksdb: the endpoint in the URI; memory: a plain S3 URI, the endpoint in the environment
    prefix = f"engine/{provider}-{root.name}"
    state = s3.uri(prefix) if provider == "rocksdb" else f"s3://{s3.bucket}/{prefix}"
    batches: dict[int, Any] = {}
    progress: list[dict[str, Any]] = []
    for i, files in enumerate(RUNS):
        if i == len(RUNS) - 1:  # a new executor: no Python worker of before, no local copy
            _end_python_workers(spark)
            shutil.rmtree(local, ignore_errors=True)
        _add(feed, files)
        q, collector = _start(spark, feed, chk, state, local, provider)
        assert q.awaitTermination(120)
        assert q.exception() is None
        assert collector.schema == oracle.schema
        batches.update(collector.batches)
        progress = q.recentProgress
    return Run(provider, chk, state, batches, progress)


def _final(oracle: Collector) -> list[tuple[Any, ...]]:
    """The state after the last batch: each key's last output row (update mode)."""
    last = {row[0]: row for b in sorted(oracle.batches) for row in oracle.batches[b]}
    return sorted(last.values())


def test_runs_on_s3_give_sparks_output_and_restore_on_new_workers(
    run: Run, oracle: Collector
) -> None:
    assert run.batches == oracle.batches
    first = run.progress[0]
    assert first["batchId"] == LAST_RUN[0]
    _restored(run.provider, first["stateOperators"][0]["customMetrics"])
    assert not (run.checkpoint / "sparkstate" / "state").exists()  # the state is on S3 only
    assert DurableDir(run.state).child("state", "0", "0").list()


def test_the_state_reader_reads_the_state_from_s3(
    spark: SparkSession, run: Run, oracle: Collector
) -> None:
    """The reader's tasks read S3 with the credentials of the executors' environment."""
    chk = str(run.checkpoint)
    state = spark.read.format("sparkstate").load(chk)
    rows = sorted((r.key.k, r.value["count"], r.value["sum"]) for r in state.collect())
    assert rows == _final(oracle)
    changes = (
        spark.read.format("sparkstate")
        .option("readChangeFeed", "true")
        .option("changeStartBatchId", LAST_RUN[0])
        .load(chk)
    )
    feed = sorted(
        (r.batch_id, r.change_type, r.key.k, r.value["count"], r.value["sum"])
        for r in changes.collect()
    )
    assert feed == sorted((b, "update", *row) for b in LAST_RUN for row in oracle.batches[b])
    [meta] = spark.read.format("sparkstate-metadata").load(chk).collect()
    assert (meta.numPartitions, meta.minBatchId, meta.maxBatchId) == (PARTITIONS, 0, LAST_RUN[1])


def test_inspect_reads_the_state_from_s3(
    run: Run, oracle: Collector, capsys: pytest.CaptureFixture[str]
) -> None:
    chk = str(run.checkpoint)
    final = _final(oracle)
    assert cli.main(["inspect", chk, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["query"]["state_location"] == run.state
    [op] = doc["operators"]
    assert op["rows"]["total"] == op["rows"]["partitions_sum"] == len(final)
    assert all(p["changelogs"]["files"] == LAST_RUN[1] + 1 for p in op["partitions"])

    assert cli.main(["inspect", chk]) == 0
    text = capsys.readouterr().out
    assert f"location    {run.state} ({join_uri(run.state, 'state')})\n" in text
    assert f"rows        {len(final)} after batch {LAST_RUN[1]}" in text

    key, n, total = final[0]
    assert cli.main(["inspect", chk, "--key", f"k={key}", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["found"]
    assert found["stores"] == {"default": [{"value": {"count": n, "sum": total}}]}


def test_repartition_moves_the_state_on_s3(
    spark: SparkSession, s3: S3Endpoint, oracle: Collector, tmp_path: Path
) -> None:
    """``ss.repartition`` of a query whose state is on S3: its tasks read the old partitions
    from S3 and write the new ones there; the next run goes on as Spark's unchanged query."""
    feed = FileFeed(tmp_path / "input")
    chk, local = tmp_path / "chk", tmp_path / "local"
    state = s3.uri(f"engine/rescale-{tmp_path.name}")
    outputs: dict[int, Any] = {}
    for i, files in enumerate(RUNS[:2]):
        if i:
            assert ss.repartition(spark, str(chk), 6) == len(RUNS[0])
        _add(feed, files)
        q, collector = _start(spark, feed, chk, state, local, "rocksdb")
        assert q.awaitTermination(120)
        outputs.update(collector.batches)
    rescaled = len(RUNS[0]) + 1  # the batch after the rescale's
    assert outputs[rescaled] == oracle.batches[len(RUNS[0])]
    assert sorted(outputs) == [0, 1, rescaled]
    assert DurableDir(state).child("state", "0", "5").list()  # a partition only the rescale has


@pytest.mark.parametrize("provider", PROVIDERS)
def test_runs_through_a_misbehaving_s3_give_sparks_output(
    spark: SparkSession,
    s3: S3Endpoint,
    oracle: Collector,
    tmp_path: Path,
    provider: str,
) -> None:
    """The same three runs with the state behind an endpoint that throttles, fails, stalls and
    drops connections (``tests/s3_fault_proxy.py``, a third of the requests): Spark's output,
    batch for batch, as without faults."""
    proxy = FaultProxy((s3.host, s3.port), seed=11, rate=0.3, delay_s=0.2)
    feed = FileFeed(tmp_path / "input")
    state = s3.uri(f"engine/faults-{provider}-{tmp_path.name}")
    state = state.replace(f"{s3.host}:{s3.port}", proxy.endpoint())
    batches: dict[int, Any] = {}
    try:
        for files in RUNS:
            _add(feed, files)
            q, collector = _start(
                spark, feed, tmp_path / "chk", state, tmp_path / "local", provider
            )
            assert q.awaitTermination(300)
            assert q.exception() is None
            batches.update(collector.batches)
    finally:
        proxy.close()
    assert batches == oracle.batches
    assert sum(proxy.faults.values()) >= 10, proxy.faults
