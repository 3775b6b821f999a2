"""The chaos run's input and queries, and its driver: one process that runs the three queries
to the end of their input, which the chaos run kills and starts again.

Three queries as a PySpark user writes them, each over its own file source read one file a
batch (``maxFilesPerTrigger``) under an ``availableNow`` trigger, into a JSON file sink:

- ``aggregate``: a windowed count and sum by key with a watermark, append mode;
- ``dedup``: ``dropDuplicatesWithinWatermark`` on an id;
- ``join``: impressions joined with clicks on the ad and a time range, with watermarks.

The input is a function of the seed and the batch only, and each duplicate or match is a copy
of one row, so the output is one multiset whatever the batches' timing: the run with faults
must write exactly the rows of the run without.

Usage: ``python -m tests.chaos.queries WORK RUN MASTER`` runs the queries of run ``RUN``
(``WORK/RUN/...``, with the options in ``WORK/options-RUN.json``) on Spark master ``MASTER``;
``python -m tests.chaos.queries WORK compare`` reads both runs' output and state and writes
``WORK/compare.json``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tests.cluster.conftest import SESSION_CONF as CLUSTER_SESSION_CONF

import sparkstate as ss
from sparkstate.testing.differential import FileFeed

#: Each query's input directories, and their schemas.
INPUTS = {
    "aggregate": "k string, v long, ts timestamp",
    "dedup": "id long, v long, ts timestamp",
    "impressions": "ad long, imp_ts timestamp",
    "clicks": "click_ad long, click_ts timestamp",
}
QUERIES = ("aggregate", "dedup", "join")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Spark's settings of the chaos sessions.
SESSION_CONF = {
    **CLUSTER_SESSION_CONF,
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
    # A task whose worker, home or executor is killed more than once in a row still goes on.
    "spark.task.maxFailures": "8",
}


#: How often the driver notes the batches' restores.
RESTORES_POLL_S = 0.5


def _ts(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def batch_rows(seed: int, b: int) -> dict[str, list[dict[str, Any]]]:
    """The rows of batch ``b`` for each input."""
    rnd = random.Random(seed * 100_003 + b)
    base = 2.0 * b
    aggregate = []
    for _ in range(40):
        late = rnd.random() < 0.05  # late by more than the watermark's delay: dropped
        aggregate.append(
            {
                "k": f"k{rnd.randrange(8)}",
                "v": rnd.randrange(1000),
                "ts": _ts(base + rnd.uniform(0, 4) - (40 if late else 0)),
            }
        )
    # Ids from a window that moves with the batches, drawn with replacement: duplicates within
    # a batch and across nearby ones. A row is a function of its id, so any copy is the same.
    ids = [rnd.randrange(10 * b, 10 * b + 30) for _ in range(25)]
    dedup = [{"id": i, "v": i * 7 % 13, "ts": _ts(i * 0.2)} for i in ids]
    ads = range(5 * b, 5 * b + 5)
    impressions = [{"ad": a, "imp_ts": _ts(a * 0.4)} for a in ads]
    # Clicks on this batch's ads and the last batch's, some twice; some ads never clicked.
    clicks = [
        {"click_ad": a, "click_ts": _ts(a * 0.4 + (a % 4))}
        for a in range(max(0, 5 * b - 5), 5 * b + 5)
        if rnd.random() < 0.4
    ]
    return {"aggregate": aggregate, "dedup": dedup, "impressions": impressions, "clicks": clicks}


def write_input(work: Path, seed: int, num_batches: int) -> int:
    """Every batch's files (one per input and batch), before any query starts; the rows."""
    feeds = {name: FileFeed(work / "input" / name) for name in INPUTS}
    total = 0
    for b in range(num_batches):
        for name, rows in batch_rows(seed, b).items():
            feeds[name].add(rows)
            total += len(rows)
    return total


def _source(spark: SparkSession, work: Path, name: str) -> DataFrame:
    return FileFeed(work / "input" / name).stream(spark, INPUTS[name])


def build(spark: SparkSession, work: Path, query: str) -> Any:
    """The query as a user writes it, with ``ss.stream`` around its input."""
    if query == "aggregate":
        events = _source(spark, work, "aggregate").withWatermark("ts", "10 seconds")
        return (
            ss.stream(events)
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
            .select(F.col("window.start").alias("start"), "k", "n", "total")
        )
    if query == "dedup":
        events = _source(spark, work, "dedup").withWatermark("ts", "10 seconds")
        return ss.stream(events).dropDuplicatesWithinWatermark(["id"])
    impressions = _source(spark, work, "impressions").withWatermark("imp_ts", "10 seconds")
    clicks = _source(spark, work, "clicks").withWatermark("click_ts", "10 seconds")
    condition = F.expr(
        "click_ad = ad AND click_ts >= imp_ts AND click_ts <= imp_ts + interval 10 seconds"
    )
    return ss.stream(impressions).join(clicks, condition, "inner")


def run_queries(spark: SparkSession, work: Path, run: str, options: dict[str, str]) -> None:
    """Run the three queries of ``run`` to the end of their input (``availableNow``)."""
    handles = []
    options = dict(options)
    state_location = options.pop("stateLocation", None)
    for query in QUERIES:
        writer = (
            build(spark, work, query)
            .writeStream.format("json")
            .outputMode("append")
            .option("path", str(work / run / "out" / query))
            .option("checkpointLocation", str(work / run / "chk" / query))
            .trigger(availableNow=True)
        )
        for k, v in options.items():
            writer = writer.option(k, v)
        if state_location is not None:  # s3://bucket/prefix?settings: a prefix per query
            base, _, settings = state_location.partition("?")
            writer = writer.option("stateLocation", f"{base}/{run}/{query}?{settings}")
        handles.append(writer.start())
    noted: set[tuple[int, int]] = set()
    while any(h.isActive for h in handles):
        _note_restores(handles, noted, work / run / "restores.jsonl")
        time.sleep(RESTORES_POLL_S)
    for h in handles:
        h.awaitTermination()
    _note_restores(handles, noted, work / run / "restores.jsonl")


def _note_restores(handles: list[Any], noted: set[tuple[int, int]], path: Path) -> None:
    """Append the restores (and lazy ones) of every batch not noted yet to ``path``: a line a
    batch of a query, kept across the driver's restarts (a killed driver's last batches aside)."""
    lines = []
    for i, h in enumerate(handles):
        for progress in h.recentProgress:
            p = json.loads(progress.json)
            if (i, p["batchId"]) in noted:
                continue
            noted.add((i, p["batchId"]))
            metrics = [op.get("customMetrics", {}) for op in p.get("stateOperators", [])]
            lines.append(
                {
                    "restores": sum(m.get("restores", 0) for m in metrics),
                    "lazy": sum(m.get("lazyRestores", 0) for m in metrics),
                }
            )
    if lines:
        with path.open("a") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)


def restores(work: Path, run: str) -> dict[str, int]:
    """The restores the queries of ``run`` made, and how many of them were lazy."""
    path = work / run / "restores.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return {
        "restores": sum(x["restores"] for x in lines),
        "lazy": sum(x["lazy"] for x in lines),
    }


def _rows(df: DataFrame) -> Counter[str]:
    """The rows of ``df`` as a multiset of JSON lines (columns in name order)."""
    return Counter(
        json.dumps(row.asDict(recursive=True), sort_keys=True, default=str) for row in df.collect()
    )


def read_run(spark: SparkSession, work: Path, run: str) -> dict[str, Counter[str]]:
    """Each sink's rows, and each query's state as the state reader reads it after the last
    batch (without ``partition_id``), of run ``run``."""
    out: dict[str, Counter[str]] = {}
    for query in QUERIES:
        out[f"output {query}"] = _rows(spark.read.json(str(work / run / "out" / query)))
        chk = str(work / run / "chk" / query)
        sides = ("left", "right") if query == "join" else (None,)
        for side in sides:
            reader = spark.read.format("sparkstate")
            if side is not None:
                reader = reader.option("joinSide", side)
            state = reader.load(chk).drop("partition_id")
            out[f"state {query}" + (f" {side}" if side else "")] = _rows(state)
    return out


def compare(work: Path) -> dict[str, Any]:
    """Both runs' output and state, compared: per item, the rows and the differences."""
    spark = SparkSession.builder.master("local[2]").config(map=SESSION_CONF).getOrCreate()
    ss.register(spark)
    try:
        reference, faulted = read_run(spark, work, "reference"), read_run(spark, work, "faults")
    finally:
        spark.stop()
    result = {}
    for item, rows in reference.items():
        theirs = faulted[item]
        result[item] = {
            "rows": sum(rows.values()),
            "missing": sum((rows - theirs).values()),
            "extra": sum((theirs - rows).values()),
        }
    return result


def main(argv: list[str]) -> None:
    work = Path(argv[0])
    if argv[1] == "compare":
        (work / "compare.json").write_text(json.dumps(compare(work)))
        return
    run, master = argv[1], argv[2]
    spark = SparkSession.builder.master(master).config(map=SESSION_CONF)
    spark = spark.appName(f"sparkstate-chaos-{run}").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    options = json.loads((work / f"options-{run}.json").read_text())
    run_queries(spark, work, run, options)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
