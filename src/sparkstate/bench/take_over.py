"""``sparkstate bench take-over``: a query that ran with Spark's own operator, restarted on its
checkpoint by Spark (``spark``) and wrapped with ``ss.stream`` (``sparkstate-rocksdb``,
``sparkstate-memory``), which takes Spark's state over at that start.

Each system, in fresh subprocesses with their own ``local[2]`` session:

1. builds the state with Spark's own operator and provider (``--spark-provider``, the HDFS-backed
   default or ``rocksdb``): ``groupBy(key).agg(count, sum(value))`` in update mode on 4 shuffle
   partitions over parquet files of new keys (``key = 0..N-1``; full: 10M state rows in batches
   of 2M; ``--quick``: 1M in batches of 500k) under ``trigger(availableNow=True)``; stops;
2. in a second subprocess (a restarted driver), times the restart on one more file,
   ``check_keys`` keys already in state and as many new ones: from ``start()`` to the end of
   that batch. ``spark`` restarts the same query; ours
   starts the wrapped query, whose start takes the state over (and the time of the take-over
   alone is read from its log line);
3. in a third subprocess, hands the checkpoint back to Spark: ours run ``ss.export`` (timed)
   and then Spark's own query, on a file of the check batch's old keys; ``spark`` restarts its
   query on the same file (the time to compare: export and Spark's restart against Spark's
   restart alone).

Every run is checked, and a failed check fails the bench: the check batch is batch ``L + 1``
after the build's last batch ``L``, holds N + ``check_keys`` rows in state, and emitted every key
of the file once, the old keys with count 2 and twice their value (a key the take-over lost or
put in the wrong partition would come out as new); and the batch after the export is batch
``L + 2``, keeps N + ``check_keys`` rows in state, and counts each old key a third time.

``restart:<ours>/spark`` is Spark's restart time over ours (>1: ours is faster), take-over
included; ``take-over:<ours>/spark`` is Spark's restart time over the take-over alone (its
target: above 1). ``back:<ours>/spark`` is Spark's restart time over the
export and Spark's restart after it (no target: the export is a move, made once).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from sparkstate.bench._spark import (
    PROVIDER_CONF,
    ROCKSDB_PROVIDER,
    BenchSpec,
    machine_info,
    recorded_conf,
    run_child,
    selected_systems,
    spark_session,
    write_report,
)
from sparkstate.bench.repartition import (
    SUMMARY_FIELDS,
    VALUE_MOD,
    Summaries,
    batch_record,
    build_batches,
    check_keys,
    expected_check_batch,
    run_to_end,
    write_keys,
)
from sparkstate.engine.spark.session import REMOTE_ENV

__all__ = ["FULL", "QUICK", "SYSTEMS", "check_system", "measure", "ratios", "run"]

SPARK = "spark"
SYSTEMS = [SPARK, "sparkstate-rocksdb", "sparkstate-memory"]
FULL = {"state_rows": 10_000_000, "rows_per_batch": 2_000_000, "partitions": 4}
QUICK = {**FULL, "state_rows": 1_000_000, "rows_per_batch": 500_000}
#: The check batch's old keys (and as many new ones): this share of the state.
CHECK_SHARE = 100
TIMEOUTS = (900.0, 3600.0)
#: The take-over's log line: its rows and seconds.
_TOOK_OVER = re.compile(r"took over the state .* \(([\d,]+) rows, ([\d.]+) s[;)]")


def params_for(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = dict(QUICK if getattr(args, "quick", False) else FULL)
    for key in ("state_rows", "rows_per_batch"):
        value = getattr(args, key, None)
        if value is not None:
            params[key] = int(value)
    params["spark_provider"] = getattr(args, "spark_provider", None) or "hdfs"
    if params["spark_provider"] not in ("hdfs", "rocksdb"):
        msg = f"--spark-provider is hdfs or rocksdb, got {params['spark_provider']!r}"
        raise ValueError(msg)
    params["check_keys"] = max(1, params["state_rows"] // CHECK_SHARE)
    if not 1 <= params["rows_per_batch"] <= params["state_rows"]:
        msg = f"need 1 <= rows per batch <= state rows, got {params['rows_per_batch']:,}"
        raise ValueError(msg)
    return params


class _TakeOverLog(logging.Handler):
    """Keeps the take-over's rows and seconds from its log line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: tuple[int, float] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        m = _TOOK_OVER.search(record.getMessage())
        if m:
            self.found = (int(m.group(1).replace(",", "")), float(m.group(2)))


def _start(spark: Any, system: str, paths: Mapping[str, str], fn: Summaries) -> Any:
    """The query as a user writes it: Spark's own, or wrapped with ``ss.stream``."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.schema("key long, value long")
        .option("maxFilesPerTrigger", 1)
        .parquet(paths["input"])
    )
    if system != SPARK:
        import sparkstate as ss

        df = ss.stream(df)
    agg = df.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("sum"))
    writer = (
        agg.writeStream.outputMode("update")
        .foreachBatch(fn)
        .option("checkpointLocation", paths["checkpoint"])
        .trigger(availableNow=True)
    )
    if system != SPARK:
        writer = writer.option("stateStore", system.removeprefix("sparkstate-"))
    return writer.start()


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Phase ``build``: build the state with Spark's operator. Phase ``restart``, in a fresh
    process as a restarted driver is: restart as ``system`` on one more file."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    workdir = params["workdir"]
    paths = {"input": os.path.join(workdir, "input"), "checkpoint": os.path.join(workdir, "ckpt")}
    conf = {"spark.sql.shuffle.partitions": str(params["partitions"])}
    if params["spark_provider"] == "rocksdb":
        conf[PROVIDER_CONF] = ROCKSDB_PROVIDER
    if params["phase"] == "back":
        return _back(system, params, paths, conf)
    if params["phase"] == "build":
        os.makedirs(paths["input"])
        for i, (start, end) in enumerate(build_batches(params)):
            write_keys(os.path.join(paths["input"], f"build-{i:05d}.parquet"), range(start, end))
    spark = spark_session(f"bench-take-over-{system}-{params['phase']}", conf)
    timeout_s = float(params["timeout_s"])
    handler = _TakeOverLog()
    logging.getLogger("sparkstate.engine").addHandler(handler)
    try:
        summaries = Summaries()
        if params["phase"] == "build":
            started = time.perf_counter()
            build = run_to_end(_start(spark, SPARK, paths, summaries), timeout_s)
            build_s = time.perf_counter() - started
            rows = build[-1]["stateOperators"][0]["numRowsTotal"] if build else None
            print(f"    {system}: Spark built {rows:,} state rows in {build_s:,.1f} s", flush=True)
            old, new = check_keys(params)
            write_keys(os.path.join(paths["input"], "check.parquet"), old + new)
            return {"available": True, "build_s": build_s, "build_batches": len(build)}
        started = time.perf_counter()
        after = run_to_end(_start(spark, system, paths, summaries), timeout_s)
        restart_s = time.perf_counter() - started
        taken = handler.found
        print(
            f"    {system}: restart and check batch {restart_s:,.2f} s"
            + (f" (take-over {taken[1]:,.2f} s of {taken[0]:,} rows)" if taken else ""),
            flush=True,
        )
        return {
            "available": True,
            "restart_s": restart_s,
            "take_over_s": taken[1] if taken else None,
            "take_over_rows": taken[0] if taken else None,
            "check": [batch_record(p, summaries.by_batch.get(int(p["batchId"]))) for p in after],
            "spark_conf": recorded_conf(spark),
        }
    finally:
        logging.getLogger("sparkstate.engine").removeHandler(handler)
        spark.stop()


def _back(
    system: str, params: dict[str, Any], paths: Mapping[str, str], conf: dict[str, str]
) -> dict[str, Any]:
    """Phase ``back``: ours export the checkpoint to Spark's operators; then Spark's own query
    runs on a file of the check batch's old keys."""
    old, _ = check_keys(params)
    write_keys(os.path.join(paths["input"], "back.parquet"), old)
    spark = spark_session(f"bench-take-over-{system}-back", conf)
    try:
        export_s = None
        if system != SPARK:
            import sparkstate as ss

            started = time.perf_counter()
            ss.export(spark, paths["checkpoint"])
            export_s = time.perf_counter() - started
        summaries = Summaries()
        started = time.perf_counter()
        after = run_to_end(_start(spark, SPARK, paths, summaries), float(params["timeout_s"]))
        back_s = time.perf_counter() - started
        print(
            f"    {system}: "
            + (f"export {export_s:,.2f} s, " if export_s is not None else "")
            + f"Spark's restart and batch {back_s:,.2f} s",
            flush=True,
        )
        return {
            "export_s": export_s,
            "back_s": back_s,
            "back_check": [
                batch_record(p, summaries.by_batch.get(int(p["batchId"]))) for p in after
            ],
        }
    finally:
        spark.stop()


def _check_back(params: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """How the batch after the export disagrees with what it must do (empty: it agrees)."""
    check = result.get("back_check") or []
    if len(check) != 1:
        return [f"back: {len(check)} batches ran, 1 expected"]
    rec, m = check[0], params["check_keys"]
    old, _ = check_keys(params)
    want = {
        "batchId": int(result.get("build_batches", -2)) + 1,
        "numRowsTotal": params["state_rows"] + m,
        "numRowsUpdated": m,
    }
    problems = [
        f"back: {field} {rec.get(field)!r}, expected {value!r}"
        for field, value in want.items()
        if rec.get(field) != value
    ]
    output = rec.get("output") or {}
    expected = {"rows": m, "count": 3 * m, "sum": 3 * sum(k % VALUE_MOD for k in old)}
    problems += [
        f"back: output {field} {output.get(field)!r}, expected {value!r}"
        for field, value in expected.items()
        if output.get(field) != value
    ]
    return problems


def check_system(params: Mapping[str, Any], system: str, result: Mapping[str, Any]) -> list[str]:
    """How a system's restart disagrees with what the check batch must do (empty: it agrees)."""
    problems: list[str] = []
    check = result.get("check") or []
    if len(check) != 1:
        problems.append(f"check: {len(check)} batches ran, 1 expected")
    exp = expected_check_batch(params)
    for rec in check[:1]:
        if rec["batchId"] != result.get("build_batches"):
            problems.append(
                f"check batch: id {rec['batchId']}, {result.get('build_batches')} expected"
            )
        want = {
            "numInputRows": exp["rows"],
            "numRowsTotal": exp["numRowsTotal"],
            "numRowsUpdated": exp["numRowsUpdated"],
        }
        for field, value in want.items():
            if rec.get(field) != value:
                problems.append(f"check batch: {field} {rec.get(field)!r}, expected {value!r}")
        for field in SUMMARY_FIELDS:
            got = (rec.get("output") or {}).get(field)
            if got != exp[field]:
                problems.append(f"check batch: output {field} {got!r}, expected {exp[field]!r}")
    if system != SPARK and result.get("take_over_rows") != params["state_rows"]:
        problems.append(
            f"take-over: {result.get('take_over_rows')} rows, {params['state_rows']} expected"
        )
    if "back_error" in result:  # reported as such, not as a failed check
        return problems
    return problems + _check_back(params, result)


def ratios(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Spark's restart time over each of ours, where both ran."""
    theirs = results.get(SPARK, {}).get("restart_s")
    theirs_back = results.get(SPARK, {}).get("back_s")
    out = {}
    for system, r in results.items():
        if system != SPARK and theirs and r.get("restart_s"):
            out[f"restart:{system}/{SPARK}"] = float(theirs) / float(r["restart_s"])
        if system != SPARK and theirs and r.get("take_over_s"):
            out[f"take-over:{system}/{SPARK}"] = float(theirs) / float(r["take_over_s"])
    for system, r in results.items():
        if system != SPARK and theirs_back and r.get("back_s") and r.get("export_s"):
            ours = float(r["export_s"]) + float(r["back_s"])
            out[f"back:{system}/{SPARK}"] = float(theirs_back) / ours
    return out


def _run_system(spec: BenchSpec, system: str) -> dict[str, Any]:
    """The build in one subprocess, the restart in another (a fresh driver, as a restart is)."""
    print(f"[bench take-over] {system} ... (load {os.getloadavg()[0]:.2f})", flush=True)
    workdir = tempfile.mkdtemp(prefix=f"sparkstate-bench-take-over-{system}-")
    result: dict[str, Any] = {}
    try:
        for phase in ("build", "restart", "back"):
            one = BenchSpec(
                spec.name, spec.module, spec.systems, [], {**spec.params, "phase": phase},
                spec.timeout_s,
            )  # fmt: skip
            done = run_child(one, system, workdir)
            if phase == "back" and "error" in done:  # the restart's numbers stand
                result["back_error"] = done["error"]
                break
            result.update(done)
            if "error" in result or not result.get("available"):
                break
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if result.get("available") and "error" not in result:
        result["problems"] = check_system(spec.params, system, result)
    return result


def _print_summary(results: Mapping[str, Mapping[str, Any]], rat: Mapping[str, float]) -> None:
    head = (
        f"{'system':<22}{'build s':>10}{'restart s':>12}{'take-over s':>13}{'export s':>10}"
        f"{'back s':>9}"
    )
    lines = [head, "-" * len(head)]
    for system, r in results.items():
        if "error" in r or not r.get("available"):
            lines.append(f"{system:<22}{'-':>10}{'-':>12}{'-':>13}  {r.get('error', '')}")
            continue
        taken, exported = r.get("take_over_s"), r.get("export_s")
        verdict = "ok" if not r["problems"] else "CHECK FAILED"
        back = f"{r['back_s']:>9,.2f}" if "back_s" in r else f"{'-':>9}"
        lines.append(
            f"{system:<22}{r['build_s']:>10,.1f}{r['restart_s']:>12,.2f}"
            f"{(f'{taken:,.2f}' if taken is not None else '-'):>13}"
            f"{(f'{exported:,.2f}' if exported is not None else '-'):>10}"
            f"{back}  {verdict}"
            + (f"; back failed: {r['back_error']}" if "back_error" in r else "")
        )
    print("\n[bench take-over] summary\n" + "\n".join(lines))
    for system, r in results.items():
        for problem in (r.get("problems") or [])[:10]:
            print(f"[bench take-over] {system}: CHECK FAILED: {problem}")
    for key, value in rat.items():
        if key.startswith("back:"):
            print(
                f"[bench take-over] {key}: {value:.2f}x (Spark's restart over the export and "
                "Spark's restart after it)"
            )
            continue
        verdict = "met" if value >= 1.0 else "MISSED"
        what = "the take-over alone" if key.startswith("take-over:") else "take-over included"
        print(
            f"[bench take-over] {key}: {value:.2f}x (Spark's restart over ours, {what}; "
            f"target >= 1: {verdict})"
        )


def run(args: argparse.Namespace) -> int:
    if os.environ.get(REMOTE_ENV):
        print("[bench take-over] runs in Spark Classic only: not with --remote")
        return 2
    try:
        params = params_for(args)
    except ValueError as exc:
        print(f"[bench take-over] {exc}")
        return 2
    quick = bool(getattr(args, "quick", False))
    spec = BenchSpec("take-over", __name__, SYSTEMS, [], params, TIMEOUTS[0 if quick else 1])
    systems = selected_systems(spec, args)
    if systems is None:
        return 2
    print(f"[bench take-over] {json.dumps(params)}", flush=True)
    results = {system: _run_system(spec, system) for system in systems}
    rat = ratios(results)
    _print_summary(results, rat)
    report = {
        "benchmark": "take-over",
        "quick": quick,
        "params": params,
        "machine": machine_info(),
        "systems": results,
        "ratios": rat,
    }
    write_report("take-over", args, report)
    failed = any("error" in r or r.get("problems") for r in results.values())
    return 1 if failed else 0
