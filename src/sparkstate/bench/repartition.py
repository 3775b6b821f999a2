"""``sparkstate bench repartition``: moving a stopped query's state to more partitions,
sparkstate's ``ss.repartition`` against Spark's own (``StreamingCheckpointManager.repartition``).

Each system, in a fresh subprocess with its own ``local[2]`` session:

1. builds the state: ``groupBy(key).agg(count, sum(value))`` in update mode on 4 shuffle
   partitions over parquet files of new keys (``key = 0..N-1``, ``value = key % 1000``; full:
   10M state rows in batches of 2M; ``--quick``: 1M in batches of 500k), one file per batch
   under ``trigger(availableNow=True)``, so the query ends by itself with every batch committed;
   ``spark-rocksdb`` on Spark's ``RocksDBStateStoreProvider``, ``sparkstate-rocksdb`` as
   ``ss.stream(df)...option("stateStore", "rocksdb")``;
2. times the repartition call alone, 4 to 16 partitions, on the stopped query's checkpoint:
   ``spark._streamingCheckpointManager.repartition(checkpoint, 16)`` or
   ``ss.repartition(spark, checkpoint, 16)``; both write one batch that carries the moved state;
3. restarts the same query on one more file: ``check_keys`` keys already in state (spread over
   the whole key range) and as many new ones.

Every run is checked, and a failed check fails the bench: the build's batches end with N rows in
state on 4 partitions; the repartition wrote the batch after the last one; the batch after it
runs on 16 partitions (``numShufflePartitions`` and ``numStateStoreInstances`` of its
progress), holds N + ``check_keys`` rows in state and updated 2 x ``check_keys`` of them, and
emitted, from a ``foreachBatch`` that sums its output, every key of the file once: the old keys
with count 2 and twice their value, the new ones with count 1 (a key the repartition lost, or put
in a partition its hash does not send it to, would come out as new).

The ratio ``repartition:sparkstate-rocksdb/spark-rocksdb`` is Spark's repartition time over
ours (>1: ours is faster). A system without a repartition yet is reported as not available.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkstate.bench._spark import (
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
from sparkstate.engine.spark.session import REMOTE_ENV
from sparkstate.runtime.progress import progress_as_dict

__all__ = [
    "FULL",
    "QUICK",
    "RATIO",
    "SYSTEMS",
    "Summaries",
    "check_system",
    "expected_check_batch",
    "measure",
    "params_for",
    "ratios",
    "run",
    "run_to_end",
    "targets",
    "write_keys",
]

SYSTEMS = ["spark-rocksdb", "sparkstate-rocksdb"]
OURS, THEIRS = "sparkstate-rocksdb", "spark-rocksdb"
RATIO = f"repartition:{OURS}/{THEIRS}"
#: The issue's target for :data:`RATIO`.
RATIO_GOAL = 1.0
FULL = {
    "state_rows": 10_000_000,
    "rows_per_batch": 2_000_000,
    "from_partitions": 4,
    "to_partitions": 16,
}
QUICK = {**FULL, "state_rows": 1_000_000, "rows_per_batch": 500_000}
#: The check batch's old keys (and as many new ones), unless set: this share of the state.
CHECK_SHARE = 100
#: Seconds a system may take, ``--quick`` and full.
TIMEOUTS = (900.0, 3600.0)
#: ``value = key % VALUE_MOD``: small, so sums stay exact.
VALUE_MOD = 1000
#: The output summed per batch by the ``foreachBatch`` function.
SUMMARY_FIELDS = ("rows", "count", "sum", "old_rows", "old_sum")


def params_for(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes from ``--quick``; ``state_rows``, ``rows_per_batch``, ``from_partitions`` and
    ``to_partitions`` attributes override them; ``check_keys`` is a hundredth of the state rows
    unless set."""
    params: dict[str, Any] = dict(QUICK if getattr(args, "quick", False) else FULL)
    params["check_keys"] = None
    for key in params:
        value = getattr(args, key, None)
        if value is not None:
            params[key] = int(value)
    if params["check_keys"] is None:
        params["check_keys"] = max(1, params["state_rows"] // CHECK_SHARE)
    if params["rows_per_batch"] > params["state_rows"] or params["rows_per_batch"] < 1:
        msg = (
            f"need 1 <= rows per batch <= state rows, got {params['rows_per_batch']:,} and "
            f"{params['state_rows']:,}"
        )
        raise ValueError(msg)
    if not 1 <= params["check_keys"] <= params["state_rows"]:
        msg = f"need 1 <= check keys <= state rows, got {params['check_keys']:,}"
        raise ValueError(msg)
    if params["from_partitions"] == params["to_partitions"]:
        msg = f"the partitions do not change ({params['from_partitions']})"
        raise ValueError(msg)
    return params


# --- the input and what the check batch must do ---------------------------------------------------


def build_batches(params: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The key ranges ``[start, end)`` of the build's batches, one file each."""
    n, step = params["state_rows"], params["rows_per_batch"]
    return [(start, min(start + step, n)) for start in range(0, n, step)]


def check_keys(params: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """The check batch's keys: ``check_keys`` old ones spread evenly over the state, and as
    many new ones."""
    n, m = params["state_rows"], params["check_keys"]
    old = [i * n // m for i in range(m)]
    return old, list(range(n, n + m))


def expected_check_batch(params: Mapping[str, Any]) -> dict[str, int]:
    """What the check batch's output sums to (:data:`SUMMARY_FIELDS`) and its state rows."""
    old, new = check_keys(params)
    old_sum = 2 * sum(k % VALUE_MOD for k in old)
    m = params["check_keys"]
    return {
        "rows": 2 * m,
        "count": 3 * m,
        "sum": old_sum + sum(k % VALUE_MOD for k in new),
        "old_rows": m,
        "old_sum": old_sum,
        "numRowsTotal": params["state_rows"] + m,
        "numRowsUpdated": 2 * m,
    }


def write_keys(path: str, keys: Sequence[int] | range) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = np.asarray(keys, dtype=np.int64)
    table = pa.table({"key": key, "value": key % VALUE_MOD})
    pq.write_table(table, path + ".tmp")
    os.replace(path + ".tmp", path)  # the file source must never list a half-written file


# --- the systems (child side) ---------------------------------------------------------------------


class Summaries:
    """The ``foreachBatch`` function: sums each batch's output (old keys: count 2) and writes
    it to the stream's output; a batch's state is written as its output is computed."""

    def __init__(self) -> None:
        self.by_batch: dict[int, dict[str, int]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        old = F.col("count") == 2
        row = df.agg(
            F.count("*").alias("rows"),
            F.sum("count").alias("count"),
            F.sum("sum").alias("sum"),
            F.sum(F.when(old, 1).otherwise(0)).alias("old_rows"),
            F.sum(F.when(old, F.col("sum")).otherwise(0)).alias("old_sum"),
        ).collect()[0]
        self.by_batch[int(batch_id)] = {f: int(row[f] or 0) for f in SUMMARY_FIELDS}


#: sparkstate's repartition, by its name in the ``sparkstate`` package: the bench runs our
#: system once it exists.
OUR_REPARTITION = "repartition"


def _ours() -> Callable[..., int]:
    """``ss.repartition``; :class:`NotAvailable` before it exists (and before a JVM starts)."""
    try:
        import sparkstate as ss
        import sparkstate.engine  # noqa: F401
    except ImportError as exc:
        msg = f"the sparkstate engine is not importable ({exc})"
        raise NotAvailable(msg) from exc
    fn = getattr(ss, OUR_REPARTITION, None)
    if fn is None:
        msg = f"sparkstate has no repartition yet (ss.{OUR_REPARTITION})"
        raise NotAvailable(msg)
    result: Callable[..., int] = fn
    return result


def _start(
    spark: Any, system: str, params: Mapping[str, Any], paths: Mapping[str, str], fn: Summaries
) -> Any:
    """The query as a user writes it, on the checkpoint, to the end of its input."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.schema("key long, value long")
        .option("maxFilesPerTrigger", 1)
        .parquet(paths["input"])
    )
    if system == OURS:
        import sparkstate as ss
        from sparkstate import functions as SF

        counted = ss.stream(df).groupBy("key")
        agg = counted.agg(SF.count("*").alias("count"), SF.sum("value").alias("sum"))
    else:
        agg = df.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("sum"))
    writer = (
        agg.writeStream.outputMode("update")
        .foreachBatch(fn)
        .option("checkpointLocation", paths["checkpoint"])
        .queryName(f"repartition_{system}".replace("-", "_"))
        .trigger(availableNow=True)
    )
    if system == OURS:
        writer = writer.option("stateStore", "rocksdb")
    return writer.start()


def run_to_end(query: Any, timeout_s: float) -> list[dict[str, Any]]:
    """Wait for an available-now query to end; the progress of its batches, in batch order."""
    if not query.awaitTermination(timeout_s):
        query.stop()
        msg = f"the query did not end within {timeout_s:,.0f} s"
        raise TimeoutError(msg)
    failure = query.exception()
    if failure is not None:
        msg = f"the query failed: {failure}"
        raise RuntimeError(msg)
    progress = [progress_as_dict(p) for p in query.recentProgress or []]
    done = {int(p["batchId"]): p for p in progress if p.get("sources")}
    return [done[b] for b in sorted(done)]


def batch_record(p: Mapping[str, Any], summary: Mapping[str, int] | None) -> dict[str, Any]:
    """A batch's input, state and output, from its progress and its output's sums."""
    op = (p.get("stateOperators") or [{}])[0]
    return {
        "batchId": int(p["batchId"]),
        "numInputRows": int(p.get("numInputRows", 0)),
        "batch_ms": float((p.get("durationMs") or {}).get("triggerExecution", 0)),
        "numRowsTotal": op.get("numRowsTotal"),
        "numRowsUpdated": op.get("numRowsUpdated"),
        "numShufflePartitions": op.get("numShufflePartitions"),
        "numStateStoreInstances": op.get("numStateStoreInstances"),
        "output": dict(summary) if summary is not None else None,
    }


def _last_offset_batch(checkpoint: str) -> int | None:
    """The last batch in the checkpoint's offset log (Spark's repartition returns nothing)."""
    names = os.listdir(os.path.join(checkpoint, "offsets"))
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else None


def _state_partitions(system: str, checkpoint: str) -> list[int]:
    """The state partition directories of operator 0 on disk."""
    parts = ["sparkstate", "state", "0"] if system == OURS else ["state", "0"]
    root = os.path.join(checkpoint, *parts)
    if not os.path.isdir(root):
        return []
    return sorted(int(n) for n in os.listdir(root) if n.isdigit())


def _repartition(spark: Any, system: str, checkpoint: str, to: int) -> tuple[float, int | None]:
    """Repartition the stopped query's state; the seconds of the call alone, and the batch it
    wrote (ours returns it, Spark's is the last in the offset log)."""
    if system == OURS:
        fn = _ours()
        started = time.perf_counter()
        batch: int | None = int(fn(spark, checkpoint, to, enforce_exactly_once_sink=True))
        return time.perf_counter() - started, batch
    manager = spark._streamingCheckpointManager  # noqa: SLF001 - Spark's own API (4.2+)
    started = time.perf_counter()
    manager.repartition(checkpoint, to, True)
    seconds = time.perf_counter() - started
    return seconds, _last_offset_batch(checkpoint)


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Build the state, repartition it and run the check batch, in this (fresh) process."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    if system == OURS:
        _ours()
    workdir = params["workdir"]
    paths = {"input": os.path.join(workdir, "input"), "checkpoint": os.path.join(workdir, "ckpt")}
    os.makedirs(paths["input"])
    for i, (start, end) in enumerate(build_batches(params)):
        write_keys(os.path.join(paths["input"], f"build-{i:05d}.parquet"), range(start, end))
    conf = {"spark.sql.shuffle.partitions": str(params["from_partitions"])}
    if system == THEIRS:
        conf[PROVIDER_CONF] = ROCKSDB_PROVIDER
    started = time.perf_counter()
    spark = spark_session(f"bench-repartition-{system}", conf)
    session_s = time.perf_counter() - started
    timeout_s = float(params["timeout_s"])
    try:
        summaries = Summaries()
        started = time.perf_counter()
        build = run_to_end(_start(spark, system, params, paths, summaries), timeout_s)
        build_s = time.perf_counter() - started
        records = [batch_record(p, summaries.by_batch.get(int(p["batchId"]))) for p in build]
        rows = records[-1]["numRowsTotal"] if records else None
        print(f"    {system}: built {rows:,} state rows in {build_s:,.1f} s", flush=True)
        seconds, batch = _repartition(spark, system, paths["checkpoint"], params["to_partitions"])
        print(
            f"    {system}: repartition {params['from_partitions']} -> "
            f"{params['to_partitions']}: {seconds:,.2f} s (batch {batch})",
            flush=True,
        )
        old, new = check_keys(params)
        write_keys(os.path.join(paths["input"], "check.parquet"), old + new)
        started = time.perf_counter()
        after = run_to_end(_start(spark, system, params, paths, summaries), timeout_s)
        after_s = time.perf_counter() - started
        return {
            "available": True,
            "repartition_s": seconds,
            "repartition_batch": batch,
            "build_s": build_s,
            "build": records,
            "check_s": after_s,
            "check": [batch_record(p, summaries.by_batch.get(int(p["batchId"]))) for p in after],
            "state_partitions_on_disk": _state_partitions(system, paths["checkpoint"]),
            "session_start_s": session_s,
            "spark_conf": recorded_conf(spark),
        }
    finally:
        spark.stop()


# --- the run (parent side) ------------------------------------------------------------------------


def check_system(params: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """How a system's run disagrees with what the build, the repartition and the check batch
    must do (empty: it agrees)."""
    problems: list[str] = []
    build = result.get("build") or []
    ranges = build_batches(params)
    if [r["batchId"] for r in build] != list(range(len(ranges))):
        problems.append(f"build: batches {[r['batchId'] for r in build]}, {len(ranges)} expected")
    for rec, (start, end) in zip(build, ranges, strict=False):
        want = {
            "numInputRows": end - start,
            "numRowsTotal": end,
            "numShufflePartitions": params["from_partitions"],
            "output": {"rows": end - start, "count": end - start},
        }
        problems += _disagreements(f"build batch {rec['batchId']}", rec, want)
    last = len(ranges) - 1
    if result.get("repartition_batch") != last + 1:
        problems.append(
            f"repartition: wrote batch {result.get('repartition_batch')}, expected {last + 1}"
        )
    check = result.get("check") or []
    if len(check) != 1:
        problems.append(f"check: {len(check)} batches ran, 1 expected")
    exp = expected_check_batch(params)
    for rec in check[:1]:
        to = params["to_partitions"]
        want = {
            "batchId": last + 2,
            "numInputRows": exp["rows"],
            "numRowsTotal": exp["numRowsTotal"],
            "numRowsUpdated": exp["numRowsUpdated"],
            "numShufflePartitions": to,
            "numStateStoreInstances": to,
            "output": {f: exp[f] for f in SUMMARY_FIELDS},
        }
        problems += _disagreements("check batch", rec, want)
    return problems


def _disagreements(label: str, got: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    out = []
    for field, value in want.items():
        if isinstance(value, Mapping):
            out += _disagreements(f"{label} {field}", got.get(field) or {}, value)
        elif got.get(field) != value:
            out.append(f"{label}: {field} {got.get(field)!r}, expected {value!r}")
    return out


def ratios(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Spark's repartition time over ours, when both ran."""
    ours, theirs = results.get(OURS, {}), results.get(THEIRS, {})
    if ours.get("repartition_s") and theirs.get("repartition_s"):
        return {RATIO: float(theirs["repartition_s"]) / float(ours["repartition_s"])}
    return {}


def targets(rat: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """The issue's target, as ``bench scale`` records its own: value, goal, and whether it is
    met (None: not measured in this run)."""
    value = rat.get(RATIO)
    met = None if value is None else value >= RATIO_GOAL
    return {RATIO: {"value": value, "goal": f">= {RATIO_GOAL:g}", "met": met}}


def _run_system(spec: BenchSpec, system: str) -> dict[str, Any]:
    print(f"[bench repartition] {system} ... (load {os.getloadavg()[0]:.2f})", flush=True)
    workdir = tempfile.mkdtemp(prefix=f"sparkstate-bench-repartition-{system}-")
    try:
        result = run_child(spec, system, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if result.get("available") and "error" not in result:
        result["problems"] = check_system(spec.params, result)
    return result


def _print_summary(results: Mapping[str, Mapping[str, Any]], rat: Mapping[str, float]) -> None:
    head = f"{'system':<22}{'state rows':>12}{'build s':>10}{'repartition s':>15}{'check ms':>10}"
    lines = [head, "-" * len(head)]
    for system, r in results.items():
        if "error" in r or not r.get("available"):
            note = r.get("error") or f"not available: {r.get('reason', '')}"
            lines.append(f"{system:<22}{'-':>12}{'-':>10}{'-':>15}{'-':>10}  {note}")
            continue
        rows = (r["build"][-1]["numRowsTotal"] if r["build"] else None) or 0
        check_ms = r["check"][0]["batch_ms"] if r["check"] else 0.0
        verdict = "ok" if not r["problems"] else "CHECK FAILED"
        lines.append(
            f"{system:<22}{rows:>12,}{r['build_s']:>10,.1f}{r['repartition_s']:>15,.2f}"
            f"{check_ms:>10,.0f}  {verdict}"
        )
    print("\n[bench repartition] summary\n" + "\n".join(lines))
    for system, r in results.items():
        for problem in (r.get("problems") or [])[:10]:
            print(f"[bench repartition] {system}: CHECK FAILED: {problem}")
    for key, t in targets(rat).items():
        if t["met"] is None:
            print(f"[bench repartition] {key}: not measured (target {t['goal']})")
            continue
        verdict = "met" if t["met"] else "MISSED"
        print(
            f"[bench repartition] {key}: {t['value']:.2f}x (Spark's time over ours; target "
            f"{t['goal']}: {verdict})"
        )


def run(args: argparse.Namespace) -> int:
    if os.environ.get(REMOTE_ENV):
        print(
            "[bench repartition] Spark's repartition runs in Spark Classic only: not with --remote"
        )
        return 2
    try:
        params = params_for(args)
    except ValueError as exc:
        print(f"[bench repartition] {exc}")
        return 2
    quick = bool(getattr(args, "quick", False))
    spec = BenchSpec("repartition", __name__, SYSTEMS, [], params, TIMEOUTS[0 if quick else 1])
    systems = selected_systems(spec, args)
    if systems is None:
        return 2
    print(f"[bench repartition] {json.dumps(params)}", flush=True)
    results = {system: _run_system(spec, system) for system in systems}
    rat = ratios(results)
    _print_summary(results, rat)
    report = {
        "benchmark": "repartition",
        "quick": quick,
        "params": params,
        "machine": machine_info(),
        "systems": results,
        "ratios": rat,
        "targets": targets(rat),
    }
    write_report("repartition", args, report)
    failed = any("error" in r or r.get("problems") for r in results.values())
    return 1 if failed else 0
