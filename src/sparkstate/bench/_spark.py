"""Shared machinery of the streaming benchmarks (``sparkstate bench aggregate | arbitrary | ...``).

Every system runs in a fresh subprocess with a SparkSession of its own
(:mod:`sparkstate.bench._processes`); its progress is summarized by
:mod:`sparkstate.bench._results`. This module makes the session, feeds it and drives a query.

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

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkstate.bench._processes import (
    RESULT_PREFIX,
    BenchSpec,
    NotAvailable,
    Workloads,
    rows_emitted_measured,
    run_bench,
    run_child,
    run_systems,
    run_workloads,
    selected_systems,
    worker_main,
)
from sparkstate.bench._results import (
    BATCH_STATE_FIELDS,
    BREAKDOWN,
    DURATION_FIELDS,
    STATE_FIELDS,
    batch_records,
    machine_info,
    print_summary,
    ratios,
    summarize,
    time_breakdown,
    write_report,
)
from sparkstate.bench._settings import (
    DRIVER_MEMORY,
    HDFS_PROVIDER,
    MASTER,
    PROFILE_ENV,
    PROVIDER_CONF,
    RECORDED_CONF,
    REMOTE_POLL_S,
    ROCKSDB_PROVIDER,
    SHUFFLE_PARTITIONS,
    UDF_PROFILER_CONF,
)
from sparkstate.engine.spark.session import REMOTE_ENV
from sparkstate.runtime.progress import progress_as_dict

__all__ = [
    "BATCH_STATE_FIELDS",
    "BREAKDOWN",
    "DRIVER_MEMORY",
    "DURATION_FIELDS",
    "HDFS_PROVIDER",
    "MASTER",
    "PROFILE_ENV",
    "PROVIDER_CONF",
    "RECORDED_CONF",
    "REMOTE_POLL_S",
    "RESULT_PREFIX",
    "ROCKSDB_PROVIDER",
    "SHUFFLE_PARTITIONS",
    "STATE_FIELDS",
    "UDF_PROFILER_CONF",
    "BenchSpec",
    "NotAvailable",
    "Workloads",
    "batch_records",
    "drive",
    "machine_info",
    "measure_query",
    "print_summary",
    "rate_keys",
    "ratios",
    "recorded_conf",
    "rows_emitted_measured",
    "run_bench",
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
