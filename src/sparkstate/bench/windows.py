"""``sparkstate bench windows``: windowed counts per key, sparkstate against Spark's built-in.

Two workloads in one run, each over the ``rate-micro-batch`` source with ``key = value % keys``
(full: 1M rows and 1M distinct keys per batch; ``--quick``: 200k), ``local[2]``, 4 shuffle
partitions, a 1-minute watermark on ``ts``, append mode, ``noop`` output:

- ``tumbling``: ``groupBy(window("ts", "10 minutes"), "key").agg(count("*"))``;
- ``session``: ``groupBy(session_window("ts", "30 seconds"), "key").agg(count("*"))``.

Event time is derived from ``value`` rather than taken from the source's ``timestamp`` (which
follows ``advanceMillisPerBatch`` and is the same for every row of a batch): so it is identical in
every system and every run, spread over the batch, and a model can say what each batch must emit.

- ``tumbling``: ``ts = 2024-01-01 + value * 10 min / rows_per_batch``. Each batch covers exactly
  one 10-minute window, aligned to it. After batch ``b`` the watermark is just under the end of
  window ``b`` minus one minute, so batch ``b + 1`` evicts window ``b - 1``: from batch 2 on every
  batch inserts one window of ``keys`` new (window, key) rows and evicts and emits the window
  before last, as many rows; state stays at two windows. Each key occurs once per window, so
  every state lookup misses: the measure is inserts plus eviction, which Spark's append mode
  finds by iterating the whole state, and sparkstate by a range scan over keys led by the
  window's end.
- ``session``: batches are 25 s of event time apart (``ts = 2024-01-01 + b * 25 s + position in
  the batch * 25 s / rows_per_batch``), and a key's row is 15 s later in every other batch (by
  the parity of ``b + key``). A key's rows thus come 10 s, then 40 s apart: each session holds
  two rows of two consecutive batches (the second merges with the session in state) and closes at
  the 40 s pause. Every batch half of the keys start a session and half extend one; from batch 4
  on every batch evicts and emits the sessions of about half of the keys. State stays at about
  2.5 sessions per key.

Warm-up batches are those before evictions reach their steady state (2 for tumbling, 4 for
session); the measured batches all insert, merge and evict.

Systems, each in a fresh subprocess with its own SparkSession: ``spark-hdfs`` / ``spark-rocksdb``
(Spark's aggregation with its HDFS-backed or RocksDB provider) and ``sparkstate-rocksdb`` /
``sparkstate-memory`` (``ss.stream(df).withWatermark(...).groupBy(SF.window(...) or
SF.session_window(...), "key").agg(SF.count("*"))`` with that ``stateStore``). A sparkstate
system whose operator has not landed is reported as not available.

The bench checks its results: :func:`expected` models a workload (numpy, the same event times)
and gives, per batch, the watermark it runs with, how many windows or sessions it closes (append
mode emits each once), the rows counted in them, and (tumbling) the windows left in state. Every
system's progress must agree batch by batch (``eventTime.watermark``, ``sink.numOutputRows``, no
row dropped as late, and ``numRowsTotal`` for tumbling); a disagreement fails the bench. Ratios are
keyed by workload: ``"tumbling:sparkstate-rocksdb/spark-rocksdb"`` is the throughput of
``sparkstate-rocksdb`` over that of ``spark-rocksdb`` (>1: sparkstate is faster).
See :mod:`sparkstate.bench._spark` for how batches are timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from sparkstate.bench._spark import (
    HDFS_PROVIDER,
    PROVIDER_CONF,
    ROCKSDB_PROVIDER,
    NotAvailable,
    Workloads,
    measure_query,
    rows_emitted_measured,
    run_workloads,
    spark_session,
)

__all__ = [
    "SYSTEMS",
    "WORKLOADS",
    "Expected",
    "check_system",
    "event_time_sql",
    "event_time_us",
    "expected",
    "measure",
    "params_for",
    "run",
]

WORKLOADS = ("tumbling", "session")
SYSTEMS = ["spark-hdfs", "spark-rocksdb", "sparkstate-rocksdb", "sparkstate-memory"]
RATIO_PAIRS = [
    ("sparkstate-rocksdb", "spark-rocksdb"),
    ("sparkstate-memory", "spark-hdfs"),
    ("sparkstate-rocksdb", "spark-hdfs"),
    ("sparkstate-memory", "spark-rocksdb"),
    ("spark-rocksdb", "spark-hdfs"),
]
SPARK_PROVIDERS = {"spark-hdfs": HDFS_PROVIDER, "spark-rocksdb": ROCKSDB_PROVIDER}

#: 2024-01-01T00:00:00Z in microseconds: a multiple of the window, so windows align to batches.
BASE_US = 1_704_067_200_000_000
WATERMARK, DELAY_US = "1 minute", 60_000_000
WINDOW, WINDOW_US = "10 minutes", 600_000_000
GAP, GAP_US = "30 seconds", 30_000_000
#: Session workload: event time per batch, and the pause added to a key's row every other batch.
SESSION_STEP_US = 25_000_000
SESSION_PAUSE_US = 15_000_000

#: Per workload: total batches and warm-up batches (those before evictions are steady).
FULL: dict[str, dict[str, int]] = {
    "tumbling": {"rows_per_batch": 1_000_000, "keys": 1_000_000, "batches": 8, "warmup": 2},
    "session": {"rows_per_batch": 1_000_000, "keys": 1_000_000, "batches": 9, "warmup": 4},
}
QUICK: dict[str, dict[str, int]] = {
    "tumbling": {"rows_per_batch": 200_000, "keys": 200_000, "batches": 6, "warmup": 2},
    "session": {"rows_per_batch": 200_000, "keys": 200_000, "batches": 8, "warmup": 4},
}


def params_for(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Sizes per workload from ``--quick``. ``rows`` / ``keys`` attributes override the sizes and
    ``batches`` the number of measured batches (tests); ``workloads`` picks some."""
    chosen = str(getattr(args, "workloads", None) or ",".join(WORKLOADS)).split(",")
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        msg = f"unknown workloads {unknown}; known: {list(WORKLOADS)}"
        raise ValueError(msg)
    sizes = QUICK if getattr(args, "quick", False) else FULL
    out: dict[str, dict[str, Any]] = {}
    for workload in chosen:
        params: dict[str, Any] = {"workload": workload, **sizes[workload]}
        for name, key in (("rows", "rows_per_batch"), ("keys", "keys")):
            value = getattr(args, name, None)
            if value is not None:
                params[key] = int(value)
        if getattr(args, "batches", None) is not None:
            params["batches"] = params["warmup"] + int(args.batches)
        out[workload] = params
    return out


# --- event time and the model ---------------------------------------------------------------------


def event_time_sql(workload: str, rows: int, keys: int) -> str:
    """Spark SQL for a row's event time from its ``value`` (see the module docstring)."""
    if workload == "tumbling":
        return f"timestamp_micros({BASE_US} + value * {WINDOW_US} div {rows})"
    batch, position, key = f"(value div {rows})", f"(value % {rows})", f"(value % {keys})"
    return (
        f"timestamp_micros({BASE_US} + {batch} * {SESSION_STEP_US} "
        f"+ {position} * {SESSION_STEP_US} div {rows} "
        f"+ if(({batch} + {key}) % 2 = 0, {SESSION_PAUSE_US}, 0))"
    )


def event_time_us(workload: str, values: np.ndarray, rows: int, keys: int) -> np.ndarray:
    """:func:`event_time_sql` in numpy, in epoch microseconds."""
    out: np.ndarray
    if workload == "tumbling":
        out = BASE_US + values * WINDOW_US // rows
        return out
    batch, position, key = values // rows, values % rows, values % keys
    pause = np.where((batch + key) % 2 == 0, SESSION_PAUSE_US, 0)
    out = BASE_US + batch * SESSION_STEP_US + position * SESSION_STEP_US // rows + pause
    return out


@dataclasses.dataclass(frozen=True)
class Expected:
    """What every batch of a workload must do, by batch id."""

    #: The watermark each batch runs with (epoch milliseconds; 0 before the first).
    watermark_ms: list[int]
    #: Windows (or sessions) each batch closes, so emits in append mode.
    closed: list[int]
    #: Input rows counted in them (the sum of their counts).
    closed_rows: list[int]
    #: Windows (or sessions) in state after each batch.
    open: list[int]

    def to_dict(self) -> dict[str, list[int]]:
        return dataclasses.asdict(self)


def expected(workload: str, rows: int, keys: int, batches: int) -> Expected:
    """Model ``batches`` batches of a workload with Spark's rules: the watermark after a batch is
    the largest event time so far minus the delay (in milliseconds, never going back) and is in
    force in the next batch, which evicts (and emits) each window or session whose end is at or
    below it. Raises if a row would be late: the model does not cover dropped rows."""
    values = np.arange(batches * rows, dtype=np.int64)
    ts = event_time_us(workload, values, rows, keys)
    key, batch = values % keys, values // rows
    max_ms = ts.reshape(batches, rows).max(axis=1) // 1000
    after = np.maximum.accumulate(np.maximum(max_ms - DELAY_US // 1000, 0))
    in_force_ms = np.r_[0, after[:-1]].astype(np.int64)
    in_force_us = in_force_ms * 1000
    if not bool(np.all(ts // 1000 > in_force_ms[batch])):
        msg = f"{workload}: the workload's event times make rows late; the model does not say"
        raise ValueError(msg)
    if workload == "tumbling":
        window = (ts - BASE_US) // WINDOW_US
        _, group = np.unique(window * keys + key, return_inverse=True)
        n = int(group.max()) + 1
        end = np.zeros(n, np.int64)
        end[group] = BASE_US + (window + 1) * WINDOW_US
    else:
        order = np.lexsort((ts, key))
        k, t = key[order], ts[order]
        starts = np.r_[True, (k[1:] != k[:-1]) | (t[1:] - t[:-1] > GAP_US)]
        # a session must still be open when its next row comes (else that row starts another)
        joined = np.flatnonzero(~starts)
        if np.any(t[joined - 1] + GAP_US <= in_force_us[batch[order][joined]]):
            msg = f"{workload}: a session closes before its next row; the model does not say"
            raise ValueError(msg)
        group = np.empty(len(ts), np.int64)
        group[order] = np.cumsum(starts) - 1
        n = int(group.max()) + 1
        end = np.zeros(n, np.int64)
        np.maximum.at(end, group, ts + GAP_US)
    first = np.full(n, batches, np.int64)
    np.minimum.at(first, group, batch)
    last = np.zeros(n, np.int64)
    np.maximum.at(last, group, batch)
    count = np.bincount(group, minlength=n)
    closes = np.maximum(np.searchsorted(in_force_us, end, side="left"), last + 1)
    inside = closes < batches
    closed = np.bincount(closes[inside], minlength=batches)
    closed_rows = np.bincount(closes[inside], weights=count[inside], minlength=batches)
    opened = np.cumsum(np.bincount(first, minlength=batches))
    open_ = opened - np.cumsum(closed)
    return Expected(
        watermark_ms=[int(x) for x in in_force_ms],
        closed=[int(x) for x in closed],
        closed_rows=[int(x) for x in closed_rows],
        open=[int(x) for x in open_],
    )


def iso_ms(millis: int) -> str:
    """Spark's progress time format of epoch milliseconds (``2024-01-01T00:08:59.400Z``)."""
    t = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=millis)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def check_system(
    workload: str, params: Mapping[str, Any], exp: Expected, result: Mapping[str, Any]
) -> list[str]:
    """How a system's batches disagree with the model (empty: they agree)."""
    problems: list[str] = []
    records = result.get("per_batch") or []
    if len(records) != params["batches"]:
        problems.append(f"{len(records)} batches reported, {params['batches']} run")
    for rec in records:
        b = int(rec["batchId"])
        if not 0 <= b < len(exp.closed):
            problems.append(f"batch {b}: not in the model (0..{len(exp.closed) - 1})")
            continue
        want: dict[str, Any] = {
            "numInputRows": params["rows_per_batch"],
            "numOutputRows": exp.closed[b],
            "watermark": iso_ms(exp.watermark_ms[b]),
            "numRowsDroppedByWatermark": 0,
        }
        if workload == "tumbling":  # a session's state rows are the providers' own layout
            want["numRowsTotal"] = exp.open[b]
        for field, value in want.items():
            if rec.get(field) != value:
                problems.append(f"batch {b}: {field} {rec.get(field)!r}, expected {value!r}")
    return problems


# --- the systems (child side) ---------------------------------------------------------------------


def _source(spark: Any, params: Mapping[str, Any]) -> Any:
    from pyspark.sql import functions as F

    rows, keys = params["rows_per_batch"], params["keys"]
    raw = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", 2)
        .load()
    )
    return raw.select(
        (F.col("value") % keys).alias("key"),
        F.expr(event_time_sql(params["workload"], rows, keys)).alias("ts"),
    )


def _window(functions: Any, workload: str) -> Any:
    if workload == "tumbling":
        return functions.window("ts", WINDOW)
    return functions.session_window("ts", GAP)


def _start_spark(system: str, workload: str, df: Any, checkpoint: str) -> Any:
    from pyspark.sql import functions as F

    counted = (
        df.withWatermark("ts", WATERMARK)
        .groupBy(_window(F, workload), "key")
        .agg(F.count("*").alias("count"))
    )
    return (
        counted.writeStream.outputMode("append")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .queryName(f"{workload}_{system}".replace("-", "_"))
        .start()
    )


def _start_sparkstate(system: str, workload: str, df: Any, checkpoint: str) -> Any:
    import sparkstate as ss
    from sparkstate import functions as SF

    counted = (
        ss.stream(df)
        .withWatermark("ts", WATERMARK)
        .groupBy(_window(SF, workload), "key")
        .agg(SF.count("*").alias("count"))
    )
    return (
        counted.writeStream.outputMode("append")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .option("stateStore", system.removeprefix("sparkstate-"))
        .queryName(f"{workload}_{system}".replace("-", "_"))
        .start()
    )


def _check_sparkstate(workload: str) -> None:
    """:class:`NotAvailable` if sparkstate cannot run the workload (before a JVM starts)."""
    try:
        import sparkstate.engine  # noqa: F401
    except ImportError as exc:
        msg = f"the sparkstate engine is not importable ({exc})"
        raise NotAvailable(msg) from exc
    if workload == "session" and importlib.util.find_spec(SESSION_OPERATOR) is None:
        msg = f"sparkstate has no session window operator yet ({SESSION_OPERATOR})"
        raise NotAvailable(msg)


#: The module of sparkstate's session window operator: the session workload runs once it exists.
SESSION_OPERATOR = "sparkstate.operators.aggregation.session_window"


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run ``system`` on ``params["workload"]`` in this (fresh) process and summarize it."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    workload = params["workload"]
    ours = system.startswith("sparkstate-")
    if ours:
        _check_sparkstate(workload)
    conf = {} if ours else {PROVIDER_CONF: SPARK_PROVIDERS[system]}
    started = time.perf_counter()
    spark = spark_session(f"bench-windows-{workload}-{system}", conf)
    session_s = time.perf_counter() - started
    try:
        df = _source(spark, params)
        checkpoint = os.path.join(params["workdir"], "checkpoint")
        start = _start_sparkstate if ours else _start_spark
        query = start(system, workload, df, checkpoint)
        result = measure_query(spark, query, params, system, session_s)
        if ours:
            result["state_store"] = system.removeprefix("sparkstate-")
        return result
    finally:
        spark.stop()


# --- the run (parent side) ------------------------------------------------------------------------


def _check_workload(
    workload: str, params: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The model's numbers, each system's disagreements with them, and the rows counted in the
    windows each system emitted in the measured batches."""
    exp = expected(workload, params["rows_per_batch"], params["keys"], params["batches"])
    measured = slice(params["warmup"], params["batches"])
    out: dict[str, Any] = {
        "expected": exp.to_dict(),
        "expected_closed_measured": sum(exp.closed[measured]),
        "expected_closed_rows_measured": sum(exp.closed_rows[measured]),
        "systems": {},
    }
    for system, r in results.items():
        if "error" in r or not r.get("available", False):
            continue
        problems = check_system(workload, params, exp, r)
        emitted = rows_emitted_measured(r, params)
        out["systems"][system] = {
            "ok": not problems,
            "closed_measured": emitted,
            "problems": problems[:20],
        }
    return out


def run(args: argparse.Namespace) -> int:
    try:
        params = params_for(args)
    except ValueError as exc:
        print(f"[bench windows] {exc}")
        return 2
    bench = Workloads(
        "windows",
        __name__,
        SYSTEMS,
        RATIO_PAIRS,
        (600.0, 2400.0),
        _check_workload,
        measured="closed_measured",
        expected="expected_closed_measured",
        counted="windows closed",
    )
    return run_workloads(bench, params, args)
