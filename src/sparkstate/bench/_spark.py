"""Shared machinery of the streaming benchmarks (``sparkstate bench aggregate | arbitrary | ...``).

Every system runs in a fresh subprocess with a SparkSession of its own, so no JVM, Python worker,
cache or RocksDB instance carries over from one system to the next. A child runs
``module.measure(system, params)`` and prints its result as one JSON line after
:data:`RESULT_PREFIX`; everything else it prints to stdout is echoed by the parent as progress.
A system whose implementation does not exist yet raises :class:`NotAvailable` and is reported
as ``{"available": false, "reason": ...}`` (and not counted as a failure).

Timing: each query runs with the default trigger (the next batch starts as soon as the previous
one ends) over the ``rate-micro-batch`` source, which hands every trigger exactly
``rowsPerBatch`` new rows whatever the wall clock says. The driver polls ``recentProgress``
until enough batches have completed, then stops the query. A batch's time is its
``durationMs.triggerExecution``; the first ``warmup`` batches are not measured.
``rows_per_s`` = measured input rows / summed measured batch time.

Profiling: with ``SPARKSTATE_BENCH_PROFILE=<dir>`` in the environment, Spark's own Python UDF
profiler (``spark.sql.pyspark.udf.profiler=perf``, cProfile around every call into a
``mapInArrow`` function, so around sparkstate's stateful tasks, input reads included) runs in each
system's session, and each system's stats are dumped under ``<dir>/<bench>-<system>/`` as
``.pstats`` files (one per batch's stateful stage). Profiled runs are slower: their numbers are
for finding where time goes, not for ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sparkstate.engine.session import REMOTE_ENV
from sparkstate.runtime.progress import progress_as_dict

__all__ = [
    "HDFS_PROVIDER",
    "PROFILE_ENV",
    "RESULT_PREFIX",
    "ROCKSDB_PROVIDER",
    "BenchSpec",
    "NotAvailable",
    "Workloads",
    "batch_records",
    "drive",
    "machine_info",
    "measure_query",
    "print_summary",
    "ratios",
    "run_bench",
    "rows_emitted_measured",
    "run_child",
    "run_systems",
    "run_workloads",
    "selected_systems",
    "spark_session",
    "summarize",
    "time_breakdown",
    "worker_main",
    "write_report",
]

#: Spark's state store providers (class names checked in the pyspark 4.3.0 jars and in
#: apache/spark sql/core/.../execution/streaming/state/).
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"

RESULT_PREFIX = "@@sparkstate-bench-result "
#: A directory: profile the Python side of every system's tasks and dump the stats there.
PROFILE_ENV = "SPARKSTATE_BENCH_PROFILE"
UDF_PROFILER_CONF = "spark.sql.pyspark.udf.profiler"
MASTER = "local[2]"
REMOTE_POLL_S = 3.0
SHUFFLE_PARTITIONS = 4
DRIVER_MEMORY = "2g"
#: Spark settings recorded in the JSON next to the numbers they produced.
RECORDED_CONF = (
    PROVIDER_CONF,
    "spark.sql.shuffle.partitions",
    "spark.driver.memory",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot",
    "spark.sql.streaming.stateStore.stateSchemaCheck",
    "spark.sql.execution.arrow.maxRecordsPerBatch",
)
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


class NotAvailable(Exception):  # noqa: N818 - a state, not a failure
    """The system cannot run here (its implementation has not landed yet)."""


# --- child side -----------------------------------------------------------------------------------


def spark_session(app: str, conf: Mapping[str, str] | None = None) -> Any:
    """A fresh ``local[2]`` session with 4 shuffle partitions, no UI and a 2g driver; or,
    under ``sparkstate bench --remote``, a Spark Connect session with the same SQL settings
    (the server's own settings for the rest)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    if os.environ.get(PROFILE_ENV):
        conf = {**(conf or {}), UDF_PROFILER_CONF: "perf"}
    remote = os.environ.get(REMOTE_ENV)
    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        sql = {
            "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
            "spark.sql.session.timeZone": "UTC",
            **(conf or {}),
        }
        for key, value in sql.items():
            spark.conf.set(key, value)
        return spark

    builder = (
        SparkSession.builder.master(MASTER)
        .appName(app)
        .config("spark.driver.memory", DRIVER_MEMORY)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rate_keys(spark: Any, rows_per_batch: int, keys: int) -> Any:
    """``rate-micro-batch`` with ``rowsPerBatch`` rows per trigger, as ``key = value % keys``."""
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 2)
        .load()
    )
    return raw.select((F.col("value") % keys).alias("key"))


def recorded_conf(spark: Any) -> dict[str, str | None]:
    """The effective values (defaults included) of :data:`RECORDED_CONF`."""
    out: dict[str, str | None] = {}
    for key in RECORDED_CONF:
        try:
            out[key] = spark.conf.get(key)
        except Exception:  # noqa: BLE001 - a key without a default is simply unset
            out[key] = None
    return out


def drive(
    recent_progress: Callable[[], Sequence[Any]],
    stop: Callable[[], None],
    exception: Callable[[], Any],
    *,
    batches: int,
    timeout_s: float,
    label: str,
    poll_s: float = 0.2,
) -> list[dict[str, Any]]:
    """Let a started query run until ``batches`` batches completed; stop it; their progress.

    A batch counts once Spark's own progress for it exists (it has ``sources``): sparkstate's
    handle publishes its part of a batch's progress from inside ``foreachBatch``, before Spark
    commits the batch, and only the merged dict carries Spark's ``triggerExecution``, the same
    measure as for Spark's systems. Prints one line per completed batch. Raises if the query
    fails or the timeout passes.
    """
    deadline = time.monotonic() + timeout_s
    seen: dict[int, dict[str, Any]] = {}
    try:
        while True:
            for raw in recent_progress() or []:
                p = progress_as_dict(raw)
                batch = int(p.get("batchId", -1))
                if batch < 0 or batch in seen or not p.get("sources"):
                    continue  # no "sources": not yet merged with Spark's own progress
                seen[batch] = p
                ms = p.get("durationMs", {}).get("triggerExecution", 0)
                print(
                    f"    {label}: batch {batch}: {p.get('numInputRows', 0):,} rows in {ms:,} ms",
                    flush=True,
                )
            if len(seen) >= batches:
                break
            failure = exception()
            if failure is not None:
                msg = f"{label}: the query failed: {failure}"
                raise RuntimeError(msg)
            if time.monotonic() > deadline:
                msg = f"{label}: only {len(seen)} of {batches} batches within {timeout_s:.0f} s"
                raise TimeoutError(msg)
            time.sleep(poll_s)
    finally:
        stop()
    return [seen[b] for b in sorted(seen)[:batches]]


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


def worker_main(argv: Sequence[str]) -> int:
    """Child entry: ``<bench module> <system> <params json>``; prints the result line."""
    import importlib

    module_name, system, params_json = argv
    module = importlib.import_module(module_name)
    params = json.loads(params_json)
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        result: dict[str, Any] = module.measure(system, params)
        code = 0
    except NotAvailable as exc:
        result = {"available": False, "reason": str(exc)}
        code = 0
    except Exception as exc:  # reported to the parent, which decides the exit code
        traceback.print_exc()
        result = {"available": True, "error": f"{type(exc).__name__}: {exc}"}
        code = 1
    result["process_s"] = time.perf_counter() - started
    result["loadavg_before"] = list(load_before)
    result["loadavg_after"] = list(os.getloadavg())
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return code


# --- parent side ----------------------------------------------------------------------------------


class BenchSpec:
    """What a benchmark module tells :func:`run_bench`."""

    def __init__(
        self,
        name: str,
        module: str,
        systems: Sequence[str],
        ratio_pairs: Sequence[tuple[str, str]],
        params: dict[str, Any],
        timeout_s: float,
    ) -> None:
        self.name = name
        self.module = module
        self.systems = list(systems)
        self.ratio_pairs = list(ratio_pairs)
        self.params = params
        self.timeout_s = timeout_s


def run_child(spec: BenchSpec, system: str, workdir: str) -> dict[str, Any]:
    """Run ``system`` in a subprocess (``module.measure(system, params)``) with ``workdir`` as
    its work directory; its result, echoing what it prints as it goes."""
    params = {**spec.params, "workdir": workdir, "timeout_s": spec.timeout_s}
    code = (
        "import sys; from sparkstate.bench._spark import worker_main; "
        "sys.exit(worker_main(sys.argv[1:]))"
    )
    cmd = [sys.executable, "-c", code, spec.module, system, json.dumps(params)]
    stderr_path = os.path.join(workdir, "stderr.log")
    result: dict[str, Any] | None = None
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.startswith(RESULT_PREFIX):
                    result = json.loads(line[len(RESULT_PREFIX) :])
                    break  # the last line: a JVM left behind may hold the pipe open
                print(line, end="", flush=True)
            proc.wait(timeout=spec.timeout_s + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            _kill_group(proc.pid)
    if result is None or "error" in result:
        with open(stderr_path) as err:
            tail = err.read()[-4000:]
        print(f"[bench {spec.name}] {system}: stderr tail:\n{tail}", file=sys.stderr, flush=True)
        if result is None:
            result = {"available": True, "error": f"the subprocess exited with {proc.returncode}"}
    return result


def _kill_group(pgid: int) -> None:
    """Kill what is left of a system's process group (a JVM that outlived its driver would
    hold the machine's cores and memory through the next system's run)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


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


def selected_systems(spec: BenchSpec, args: argparse.Namespace) -> list[str] | None:
    """The systems ``--systems`` names (all by default); None (and a message) if one is unknown."""
    systems = args.systems.split(",") if getattr(args, "systems", None) else spec.systems
    unknown = [s for s in systems if s not in spec.systems]
    if unknown:
        print(f"[bench {spec.name}] unknown systems {unknown}; known: {spec.systems}")
        return None
    return systems


def run_systems(spec: BenchSpec, systems: Sequence[str]) -> tuple[dict[str, Any], bool]:
    """Each system in its own subprocess, one after the other: their results, and whether any
    failed (a system that is not available has not failed)."""
    print(f"[bench {spec.name}] {json.dumps(spec.params)}", flush=True)
    results: dict[str, Any] = {}
    failed = False
    for system in systems:
        print(f"[bench {spec.name}] {system} ... (load {os.getloadavg()[0]:.2f})", flush=True)
        workdir = tempfile.mkdtemp(prefix=f"sparkstate-bench-{spec.name}-{system}-")
        try:
            r = run_child(spec, system, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        results[system] = r
        if "error" in r:
            failed = True
            print(f"[bench {spec.name}] {system}: FAILED: {r['error']}", flush=True)
        elif not r.get("available", False):
            print(f"[bench {spec.name}] {system}: not available: {r.get('reason')}", flush=True)
        else:
            print(
                f"[bench {spec.name}] {system}: {r['rows_per_s']:,.0f} rows/s, "
                f"p50 {r['p50_batch_ms']:,.0f} ms, p99 {r['p99_batch_ms']:,.0f} ms",
                flush=True,
            )
    return results, failed


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


def run_bench(spec: BenchSpec, args: argparse.Namespace) -> int:
    """Run every selected system in its own subprocess; print a table; write the JSON."""
    systems = selected_systems(spec, args)
    if systems is None:
        return 2
    results, failed = run_systems(spec, systems)
    rat = ratios(results, spec.ratio_pairs)
    print_summary(spec.name, results, rat)
    report = {
        "benchmark": spec.name,
        "quick": bool(getattr(args, "quick", False)),
        "params": spec.params,
        "machine": machine_info(),
        "systems": results,
        "ratios": rat,
    }
    write_report(spec.name, args, report)
    return 1 if failed else 0


def measure_query(
    spark: Any, query: Any, params: dict[str, Any], system: str, session_s: float
) -> dict[str, Any]:
    """Drive a started query through its batches and summarize its progress."""
    run_started = time.perf_counter()
    progress = drive(
        lambda: query.recentProgress,
        query.stop,
        query.exception,
        batches=params["batches"],
        timeout_s=params["timeout_s"],
        label=system,
        # Over Spark Connect a sparkstate handle reads progress back with a Spark job: poll
        # seldom, so that the reads take little from the query measured (for every system).
        poll_s=REMOTE_POLL_S if os.environ.get(REMOTE_ENV) else 0.2,
    )
    run_s = time.perf_counter() - run_started
    result = summarize(progress, params["warmup"])
    profile_dir = os.environ.get(PROFILE_ENV)
    if profile_dir:
        name = f"{params.get('workload') or 'bench'}-{system}"
        result["profile_dir"] = os.path.join(os.path.abspath(profile_dir), name)
        spark.profile.dump(result["profile_dir"], type="perf")
    result["per_batch"] = batch_records(progress)
    result["keys_per_s"] = result["rows_per_s"] * params["keys"] / params["rows_per_batch"]
    result["session_start_s"] = session_s
    result["run_s"] = run_s
    result["spark_conf"] = recorded_conf(spark)
    return result


@dataclasses.dataclass(frozen=True)
class Workloads:
    """A benchmark of several workloads, each run on every system and checked against a model
    (``windows``, ``join``): what :func:`run_workloads` needs of it."""

    #: The benchmark's name (``windows``) and the module its systems run from.
    name: str
    module: str
    systems: Sequence[str]
    ratio_pairs: Sequence[tuple[str, str]]
    #: Seconds a system may take, ``--quick`` and full.
    timeouts: tuple[float, float]
    #: ``check(workload, params, results)``: per system ``ok``, ``problems`` and the count
    #: named by ``measured``; and the model's count under ``expected``.
    check: Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]]
    #: Keys of the check's counts, and what they count in the printed verdict.
    measured: str
    expected: str
    counted: str


def rows_emitted_measured(result: Mapping[str, Any], params: Mapping[str, Any]) -> int:
    """The rows a system emitted in the measured batches (after the warm-up ones)."""
    return sum(
        int(rec.get("numOutputRows") or 0)
        for rec in result.get("per_batch", [])
        if params["warmup"] <= int(rec["batchId"]) < params["batches"]
    )


def run_workloads(bench: Workloads, params: dict[str, dict[str, Any]], args: Any) -> int:
    """Run every workload of ``params`` on the selected systems, print and check each, and
    write the report; the exit status (1 when a system failed or disagreed with the model)."""
    quick = bool(getattr(args, "quick", False))
    timeout = bench.timeouts[0] if quick else bench.timeouts[1]
    specs = {
        w: BenchSpec(
            f"{bench.name}-{w}", bench.module, bench.systems, bench.ratio_pairs, p, timeout
        )
        for w, p in params.items()
    }
    systems = selected_systems(next(iter(specs.values())), args)
    if systems is None:
        return 2
    all_results: dict[str, Any] = {}
    all_ratios: dict[str, float] = {}
    checks: dict[str, Any] = {}
    failed = False
    for workload, spec in specs.items():
        results, workload_failed = run_systems(spec, systems)
        failed |= workload_failed
        rat = {f"{workload}:{k}": v for k, v in ratios(results, bench.ratio_pairs).items()}
        print_summary(spec.name, results, rat)
        checks[workload] = bench.check(workload, spec.params, results)
        for system, outcome in checks[workload]["systems"].items():
            verdict = "ok" if outcome["ok"] else "FAILED: " + "; ".join(outcome["problems"][:5])
            print(
                f"[bench {spec.name}] check {system}: {outcome[bench.measured]:,} "
                f"{bench.counted} in the measured batches (model "
                f"{checks[workload][bench.expected]:,}): {verdict}",
                flush=True,
            )
            failed |= not outcome["ok"]
        all_results.update({f"{workload}:{s}": r for s, r in results.items()})
        all_ratios.update(rat)
    if all_ratios:
        print(f"[bench {bench.name}] ratios (throughput, >1: the first is faster):")
        for workload in params:
            for key, value in all_ratios.items():
                if key.startswith(f"{workload}:"):
                    print(f"    {key}: {value:.2f}x")
    report = {
        "benchmark": bench.name,
        "quick": quick,
        "workloads": list(params),
        "params": params,
        "machine": machine_info(),
        "systems": all_results,
        "ratios": all_ratios,
        "checks": checks,
    }
    write_report(bench.name, args, report)
    return 1 if failed else 0
