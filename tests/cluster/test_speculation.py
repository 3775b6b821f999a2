"""With ``spark.speculation`` on, Spark runs a copy of a slow task beside it, and both attempts
of the partition can commit its next version. The version that counts must be that of the
attempt whose output Spark kept: the next batch, and a restart, load it.

A job of its own (``speculation_job.py``: speculation is set when Spark's context starts) runs
an aggregation on a two-worker cluster, with one attempt made slow at its commit
(``slow_attempt.py``), through a stop and a restart, on both providers, with and without state
homes. Spark's own aggregation runs over the same files beside it. Which attempt Spark kept is
read from Spark's own status store: the one that finished first with ``SUCCESS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import PYTHON_START

from .conftest import java_missing
from .speculation_job import CASES, NUM_BATCHES, SLOW_BATCH, SLOW_PARTITION

pytestmark = pytest.mark.cluster

JOB = Path(__file__).with_name("speculation_job.py")
REPO = str(Path(__file__).resolve().parents[2])
CASE_NAMES = [f"{p}-{'homes' if h else 'workers'}" for p, h in CASES]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = java_missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("speculation")
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join((REPO, PYTHON_START)),
    }
    done = subprocess.run(
        [sys.executable, str(JOB), str(work)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    data: dict[str, Any] = json.loads((work / "result.json").read_text())
    return data


def _slow_partitions_attempts(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The commits of the slow partition's version of the slow batch, one per attempt."""
    return [
        a
        for a in case["attempts"]
        if a["partition"] == SLOW_PARTITION
        and a["version"] == SLOW_BATCH + 1
        and "checkpoint_id" in a
    ]


def _reported_at(case: dict[str, Any]) -> dict[int, float]:
    """When each task attempt wrote its report (epoch s), after its commit."""
    return {a["reported"]: a["at"] for a in case["attempts"] if "reported" in a}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_speculative_query_gives_sparks_output_across_a_restart(
    result: dict[str, Any], name: str
) -> None:
    case = result[name]
    assert sorted(case["spark"]) == [str(b) for b in range(NUM_BATCHES)]
    for b in sorted(case["spark"]):
        assert case["ours"].get(b) == case["spark"][b], f"{name}, batch {b}"


@pytest.mark.parametrize("name", CASE_NAMES)
def test_the_state_that_counts_is_that_of_the_attempt_spark_kept(
    result: dict[str, Any], name: str
) -> None:
    case, tasks = result[name], result["tasks"]
    attempts = _slow_partitions_attempts(case)
    # Both attempts committed the partition: the slow one and Spark's speculative copy.
    assert sorted(a["attempt"] for a in attempts) == [0, 1], attempts
    # The one Spark kept: of those that ended with SUCCESS, the first to finish.
    succeeded = [a for a in attempts if tasks[str(a["task_attempt_id"])]["status"] == "SUCCESS"]
    assert succeeded, (attempts, [tasks[str(a["task_attempt_id"])] for a in attempts])
    kept = min(succeeded, key=lambda a: tasks[str(a["task_attempt_id"])]["finished_ms"])
    other = next(a for a in attempts if a is not kept)
    # What makes the case: the attempt Spark did not keep committed last and reported it before
    # the kept one finished (so before the driver read the reports): "the newest commit wins"
    # would have taken its state.
    assert other["at"] > kept["at"], attempts
    kept_finished_s = tasks[str(kept["task_attempt_id"])]["finished_ms"] / 1000
    assert _reported_at(case)[other["task_attempt_id"]] < kept_finished_s, (attempts, tasks)
    committed = case["lineage"][str(SLOW_BATCH)]["0"][str(SLOW_PARTITION)]
    assert committed == kept["checkpoint_id"], (committed, attempts)
