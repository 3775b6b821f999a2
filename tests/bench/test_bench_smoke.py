"""The streaming benchmarks at tiny sizes: they run every kind of system and write sane JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from sparkstate.bench import _spark, aggregate, arbitrary


def _progress(batch: int, rows: int, ms: int, commit: int) -> dict[str, Any]:
    return {
        "batchId": batch,
        "sources": [{"numInputRows": rows}],
        "numInputRows": rows,
        "durationMs": {"triggerExecution": ms, "addBatch": ms - 10},
        "stateOperators": [
            {
                "numRowsTotal": rows,
                "commitTimeMs": commit,
                "customMetrics": {"x": 1, "userFunctionTimeMs": ms // 2},
            }
        ],
        "sink": {"numOutputRows": rows},
    }


def test_summarize_skips_warmup_and_sums_batch_time() -> None:
    progress = [_progress(0, 100, 5000, 1), _progress(1, 100, 100, 2), _progress(2, 100, 300, 4)]
    s = _spark.summarize(progress, warmup=1)
    assert s["batches_measured"] == 2
    assert s["rows_per_s"] == pytest.approx(200 / 0.4)
    assert s["p50_batch_ms"] == pytest.approx(200)
    assert 298 <= s["p99_batch_ms"] <= 300
    assert s["warmup_batch_ms"] == [5000.0]
    assert s["mean_duration_ms"]["addBatch"] == pytest.approx(190)
    assert s["mean_state"]["commitTimeMs"] == pytest.approx(3)
    assert s["mean_state"]["customMetrics"] == {"x": 1.0, "userFunctionTimeMs": 100.0}
    assert s["where_time_goes_ms"] == {
        "batch": 200.0,
        "spark job": 190.0,
        "state updates": 0.0,
        "removals": 0.0,
        "function": 100.0,
        "commit": 3.0,
    }
    with pytest.raises(ValueError, match="no measured batches"):
        _spark.summarize(progress[:1], warmup=1)


def test_ratios_only_between_systems_that_ran() -> None:
    results = {
        "a": {"available": True, "rows_per_s": 300.0},
        "b": {"available": True, "rows_per_s": 100.0},
        "c": {"available": False, "reason": "later"},
    }
    assert _spark.ratios(results, [("a", "b"), ("c", "b")]) == {"a/b": 3.0}


def _check_report(path: Path, name: str, systems: list[str], keys: int) -> dict[str, Any]:
    report = json.loads(path.read_text())
    assert report["benchmark"] == name
    assert set(report["systems"]) == set(systems)
    assert isinstance(report["ratios"], dict)
    for system, r in report["systems"].items():
        assert "error" not in r, (system, r)
        if not r["available"]:
            assert r["reason"]
            continue
        assert r["rows_per_s"] > 0
        assert 0 < r["p50_batch_ms"] <= r["p99_batch_ms"]
        assert r["batches_measured"] > 0
        assert r["mean_state"]["finalNumRowsTotal"] == keys, system
        assert all(n == keys for n in r["sink_output_rows"]), system
        where = r["where_time_goes_ms"]
        assert where["batch"] >= where["spark job"] > 0, (system, where)
    return report


@pytest.mark.spark
@pytest.mark.slow
def test_aggregate_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "aggregate.json"
    systems = ["spark-hdfs", "sparkstate-memory"]
    args = argparse.Namespace(
        quick=True, systems=",".join(systems), json_out=str(out), rows=500, keys=500, batches=2
    )
    assert aggregate.run(args) == 0
    report = _check_report(out, "aggregate", systems, 500)
    if report["systems"]["sparkstate-memory"]["available"]:
        assert "sparkstate-memory/spark-hdfs" in report["ratios"]


@pytest.mark.spark
@pytest.mark.slow
def test_arbitrary_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "arbitrary.json"
    systems = ["spark-aipws", "sparkstate-processor"]
    args = argparse.Namespace(
        quick=True, systems=",".join(systems), json_out=str(out), keys=200, batches=2
    )
    assert arbitrary.run(args) == 0
    report = _check_report(out, "arbitrary", systems, 200)
    ours = report["systems"]["sparkstate-processor"]["where_time_goes_ms"]
    assert {"input", "grouping", "state read", "function", "state write"} <= set(ours), ours


def test_unknown_system_is_refused(tmp_path: Path) -> None:
    args = argparse.Namespace(quick=True, systems="nope", json_out=None)
    assert aggregate.run(args) == 2


def test_drive_waits_for_sparks_own_progress_of_a_batch() -> None:
    ours_only = {**_progress(1, 100, 50, 1), "sources": []}
    feeds = [
        [_progress(0, 100, 900, 1), ours_only],
        [_progress(0, 100, 900, 1), _progress(1, 100, 120, 1)],
    ]
    stopped: list[bool] = []

    def recent() -> list[dict[str, Any]]:
        return feeds.pop(0) if len(feeds) > 1 else feeds[0]

    got = _spark.drive(
        recent, lambda: stopped.append(True), lambda: None,
        batches=2, timeout_s=5, label="fake", poll_s=0.01,
    )
    assert [p["durationMs"]["triggerExecution"] for p in got] == [900, 120]
    assert stopped == [True]
