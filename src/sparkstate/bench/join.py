"""``sparkstate bench join``: stream-stream joins of impressions and clicks, sparkstate against
Spark's built-in.

Two workloads in one run, each over two ``rate-micro-batch`` sources (impressions on the left,
clicks on the right; full: 500k rows per side per batch, ``--quick``: 100k), ``local[2]``, 4
shuffle partitions, a 1-minute watermark on both sides, append mode, ``noop`` output, joined on

    click_ad = ad AND click_ts >= imp_ts AND click_ts <= imp_ts + interval 10 minutes

- ``inner``: ``left.join(right, condition, "inner")``;
- ``leftOuter``: ``left.join(right, condition, "left_outer")``: an impression that no click
  matched is emitted with nulls when the watermark evicts it.

Keys and event times are derived from ``value`` rather than taken from the source's ``timestamp``
(which follows ``advanceMillisPerBatch`` and is the same for every row of a batch): so they are
identical in every system and every run, and a model can say what each batch must emit. Each
batch covers 10 minutes of event time on both sides, ``ts = 2024-01-01 + value * 10 min /
rows_per_batch``, and ``keys`` is twice the rows per batch by default:

- an impression (``value`` ``v``) is of ``ad = v % keys`` at ``imp_ts = ts(v)``: an ad has an
  impression every 20 minutes;
- a click (``value`` ``u``) is at ``click_ts = ts(u)``. One click in four (``u % 4 = 0``) is of
  the impression half a batch earlier (``v = u - rows_per_batch / 2``, 5 minutes before it): it
  matches that impression and no other. The others are of the ad of the impression half a batch
  later, whose impressions are 5 minutes after the click (not yet) and 15 minutes before it (too
  late): their keys are in state and the condition is evaluated, but nothing matches.

Spark's state watermarks for that condition (the join's watermark ``W``, the smallest of the two
sides'): an impression is evicted once ``imp_ts <= W - 10 min - 1 ms``, a click once ``click_ts
<= W - 1 ms``. After batch ``b`` the watermark is just under the end of batch ``b`` minus one
minute, so from batch 3 on every batch stores both sides' rows, joins a quarter of its clicks
(with impressions of this or the previous batch), and evicts as many impressions (batches ``b -
2`` and ``b - 3``) and clicks (``b - 1`` and ``b - 2``) as it stores; a left outer join emits the
three quarters of them that no click matched. State stays at about 2.1 batches of impressions and
1.1 batches of clicks. Warm-up batches are those before evictions reach that steady state (3).

Systems, each in a fresh subprocess with its own SparkSession: ``spark-hdfs`` / ``spark-rocksdb``
(Spark's ``left.join(right, condition, how)`` with its HDFS-backed or RocksDB provider) and
``sparkstate-rocksdb`` / ``sparkstate-memory`` (``ss.stream(left).join(right, condition, how)``
with that ``stateStore``). Both inputs carry their ``withWatermark`` in every system.
``rows_per_s`` counts the input rows of both sides.

The bench checks its results: :func:`expected` models the workload (numpy, the same keys and
event times, Spark's rules for the watermark, eviction and matching) and gives, per batch, the
watermark it runs with, the joined rows it emits, the impressions it emits with nulls (left
outer), and the rows it stores in and removes from state. Every system's progress must agree
with it batch by batch (``eventTime.watermark``, ``sink.numOutputRows``, and the join's
``numRowsTotal``, ``numRowsUpdated``, ``numRowsRemoved``, ``numRowsDroppedByWatermark``), and
with the other systems of the run; a disagreement fails the bench. Ratios are keyed by workload:
``"inner:sparkstate-rocksdb/spark-rocksdb"`` is the throughput of ``sparkstate-rocksdb`` over that
of ``spark-rocksdb`` (>1: sparkstate is faster). See :mod:`sparkstate.bench._spark` for how
batches are timed.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from sparkstate.bench.windows import iso_ms

__all__ = [
    "CONDITION",
    "SYSTEMS",
    "WORKLOADS",
    "Expected",
    "check_agreement",
    "check_system",
    "click_sql",
    "clicks_of",
    "expected",
    "impression_sql",
    "impressions_of",
    "measure",
    "params_for",
    "run",
]

WORKLOADS = ("inner", "leftOuter")
#: PySpark's ``how`` of each workload.
HOW = {"inner": "inner", "leftOuter": "left_outer"}
SYSTEMS = ["spark-hdfs", "spark-rocksdb", "sparkstate-rocksdb", "sparkstate-memory"]
RATIO_PAIRS = [
    ("sparkstate-rocksdb", "spark-rocksdb"),
    ("sparkstate-memory", "spark-hdfs"),
    ("sparkstate-rocksdb", "spark-hdfs"),
    ("sparkstate-memory", "spark-rocksdb"),
    ("spark-rocksdb", "spark-hdfs"),
]
SPARK_PROVIDERS = {"spark-hdfs": HDFS_PROVIDER, "spark-rocksdb": ROCKSDB_PROVIDER}

#: 2024-01-01T00:00:00Z in microseconds.
BASE_US = 1_704_067_200_000_000
WATERMARK, DELAY_MS = "1 minute", 60_000
#: Event time covered by each batch (both sides).
STEP_US = 600_000_000
#: How long after its impression a click still matches it.
RANGE_US = 600_000_000
CONDITION = "click_ad = ad AND click_ts >= imp_ts AND click_ts <= imp_ts + interval 10 minutes"
#: Spark's state watermarks of the two sides for :data:`CONDITION`, as offsets below the join's
#: watermark in milliseconds (``StreamingJoinHelper.getStateValueWatermark``: the range's bound,
#: and one less for a non-strict comparison). A row is evicted once its time is at or below.
LEFT_STATE_OFFSET_MS = 600_001
RIGHT_STATE_OFFSET_MS = 1
#: One click in this many is of an impression (and matches it).
MATCH_EVERY = 4

#: Per workload: total batches and warm-up batches (those before evictions are steady).
FULL: dict[str, dict[str, int]] = {
    w: {"rows_per_batch": 500_000, "keys": 1_000_000, "batches": 8, "warmup": 3} for w in WORKLOADS
}
QUICK: dict[str, dict[str, int]] = {
    w: {"rows_per_batch": 100_000, "keys": 200_000, "batches": 6, "warmup": 3} for w in WORKLOADS
}


def params_for(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Sizes per workload from ``--quick``. ``rows`` / ``keys`` attributes override the sizes
    (``keys`` defaults to twice ``rows``), ``warmup`` the warm-up batches and ``batches`` the
    number of measured batches (tests); ``workloads`` picks some."""
    chosen = str(getattr(args, "workloads", None) or ",".join(WORKLOADS)).split(",")
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        msg = f"unknown workloads {unknown}; known: {list(WORKLOADS)}"
        raise ValueError(msg)
    sizes = QUICK if getattr(args, "quick", False) else FULL
    out: dict[str, dict[str, Any]] = {}
    for workload in chosen:
        params: dict[str, Any] = {"workload": workload, **sizes[workload]}
        rows, keys = getattr(args, "rows", None), getattr(args, "keys", None)
        if rows is not None:
            params["rows_per_batch"] = int(rows)
            params["keys"] = 2 * int(rows)
        if keys is not None:
            params["keys"] = int(keys)
        measured = params["batches"] - params["warmup"]
        if getattr(args, "warmup", None) is not None:
            params["warmup"] = int(args.warmup)
        if getattr(args, "batches", None) is not None:
            measured = int(args.batches)
        params["batches"] = params["warmup"] + measured
        out[workload] = params
    return out


# --- keys, event times and the model --------------------------------------------------------------


def _ts_sql(rows: int) -> str:
    return f"timestamp_micros({BASE_US} + value * {STEP_US} div {rows})"


def impression_sql(rows: int, keys: int) -> dict[str, str]:
    """Spark SQL of an impression's columns from its ``value`` (see the module docstring)."""
    return {"ad": f"value % {keys}", "imp_id": "value", "imp_ts": _ts_sql(rows)}


def click_sql(rows: int, keys: int) -> dict[str, str]:
    """Spark SQL of a click's columns from its ``value`` (see the module docstring)."""
    half = rows // 2
    of = f"if(value % {MATCH_EVERY} = 0, value - {half}, value + {half})"
    return {"click_ad": f"pmod({of}, {keys})", "click_id": "value", "click_ts": _ts_sql(rows)}


def impressions_of(values: np.ndarray, rows: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`impression_sql` in numpy: (ad, event time in epoch microseconds)."""
    return values % keys, BASE_US + values * STEP_US // rows


def clicks_of(values: np.ndarray, rows: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`click_sql` in numpy: (ad, event time in epoch microseconds)."""
    half = rows // 2
    of = np.where(values % MATCH_EVERY == 0, values - half, values + half)
    return np.mod(of, keys), BASE_US + values * STEP_US // rows


@dataclasses.dataclass(frozen=True)
class Expected:
    """What every batch of the workload must do, by batch id."""

    #: The watermark each batch runs with (epoch milliseconds; 0 before the first).
    watermark_ms: list[int]
    #: Joined rows (an impression and a click) each batch emits.
    joined: list[int]
    #: Impressions each batch evicts that no click matched (a left outer join emits them).
    unmatched: list[int]
    #: Rows each batch stores (both sides): ``numRowsUpdated``.
    stored: list[int]
    #: Rows each batch evicts (both sides): ``numRowsRemoved``.
    removed: list[int]
    #: Rows in state after each batch (both sides): ``numRowsTotal``.
    total: list[int]

    def output(self, workload: str) -> list[int]:
        """Rows each batch emits in ``workload``."""
        if workload == "inner":
            return list(self.joined)
        return [a + b for a, b in zip(self.joined, self.unmatched, strict=True)]

    def to_dict(self) -> dict[str, list[int]]:
        return dataclasses.asdict(self)


def _evicted_in(
    ts: np.ndarray, arrival: np.ndarray, watermark_ms: np.ndarray, offset_ms: int
) -> np.ndarray:
    """The batch that evicts each row: the first from its arrival on whose state watermark
    (``watermark - offset``, none before the first watermark) is at or above its time; the number
    of batches for a row still in state at the end."""
    floor = np.iinfo(np.int64).min
    threshold_us = np.where(watermark_ms > 0, (watermark_ms - offset_ms) * 1000, floor)
    out: np.ndarray = np.maximum(arrival, np.searchsorted(threshold_us, ts, side="left"))
    return out


def expected(rows: int, keys: int, batches: int) -> Expected:
    """Model ``batches`` batches of the workload with Spark's rules: the watermark after a batch
    is the largest event time so far minus the delay (in milliseconds, never going back; both
    sides have the same times, so the same watermark) and is in force in the next batch. A batch
    joins its impressions with the clicks in state, then its clicks with the impressions in state
    (its own included), then evicts each side's rows at or below that side's state watermark; a
    row is still joined in the batch that evicts it. Raises if a row would be late or evicted as
    it arrives: the model does not cover those."""
    values = np.arange(batches * rows, dtype=np.int64)
    batch = values // rows
    imp_ad, imp_ts = impressions_of(values, rows, keys)
    click_ad, click_ts = clicks_of(values, rows, keys)
    max_ms = np.maximum(imp_ts, click_ts).reshape(batches, rows).max(axis=1) // 1000
    after = np.maximum.accumulate(np.maximum(max_ms - DELAY_MS, 0))
    wm = np.r_[0, after[:-1]].astype(np.int64)
    if not bool(np.all(np.minimum(imp_ts, click_ts) // 1000 > wm[batch])):
        msg = "join: the workload's event times make rows late; the model does not say"
        raise ValueError(msg)
    imp_out = _evicted_in(imp_ts, batch, wm, LEFT_STATE_OFFSET_MS)
    click_out = _evicted_in(click_ts, batch, wm, RIGHT_STATE_OFFSET_MS)
    if bool(np.any(imp_out == batch)) or bool(np.any(click_out == batch)):
        msg = "join: a row is evicted in the batch it comes in; the model does not say"
        raise ValueError(msg)

    # Candidate pairs: per click, the impressions of its ad with imp_ts in [click_ts - range,
    # click_ts], found in the impressions sorted by (ad, time rank).
    times = np.unique(np.concatenate([imp_ts, click_ts, click_ts - RANGE_US]))
    width = len(times)
    imp_key = imp_ad * width + np.searchsorted(times, imp_ts)
    order = np.argsort(imp_key, kind="stable")
    sorted_key = imp_key[order]
    lo = np.searchsorted(sorted_key, click_ad * width + np.searchsorted(times, click_ts - RANGE_US))
    hi = np.searchsorted(sorted_key, click_ad * width + np.searchsorted(times, click_ts), "right")
    counts = hi - lo
    pair_click = np.repeat(values, counts)
    starts = np.repeat(lo - np.r_[0, np.cumsum(counts)[:-1]], counts)
    pair_imp = order[starts + np.arange(int(counts.sum()))]
    # A pair joins in the batch the later of its rows comes in, if the earlier one is still in
    # state then.
    bi, bc = batch[pair_imp], batch[pair_click]
    joins = np.where(
        bi < bc, imp_out[pair_imp] >= bc, np.where(bc < bi, click_out[pair_click] >= bi, True)
    )
    joined = np.bincount(np.maximum(bi, bc)[joins], minlength=batches)
    matched = np.zeros(len(values), bool)
    matched[pair_imp[joins]] = True
    gone = imp_out < batches
    unmatched = np.bincount(imp_out[gone & ~matched], minlength=batches)
    removed = np.bincount(imp_out[gone], minlength=batches) + np.bincount(
        click_out[click_out < batches], minlength=batches
    )
    stored = np.full(batches, 2 * rows, np.int64)
    total = np.cumsum(stored - removed)
    return Expected(
        watermark_ms=[int(x) for x in wm],
        joined=[int(x) for x in joined],
        unmatched=[int(x) for x in unmatched],
        stored=[int(x) for x in stored],
        removed=[int(x) for x in removed],
        total=[int(x) for x in total],
    )


#: The per-batch fields every system must report alike (the model's and the others').
COMPARED = (
    "numInputRows",
    "numOutputRows",
    "watermark",
    "numRowsTotal",
    "numRowsUpdated",
    "numRowsRemoved",
    "numRowsDroppedByWatermark",
)


def check_system(
    workload: str, params: Mapping[str, Any], exp: Expected, result: Mapping[str, Any]
) -> list[str]:
    """How a system's batches disagree with the model (empty: they agree)."""
    problems: list[str] = []
    records = result.get("per_batch") or []
    if len(records) != params["batches"]:
        problems.append(f"{len(records)} batches reported, {params['batches']} run")
    output = exp.output(workload)
    for rec in records:
        b = int(rec["batchId"])
        if not 0 <= b < len(output):
            problems.append(f"batch {b}: not in the model (0..{len(output) - 1})")
            continue
        want: dict[str, Any] = {
            "numInputRows": 2 * params["rows_per_batch"],
            "numOutputRows": output[b],
            "watermark": iso_ms(exp.watermark_ms[b]),
            "numRowsTotal": exp.total[b],
            "numRowsUpdated": exp.stored[b],
            "numRowsRemoved": exp.removed[b],
            "numRowsDroppedByWatermark": 0,
        }
        for field, value in want.items():
            if rec.get(field) != value:
                problems.append(f"batch {b}: {field} {rec.get(field)!r}, expected {value!r}")
    return problems


def check_agreement(results: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per system, how its batches disagree with the reference system's (the first of
    ``spark-hdfs``, ``spark-rocksdb`` that ran, else the first system that ran) in
    :data:`COMPARED`."""
    ran = {s: r for s, r in results.items() if r.get("available") and "error" not in r}
    if not ran:
        return {}
    reference = next((s for s in SPARK_PROVIDERS if s in ran), next(iter(ran)))
    theirs = {int(rec["batchId"]): rec for rec in ran[reference].get("per_batch") or []}
    out: dict[str, list[str]] = {}
    for system, r in ran.items():
        problems: list[str] = []
        ours = {int(rec["batchId"]): rec for rec in r.get("per_batch") or []}
        if sorted(ours) != sorted(theirs):
            problems.append(f"batches {sorted(ours)}, {reference} ran {sorted(theirs)}")
        for b in sorted(set(ours) & set(theirs)):
            for field in COMPARED:
                if ours[b].get(field) != theirs[b].get(field):
                    problems.append(
                        f"batch {b}: {field} {ours[b].get(field)!r}, "
                        f"{reference} {theirs[b].get(field)!r}"
                    )
        out[system] = problems
    return out


# --- the systems (child side) ---------------------------------------------------------------------


def _sources(spark: Any, params: Mapping[str, Any]) -> tuple[Any, Any]:
    """Impressions and clicks, each with its watermark."""
    from pyspark.sql import functions as F

    rows, keys = params["rows_per_batch"], params["keys"]

    def rate(columns: dict[str, str]) -> Any:
        raw = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", rows)
            .option("numPartitions", 2)
            .load()
        )
        return raw.select(*[F.expr(sql).alias(name) for name, sql in columns.items()])

    impressions = rate(impression_sql(rows, keys)).withWatermark("imp_ts", WATERMARK)
    clicks = rate(click_sql(rows, keys)).withWatermark("click_ts", WATERMARK)
    return impressions, clicks


def _start(system: str, workload: str, joined: Any, checkpoint: str) -> Any:
    writer = (
        joined.writeStream.outputMode("append")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .queryName(f"join_{workload}_{system}".replace("-", "_"))
    )
    if system.startswith("sparkstate-"):
        writer = writer.option("stateStore", system.removeprefix("sparkstate-"))
    return writer.start()


#: The module of sparkstate's join operator: the sparkstate systems run once it exists.
JOIN_OPERATOR = "sparkstate.operators.join"


def _check_sparkstate() -> None:
    """:class:`NotAvailable` if sparkstate cannot run the join (before a JVM starts)."""
    try:
        import sparkstate.engine  # noqa: F401
    except ImportError as exc:
        msg = f"the sparkstate engine is not importable ({exc})"
        raise NotAvailable(msg) from exc
    if importlib.util.find_spec(JOIN_OPERATOR) is None:
        msg = f"sparkstate has no stream-stream join operator yet ({JOIN_OPERATOR})"
        raise NotAvailable(msg)


def measure(system: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run ``system`` on ``params["workload"]`` in this (fresh) process and summarize it."""
    if system not in SYSTEMS:
        msg = f"unknown system {system!r}; known: {SYSTEMS}"
        raise ValueError(msg)
    workload = params["workload"]
    ours = system.startswith("sparkstate-")
    if ours:
        _check_sparkstate()
    conf = {} if ours else {PROVIDER_CONF: SPARK_PROVIDERS[system]}
    started = time.perf_counter()
    spark = spark_session(f"bench-join-{workload}-{system}", conf)
    session_s = time.perf_counter() - started
    try:
        from pyspark.sql import functions as F

        impressions, clicks = _sources(spark, params)
        if ours:
            import sparkstate as ss

            left: Any = ss.stream(impressions)
        else:
            left = impressions
        joined = left.join(clicks, F.expr(CONDITION), HOW[workload])
        checkpoint = os.path.join(params["workdir"], "checkpoint")
        query = _start(system, workload, joined, checkpoint)
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
    """The model's numbers, each system's disagreements with them and with the other systems,
    and the rows each system emitted in the measured batches."""
    exp = expected(params["rows_per_batch"], params["keys"], params["batches"])
    measured = slice(params["warmup"], params["batches"])
    out: dict[str, Any] = {
        "expected": exp.to_dict(),
        "expected_output_measured": sum(exp.output(workload)[measured]),
        "systems": {},
    }
    disagreements = check_agreement(results)
    for system, r in results.items():
        if "error" in r or not r.get("available", False):
            continue
        problems = check_system(workload, params, exp, r) + disagreements.get(system, [])
        emitted = rows_emitted_measured(r, params)
        out["systems"][system] = {
            "ok": not problems,
            "output_measured": emitted,
            "problems": problems[:20],
        }
    return out


def run(args: argparse.Namespace) -> int:
    try:
        params = params_for(args)
    except ValueError as exc:
        print(f"[bench join] {exc}")
        return 2
    bench = Workloads(
        "join",
        __name__,
        SYSTEMS,
        RATIO_PAIRS,
        (1800.0, 7200.0),
        _check_workload,
        measured="output_measured",
        expected="expected_output_measured",
        counted="rows emitted",
    )
    return run_workloads(bench, params, args)
