"""Stops a query at random points inside its batches; run by ``test_stop.py`` in a process of its
own, so that the test sees everything Spark and Python print.

``python -m tests.engine.stopper WORK PROVIDERS SEED`` feeds a directory of JSON files, one per
batch; runs a deduplication into a Parquet sink (append mode, a file sink's only mode) once
through Spark's own ``dropDuplicates`` without a stop, as the reference; then, for each provider,
starts the query, lets one batch finish, stops the query at a random moment of the next batch's
sink action (which runs its stateful stage), and starts it again, a few times. It prints one line
of JSON: what every stop did, and whether each output equals what a deduplication gives for the
files that the checkpoint's logs say each batch read, batch for batch (checked on Spark's own
reference run too), with the same rows over all batches as the reference; where they do not, the
batches that differ and the entries of the checkpoint's logs (Spark's and sparkstate's).

A stop can fall between the file source's log entry and Spark's offset log entry of the next
batch; Spark's file source then gives that batch two files at the next start, in Spark's own query
as in ours. The batches are therefore checked against the files each one read, not against the
reference's batches.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

import sparkstate as ss
from sparkstate.engine.run.driver import BatchDriver
from sparkstate.engine.run.sinks import FileSink
from sparkstate.testing import FileFeed

SCHEMA = "k string, v int"
#: A start runs the batch stopped last, the batch it is stopped in, and at most one more that
#: began before the stop reached it, and a stop between the file source's log and Spark's
#: offset log gives the next batch two files: each stop takes four files at most, and a fourth
#: start needs one more. The file logs' compaction is moved out of the way (:data:`NO_COMPACTION`).
FILES = 14
#: Spark's file logs compact every tenth entry by default; the checks read each entry.
NO_COMPACTION = {
    "spark.sql.streaming.fileSource.log.compactInterval": "100",
    "spark.sql.streaming.fileSink.log.compactInterval": "100",
}
STOPS = 3


class Probe:
    """What the driver and the file sink did, in order: ("sink", b) when a batch's sink action
    starts, ("done", b) or ("failed", b) when the driver is through with the batch."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.sink_s: list[float] = []
        self._cond = threading.Condition()

    def install(self) -> None:
        run_batch, add_batch = BatchDriver.run_batch, FileSink.add_batch
        probe = self

        def probed_run_batch(driver: BatchDriver, df: DataFrame, batch_id: int) -> None:
            try:
                run_batch(driver, df, batch_id)
            except BaseException:
                probe.note("failed", batch_id)
                raise
            probe.note("done", batch_id)

        def probed_add_batch(sink: FileSink, batch_id: int, df: DataFrame, mode: str) -> None:
            probe.note("sink", batch_id)
            started = time.monotonic()
            add_batch(sink, batch_id, df, mode)
            probe.sink_s.append(time.monotonic() - started)

        BatchDriver.run_batch = probed_run_batch  # type: ignore[method-assign]
        FileSink.add_batch = probed_add_batch  # type: ignore[method-assign]

    def note(self, what: str, batch_id: int) -> None:
        with self._cond:
            self.events.append((what, batch_id))
            self._cond.notify_all()

    def mark(self) -> int:
        with self._cond:
            return len(self.events)

    def wait(self, what: str, since: int, timeout: float = 180.0) -> int:
        """The batch of the first ``what`` event at or after position ``since``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event, batch_id in self.events[since:]:
                    if event == what:
                        return batch_id
                left = deadline - time.monotonic()
                if left <= 0:
                    msg = f"no {what!r} event after {self.events[:since]}: {self.events[since:]}"
                    raise TimeoutError(msg)
                self._cond.wait(left)

    def outcome(self, batch_id: int, since: int) -> str | None:
        with self._cond:
            ends = [e for e, b in self.events[since:] if b == batch_id and e != "sink"]
        return ends[-1] if ends else None


def start(spark: SparkSession, feed: Path, base: Path, provider: str | None) -> Any:
    """The query through sparkstate's ``provider``, or through Spark's own operator if None."""
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(feed))
    return (
        (events if provider is None else ss.stream(events))
        .dropDuplicates()
        .writeStream.outputMode("append")
        .format("parquet")
        .option("path", str(base / "out"))
        .option("checkpointLocation", str(base / "chk"))
        .option("stateStore", provider)
        .start()
    )


def batch_rows(out: Path) -> dict[str, list[list[Any]]]:
    """Each batch's rows, from the files its manifest (``_spark_metadata/<b>``) lists."""
    rows: dict[str, list[list[Any]]] = {}
    for manifest in sorted((out / "_spark_metadata").iterdir()):
        if manifest.name.startswith("."):
            continue
        lines = manifest.read_text().splitlines()[1:]
        paths = [json.loads(line)["path"].removeprefix("file://") for line in lines]
        tables = [pq.read_table(p).to_pylist() for p in paths]
        rows[manifest.name] = sorted(([r["k"], r["v"]] for t in tables for r in t), key=str)
    return rows


def expected_batches(checkpoint: Path) -> dict[str, list[list[Any]]]:
    """Each committed batch's rows as a deduplication gives them, from the files that the offset
    log and the file source's log say the batch read (the rows of its files not seen before)."""
    files: dict[int, list[str]] = {}
    for entry in _entries(checkpoint / "sources" / "0"):
        lines = (checkpoint / "sources" / "0" / entry).read_text().splitlines()[1:]
        files[int(entry)] = [
            unquote(json.loads(line)["path"]).removeprefix("file://") for line in lines
        ]
    seen: set[tuple[Any, ...]] = set()
    rows: dict[str, list[list[Any]]] = {}
    read_to = -1
    for batch in _entries(checkpoint / "commits"):
        offset = (checkpoint / "offsets" / batch).read_text().splitlines()[-1]
        upto = json.loads(offset)["logOffset"]
        new = []
        for entry in range(read_to + 1, upto + 1):
            for path in files[entry]:
                for line in Path(path).read_text().splitlines():
                    row = json.loads(line)
                    if (row["k"], row["v"]) not in seen:
                        seen.add((row["k"], row["v"]))
                        new.append([row["k"], row["v"]])
        rows[batch] = sorted(new, key=str)
        read_to = upto
    return rows


def logs(checkpoint: Path) -> dict[str, list[str]]:
    """The entries of Spark's logs (offsets, commits, the file source's) and sparkstate's."""
    names = ("offsets", "commits", "sources/0", "sparkstate/batches", "sparkstate/commits")
    return {name: _entries(checkpoint / name) for name in names if (checkpoint / name).is_dir()}


def _entries(log: Path) -> list[str]:
    return _in_order(p.name for p in log.iterdir() if not p.name.startswith("."))


def _in_order(names: Iterable[str]) -> list[str]:
    """Batch ids and log entries in their numeric order (2 before 10)."""
    return sorted(names, key=lambda name: (len(name), name))


def stop_inside_batches(
    spark: SparkSession, feed: Path, base: Path, provider: str, rng: random.Random, probe: Probe
) -> list[dict[str, Any]]:
    stops: list[dict[str, Any]] = []
    for _ in range(STOPS):
        since = probe.mark()
        query = start(spark, feed, base, provider)
        first = probe.wait("done", since)  # the rerun of the batch stopped last time, if any
        if stops and not stops[-1]["finished"]:
            stops[-1]["rerun"] = first == stops[-1]["batch"] and probe.wait("sink", since) == first
        mark = probe.mark()
        batch_id = probe.wait("sink", mark)
        delay = rng.uniform(0.0, 0.9 * min(probe.sink_s[-3:]))
        time.sleep(delay)
        started = time.monotonic()
        query.stop()
        stopped_s = time.monotonic() - started
        query.awaitTermination()  # raises if Spark took the stop for a failure
        state = base / "chk" / "sparkstate"
        stops.append(
            {
                "provider": provider,
                "batch": batch_id,
                "delay_s": round(delay, 3),
                "stop_s": round(stopped_s, 3),
                "finished": probe.outcome(batch_id, mark) == "done",
                "outcome": probe.outcome(batch_id, mark),
                "commit": (state / "commits" / f"{batch_id}.json").exists(),
                "manifest": (base / "out" / "_spark_metadata" / str(batch_id)).exists(),
            }
        )
    since = probe.mark()
    query = start(spark, feed, base, provider)
    query.processAllAvailable()
    if not stops[-1]["finished"]:
        stops[-1]["rerun"] = probe.wait("done", since) == stops[-1]["batch"]
    query.stop()
    return stops


def main(work: Path, providers: list[str], seed: int) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)  # so that py4j's logged errors would show
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config(map=NO_COMPACTION)
        .getOrCreate()
    )
    rng = random.Random(seed)
    feed = FileFeed(work / "feed")
    for _ in range(FILES):
        feed.add([{"k": f"k{rng.randrange(40)}", "v": rng.randrange(1000)} for _row in range(300)])
    probe = Probe()
    probe.install()
    reference = start(spark, feed.path, work / "reference", None)
    reference.processAllAvailable()
    reference.stop()
    spark_rows = batch_rows(work / "reference" / "out")
    report: dict[str, Any] = {"seed": seed, "batches": len(spark_rows), "stops": [], "equal": {}}
    # The oracle of the batches, checked on Spark's own run.
    report["equal"]["spark"] = spark_rows == expected_batches(work / "reference" / "chk")
    every_row = sorted((r for rows in spark_rows.values() for r in rows), key=str)
    for provider in providers:
        base = work / provider
        report["stops"] += stop_inside_batches(spark, feed.path, base, provider, rng, probe)
        got, want = batch_rows(base / "out"), expected_batches(base / "chk")
        all_got = sorted((r for rows in got.values() for r in rows), key=str)
        report["equal"][provider] = got == want and all_got == every_row
        if not report["equal"][provider]:  # what differs, and where each log stands
            report.setdefault("differs", {})[provider] = {
                b: {"want": want.get(b), "got": got.get(b)}
                for b in _in_order(set(want) | set(got))
                if want.get(b) != got.get(b)
            }
            report.setdefault("logs", {})[provider] = logs(base / "chk")
        staging = base / "out" / "_sparkstate_staging"
        report.setdefault("staging_left", {})[provider] = (
            sorted(p.name for p in staging.iterdir()) if staging.exists() else []
        )
    spark.stop()
    return report


if __name__ == "__main__":
    result = main(Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]))
    print(json.dumps(result), flush=True)
