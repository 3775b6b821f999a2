"""``sparkstate bench repartition``: its sizes, its checks and ratio without Spark, and the
whole bench at a tiny size."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest

import sparkstate as ss
from sparkstate.bench import _spark, repartition
from sparkstate.cli import _parser
from sparkstate.engine.spark.session import REMOTE_ENV

#: One build batch and few partitions: the smoke test's time is the sessions' and the jobs'.
TINY = {
    "state_rows": 10_000,
    "rows_per_batch": 10_000,
    "check_keys": 500,
    "from_partitions": 2,
    "to_partitions": 5,
}
#: Two build batches, for the checks without Spark.
TWO_BATCHES = {**TINY, "rows_per_batch": 5_000}


def _record(batch: int, rows: int, total: int, partitions: int, output: dict[str, int]) -> Any:
    return {
        "batchId": batch,
        "numInputRows": rows,
        "batch_ms": 100.0,
        "numRowsTotal": total,
        "numRowsUpdated": rows,
        "numShufflePartitions": partitions,
        "numStateStoreInstances": partitions,
        "output": output,
    }


def _good_run(params: dict[str, Any]) -> dict[str, Any]:
    """What a system that does everything right reports."""
    build = [
        _record(b, end - start, end, params["from_partitions"], {"rows": end - start})
        for b, (start, end) in enumerate(repartition.build_batches(params))
    ]
    for rec in build:
        rec["output"]["count"] = rec["numInputRows"]
    exp = repartition.expected_check_batch(params)
    output = {f: exp[f] for f in repartition.SUMMARY_FIELDS}
    check = _record(len(build) + 1, exp["rows"], exp["numRowsTotal"], 5, output)
    return {
        "available": True,
        "repartition_s": 1.0,
        "repartition_batch": len(build),
        "build": build,
        "check": [check],
    }


def test_params() -> None:
    quick = repartition.params_for(argparse.Namespace(quick=True))
    assert quick == {
        "state_rows": 1_000_000,
        "rows_per_batch": 500_000,
        "from_partitions": 4,
        "to_partitions": 16,
        "check_keys": 10_000,
    }
    full = repartition.params_for(argparse.Namespace())
    assert (full["state_rows"], full["check_keys"]) == (10_000_000, 100_000)
    assert repartition.params_for(argparse.Namespace(**TINY)) == TINY
    args = _parser().parse_args(
        ["bench", "repartition", "--quick", "--state-rows", "3000", "--rows-per-batch", "1000"]
    )
    params = repartition.params_for(args)
    assert (params["state_rows"], params["rows_per_batch"], params["check_keys"]) == (
        3000,
        1000,
        30,
    )
    for bad in ({"rows_per_batch": 20_000}, {"check_keys": 20_000}, {"to_partitions": 2}):
        with pytest.raises(ValueError):
            repartition.params_for(argparse.Namespace(**{**TINY, **bad}))


def test_build_batches_and_check_keys() -> None:
    params = {**TWO_BATCHES, "state_rows": 12_000}
    assert repartition.build_batches(params) == [(0, 5000), (5000, 10_000), (10_000, 12_000)]
    old, new = repartition.check_keys({**params, "check_keys": 4})
    assert old == [0, 3000, 6000, 9000]
    assert new == [12_000, 12_001, 12_002, 12_003]
    exp = repartition.expected_check_batch({**params, "check_keys": 4})
    assert exp["rows"] == exp["numRowsUpdated"] == 8
    assert exp["numRowsTotal"] == 12_004
    assert exp["count"] == 12  # the old keys counted twice, the new once
    assert exp["old_sum"] == 2 * (0 + 0 + 0 + 0)  # value = key % 1000
    assert exp["sum"] == exp["old_sum"] + 0 + 1 + 2 + 3


def test_check_passes_a_right_run_and_names_what_is_wrong() -> None:
    run = _good_run(TWO_BATCHES)
    assert repartition.check_system(TWO_BATCHES, run) == []
    lost = copy.deepcopy(run)  # the repartition lost a key: it comes back as a new one
    lost["check"][0]["numRowsTotal"] -= 1
    lost["check"][0]["output"]["old_rows"] -= 1
    assert repartition.check_system(TWO_BATCHES, lost) == [
        "check batch: numRowsTotal 10499, expected 10500",
        "check batch output: old_rows 499, expected 500",
    ]
    unmoved = copy.deepcopy(run)
    unmoved["check"][0]["numShufflePartitions"] = 2
    unmoved["repartition_batch"] = 1
    assert repartition.check_system(TWO_BATCHES, unmoved) == [
        "repartition: wrote batch 1, expected 2",
        "check batch: numShufflePartitions 2, expected 5",
    ]
    assert "check: 0 batches ran, 1 expected" in repartition.check_system(
        TWO_BATCHES, {**run, "check": []}
    )


def test_ratio_is_sparks_time_over_ours() -> None:
    results = {
        "spark-rocksdb": {"available": True, "repartition_s": 6.0},
        "sparkstate-rocksdb": {"available": True, "repartition_s": 2.0},
    }
    rat = repartition.ratios(results)
    assert rat == {"repartition:sparkstate-rocksdb/spark-rocksdb": 3.0}
    assert repartition.targets(rat)[repartition.RATIO] == {
        "value": 3.0,
        "goal": ">= 1",
        "met": True,
    }
    results["sparkstate-rocksdb"] = {"available": False, "reason": "later"}
    assert repartition.ratios(results) == {}
    assert repartition.targets({})[repartition.RATIO]["met"] is None


def test_not_available_without_ss_repartition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repartition, "OUR_REPARTITION", "no_such_function")
    with pytest.raises(_spark.NotAvailable, match="no repartition"):
        repartition.measure("sparkstate-rocksdb", {})  # before any file or JVM


def test_refused_over_spark_connect_and_for_unknown_systems(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert repartition.run(argparse.Namespace(quick=True, systems="nope", json_out=None)) == 2
    monkeypatch.setenv(REMOTE_ENV, "sc://127.0.0.1:1")
    assert repartition.run(argparse.Namespace(quick=True, json_out=None)) == 2


@pytest.mark.spark
@pytest.mark.slow
def test_repartition_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "repartition.json"
    args = argparse.Namespace(quick=True, systems=None, json_out=str(out), **TINY)
    assert repartition.run(args) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "repartition"
    assert report["params"] == TINY
    assert set(report["systems"]) == set(repartition.SYSTEMS)
    ours = report["systems"]["sparkstate-rocksdb"]
    # once sparkstate has its repartition, the bench runs it
    assert ours["available"] is hasattr(ss, "repartition"), ours
    for system, r in report["systems"].items():
        assert "error" not in r, (system, r)
        if not r["available"]:
            assert r["reason"]
            continue
        assert r["problems"] == [], (system, r["problems"])
        assert r["repartition_s"] > 0
        assert r["state_partitions_on_disk"] == list(range(5)), system
        assert [b["batchId"] for b in r["build"]] == [0]
        assert r["check"][0]["batchId"] == 2
    theirs = report["systems"]["spark-rocksdb"]
    assert theirs["available"]
    if ours["available"]:
        ratio = theirs["repartition_s"] / ours["repartition_s"]
        assert report["ratios"] == {"repartition:sparkstate-rocksdb/spark-rocksdb": ratio}
    else:
        assert report["ratios"] == {}
    assert report["targets"][repartition.RATIO]["goal"] == ">= 1"
