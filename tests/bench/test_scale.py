"""``sparkstate bench scale`` without Spark: the early and late batches, when an in-memory
system stops, the checks, ratios, targets and the plot."""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from sparkstate.bench import scale, scale_follow, scale_report


def test_early_batches_are_the_second_to_fifth_late_the_last_tenth() -> None:
    values = list(range(20))
    assert scale_report.early_late(values) == ([1, 2, 3, 4], [18, 19])
    assert scale_report.early_late(list(range(50)))[1] == [45, 46, 47, 48, 49]
    # a short run: they overlap, and late is at least one batch
    assert scale_report.early_late([5, 6, 7]) == ([6, 7], [7])
    assert scale_report.early_late([]) == ([], [])


def _records(batch_ms: list[float], rows: int = 100) -> list[dict[str, Any]]:
    return [
        {"batchId": b, "state_rows": (b + 1) * rows, "input_rows": rows, "batch_ms": ms}
        for b, ms in enumerate(batch_ms)
    ]


def test_batch_summary() -> None:
    s = scale_report.batch_summary(_records([900, 100, 200, 300, 400, 500, 600, 700, 800, 900]))
    assert s["state_rows_reached"] == 1000
    assert s["batches"] == 10
    assert s["p50_batch_ms_early"] == 250
    assert s["p50_batch_ms_late"] == 900
    assert s["late_over_early"] == pytest.approx(3.6)
    assert s["rows_per_s_early"] == pytest.approx(400 / 1.0)
    assert s["rows_per_s_late"] == pytest.approx(100 / 0.9)
    empty = scale_report.batch_summary([])
    assert empty["state_rows_reached"] == 0
    assert empty["p50_batch_ms_early"] is None


def test_where_the_time_goes_in_the_late_batches() -> None:
    progress = {
        "batchId": 7,
        "numInputRows": 100,
        "sources": [{"numInputRows": 100}],
        "durationMs": {"triggerExecution": 900, "addBatch": 800},
        "stateOperators": [
            {"numRowsTotal": 800, "commitTimeMs": 30, "customMetrics": {"loadTimeMs": 10}}
        ],
    }
    record = scale_follow.batch_record(progress, 5.0, (100.0, 50.0))
    assert record["time_ms"]["commit"] == 30 and record["time_ms"]["load"] == 10
    records = _records([100] * 10)
    for r, commit in zip(records, range(10), strict=True):
        r["time_ms"] = {"commit": float(commit)}
    summary = scale_report.batch_summary(records)
    assert summary["where_time_goes_ms_late"] == {"commit": 9.0}  # the last tenth: batch 9


def test_an_in_memory_system_stops_over_budget_or_ten_times_slower() -> None:
    early = [5000.0, 100.0, 100.0, 120.0, 140.0]
    assert scale_follow.stop_reason(early, 500, 1000, 2048, 10) is None
    assert scale_report.slow_batch_limit(early, 10) == 1100
    assert scale_report.slow_batch_limit([*early, 9000.0], 10) == 1100  # the early ones only
    assert scale_report.slow_batch_limit(early[:1], 10) is None  # no early batch ran yet
    reason = scale_follow.stop_reason(early, 0, 2100, 2048, 10)
    assert reason == "the Python workers held 2,100 MB, over the 2,048 MB budget"
    reason = scale_follow.stop_reason([*early, 1200.0], 0, 1000, 2048, 10)
    assert reason == "batch 5 took 1,200 ms, over 10x the early p50 (110 ms)"
    reason = scale_follow.stop_reason(early, 1500, 1000, 2048, 10)
    assert reason == "batch 5 ran for 1,500 ms without finishing, over 10x the early p50 (110 ms)"
    # while the early batches run, the limit comes from those that ran before
    assert scale_follow.stop_reason(early[:3], 900, 1000, 2048, 10) is None
    reason = scale_follow.stop_reason(early[:3], 1001, 1000, 2048, 10)
    assert reason == "batch 3 ran for 1,001 ms without finishing, over 10x the early p50 (100 ms)"
    reason = scale_follow.stop_reason([5000.0, 100.0, 2000.0], 0, 1000, 2048, 10)
    assert reason == "batch 2 took 2,000 ms, over 10x the early p50 (100 ms)"
    # after the first batch alone (it starts the workers), only the budget counts
    assert scale_follow.stop_reason(early[:1], 60_000, 1000, 2048, 10) is None
    assert scale_follow.stop_reason([], 60_000, 1000, 2048, 10) is None


class _FakeQuery:
    """A query whose batches finish one per ``recentProgress`` call, each ``ms`` long."""

    def __init__(self, batch_ms: list[float], failure: str | None = None) -> None:
        self.batch_ms = batch_ms
        self.failure = failure
        self.polls = 0

    @property
    def recentProgress(self) -> list[dict[str, Any]]:  # noqa: N802 - PySpark's name
        self.polls += 1
        done = self.batch_ms[: self.polls]
        return [
            {
                "batchId": b,
                "sources": [{}],
                "numInputRows": 100,
                "durationMs": {"triggerExecution": ms},
                "stateOperators": [{"numRowsTotal": (b + 1) * 100}],
            }
            for b, ms in enumerate(done)
        ]

    def exception(self) -> str | None:
        return self.failure if self.polls >= len(self.batch_ms) else None


class _FakeSampler:
    peak_workers_mb = 300.0
    takes = 0  # one per batch recorded

    def take_peaks(self) -> tuple[float, float]:
        self.takes += 1
        return (700.0, self.peak_workers_mb)


def _follow(
    query: _FakeQuery,
    system: str,
    workers_mb: float = 300.0,
    clock: Callable[[_FakeSampler], float] | None = None,
    **params: Any,
) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """``clock(sampler)``: the time ``follow`` sees (by default the real one)."""
    sampler = _FakeSampler()
    sampler.peak_workers_mb = workers_mb
    base = {"target_rows": 300, "time_budget_s": 30.0, "worker_budget_mb": 2048, "slowdown": 10.0}
    in_memory = system in scale.IN_MEMORY
    timing = {} if clock is None else {"clock": lambda: clock(sampler)}
    return scale_follow.follow(
        query, system, {**base, **params}, cast(Any, sampler), in_memory=in_memory, **timing
    )


def test_follow_until_the_target() -> None:
    records, failed, stopped = _follow(_FakeQuery([500.0, 100.0, 100.0, 100.0]), "spark-rocksdb")
    assert (failed, stopped) == (None, None)
    assert [r["state_rows"] for r in records] == [100, 200, 300]  # not past the target
    assert records[0] == {
        **records[0],
        "batchId": 0,
        "input_rows": 100,
        "batch_ms": 500.0,
        "jvm_rss_mb": 700.0,
        "worker_rss_mb": 300.0,
    }


def test_follow_stops_on_a_failure_with_the_batches_before_it() -> None:
    oom = "java.lang.OutOfMemoryError: Java heap space\n\tat ..."
    records, failed, stopped = _follow(_FakeQuery([500.0, 100.0], failure=oom), "spark-hdfs")
    assert [r["batchId"] for r in records] == [0, 1]
    assert failed == "the query failed: java.lang.OutOfMemoryError: Java heap space"
    assert stopped is None


def test_follow_stops_an_in_memory_system_over_its_budgets() -> None:
    query = _FakeQuery([500.0, 100.0, 100.0])
    _, failed, _ = _follow(query, "sparkstate-memory", workers_mb=5000.0, target_rows=1000)
    assert failed is not None and "over the 2,048 MB budget" in failed
    # a batch that does not finish, 10x the early ones: time stands still until the third batch
    # is recorded, then each look at the clock is a second later
    ticks = itertools.count()

    def clock(sampler: _FakeSampler) -> float:
        return 0.0 if sampler.takes < 3 else float(next(ticks))

    _, failed, _ = _follow(
        _FakeQuery([500.0, 10.0, 10.0]), "spark-hdfs", clock=clock, target_rows=1000
    )
    assert failed is not None and failed.startswith("batch 3 ran for"), failed


def test_follow_holds_a_rocksdb_system_to_its_time_budget_only() -> None:
    query = _FakeQuery([500.0, 100.0])
    records, failed, stopped = _follow(
        query,
        "sparkstate-rocksdb",
        workers_mb=5000.0,
        clock=lambda sampler: 0.0 if sampler.takes < 2 else 60.0,  # a minute after batch 2
        target_rows=1000,
        time_budget_s=30.0,
    )
    assert len(records) == 2 and failed is None
    assert stopped is not None and stopped.startswith("time budget of")


def test_every_row_a_new_key_is_checked_per_batch() -> None:
    records = _records([1.0, 1.0, 1.0])
    assert scale.check_batches(records, 100) == []
    records[2]["state_rows"] = 250
    assert scale.check_batches(records, 100) == ["batch 2: 250 state rows, expected 300"]


def test_store_options_pass_the_memory_budget_only_where_the_store_has_it() -> None:
    assert scale.store_options("sparkstate-rocksdb", "/l", 1024, ["local_dir"]) == {
        "stateStore.local_dir": "/l"
    }
    assert scale.store_options("sparkstate-rocksdb", "/l", 512, ["memory_budget_mb"]) == {
        "stateStore.local_dir": "/l",
        "stateStore.memory_budget_mb": "512",
    }
    assert scale.store_options("sparkstate-memory", "/l", 512, ["memory_budget_mb"]) == {}


def test_params() -> None:
    full = scale.params_for(argparse.Namespace())
    assert (full["rows_per_batch"], full["target_rows"]) == (2_000_000, 100_000_000)
    assert full["jvm_memory_mb"] == full["worker_budget_mb"] == 2048
    quick = scale.params_for(argparse.Namespace(quick=True))
    assert quick["target_rows"] == 10_000_000
    assert quick["time_budget_s"] < full["time_budget_s"]
    tiny = scale.params_for(
        argparse.Namespace(
            quick=True,
            rows_per_batch=10,
            target_rows=30,
            time_budget_min=0.5,
            memory_budget_mb=512,
            store_memory_mb=64,
        )
    )
    assert tiny["rows_per_batch"] == 10 and tiny["target_rows"] == 30
    assert tiny["time_budget_s"] == 30
    assert tiny["jvm_memory_mb"] == tiny["worker_budget_mb"] == 512
    assert tiny["store_memory_mb"] == 64
    with pytest.raises(ValueError, match="rows per batch"):
        scale.params_for(argparse.Namespace(rows_per_batch=10, target_rows=5))


def test_bad_sizes_and_unknown_systems_are_refused() -> None:
    args = argparse.Namespace(quick=True, systems="nope", json_out=None)
    assert scale.run(args) == 2
    assert scale.run(argparse.Namespace(rows_per_batch=0)) == 2


def test_dir_bytes_counts_a_hard_link_once(tmp_path: Path) -> None:
    (tmp_path / "StateStoreId(opId=0)-x").mkdir()
    (tmp_path / "StateStoreId(opId=0)-x" / "a.sst").write_bytes(b"x" * 100)
    os.link(
        tmp_path / "StateStoreId(opId=0)-x" / "a.sst", tmp_path / "StateStoreId(opId=0)-x" / "b"
    )
    (tmp_path / "blockmgr").mkdir()
    (tmp_path / "blockmgr" / "shuffle").write_bytes(b"y" * 10)
    assert scale.dir_bytes(str(tmp_path)) == 110
    assert scale.dir_bytes(str(tmp_path), "StateStoreId(") == 100
    assert scale.dir_bytes(str(tmp_path / "missing")) == 0


def _system(rows: int, late_rps: float, recovery_ms: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "available": True,
        "state_rows_reached": rows,
        "p50_batch_ms_early": 100.0,
        "p50_batch_ms_late": 120.0,
        "late_over_early": 1.2,
        "rows_per_s_late": late_rps,
        "peak_worker_rss_mb": 900.0,
        "peak_jvm_rss_mb": 1500.0,
        "state_bytes_on_disk": {"checkpoint": 2**30, "local": None},
        "failed": None,
        "stopped": None,
        "recovery_ms": recovery_ms,
        **extra,
    }


def test_ratios_are_speed_ups_of_ours_and_note_different_sizes() -> None:
    results = {
        "sparkstate-rocksdb": _system(1000, 300.0, 2000.0),
        "spark-rocksdb": _system(1000, 100.0, 5000.0),
    }
    rat, notes = scale_report.ratios(results)
    assert rat == {
        "scale:sparkstate-rocksdb/spark-rocksdb": 3.0,
        "recovery:sparkstate-rocksdb/spark-rocksdb": 2.5,
    }
    assert notes == []
    results["spark-rocksdb"] = _system(600, 100.0, 5000.0, stopped="time budget")
    assert scale_report.ratios(results)[1] == [
        "sparkstate-rocksdb reached 1,000 state rows and spark-rocksdb 600: the ratios compare "
        "their late batches and recoveries at those sizes"
    ]
    assert scale_report.ratios({"sparkstate-rocksdb": results["sparkstate-rocksdb"]}) == ({}, [])

    goals = scale_report.targets(results, rat, target_rows=1000)
    assert {name: t["met"] for name, t in goals.items()} == {
        "state_rows_reached": True,
        "peak_worker_rss_mb": True,
        "late_over_early": True,
        "scale:sparkstate-rocksdb/spark-rocksdb": True,
        "recovery:sparkstate-rocksdb/spark-rocksdb": True,
    }
    assert scale_report.target_lines(goals)[:2] == [
        "state_rows_reached: 1,000 (goal >= 1,000): met",
        "peak_worker_rss_mb: 900.00 (goal <= 1,536): met",
    ]
    assert scale_report.targets(results, {}, target_rows=2000)["state_rows_reached"]["met"] is False
    assert scale_report.targets(results, {}, 1000)["recovery:sparkstate-rocksdb/spark-rocksdb"] == {
        "value": None,
        "goal": ">= 1",
        "met": None,
    }


def test_table_and_plot(tmp_path: Path) -> None:
    records = [
        {**r, "worker_rss_mb": 10.0 * i, "jvm_rss_mb": 500.0}
        for i, r in enumerate(_records([5, 1, 1]))
    ]
    results = {
        "sparkstate-memory": _system(300, 1.0, None, failed="over budget", per_batch=records),
        "spark-rocksdb": _system(
            300,
            1.0,
            40.0,
            per_batch=records,
            recovery={"recovery_ms": 40.0, "batch": {"state_rows": 400}},
        ),
        "sparkstate-rocksdb": {"available": True, "error": "RuntimeError: boom"},
    }
    text = scale_report.table(results)
    assert "failed: over budget" in text
    assert "RuntimeError: boom" in text
    pytest.importorskip("matplotlib")
    out = tmp_path / "scale.png"
    scale_report.plot(results, str(out), "title")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
