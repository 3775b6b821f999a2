"""``sparkstate bench latency``: the fixed costs of small and medium streams, against Spark's own.

A windowed count with a watermark, as a user writes it
(``withWatermark("ts", "5 seconds").groupBy(window("ts", "10 seconds"), "key").count()``, update
mode, ``noop`` output), over ``rate-micro-batch`` with ``key = value % keys`` and event time
advancing one second a batch, on ``local[2]`` with 4 shuffle partitions. Two workloads:

- ``small``: 200 rows a batch, 50 keys;
- ``medium``: 2,000 rows and 2,000 keys a batch.

Each system runs in a fresh subprocess with a SparkSession of its own (``spark-hdfs``,
``spark-rocksdb``, ``sparkstate-memory``, ``sparkstate-rocksdb``) and reports:

- ``start_s``: from ``start()`` to the first batch's progress (the query's first committed
  batch), the session already up;
- batch time percentiles (``p50_batch_ms``, ``p90_batch_ms``, ``p99_batch_ms``), each batch's
  ``durationMs.triggerExecution``, the warm-up batches left out;
- ``cpu_per_batch_s``: CPU seconds (user and system) the system's whole process tree spent per
  measured batch: the driver, the JVM (``cpu_jvm_per_batch_s``) and every Python worker and
  state home, read from ``/proc`` when the warm-up ends and when the last batch is in;
- where a batch's time goes: the mean of Spark's ``durationMs`` fields and of sparkstate's phase
  metrics (:data:`sparkstate.bench._results.BREAKDOWN`).

The ratios printed are sparkstate's over Spark's (``<1``: sparkstate takes less), for each
measure; the targets of the project are at most 1.0 for the start and 0.8 for batch times.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from sparkstate.bench._processes import BenchSpec
from sparkstate.bench._spark import (
    HDFS_PROVIDER,
    PROVIDER_CONF,
    ROCKSDB_PROVIDER,
    NotAvailable,
    batch_records,
    machine_info,
    run_systems,
    selected_systems,
    spark_session,
    summarize,
    write_report,
)
from sparkstate.runtime.progress import progress_as_dict

__all__ = ["MEASURES", "SYSTEMS", "WORKLOADS", "measure", "process_tree_cpu", "run"]

SYSTEMS = ["spark-hdfs", "spark-rocksdb", "sparkstate-memory", "sparkstate-rocksdb"]
SPARK_PROVIDERS = {"spark-hdfs": HDFS_PROVIDER, "spark-rocksdb": ROCKSDB_PROVIDER}
#: workload -> rows a batch, distinct keys.
WORKLOADS = {"small": (200, 50), "medium": (2_000, 2_000)}
FULL = {"batches": 40, "warmup": 5}
QUICK = {"batches": 16, "warmup": 3}
#: What is compared, each lower-is-better: result field -> label.
MEASURES = {
    "start_s": "start to first batch",
    "p50_batch_ms": "batch p50",
    "p90_batch_ms": "batch p90",
    "p99_batch_ms": "batch p99",
    "cpu_per_batch_s": "CPU per batch",
}
#: (ours, Spark's) pairs the ratios are printed for.
RATIO_PAIRS = [
    ("sparkstate-memory", "spark-hdfs"),
    ("sparkstate-rocksdb", "spark-hdfs"),
    ("sparkstate-rocksdb", "spark-rocksdb"),
]


# --- the system (child side) ----------------------------------------------------------------------


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def process_tree_cpu(root: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) of the live processes under ``root`` (this one by default):
    ``total`` and ``jvm`` (the ``java`` processes). A process that ended meanwhile is not
    counted, which is why the measure is taken while the query runs, its workers alive."""
    tick = os.sysconf("SC_CLK_TCK")
    total = jvm = 0.0
    for pid in _descendants(os.getpid() if root is None else root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        total += cpu
        if name == "java":
            jvm += cpu
    return {"total": total, "jvm": jvm}


def _query(system: str, df: Any, checkpoint: str) -> Any:
    from pyspark.sql import functions as F

    ours = system.startswith("sparkstate-")
    if ours:
        import sparkstate as ss

        df = ss.stream(df)
    counts = df.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"), "key")
    writer = (
        counts.count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .queryName(system.replace("-", "_"))
    )
    if ours:
        writer = writer.option("stateStore", system.removeprefix("sparkstate-"))
    return writer


def _drive(query: Any, params: Mapping[str, Any], label: str) -> dict[str, Any]:
    """Run ``query`` until its batches are in, taking the process tree's CPU when the warm-up
    ends and at the end; stop it. Its progress, CPU per measured batch and first batch's time."""
    started = time.perf_counter()
    deadline = started + params["timeout_s"]
    seen: dict[int, dict[str, Any]] = {}
    first_s = cpu_from = cpu_to = None
    batches_from = 0
    try:
        while len(seen) < params["batches"]:
            for raw in query.recentProgress or []:
                p = progress_as_dict(raw)
                batch = int(p.get("batchId", -1))
                if batch < 0 or batch in seen or not p.get("sources"):
                    continue
                seen[batch] = p
                if first_s is None:
                    first_s = time.perf_counter() - started
                ms = p.get("durationMs", {}).get("triggerExecution", 0)
                print(f"    {label}: batch {batch}: {ms:,} ms", flush=True)
            if cpu_from is None and len(seen) >= params["warmup"]:
                cpu_from, batches_from = process_tree_cpu(), len(seen)
            if query.exception() is not None:
                msg = f"{label}: the query failed: {query.exception()}"
                raise RuntimeError(msg)
            if time.perf_counter() > deadline:
                msg = f"{label}: {len(seen)} of {params['batches']} batches in time"
                raise TimeoutError(msg)
            time.sleep(0.05)
        cpu_to = process_tree_cpu()
    finally:
        query.stop()
    assert cpu_from is not None and first_s is not None
    measured = max(len(seen) - batches_from, 1)
    return {
        "progress": [seen[b] for b in sorted(seen)][: params["batches"]],
        "start_s": first_s,
        "cpu_per_batch_s": (cpu_to["total"] - cpu_from["total"]) / measured,
        "cpu_jvm_per_batch_s": (cpu_to["jvm"] - cpu_from["jvm"]) / measured,
    }


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run ``system`` on ``params["workload"]`` in this (fresh) process and summarize it."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    ours = system.startswith("sparkstate-")
    if ours:
        try:
            import sparkstate.engine  # noqa: F401 - fail early, before a JVM starts
        except ImportError as exc:
            msg = f"the sparkstate engine is not importable ({exc})"
            raise NotAvailable(msg) from exc
    conf = {} if ours else {PROVIDER_CONF: SPARK_PROVIDERS[system]}
    started = time.perf_counter()
    spark = spark_session(f"bench-latency-{params['workload']}-{system}", conf)
    session_s = time.perf_counter() - started
    try:
        from pyspark.sql import functions as F

        raw = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", params["rows_per_batch"])
            .option("numPartitions", 2)
            .option("startTimestamp", 0)
            .option("advanceMillisPerBatch", 1000)
            .load()
        )
        df = raw.select((F.col("value") % params["keys"]).alias("key"), raw.timestamp.alias("ts"))
        writer = _query(system, df, os.path.join(params["workdir"], "checkpoint"))
        run = _drive(writer.start(), params, system)
    finally:
        spark.stop()
    progress = run.pop("progress")
    result = summarize(progress, params["warmup"]) | run
    result["p90_batch_ms"] = float(np.percentile(result["batch_ms"], 90))
    result["per_batch"] = batch_records(progress)
    result["session_start_s"] = session_s
    return result


# --- the run (parent side) ------------------------------------------------------------------------


def params_for(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per workload: its sizes and the batches (``--quick``: fewer; ``--batches``, with a third
    of them, at most the default's, as the warm-up)."""
    sizes = dict(QUICK if getattr(args, "quick", False) else FULL)
    if getattr(args, "batches", None):
        sizes["batches"] = int(args.batches)
        sizes["warmup"] = max(1, min(sizes["warmup"], sizes["batches"] // 3))
    chosen = args.workloads.split(",") if getattr(args, "workloads", None) else list(WORKLOADS)
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        msg = f"unknown workloads {unknown}; known: {list(WORKLOADS)}"
        raise ValueError(msg)
    return {
        w: {"workload": w, "rows_per_batch": WORKLOADS[w][0], "keys": WORKLOADS[w][1], **sizes}
        for w in chosen
    }


def latency_ratios(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``"<measure>:<ours>/<Spark's>"`` -> ratio, for each pair both of whose systems ran."""
    out: dict[str, float] = {}
    for ours, theirs in RATIO_PAIRS:
        a, b = results.get(ours, {}), results.get(theirs, {})
        for field in MEASURES:
            if a.get(field) and b.get(field):
                out[f"{field}:{ours}/{theirs}"] = float(a[field]) / float(b[field])
    return out


def _table(workload: str, results: Mapping[str, Mapping[str, Any]]) -> str:
    head = f"{'system':<20}{'start s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
    head += f"{'CPU/batch s':>13}{'of it JVM':>11}"
    lines = [f"[bench latency-{workload}]", head]
    for system, r in results.items():
        if "error" in r or not r.get("available", False):
            lines.append(f"{system:<20}{r.get('error') or r.get('reason')}")
            continue
        lines.append(
            f"{system:<20}{r['start_s']:>9.2f}{r['p50_batch_ms']:>9.0f}{r['p90_batch_ms']:>9.0f}"
            f"{r['p99_batch_ms']:>9.0f}{r['cpu_per_batch_s']:>13.3f}{r['cpu_jvm_per_batch_s']:>11.3f}"
        )
    lines.append("where a batch's time goes (mean ms): " + ", ".join(results))
    fields: list[str] = []
    for r in results.values():
        for f in r.get("mean_duration_ms") or {}:
            if f not in fields:
                fields.append(f)
        for f in (r.get("mean_state") or {}).get("customMetrics") or {}:
            if f.endswith("TimeMs") and f not in fields:
                fields.append(f)
    for f in fields:
        row = f"    {f:<24}"
        for r in results.values():
            value = (r.get("mean_duration_ms") or {}).get(f)
            if value is None:
                value = ((r.get("mean_state") or {}).get("customMetrics") or {}).get(f)
            row += f"{'-' if value is None else f'{value:,.0f}':>12}"
        lines.append(row)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        params = params_for(args)
    except ValueError as exc:
        print(f"[bench latency] {exc}")
        return 2
    timeout = 600.0 if getattr(args, "quick", False) else 1200.0
    all_results: dict[str, Any] = {}
    all_ratios: dict[str, float] = {}
    failed = False
    for workload, p in params.items():
        spec = BenchSpec(f"latency-{workload}", __name__, SYSTEMS, RATIO_PAIRS, p, timeout)
        systems = selected_systems(spec, args)
        if systems is None:
            return 2
        results, workload_failed = run_systems(spec, systems)
        failed |= workload_failed
        print(_table(workload, results), flush=True)
        rat = {f"{workload}:{k}": v for k, v in latency_ratios(results).items()}
        all_results.update({f"{workload}:{s}": r for s, r in results.items()})
        all_ratios.update(rat)
    print("[bench latency] ratios (ours over Spark's, <1: sparkstate takes less):")
    for key, value in all_ratios.items():
        print(f"    {key}: {value:.2f}x")
    report = {
        "benchmark": "latency",
        "quick": bool(getattr(args, "quick", False)),
        "params": params,
        "machine": machine_info(),
        "systems": all_results,
        "ratios": all_ratios,
    }
    write_report("latency", args, report)
    return 1 if failed else 0
