"""sparkstate queries from a Spark Connect client, against Spark's own operators: a server
started from the PySpark wheel on loopback, and clients in processes of their own
(``connect_cases.py``; a process holds a classic or a Connect session, not both). Spark's output,
the oracle, does not depend on the client: it comes from the same queries in this process's
classic session (``conftest.py``), where they cost less than through the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from tests.connect.connect_cases import CONNECT_CASES, JOINS, PROVIDERS, run_join, run_system
from tests.engine.test_port import CASES, FILES

from sparkstate.testing.connect_server import ConnectServer

pytestmark = pytest.mark.connect

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    server = ConnectServer(
        tmp_path_factory.mktemp("connect"), conf={"spark.sql.shuffle.partitions": "4"}
    )
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env_path) if p)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        os.environ["PYTHONPATH"] = env_path


def client(server: ConnectServer, workdir: Path, what: str) -> Any:
    """Run ``connect_cases.py``'s ``what`` in a client process; its JSON result."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "tests.connect.connect_cases", server.url, str(workdir), what],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr[-4000:]}\nserver log: {server.log_file()}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def differential(server: ConnectServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return client(server, tmp_path_factory.mktemp("differential"), "differential")


@pytest.fixture(scope="module")
def spark_differential(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Spark's own output of the ``differential`` cases, in the classic session."""
    workdir = tmp_path_factory.mktemp("spark-differential")
    return {
        case.name: run_system(spark, workdir / case.name, case, "spark")
        for case in CASES
        if case.name in CONNECT_CASES
    }


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", CONNECT_CASES)
def test_query_over_connect_matches_spark(
    differential: Any, spark_differential: dict[str, Any], case: str, provider: str
) -> None:
    """Batch by batch, rows and schema, through a restart: cases of ``test_port.py`` (complete
    aggregation with a sort after it, applyInPandasWithState with event-time timeouts,
    transformWithStateInPandas with eventTimeColumnName)."""
    theirs = spark_differential[case]
    ours = differential[case][provider]
    assert len(theirs) >= FILES  # a batch per file at least, over both runs
    assert ours == theirs


@pytest.fixture(scope="module")
def joins(server: ConnectServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return client(server, tmp_path_factory.mktemp("joins"), "joins")


@pytest.fixture(scope="module")
def spark_joins(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Spark's own output of the ``joins`` cases, in the classic session."""
    workdir = tmp_path_factory.mktemp("spark-joins")
    return {
        name: run_join(spark, workdir / name, build, files, "spark", name)
        for name, (build, files) in JOINS.items()
    }


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", list(JOINS))
def test_join_over_connect_matches_spark(
    joins: Any, spark_joins: dict[str, Any], case: str, provider: str
) -> None:
    """Stream-stream joins from a Connect client, batch by batch through a restart: the
    condition as Columns of both DataFrames, over aliased sides; a join after windowed
    aggregations on both sides, its condition as SQL."""
    theirs = spark_joins[case]
    ours = joins[case][provider]
    assert sum(len(batch["rows"]) for batch in theirs.values()) > 3
    assert ours == theirs


def test_a_side_with_sparks_own_stateful_step_is_refused_over_connect(joins: Any) -> None:
    """As in a classic session: a deduplication Spark would run before the join."""
    assert "the left side runs a stateful step in Spark (Deduplicate)" in joins["refused"]


def test_failure_over_connect_commits_nothing_and_surfaces(
    server: ConnectServer, tmp_path: Path
) -> None:
    """A foreachBatch function that fails in batch 1: the client catches sparkstate's
    ``UserFunctionError`` (also a ``StreamingQueryException``) with the user's traceback first;
    batch 1 is not committed; a restart with a working sink runs batches 1 and 2 on the state of
    batch 0, and stops with a snapshot of each partition's newest version. Progress carries
    sparkstate's state operators and Spark's ids. The state reader and ``ss.repartition`` work
    from the client."""
    result = client(server, tmp_path, "failure")
    failing, restarted = result["failing"], result["restarted"]
    assert failing["user_function_error"]
    assert failing["streaming_query_exception"]
    lines = failing["message"].splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "RuntimeError: the sink refuses batch 1" in lines
    assert failing["commits"] == [0]
    assert restarted["error"] is None
    assert restarted["commits"] == [0, 1, 2]
    assert restarted["batches"]["1"]["rows"] == [["k0", 2], ["k3", 1]]
    assert restarted["batches"]["2"]["rows"] == [["k2", 1], ["k3", 2]]
    for run in (failing, restarted):
        assert run["progress"], "no progress read back"
        for progress in run["progress"]:
            assert (progress["id"], progress["runId"]) == (run["id"], run["runId"])
    assert [p["numRowsTotal"] for p in restarted["progress"]] == [[3], [4]]
    # The query stopped cleanly: each partition's newest version (3) was snapshotted at stop
    # (snapshots are otherwise due every 10 versions); the failed run left none.
    assert restarted["snapshots"] == {str(p): ["3"] for p in range(4)}, restarted["snapshots"]
    assert failing["snapshots"] == {str(p): [] for p in range(4)}, failing["snapshots"]
    assert result["memory_table"] == [["k0", 2], ["k1", 1], ["k2", 1], ["k3", 2]]
    assert result["state"] == result["memory_table"]  # the state reader from the client
    assert result["rescaled_batch"] == 3  # ss.repartition from the client: batch 3 holds it
    assert result["rescaled_state"] == result["state"]
    assert set(result["rescaled_partitions"]) <= {0, 1}


def test_a_checkpoint_of_sparks_own_operator_is_taken_over_over_connect(
    server: ConnectServer, tmp_path: Path
) -> None:
    """The wrapped query started from a client on the checkpoint of Spark's own operator takes
    its state over on the server's side and goes on as Spark's own restart does; exported from
    the client, Spark's own operator goes on from it."""
    result = client(server, tmp_path, "take_over")
    assert result["ours"] == result["expected"]
    assert list(result["ours"]) == ["2"]  # the batch after Spark's last
    assert result["exported"] == 2
    assert result["back"] == result["expected_back"]
    assert list(result["back"]) == ["3"]


def test_demo_runs_through_connect(server: ConnectServer, tmp_path: Path) -> None:
    """``sparkstate demo --remote``: the README's way to try it through a server."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    done = subprocess.run(
        [sys.executable, "-m", "sparkstate.cli", "demo", "--remote", server.url]
        + ["--batches", "2", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "40,000 events in 2 batches" in done.stdout
    written = sorted((tmp_path / "output").glob("batch=*"))  # each batch's updated rows
    assert written and any(list(d.glob("*.parquet")) for d in written)
