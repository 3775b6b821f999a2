"""What a benchmark's runs give: each system's progress summarized (throughput, batch times,
state metrics, where the time goes), the table printed, the ratios between systems, the report."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sparkstate.bench._settings import SHUFFLE_PARTITIONS

__all__ = [
    "BATCH_STATE_FIELDS",
    "BREAKDOWN",
    "DURATION_FIELDS",
    "STATE_FIELDS",
    "batch_records",
    "machine_info",
    "print_summary",
    "ratios",
    "summarize",
    "time_breakdown",
    "write_report",
]

DURATION_FIELDS = (
    "triggerExecution",
    "latestOffset",
    "getBatch",
    "queryPlanning",
    "walCommit",
    "addBatch",
    "commitOffsets",
)
STATE_FIELDS = (
    "numRowsTotal",
    "numRowsUpdated",
    "numRowsRemoved",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
    "commitTimeMs",
    "memoryUsedBytes",
)


#: Where a batch's time goes: (label, section of a summarized result, field), mean per measured
#: batch. Task times (phases, state updates, commit) are summed over the shuffle partitions, which
#: share the machine's cores; ``allUpdatesTimeMs`` holds the phases up to the state write,
#: ``allRemovalsTimeMs`` the eviction of what the watermark closed (emitting it included).
#: ``statefulStage`` is sparkstate's own: the Spark job that runs its stateful tasks.
BREAKDOWN = (
    ("batch", "mean_duration_ms", "triggerExecution"),
    ("spark job", "mean_duration_ms", "addBatch"),
    ("stateful stage", "mean_duration_ms", "statefulStage"),
    ("state updates", "mean_state", "allUpdatesTimeMs"),
    ("removals", "mean_state", "allRemovalsTimeMs"),
    ("load", "customMetrics", "loadTimeMs"),
    ("input", "customMetrics", "inputReadTimeMs"),
    ("grouping", "customMetrics", "groupingTimeMs"),
    ("state read", "customMetrics", "stateReadTimeMs"),
    ("function", "customMetrics", "userFunctionTimeMs"),
    ("state write", "customMetrics", "stateWriteTimeMs"),
    ("timeouts", "customMetrics", "timeoutProcessingTimeMs"),
    ("timers", "customMetrics", "timerProcessingTimeMs"),
    ("ttl", "customMetrics", "ttlEvictionTimeMs"),
    ("rocksdb get", "customMetrics", "rocksdbGetLatency"),
    ("rocksdb put", "customMetrics", "rocksdbPutLatency"),
    ("commit", "mean_state", "commitTimeMs"),
)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize(progress: Sequence[Mapping[str, Any]], warmup: int) -> dict[str, Any]:
    """Throughput, batch-time percentiles and the mean progress breakdown of measured batches."""
    measured = list(progress[warmup:])
    if not measured:
        msg = f"no measured batches: {len(progress)} completed, {warmup} warm-up"
        raise ValueError(msg)
    batch_ms = [float(p["durationMs"]["triggerExecution"]) for p in measured]
    rows = sum(int(p.get("numInputRows", 0)) for p in measured)
    total_s = max(sum(batch_ms), 1.0) / 1000
    fields = list(DURATION_FIELDS)
    for p in measured:
        fields += [f for f in p.get("durationMs", {}) if f not in fields]
    durations = {
        f: _mean([float(p["durationMs"][f]) for p in measured if f in p.get("durationMs", {})])
        for f in fields
    }
    state: dict[str, Any] = {}
    custom: dict[str, list[float]] = {}
    for f in STATE_FIELDS:
        vals = [
            float(sum(op.get(f, 0) for op in p.get("stateOperators", [])))
            for p in measured
            if p.get("stateOperators")
        ]
        state[f] = _mean(vals)
    for p in measured:
        for op in p.get("stateOperators", []):
            for name, value in (op.get("customMetrics") or {}).items():
                if isinstance(value, int | float):
                    custom.setdefault(name, []).append(float(value))
    state["customMetrics"] = {k: _mean(v) for k, v in sorted(custom.items())}
    last_ops = measured[-1].get("stateOperators", [])
    state["operators"] = [op.get("operatorName") for op in last_ops]
    state["finalNumRowsTotal"] = sum(int(op.get("numRowsTotal", 0)) for op in last_ops)
    out_rows = [int((p.get("sink") or {}).get("numOutputRows", -1)) for p in measured]
    summary = {
        "available": True,
        "rows_per_s": rows / total_s,
        "p50_batch_ms": float(np.percentile(batch_ms, 50)),
        "p99_batch_ms": float(np.percentile(batch_ms, 99)),
        "mean_batch_ms": float(np.mean(batch_ms)),
        "batches_measured": len(measured),
        "warmup_batches": warmup,
        "rows_measured": rows,
        "batch_ms": batch_ms,
        "warmup_batch_ms": [float(p["durationMs"]["triggerExecution"]) for p in progress[:warmup]],
        "sink_output_rows": out_rows,
        "mean_duration_ms": durations,
        "mean_state": state,
    }
    summary["where_time_goes_ms"] = time_breakdown(summary)
    return summary


def time_breakdown(summary: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`BREAKDOWN` entries that a system reports, in milliseconds per batch."""
    sections = {
        "mean_duration_ms": summary.get("mean_duration_ms") or {},
        "mean_state": summary.get("mean_state") or {},
        "customMetrics": (summary.get("mean_state") or {}).get("customMetrics") or {},
    }
    out: dict[str, float] = {}
    for label, section, field in BREAKDOWN:
        value = sections[section].get(field)
        if isinstance(value, int | float):
            out[label] = float(value)
    return out


#: Per-batch fields kept from each batch's first state operator (for the benches' own checks).
BATCH_STATE_FIELDS = (
    "numRowsTotal",
    "numRowsUpdated",
    "numRowsRemoved",
    "numRowsDroppedByWatermark",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
)


def batch_records(progress: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One small record per batch (warm-up included): its id, input and output rows, the
    watermark it ran with, and the first state operator's counts."""
    out = []
    for p in progress:
        ops = p.get("stateOperators") or [{}]
        record: dict[str, Any] = {
            "batchId": int(p.get("batchId", -1)),
            "triggerExecution": (p.get("durationMs") or {}).get("triggerExecution"),
            "numInputRows": p.get("numInputRows"),
            "numOutputRows": (p.get("sink") or {}).get("numOutputRows"),
            "watermark": (p.get("eventTime") or {}).get("watermark"),
        }
        record.update({f: ops[0].get(f) for f in BATCH_STATE_FIELDS})
        out.append(record)
    return out


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(results: Mapping[str, Mapping[str, Any]]) -> str:
    head = f"{'system':<22}{'rows/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'commit ms':>11}  note"
    lines = [head, "-" * len(head)]
    for system, r in results.items():
        if not r.get("available", False) or "error" in r:
            note = r.get("error") or f"not available: {r.get('reason', '')}"
            lines.append(f"{system:<22}{'-':>12}{'-':>10}{'-':>10}{'-':>11}  {note}")
            continue
        commit = (r.get("mean_state") or {}).get("commitTimeMs")
        lines.append(
            f"{system:<22}{_fmt(r['rows_per_s'], ',.0f'):>12}{_fmt(r['p50_batch_ms'], ',.0f'):>10}"
            f"{_fmt(r['p99_batch_ms'], ',.0f'):>10}{_fmt(commit, ',.0f'):>11}"
        )
    return "\n".join(lines)


def _breakdown(results: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [
        f"where the time goes (ms per batch; task times summed over {SHUFFLE_PARTITIONS} "
        "partitions on the machine's cores):"
    ]
    for system, r in results.items():
        parts = r.get("where_time_goes_ms")
        if parts:
            text = " | ".join(f"{label} {value:,.0f}" for label, value in parts.items())
            lines.append(f"    {system}: {text}")
    return "\n".join(lines)


def ratios(
    results: Mapping[str, Mapping[str, Any]], pairs: Sequence[tuple[str, str]]
) -> dict[str, float]:
    """``"a/b"``: a's throughput over b's, for the pairs where both ran."""
    out: dict[str, float] = {}
    for a, b in pairs:
        ra, rb = results.get(a, {}), results.get(b, {})
        if ra.get("rows_per_s") and rb.get("rows_per_s"):
            out[f"{a}/{b}"] = float(ra["rows_per_s"]) / float(rb["rows_per_s"])
    return out


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def print_summary(
    name: str, results: Mapping[str, Mapping[str, Any]], rat: Mapping[str, float]
) -> None:
    """The table of systems, where their time goes, and the ratios."""
    print(f"\n[bench {name}] summary\n{_table(results)}")
    print(f"[bench {name}] {_breakdown(results)}")
    if rat:
        print(f"[bench {name}] ratios (throughput):")
        for key, value in rat.items():
            print(f"    {key}: {value:.2f}x")


def machine_info() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pyspark": _version("pyspark"),
        "platform": platform.platform(),
        "loadavg_end": list(os.getloadavg()),
    }


def write_report(name: str, args: argparse.Namespace, report: Mapping[str, Any]) -> None:
    """Write ``report`` where ``--json`` says, if it says."""
    if getattr(args, "json_out", None):
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"[bench {name}] wrote {args.json_out}")
