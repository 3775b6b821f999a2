"""What ``sparkstate bench scale`` makes of its systems' batches: early and late batch times,
ratios against Spark's RocksDB provider, the issue's targets, the table and the plot.

Pure functions over the per-batch records a system's run returns (see :mod:`.scale`), so that
they are tested without Spark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "EARLY",
    "LATE_FRACTION",
    "OURS",
    "THEIRS",
    "batch_summary",
    "early_late",
    "plot",
    "ratios",
    "slow_batch_limit",
    "table",
    "target_lines",
    "targets",
]

#: The early batches: the second to the fifth (the first one starts the workers and compiles).
EARLY = slice(1, 5)
#: The late batches: this last share of them, at least one.
LATE_FRACTION = 0.1
OURS, THEIRS = "sparkstate-rocksdb", "spark-rocksdb"
#: The issue's targets for ``sparkstate-rocksdb``.
WORKER_RSS_GOAL_MB = 1536.0
LATE_OVER_EARLY_GOAL = 1.5
SCALE_RATIO_GOAL = 1.5
RECOVERY_RATIO_GOAL = 1.0

T = TypeVar("T")


def early_late(values: Sequence[T]) -> tuple[list[T], list[T]]:
    """The early (:data:`EARLY`) and late (the last :data:`LATE_FRACTION`) of ``values``, one
    per batch in batch order. A short run's early and late batches overlap."""
    late_n = max(1, math.ceil(len(values) * LATE_FRACTION)) if values else 0
    return list(values[EARLY]), list(values[len(values) - late_n :])


def _p50(values: Sequence[float]) -> float | None:
    return float(np.percentile(values, 50)) if values else None


def _rows_per_s(records: Sequence[Mapping[str, Any]]) -> float | None:
    ms = sum(float(r["batch_ms"]) for r in records)
    return sum(int(r["input_rows"]) for r in records) / (ms / 1000) if ms > 0 else None


def slow_batch_limit(batch_ms: Sequence[float], factor: float) -> float | None:
    """``factor`` times the p50 of the early batches among ``batch_ms`` (those that ran so
    far, until all of them did); None before the first of them."""
    p50 = _p50(early_late(batch_ms)[0])
    return None if p50 is None else factor * p50


def batch_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """State rows reached, the early and late batches' p50 and throughput, from one record per
    batch (``state_rows``, ``batch_ms``, ``input_rows``) in batch order."""
    early, late = early_late(list(records))
    p50_early = _p50([float(r["batch_ms"]) for r in early])
    p50_late = _p50([float(r["batch_ms"]) for r in late])
    return {
        "state_rows_reached": int(records[-1]["state_rows"]) if records else 0,
        "batches": len(records),
        "p50_batch_ms_early": p50_early,
        "p50_batch_ms_late": p50_late,
        "late_over_early": p50_late / p50_early if p50_early and p50_late else None,
        "rows_per_s_early": _rows_per_s(early),
        "rows_per_s_late": _rows_per_s(late),
        "where_time_goes_ms_late": _mean_breakdown(late),
    }


def _mean_breakdown(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Where the time of the batches went (``time_ms`` of each record), mean per batch."""
    parts: dict[str, list[float]] = {}
    for r in records:
        for label, ms in (r.get("time_ms") or {}).items():
            parts.setdefault(label, []).append(float(ms))
    return {label: round(sum(v) / len(v), 1) for label, v in parts.items()}


def _ran(r: Mapping[str, Any] | None) -> bool:
    """Whether a system ran (it may still have failed along the way)."""
    return r is not None and bool(r.get("available")) and "error" not in r


def ratios(results: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, float], list[str]]:
    """Speed-ups of ours over Spark's RocksDB provider (>1: ours is faster): late-batch
    throughput, and Spark's recovery time over ours; and notes where the two did not reach the
    same state (the ratio then compares different sizes)."""
    ours, theirs = results.get(OURS), results.get(THEIRS)
    if not (_ran(ours) and _ran(theirs)):
        return {}, []
    assert ours is not None and theirs is not None
    out: dict[str, float] = {}
    if ours.get("rows_per_s_late") and theirs.get("rows_per_s_late"):
        out[f"scale:{OURS}/{THEIRS}"] = ours["rows_per_s_late"] / theirs["rows_per_s_late"]
    if ours.get("recovery_ms") and theirs.get("recovery_ms"):
        out[f"recovery:{OURS}/{THEIRS}"] = theirs["recovery_ms"] / ours["recovery_ms"]
    notes = []
    if ours["state_rows_reached"] != theirs["state_rows_reached"]:
        notes.append(
            f"{OURS} reached {ours['state_rows_reached']:,} state rows and {THEIRS} "
            f"{theirs['state_rows_reached']:,}: the ratios compare their late batches and "
            "recoveries at those sizes"
        )
    return out, notes


def _target(value: float | None, goal: float, at_most: bool) -> dict[str, Any]:
    met = None if value is None else (value <= goal if at_most else value >= goal)
    return {"value": value, "goal": ("<= " if at_most else ">= ") + f"{goal:,.10g}", "met": met}


def targets(
    results: Mapping[str, Mapping[str, Any]], rat: Mapping[str, float], target_rows: int
) -> dict[str, dict[str, Any]]:
    """The issue's targets for ``sparkstate-rocksdb``, each with its value, goal and whether it
    is met (None: not measured in this run)."""
    ours = results.get(OURS)
    if not _ran(ours):
        return {}
    assert ours is not None
    return {
        "state_rows_reached": _target(ours.get("state_rows_reached"), target_rows, False),
        "peak_worker_rss_mb": _target(ours.get("peak_worker_rss_mb"), WORKER_RSS_GOAL_MB, True),
        "late_over_early": _target(ours.get("late_over_early"), LATE_OVER_EARLY_GOAL, True),
        f"scale:{OURS}/{THEIRS}": _target(
            rat.get(f"scale:{OURS}/{THEIRS}"), SCALE_RATIO_GOAL, False
        ),
        f"recovery:{OURS}/{THEIRS}": _target(
            rat.get(f"recovery:{OURS}/{THEIRS}"), RECOVERY_RATIO_GOAL, False
        ),
    }


def target_lines(goals: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per target: its value, its goal, and whether it is met."""
    lines = []
    for name, t in goals.items():
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        got = t["value"]
        shown = f"{got:,}" if isinstance(got, int) else _fmt(got, ",.2f")
        lines.append(f"{name}: {shown} (goal {t['goal']}): {verdict}")
    return lines


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per system: how far it got, early and late batches, memory, disk, recovery."""
    head = (
        f"{'system':<20}{'state rows':>13}{'early ms':>10}{'late ms':>10}{'late/early':>11}"
        f"{'workers MB':>11}{'PSS MB':>8}{'JVM MB':>8}{'chk MB':>9}{'local MB':>9}"
        f"{'recovery ms':>12}  note"
    )
    lines = [head, "-" * len(head)]
    for system, r in results.items():
        if not _ran(r):
            note = r.get("error") or f"not available: {r.get('reason', '')}"
            lines.append(f"{system:<20}{'-':>13}  {note}")
            continue
        disk = r.get("state_bytes_on_disk") or {}
        note = r.get("failed") and f"failed: {r['failed']}" or r.get("stopped") or ""
        lines.append(
            f"{system:<20}{r['state_rows_reached']:>13,}{_fmt(r['p50_batch_ms_early'], ',.0f'):>10}"
            f"{_fmt(r['p50_batch_ms_late'], ',.0f'):>10}{_fmt(r['late_over_early'], '.2f'):>11}"
            f"{_fmt(r['peak_worker_rss_mb'], ',.0f'):>11}"
            f"{_fmt(r.get('peak_worker_pss_mb'), ',.0f'):>8}{_fmt(r['peak_jvm_rss_mb'], ',.0f'):>8}"
            f"{_mb(disk.get('checkpoint')):>9}{_mb(disk.get('local')):>9}"
            f"{_fmt(r.get('recovery_ms'), ',.0f'):>12}  {note}"
        )
    return "\n".join(lines)


def plot(results: Mapping[str, Mapping[str, Any]], path: str, title: str = "") -> None:
    """Two panels against state rows, one line per system: batch time (a star: the restart's
    time from ``start()`` to its first batch; a cross: where the system failed); the Python
    workers' (solid) and the JVM's (dashed) resident memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (times, memory) = plt.subplots(1, 2, figsize=(13, 5))
    for i, (system, r) in enumerate(results.items()):
        records = r.get("per_batch") or []
        if not _ran(r) or not records:
            continue
        color = f"C{i}"
        rows = [rec["state_rows"] / 1e6 for rec in records]
        label = system + (" (failed)" if r.get("failed") else "")
        batch_s = [rec["batch_ms"] / 1000 for rec in records]
        times.plot(rows, batch_s, "o-", color=color, label=label, markersize=3)
        if r.get("failed"):
            times.plot(rows[-1:], batch_s[-1:], "x", color=color, markersize=12)
        recovery = r.get("recovery") or {}
        if recovery.get("recovery_ms"):
            at = recovery["batch"]["state_rows"] / 1e6
            wall_s = recovery["recovery_ms"] / 1000
            times.plot([at], [wall_s], "*", color=color, markersize=12, label=f"{system}: restart")
        workers = [rec["worker_rss_mb"] for rec in records]
        if any(workers):
            memory.plot(rows, workers, "-", color=color, label=f"{system}: Python workers")
        jvm = [rec["jvm_rss_mb"] for rec in records]
        memory.plot(rows, jvm, "--", color=color, label=f"{system}: JVM")
    times.set(xlabel="state rows (millions)", ylabel="batch time (s)", title="batch time")
    memory.set(xlabel="state rows (millions)", ylabel="resident memory (MB)", title="memory")
    for ax in (times, memory):
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
