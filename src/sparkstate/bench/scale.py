"""``sparkstate bench scale``: how far state grows, and what it costs, on each store.

``groupBy(key).count()`` in update mode over ``rate-micro-batch`` with ``key = value``, so every
row is a new key and the state grows by the rows of a batch (full: 2M rows per batch up to 100M
state rows; ``--quick``: up to 10M), ``local[2]``, 4 shuffle partitions, ``noop`` output. Systems,
each in a fresh subprocess (a JVM and Python workers of its own):

- ``sparkstate-rocksdb``: ``ss.stream(df).groupBy("key").count()`` with
  ``.option("stateStore", "rocksdb")``, its local copies in the run's own directory and, where
  the store has the option, ``stateStore.memory_budget_mb`` (``--store-memory-mb``);
- ``spark-rocksdb``: Spark's aggregation on its ``RocksDBStateStoreProvider``;
- ``sparkstate-memory`` / ``spark-hdfs``: the two in-memory stores, under a memory budget: the
  JVM's heap (``spark.driver.memory``) and the Python workers' resident memory (both
  ``--memory-budget-mb``). They run until the target too, unless they fail first: a Spark
  failure (out of memory, the SparkContext shut down), the Python workers over the budget, or a
  batch (finished or still running) past 10x the p50 of the early batches (of those that ran,
  while the early ones still run).

Every system also stops at its time budget (``--time-budget-min``) and reports how far it got
(``stopped``). The JVM's and the Python workers' resident memory is sampled every second
(:mod:`.rss`). A system's result: ``state_rows_reached``, ``p50_batch_ms_early`` (batches 2-5),
``p50_batch_ms_late`` (the last 10%), ``peak_worker_rss_mb`` (all Python workers together;
``peak_worker_pss_mb``: the same with shared pages counted once),
``peak_jvm_rss_mb``, ``state_bytes_on_disk`` (the checkpoint's state files, and the local copies
of a RocksDB store), ``failed`` (None or why), and a record per batch for the plot.

Recovery (the two RocksDB systems): after the last batch the query stops and its process ends;
the executor-local copies are deleted (a new executor has none), and a new process restarts the
query on the same checkpoint: ``recovery_ms`` is the time from ``start()`` to the first batch's
progress, which restores the state from the checkpoint (its ``triggerExecution`` is reported
too). Every batch is checked: after batch ``b`` the state holds ``(b + 1) * rows_per_batch``
rows. Ratios are speed-ups of ``sparkstate-rocksdb`` over ``spark-rocksdb``:
``scale:...`` the late batches' throughput, ``recovery:...`` Spark's recovery time over ours.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkstate.bench import scale_report
from sparkstate.bench._spark import (
    HDFS_PROVIDER,
    PROVIDER_CONF,
    ROCKSDB_PROVIDER,
    BenchSpec,
    NotAvailable,
    machine_info,
    recorded_conf,
    run_child,
    selected_systems,
    spark_session,
    write_report,
)
from sparkstate.bench.rss import RssSampler
from sparkstate.bench.scale_follow import batch_record, completed_batches, first_line, follow
from sparkstate.engine.spark.session import REMOTE_ENV

__all__ = [
    "SYSTEMS",
    "check_batches",
    "dir_bytes",
    "measure",
    "params_for",
    "run",
    "store_options",
]

SYSTEMS = ["sparkstate-rocksdb", "spark-rocksdb", "sparkstate-memory", "spark-hdfs"]
SPARK_PROVIDERS = {"spark-hdfs": HDFS_PROVIDER, "spark-rocksdb": ROCKSDB_PROVIDER}
IN_MEMORY = ("sparkstate-memory", "spark-hdfs")
RECOVERABLE = ("sparkstate-rocksdb", "spark-rocksdb")
FULL = {"rows_per_batch": 2_000_000, "target_rows": 100_000_000, "time_budget_s": 2400.0}
QUICK = {"rows_per_batch": 2_000_000, "target_rows": 10_000_000, "time_budget_s": 600.0}
DEFAULTS = {
    "jvm_memory_mb": 2048,
    "worker_budget_mb": 2048,
    "store_memory_mb": 1024,
    "slowdown": 10.0,
}
GROW, RECOVER = "grow", "recover"
#: sparkstate's store option for the RocksDB memory of an executor's Python workers, passed
#: when :class:`~sparkstate.store.conf.StoreConf` has the field.
MEMORY_OPTION = "memory_budget_mb"
RECOVERY_POLL_S = 0.05
STOP_TIMEOUT_S = 60.0
#: Spark's RocksDB provider keeps a partition's local copy in a directory of this name under
#: ``spark.local.dir``.
SPARK_LOCAL_COPY_PREFIX = "StateStoreId("


# --- sizes and options ----------------------------------------------------------------------------


def params_for(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes from ``--quick``, then ``--rows-per-batch``, ``--target-rows``,
    ``--time-budget-min``, ``--memory-budget-mb`` and ``--store-memory-mb``."""
    params: dict[str, Any] = {**(QUICK if getattr(args, "quick", False) else FULL), **DEFAULTS}
    for attr in ("rows_per_batch", "target_rows", "store_memory_mb"):
        if getattr(args, attr, None) is not None:
            params[attr] = int(getattr(args, attr))
    if getattr(args, "time_budget_min", None) is not None:
        params["time_budget_s"] = float(args.time_budget_min) * 60
    if getattr(args, "memory_budget_mb", None) is not None:
        params["jvm_memory_mb"] = params["worker_budget_mb"] = int(args.memory_budget_mb)
    params["store_options"] = {}
    for option in getattr(args, "store_option", None) or []:
        name, sep, value = option.partition("=")
        if not sep or not name:
            msg = f"--store-option takes NAME=VALUE, got {option!r}"
            raise ValueError(msg)
        params["store_options"][name.removeprefix("stateStore.")] = value
    if params["rows_per_batch"] < 1 or params["target_rows"] < params["rows_per_batch"]:
        msg = (
            f"need 1 <= rows per batch <= target rows, got {params['rows_per_batch']:,} and "
            f"{params['target_rows']:,}"
        )
        raise ValueError(msg)
    return params


def store_options(
    system: str,
    local_dir: str,
    memory_mb: int,
    fields: Sequence[str],
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The ``stateStore.*`` options of a sparkstate system: a RocksDB store's local copies in
    ``local_dir``, its memory budget where the store has that option (``fields``), and the
    ``--store-option``s (``extra``)."""
    if system != "sparkstate-rocksdb":
        return {}
    options = {"stateStore.local_dir": local_dir}
    if MEMORY_OPTION in fields:
        options[f"stateStore.{MEMORY_OPTION}"] = str(memory_mb)
    options.update({f"stateStore.{k}": v for k, v in (extra or {}).items()})
    return options


def _paths(workdir: str) -> dict[str, str]:
    return {
        "checkpoint": os.path.join(workdir, "checkpoint"),
        "local": os.path.join(workdir, "local"),  # sparkstate's local copies
        GROW: os.path.join(workdir, "spark-local-grow"),  # spark.local.dir of each phase
        RECOVER: os.path.join(workdir, "spark-local-recover"),
    }


def dir_bytes(path: str, prefix: str = "") -> int:
    """Bytes of the files under ``path`` (a hard-linked file once), or only under its
    directories whose name starts with ``prefix``; 0 if it does not exist."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        if prefix and not any(part.startswith(prefix) for part in root.split(os.sep)):
            continue
        for name in files:
            with contextlib.suppress(OSError):  # a file removed while walking
                st = os.stat(os.path.join(root, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def _state_bytes(system: str, workdir: str) -> dict[str, int | None]:
    paths = _paths(workdir)
    ours = system.startswith("sparkstate-")
    durable = os.path.join(paths["checkpoint"], *(["sparkstate", "state"] if ours else ["state"]))
    local: int | None = None
    if system == "sparkstate-rocksdb":
        local = dir_bytes(paths["local"])
    elif system == "spark-rocksdb":
        local = dir_bytes(paths[GROW], SPARK_LOCAL_COPY_PREFIX)
    return {"checkpoint": dir_bytes(durable), "local": local}


# --- child side -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Session:
    """What a phase runs beside its query: the JVM, its memory sampler, the store's options."""

    jvm_pid: int
    sampler: RssSampler
    options: dict[str, str]


def _check_sparkstate() -> list[str]:
    """The store's option names; :class:`NotAvailable` if the engine is not importable."""
    try:
        importlib.import_module("sparkstate.engine")
        from sparkstate.store.conf import StoreConf
    except ImportError as exc:
        msg = f"the sparkstate engine is not importable ({exc})"
        raise NotAvailable(msg) from exc
    return [f.name for f in dataclasses.fields(StoreConf)]


def _writer(spark: Any, system: str, params: Mapping[str, Any], options: Mapping[str, str]) -> Any:
    """The query as a user writes it, ready to ``start()``."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", params["rows_per_batch"])
        .option("numPartitions", 2)
        .load()
        .select(F.col("value").alias("key"))
    )
    if system.startswith("sparkstate-"):
        import sparkstate as ss

        counts = ss.stream(df).groupBy("key").count()
    else:
        counts = df.groupBy("key").count()
    writer = (
        counts.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", _paths(params["workdir"])["checkpoint"])
        .queryName(f"scale_{system}".replace("-", "_"))
    )
    if system.startswith("sparkstate-"):
        writer = writer.option("stateStore", system.removeprefix("sparkstate-"))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


def _within(fn: Callable[[], Any], timeout_s: float) -> bool:
    """Call ``fn`` in a daemon thread; whether it returned (or raised) within ``timeout_s``."""
    done = threading.Event()

    def call() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a failed Spark may refuse to stop cleanly
            pass
        finally:
            done.set()

    threading.Thread(target=call, daemon=True).start()
    return done.wait(timeout_s)


def _stop(fn: Callable[[], Any], jvm_pid: int) -> None:
    """Stop a query or the session; a JVM that does not let it within the timeout is killed
    (it is this process's own), so that a thrashing run cannot hold the bench."""
    if not _within(fn, STOP_TIMEOUT_S):
        with contextlib.suppress(ProcessLookupError):
            os.kill(jvm_pid, signal.SIGKILL)


def _grow(spark: Any, system: str, params: Mapping[str, Any], session: _Session) -> dict[str, Any]:
    """Start the query on a new checkpoint and follow it to the target (or its limits); stop
    it, and measure its state on disk."""
    started = time.perf_counter()
    query = _writer(spark, system, params, session.options).start()
    records, failed, stopped = follow(
        query, system, params, session.sampler, in_memory=system in IN_MEMORY
    )
    run_s = time.perf_counter() - started
    _stop(query.stop, session.jvm_pid)
    return {
        "available": True,
        **scale_report.batch_summary(records),
        "failed": failed,
        "stopped": stopped,
        "peak_worker_rss_mb": round(session.sampler.peak_workers_mb, 1),
        "peak_worker_pss_mb": round(session.sampler.peak_workers_pss_mb, 1),
        "peak_jvm_rss_mb": round(session.sampler.peak_jvm_mb, 1),
        "state_bytes_on_disk": _state_bytes(system, params["workdir"]),
        "run_s": run_s,
        "per_batch": records,
    }


def _recover(
    spark: Any, system: str, params: Mapping[str, Any], session: _Session
) -> dict[str, Any]:
    """Restart the query on the checkpoint the grow phase left (without local copies) and
    time it from ``start()`` to its first batch's progress."""
    writer = _writer(spark, system, params, session.options)
    started = time.perf_counter()
    query = writer.start()
    start_ms = (time.perf_counter() - started) * 1000
    seen: set[int] = set()
    try:
        while not (first := completed_batches(query, seen)):
            failure = query.exception()
            if failure is not None:
                msg = f"the restarted query failed: {first_line(failure)}"
                raise RuntimeError(msg)
            if time.perf_counter() - started > params["time_budget_s"]:
                msg = f"no batch within the time budget of {params['time_budget_s']:,.0f} s"
                raise TimeoutError(msg)
            time.sleep(RECOVERY_POLL_S)
        wall_ms = (time.perf_counter() - started) * 1000
    finally:
        _stop(query.stop, session.jvm_pid)
    p = first[0]
    record = batch_record(p, wall_ms / 1000, session.sampler.take_peaks())
    print(
        f"    {system}: recovery: batch {record['batchId']} on {record['state_rows']:,} state "
        f"rows {wall_ms:,.0f} ms after start() ({record['batch_ms']:,.0f} ms in the batch)",
        flush=True,
    )
    return {
        "available": True,
        "recovery_ms": wall_ms,
        "start_ms": start_ms,
        "batch_ms": record["batch_ms"],
        "batch": record,
        "state_operator": (p.get("stateOperators") or [{}])[0],
        "peak_worker_rss_mb": round(session.sampler.peak_workers_mb, 1),
        "peak_jvm_rss_mb": round(session.sampler.peak_jvm_mb, 1),
    }


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run one phase (``params["phase"]``: grow, or recover) of ``system`` in this (fresh)
    process: a session of its own, with the memory sampler running beside it."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    ours = system.startswith("sparkstate-")
    fields = _check_sparkstate() if ours else []
    paths = _paths(params["workdir"])
    phase = params["phase"]
    conf = {
        "spark.driver.memory": f"{params['jvm_memory_mb']}m",
        "spark.local.dir": paths[phase],
    }
    if not ours:
        conf[PROVIDER_CONF] = SPARK_PROVIDERS[system]
    started = time.perf_counter()
    spark = spark_session(f"bench-scale-{system}-{phase}", conf)
    session_s = time.perf_counter() - started
    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    session = _Session(
        jvm_pid,
        RssSampler(jvm_pid).start(),
        store_options(
            system,
            paths["local"],
            params["store_memory_mb"],
            fields,
            params.get("store_options"),
        ),
    )
    spark_conf = recorded_conf(spark)
    try:
        result = (_grow if phase == GROW else _recover)(spark, system, params, session)
    finally:
        session.sampler.stop()
        _stop(spark.stop, jvm_pid)
    result["session_start_s"] = session_s
    result["spark_conf"] = spark_conf
    result["store_options"] = session.options
    result["rss_samples"] = [s.as_list() for s in session.sampler.samples]
    return result


# --- parent side ----------------------------------------------------------------------------------


def check_batches(records: Sequence[Mapping[str, Any]], rows_per_batch: int) -> list[str]:
    """Every row is a new key: after batch ``b`` the state holds ``(b + 1) * rows_per_batch``
    rows. The batches that do not."""
    return [
        f"batch {r['batchId']}: {r['state_rows']:,} state rows, expected "
        f"{(r['batchId'] + 1) * rows_per_batch:,}"
        for r in records
        if r["state_rows"] != (r["batchId"] + 1) * rows_per_batch
    ]


def _phase(spec: BenchSpec, phase: str) -> BenchSpec:
    params = {**spec.params, "phase": phase}
    return BenchSpec(spec.name, spec.module, spec.systems, [], params, spec.timeout_s)


def _run_system(spec: BenchSpec, system: str) -> dict[str, Any]:
    """Grow the state of ``system`` in one process and, for a RocksDB system that got through,
    recover it in another after deleting the local copies; both in one work directory."""
    print(f"[bench scale] {system} ... (load {os.getloadavg()[0]:.2f})", flush=True)
    workdir = tempfile.mkdtemp(prefix=f"sparkstate-bench-scale-{system}-")
    try:
        result = run_child(_phase(spec, GROW), system, workdir)
        if not result.get("available") or "error" in result:
            return result
        rows = spec.params["rows_per_batch"]
        result["problems"] = check_batches(result["per_batch"], rows)
        result["recovery_ms"] = None
        if system in RECOVERABLE and not result["failed"]:
            paths = _paths(workdir)
            deleted = dir_bytes(paths["local"]) + dir_bytes(paths[GROW])
            shutil.rmtree(paths["local"], ignore_errors=True)
            shutil.rmtree(paths[GROW], ignore_errors=True)
            recovery = run_child(_phase(spec, RECOVER), system, workdir)
            recovery["local_bytes_deleted"] = deleted
            result["recovery"] = recovery
            result["recovery_ms"] = recovery.get("recovery_ms")
            if "error" in recovery:
                result["problems"].append(f"recovery: {recovery['error']}")
            elif recovery.get("available"):
                result["problems"] += check_batches([recovery["batch"]], rows)
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _print_summary(
    results: Mapping[str, Any],
    rat: Mapping[str, float],
    notes: Sequence[str],
    goals: Mapping[str, Mapping[str, Any]],
) -> None:
    print(f"\n[bench scale] summary\n{scale_report.table(results)}")
    print("[bench scale] where the time goes in the late batches (ms per batch):")
    for system, r in results.items():
        parts = r.get("where_time_goes_ms_late") or {}
        print(f"    {system}: " + " | ".join(f"{k} {v:,.0f}" for k, v in parts.items()))
    for system, r in results.items():
        for problem in (r.get("problems") or [])[:5]:
            print(f"[bench scale] {system}: CHECK FAILED: {problem}")
    if rat:
        print("[bench scale] ratios (speed-ups, >1: sparkstate is faster):")
        for key, value in rat.items():
            print(f"    {key}: {value:.2f}x")
    for note in notes:
        print(f"[bench scale] note: {note}")
    if goals:
        print("[bench scale] targets (sparkstate-rocksdb):")
        for line in scale_report.target_lines(goals):
            print(f"    {line}")


def _failed(system: str, r: Mapping[str, Any]) -> bool:
    """Whether a system's result fails the run: a harness error, a check that does not hold,
    or a RocksDB system that failed (the in-memory ones are run until they fail)."""
    if "error" in r or r.get("problems"):
        return True
    return system in RECOVERABLE and bool(r.get("failed"))


def run(args: argparse.Namespace) -> int:
    if os.environ.get(REMOTE_ENV):
        print("[bench scale] samples the memory of a local JVM and its workers: not with --remote")
        return 2
    try:
        params = params_for(args)
    except ValueError as exc:
        print(f"[bench scale] {exc}")
        return 2
    spec = BenchSpec("scale", __name__, SYSTEMS, [], params, params["time_budget_s"])
    systems = selected_systems(spec, args)
    if systems is None:
        return 2
    print(f"[bench scale] {json.dumps(params)}", flush=True)
    results = {system: _run_system(spec, system) for system in systems}
    rat, notes = scale_report.ratios(results)
    goals = scale_report.targets(results, rat, params["target_rows"])
    _print_summary(results, rat, notes, goals)
    report = {
        "benchmark": "scale",
        "quick": bool(getattr(args, "quick", False)),
        "params": params,
        "machine": machine_info(),
        "systems": results,
        "ratios": rat,
        "notes": notes,
        "targets": goals,
    }
    write_report("scale", args, report)
    if getattr(args, "plot", None):
        title = (
            f"groupBy(key).count(), a new key per row, {params['rows_per_batch']:,} rows per "
            f"batch, local[2] ({os.cpu_count()} cores)"
        )
        scale_report.plot(results, args.plot, title)
        print(f"[bench scale] wrote {args.plot}")
    return 1 if any(_failed(s, r) for s, r in results.items()) else 0
