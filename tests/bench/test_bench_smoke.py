"""The streaming benchmarks at tiny sizes: they run every kind of system and write sane JSON."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparkstate.bench import _spark, aggregate, arbitrary, join, latency, scale, windows
from sparkstate.cli import _parser


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


@pytest.mark.spark  # the one benchmark run end to end in the default run (not slow)
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
    assert windows.run(args) == 2
    assert windows.run(argparse.Namespace(quick=True, workloads="hopping")) == 2
    assert join.run(args) == 2
    assert join.run(argparse.Namespace(quick=True, workloads="fullOuter")) == 2


def test_windows_model_of_the_tumbling_workload() -> None:
    exp = windows.expected("tumbling", rows=100, keys=100, batches=5)
    # batch b fills window b; the watermark after it (window b's end - 1 min) closes window
    # b - 1, evicted in batch b + 1
    assert exp.closed == [0, 0, 100, 100, 100]
    assert exp.closed_rows == exp.closed
    assert exp.open == [100, 200, 200, 200, 200]
    # rows 6 s apart: the last of window 0 at 9:54, the watermark a minute behind
    assert exp.watermark_ms[:2] == [0, windows.BASE_US // 1000 + 534_000]
    assert windows.iso_ms(exp.watermark_ms[1]) == "2024-01-01T00:08:54.000Z"


def test_windows_model_of_the_session_workload() -> None:
    exp = windows.expected("session", rows=100, keys=100, batches=8)
    # two rows per session, half of the keys close one every batch from batch 4 on
    assert exp.closed[:4] == [0, 0, 0, 0]
    assert exp.closed[4:] == [50, 50, 50, 50]
    assert exp.closed_rows[5:] == [100, 100, 100]
    assert exp.open[3:] == [250] * 5
    values = np.arange(300, dtype=np.int64)
    ts = windows.event_time_us("session", values, 100, 100)
    key_7 = ts[values % 100 == 7] - windows.BASE_US
    assert np.diff(key_7).tolist() == [40_000_000, 10_000_000]


def test_windows_check_names_the_batches_that_disagree() -> None:
    params = {"rows_per_batch": 100, "batches": 3, "warmup": 2}
    exp = windows.expected("tumbling", rows=100, keys=100, batches=3)
    batches = [
        {
            "batchId": b,
            "numInputRows": 100,
            "numOutputRows": exp.closed[b],
            "watermark": windows.iso_ms(exp.watermark_ms[b]),
            "numRowsDroppedByWatermark": 0,
            "numRowsTotal": exp.open[b],
        }
        for b in range(3)
    ]
    assert windows.check_system("tumbling", params, exp, {"per_batch": batches}) == []
    batches[2] = {**batches[2], "numOutputRows": 99}
    assert windows.check_system("tumbling", params, exp, {"per_batch": batches}) == [
        "batch 2: numOutputRows 99, expected 100"
    ]


def test_windows_session_is_not_available_without_the_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(windows, "SESSION_OPERATOR", "sparkstate.operators.no_such_operator")
    with pytest.raises(_spark.NotAvailable, match="no session window operator"):
        windows.measure("sparkstate-rocksdb", {"workload": "session"})  # before any JVM starts


def test_windows_params() -> None:
    args = argparse.Namespace(quick=True, rows=10, keys=5, batches=1, workloads="session")
    assert windows.params_for(args) == {
        "session": {
            "workload": "session",
            "rows_per_batch": 10,
            "keys": 5,
            "batches": 5,
            "warmup": 4,
        }
    }
    full = windows.params_for(argparse.Namespace())
    assert list(full) == ["tumbling", "session"]
    assert full["tumbling"]["rows_per_batch"] == full["tumbling"]["keys"] == 1_000_000


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "systems"),
    [
        ("tumbling", ["spark-rocksdb", "sparkstate-rocksdb"]),
        ("session", ["sparkstate-memory"]),  # a system a workload is enough for the smoke
    ],
)
def test_windows_bench_tiny(tmp_path: Path, workload: str, systems: list[str]) -> None:
    out = tmp_path / "windows.json"
    args = argparse.Namespace(
        quick=True,
        systems=",".join(systems),
        json_out=str(out),
        rows=500,
        keys=500,
        batches=1,
        workloads=workload,
    )
    assert windows.run(args) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "windows"
    assert report["workloads"] == [workload]
    assert set(report["systems"]) == {f"{w}:{s}" for w in report["workloads"] for s in systems}
    for workload in report["workloads"]:
        check = report["checks"][workload]
        assert check["expected_closed_measured"] > 0, workload
        for name in systems:
            r = report["systems"][f"{workload}:{name}"]
            assert "error" not in r, (workload, name, r)
            if not r["available"]:
                assert r["reason"] and name.startswith("sparkstate-")
                continue
            assert check["systems"][name]["ok"], (workload, name, check["systems"][name])
            assert check["systems"][name]["closed_measured"] == check["expected_closed_measured"]
            assert [b["batchId"] for b in r["per_batch"]] == list(
                range(r["batches_measured"] + r["warmup_batches"])
            )
            assert r["where_time_goes_ms"]["removals"] >= 0, (workload, name)
        ours = report["systems"].get(f"{workload}:sparkstate-rocksdb")
        if ours is not None and ours["available"]:
            assert f"{workload}:sparkstate-rocksdb/spark-rocksdb" in report["ratios"]


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
        recent,
        lambda: stopped.append(True),
        lambda: None,
        batches=2,
        timeout_s=5,
        label="fake",
        poll_s=0.01,
    )
    assert [p["durationMs"]["triggerExecution"] for p in got] == [900, 120]
    assert stopped == [True]


def test_join_model() -> None:
    rows = 100
    exp = join.expected(rows=rows, keys=2 * rows, batches=6)
    # a quarter of the clicks match, from batch 1 on all of them (half of batch 0's impressions
    # are not there for them)
    assert exp.joined == [12, 25, 25, 25, 25, 25]
    # batch b evicts the clicks of batch b - 1 (but their last minute) and the impressions of
    # batch b - 2 (but their last minute): steady from batch 3, everything stored is evicted
    assert exp.removed == [0, 89, 189, 200, 200, 200]
    assert exp.stored == [200] * 6
    assert exp.total == [200, 311, 322, 322, 322, 322]
    # the impressions no click matched (three in four) leave with nulls
    assert exp.unmatched == [0, 0, 67, 75, 75, 75]
    assert exp.output("leftOuter") == [12, 25, 92, 100, 100, 100]
    assert exp.output("inner") == exp.joined
    # rows 6 s apart: the last of batch 0 at 9:54, the watermark a minute behind
    assert join.iso_ms(exp.watermark_ms[1]) == "2024-01-01T00:08:54.000Z"


def test_join_model_counts_every_match_in_range() -> None:
    # with as many keys as rows an ad has an impression every 10 minutes, so every click is in
    # the range of one impression of its ad, the clicks that match none by default included
    rows = 100
    values = np.arange(3 * rows, dtype=np.int64)
    imp_ad, imp_ts = join.impressions_of(values, rows, rows)
    click_ad, click_ts = join.clicks_of(values, rows, rows)
    brute = np.zeros(3, np.int64)
    for c in range(len(values)):
        hits = (imp_ad == click_ad[c]) & (imp_ts <= click_ts[c])
        hits &= click_ts[c] <= imp_ts + join.RANGE_US
        brute[c // rows] += int(hits.sum())
    exp = join.expected(rows=rows, keys=rows, batches=3)
    assert exp.joined == brute.tolist()
    assert exp.joined[1:] == [100, 100]


def test_join_check_names_the_batches_that_disagree() -> None:
    params = {"rows_per_batch": 100, "batches": 3, "warmup": 2}
    exp = join.expected(rows=100, keys=200, batches=3)
    batches = [
        {
            "batchId": b,
            "numInputRows": 200,
            "numOutputRows": exp.output("leftOuter")[b],
            "watermark": join.iso_ms(exp.watermark_ms[b]),
            "numRowsTotal": exp.total[b],
            "numRowsUpdated": exp.stored[b],
            "numRowsRemoved": exp.removed[b],
            "numRowsDroppedByWatermark": 0,
        }
        for b in range(3)
    ]
    assert join.check_system("leftOuter", params, exp, {"per_batch": batches}) == []
    assert join.check_system("inner", params, exp, {"per_batch": batches}) == [
        "batch 2: numOutputRows 92, expected 25"
    ]
    theirs = {"available": True, "per_batch": batches}
    ours = {"available": True, "per_batch": [*batches[:2], {**batches[2], "numRowsTotal": 1}]}
    assert join.check_agreement({"spark-rocksdb": theirs, "sparkstate-rocksdb": ours}) == {
        "spark-rocksdb": [],
        "sparkstate-rocksdb": ["batch 2: numRowsTotal 1, spark-rocksdb 322"],
    }


def test_join_is_not_available_without_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(join, "JOIN_OPERATOR", "sparkstate.operators.no_such_operator")
    with pytest.raises(_spark.NotAvailable, match="no stream-stream join operator"):
        join.measure("sparkstate-memory", {"workload": "inner"})  # before any JVM starts


def test_join_params() -> None:
    args = argparse.Namespace(quick=True, rows=10, warmup=2, batches=1, workloads="leftOuter")
    assert join.params_for(args) == {
        "leftOuter": {
            "workload": "leftOuter",
            "rows_per_batch": 10,
            "keys": 20,
            "batches": 3,
            "warmup": 2,
        }
    }
    full = join.params_for(argparse.Namespace())
    assert list(full) == ["inner", "leftOuter"]
    assert full["inner"]["rows_per_batch"] == 500_000
    assert join.params_for(argparse.Namespace(quick=True))["inner"]["rows_per_batch"] == 100_000


@pytest.mark.spark
@pytest.mark.slow
def test_join_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "join.json"
    systems = ["spark-rocksdb", "sparkstate-rocksdb"]
    args = argparse.Namespace(
        quick=True,
        systems=",".join(systems),
        json_out=str(out),
        rows=500,
        warmup=2,
        batches=1,
        workloads="leftOuter",  # the inner join's path is the left outer's, without the nulls
    )
    assert join.run(args) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "join"
    assert report["workloads"] == ["leftOuter"]
    assert set(report["systems"]) == {f"{w}:{s}" for w in report["workloads"] for s in systems}
    for workload in report["workloads"]:
        check = report["checks"][workload]
        assert check["expected_output_measured"] > 0, workload
        for name in systems:
            r = report["systems"][f"{workload}:{name}"]
            assert "error" not in r, (workload, name, r)
            assert r["available"], (workload, name, r)
            assert check["systems"][name]["ok"], (workload, name, check["systems"][name])
            assert check["systems"][name]["output_measured"] == check["expected_output_measured"]
            assert [b["batchId"] for b in r["per_batch"]] == [0, 1, 2]
            assert r["mean_state"]["operators"] == ["symmetricHashJoin"], (workload, name)
            where = r["where_time_goes_ms"]
            assert where["removals"] >= 0 and where["commit"] >= 0, (workload, name, where)
        assert f"{workload}:sparkstate-rocksdb/spark-rocksdb" in report["ratios"]
    # the measured batch evicts impressions, and the left outer join emits those never matched
    checks = report["checks"]
    assert checks["leftOuter"]["expected_output_measured"] == 125 + 337


def test_aggregate_takes_rows_keys_and_batches() -> None:
    args = _parser().parse_args(
        ["bench", "aggregate", "--rows", "2000", "--keys", "500", "--batches", "60"]
    )
    params = aggregate.params_for(args)
    assert (params["rows_per_batch"], params["keys"], params["batches"]) == (2000, 500, 60)
    quick = aggregate.params_for(_parser().parse_args(["bench", "aggregate", "--quick"]))
    assert quick == aggregate.QUICK
    assert aggregate.params_for(_parser().parse_args(["bench", "aggregate"])) == aggregate.FULL
    too_few = argparse.Namespace(quick=True, systems="spark-hdfs", json_out=None, batches=1)
    assert aggregate.run(too_few) == 2  # one batch is the warm-up: nothing to measure


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "aggregate", "--rows", "0"],
        ["bench", "store", "--rows", "10"],
        ["bench", "aggregate", "--workloads", "x"],
    ],
)
def test_bench_refuses_options_it_does_not_take(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)


@pytest.mark.spark
@pytest.mark.slow
def test_scale_bench_tiny(tmp_path: Path) -> None:
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    # the RocksDB systems and their recovery; the in-memory ones stop by rules tested in test_scale.
    # Three small batches: what is checked is the command's path and report, not how far it scales
    # (a JVM per system and phase is most of the cost, whatever the size).
    systems = ["sparkstate-rocksdb", "spark-rocksdb"]
    rows = 2_000
    args = argparse.Namespace(
        systems=",".join(systems),
        json_out=str(out),
        plot=str(png),
        rows_per_batch=rows,
        target_rows=3 * rows,
        time_budget_min=3,
    )
    assert scale.run(args) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "scale"
    assert set(report["systems"]) == set(systems)
    for system, r in report["systems"].items():
        assert "error" not in r, (system, r)
        assert r["failed"] is None and r["stopped"] is None, (system, r)
        assert r["problems"] == [], system
        assert r["state_rows_reached"] == 3 * rows, system
        assert [b["batchId"] for b in r["per_batch"]] == [0, 1, 2]
        assert r["p50_batch_ms_early"] > 0 and r["p50_batch_ms_late"] > 0, system
        assert r["peak_jvm_rss_mb"] > 0 and r["rss_samples"], system
        assert r["state_bytes_on_disk"]["checkpoint"] > 0, system
        assert r["state_bytes_on_disk"]["local"] > 0, system
        recovery = r["recovery"]
        assert r["recovery_ms"] == recovery["recovery_ms"] > recovery["batch_ms"] > 0, system
        # the restart's first batch ran on the whole state (every row a new key)
        assert recovery["batch"]["state_rows"] == (recovery["batch"]["batchId"] + 1) * rows
    ours = report["systems"]["sparkstate-rocksdb"]
    assert ours["peak_worker_rss_mb"] > 0
    assert 0 < ours["peak_worker_pss_mb"] <= ours["peak_worker_rss_mb"]  # shared pages once
    assert ours["recovery"]["local_bytes_deleted"] > 0  # Spark's JVM removes its own on exit
    assert ours["store_options"]["stateStore.local_dir"]
    assert report["systems"]["spark-rocksdb"]["peak_worker_rss_mb"] == 0  # all in the JVM
    assert set(report["ratios"]) == {
        "scale:sparkstate-rocksdb/spark-rocksdb",
        "recovery:sparkstate-rocksdb/spark-rocksdb",
    }
    assert report["targets"]["state_rows_reached"]["met"] is True
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_latency_counts_the_cpu_of_the_whole_process_tree() -> None:
    import subprocess
    import sys

    burn = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while latency.process_tree_cpu(child.pid)["total"] < 0.5:
            assert time.monotonic() < deadline, "the child's CPU was not counted"
            time.sleep(0.1)
        assert latency.process_tree_cpu(child.pid)["jvm"] == 0.0  # a Python child, no JVM
        ours = latency.process_tree_cpu()  # this process's tree: the child's CPU is in it
        assert ours["total"] >= 0.5 and 0.0 <= ours["jvm"] <= ours["total"]
    finally:
        child.kill()
        child.wait()


def test_latency_ratios_are_ours_over_sparks_per_measure() -> None:
    results = {
        "spark-hdfs": {"start_s": 2.0, "p50_batch_ms": 200.0, "cpu_per_batch_s": 0.4},
        "sparkstate-memory": {"start_s": 1.0, "p50_batch_ms": 300.0, "cpu_per_batch_s": 0.2},
        "sparkstate-rocksdb": {"error": "failed"},
    }
    assert latency.latency_ratios(results) == {
        "start_s:sparkstate-memory/spark-hdfs": 0.5,
        "p50_batch_ms:sparkstate-memory/spark-hdfs": 1.5,
        "cpu_per_batch_s:sparkstate-memory/spark-hdfs": 0.5,
    }
    args = _parser().parse_args(["bench", "latency", "--quick", "--batches", "6"])
    params = latency.params_for(args)
    assert set(params) == {"small", "medium"}
    assert params["small"]["batches"] == 6 and params["small"]["warmup"] == 2
    with pytest.raises(ValueError, match="unknown workloads"):
        latency.params_for(argparse.Namespace(quick=True, workloads="huge"))


@pytest.mark.spark
@pytest.mark.slow
def test_latency_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    systems = ["spark-hdfs", "sparkstate-memory"]
    args = argparse.Namespace(
        quick=True, systems=",".join(systems), json_out=str(out), workloads="small", batches=4
    )
    assert latency.run(args) == 0
    report = json.loads(out.read_text())
    for system in systems:
        r = report["systems"][f"small:{system}"]
        assert r["available"], r
        assert 0 < r["start_s"] < 300
        assert r["p50_batch_ms"] <= r["p90_batch_ms"] <= r["p99_batch_ms"]
        assert 0 < r["cpu_jvm_per_batch_s"] < r["cpu_per_batch_s"]
        assert r["batches_measured"] == 3
    # Where the time went: the state's part, through Spark's tasks or (a small batch) from the
    # driver.
    parts = report["systems"]["small:sparkstate-memory"]["mean_duration_ms"]
    assert {"statefulStage", "directState"} & set(parts), parts
    assert "small:p50_batch_ms:sparkstate-memory/spark-hdfs" in report["ratios"]
