"""The Spark Connect side of ``test_connect.py``: run in a process of its own (a process holds a
classic session or a Spark Connect client's, not both) as
``python -m tests.connect.connect_cases <url> <workdir> <what>``; prints its results as JSON.

``differential``: cases of ``tests/engine/test_port.py`` through sparkstate, two
``availableNow`` runs on one checkpoint each, over the server. ``take_over``: a checkpoint of
Spark's own operator taken over by the wrapped query. ``joins``: stream-stream joins of
``tests/engine/test_join.py`` the same way, their conditions written each way a PySpark user
writes them. ``failure``: a ``foreachBatch`` function that fails in batch 1, then a restart.
Spark's own output of the same queries (:func:`run_system` and :func:`run_join` with
``"spark"``), what sparkstate's must equal, is computed by ``test_connect.py`` in a classic
session of its own process: it does not depend on the client.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tests.engine.test_join import (
    CLICKS,
    CONDITION,
    FILES,
    IMPRESSIONS,
    joined_windows,
)
from tests.engine.test_port import CASES, SCHEMA, Case, rows, run_twice

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError, UserFunctionError
from sparkstate.testing import FileFeed, normalize

#: What runs over Connect: the path (the driver pickled into the server's foreachBatch process,
#: the checkpoint prepared in a task there) is the same for every operator and provider, and
#: the classic tests cover each; so one aggregation, both arbitrary-state APIs, one provider.
PROVIDERS = ("rocksdb",)
CONNECT_CASES = ("sorted-complete", "timeout", "event-time-column")


class FileCollector:
    """A ``foreachBatch`` function that runs in the server's process: each batch's rows (in
    the query's order or normalized) and schema go to ``<dir>/<batch>.json``."""

    def __init__(self, directory: Path, *, ordered: bool = False, fail_on: int | None = None):
        self.directory = str(directory)
        self.ordered = ordered
        self.fail_on = fail_on
        Path(self.directory).mkdir(parents=True, exist_ok=True)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if batch_id == self.fail_on:
            msg = f"the sink refuses batch {batch_id}"
            raise RuntimeError(msg)
        collected = [tuple(r) for r in df.collect()]
        body = {
            "rows": [list(r) for r in (collected if self.ordered else normalize(collected))],
            "schema": df.schema.simpleString(),
        }
        Path(self.directory, f"{batch_id}.json").write_text(json.dumps(body, default=str))

    def batches(self) -> dict[str, Any]:
        files = sorted(Path(self.directory).glob("*.json"), key=lambda f: int(f.stem))
        return {f.stem: json.loads(f.read_text()) for f in files}


def differential(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    """Every case through sparkstate on each provider, two queries on the server at once (their
    batches are small, and each spends most of its time waiting on round trips; not more: each
    query's foreachBatch starts a Python process on the server, which must connect back within
    Spark's ten seconds)."""
    cases = [c for c in CASES if c.name in CONNECT_CASES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = {
            (case.name, provider): pool.submit(
                run_system, spark, workdir / case.name / provider, case, provider
            )
            for case in cases
            for provider in PROVIDERS
        }
    out: dict[str, Any] = {case.name: {} for case in cases}
    for (name, provider), run in runs.items():
        out[name][provider] = run.result()
    return out


def run_system(spark: SparkSession, tmp: Path, case: Case, system: str) -> dict[str, Any]:
    """``case`` through ``system``: Spark's own operators (``"spark"``) or sparkstate on that
    provider; each batch's rows and schema."""
    collector = FileCollector(tmp / "out", ordered=case.ordered)
    if system == "spark":
        run_twice(spark, tmp, case.query, case, None, collector)
    else:
        wrapped = lambda df: case.query(ss.stream(df))  # noqa: E731
        run_twice(spark, tmp, wrapped, case, system, collector)
    return collector.batches()


def column_condition(left: Any, right: Any) -> Any:
    """The condition as Columns of both DataFrames, as PySpark's join examples write it."""
    imps = left.df if isinstance(left, ss.StatefulStream) else left
    on = (
        (imps["ad"] == right["click_ad"])
        & (right["click_ts"] >= imps["imp_ts"])
        & (right["click_ts"] <= imps["imp_ts"] + F.expr("INTERVAL 10 SECONDS"))
    )
    return left.join(right, on, "inner")


def aliased_condition(left: Any, right: Any) -> Any:
    """The sides aliased ``i`` and ``c`` (:data:`ALIASED`) and the condition over qualified
    names, a full outer join."""
    on = (F.col("i.ad") == F.col("c.click_ad")) & F.col("c.click_ts").between(
        F.col("i.imp_ts"), F.expr("i.imp_ts + INTERVAL 10 SECONDS")
    )
    return left.join(right, on, "full_outer")


#: The joins whose inputs the user aliased ``i`` and ``c`` before wrapping the left one.
ALIASED = ("aliased-condition",)
#: Per join: how it is written and its input files. Each way of writing the condition over
#: Columns (where a Connect client's columns differ from a classic session's), and one join of
#: sides that ran stateful steps first (windowed aggregations), whose condition is SQL
#: (``F.expr``: a string, the same on either client; the left outer join on a time range with
#: SQL is covered by the classic tests; a deduplicated side runs the same planning and is
#: covered, on both providers, by the classic tests too).
JOINS = {
    "column-condition": (column_condition, FILES),
    "aliased-condition": (aliased_condition, FILES),
    "windows-join": (joined_windows, FILES),
}


def joins(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    """Each join through sparkstate on each provider, two joins at once; and a join Spark
    would run after a stateful step of its own, refused."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = {
            (name, provider): pool.submit(
                run_join, spark, workdir / name / provider, build, files, provider, name
            )
            for name, (build, files) in JOINS.items()
            for provider in PROVIDERS
        }
    out: dict[str, Any] = {name: {} for name in JOINS}
    for (name, provider), run in runs.items():
        out[name][provider] = run.result()
    imps = FileFeed(workdir / "refused" / "imps").stream(spark, IMPRESSIONS)
    clicks = FileFeed(workdir / "refused" / "clicks").stream(spark, CLICKS)
    deduplicated = imps.withWatermark("imp_ts", "5 seconds").dropDuplicates(["imp_id"])
    try:
        ss.stream(deduplicated).join(clicks, F.expr(CONDITION))
        out["refused"] = None
    except ConfigurationError as exc:
        out["refused"] = str(exc)
    return out


def run_join(  # noqa: PLR0913
    spark: SparkSession, tmp: Path, build: Any, files: list[Any], system: str, name: str
) -> dict[str, Any]:
    """``build(left, right)`` over both feeds, half the files, a stop, then the rest on the
    same checkpoint; sparkstate's with the left input wrapped: each batch's rows."""
    imps, clicks = FileFeed(tmp / "imps"), FileFeed(tmp / "clicks")
    collector = FileCollector(tmp / "out")
    half = len(files) // 2
    for part in (files[:half], files[half:]):
        for left_rows, right_rows in part:
            imps.add(left_rows)
            clicks.add(right_rows)
        left = imps.stream(spark, IMPRESSIONS).withWatermark("imp_ts", "5 seconds")
        right = clicks.stream(spark, CLICKS).withWatermark("click_ts", "5 seconds")
        if name in ALIASED:
            left, right = left.alias("i"), right.alias("c")
        query = build(left if system == "spark" else ss.stream(left), right)
        writer = query.writeStream.outputMode("append").foreachBatch(collector)
        writer = writer.option("checkpointLocation", str(tmp / "checkpoint"))
        if system != "spark":
            writer = writer.option("stateStore", system)
        handle = writer.trigger(availableNow=True).start()
        handle.awaitTermination(300)
    return collector.batches()


def failure(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    """A sink that fails in batch 1; what the client sees; a restart with a working sink."""
    feed = FileFeed(workdir / "input")
    for i in range(3):
        feed.add(rows(i))
    checkpoint = str(workdir / "checkpoint")
    result: dict[str, Any] = {}
    for attempt, fail_on in (("failing", 1), ("restarted", None)):
        collector = FileCollector(workdir / attempt, fail_on=fail_on)
        counted = ss.stream(feed.stream(spark, SCHEMA)).groupBy("k").count()
        writer = counted.writeStream.outputMode("update").foreachBatch(collector)
        writer = writer.option("checkpointLocation", checkpoint).option("stateStore", "rocksdb")
        handle = writer.trigger(availableNow=True).start()
        try:
            handle.awaitTermination(180)
            result[attempt] = {"error": None}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result[attempt] = {
                "error": type(exc).__name__,
                "user_function_error": isinstance(exc, UserFunctionError),
                "streaming_query_exception": isinstance(exc, StreamingQueryException),
                "message": str(exc),
            }
        commits = Path(checkpoint, "sparkstate", "commits")
        result[attempt]["commits"] = sorted(int(f.stem) for f in commits.glob("*.json"))
        result[attempt]["batches"] = collector.batches()
        result[attempt]["id"] = handle.id
        result[attempt]["progress"] = [
            {
                "batchId": p["batchId"],
                "runId": p["runId"],
                "id": p["id"],
                "numRowsTotal": [o["numRowsTotal"] for o in p["stateOperators"]],
            }
            for p in handle.recentProgress
        ]
        result[attempt]["runId"] = handle.runId
        result[attempt]["found_by_id"] = spark.streams.get(handle.id) is not None
        state_dir = Path(checkpoint, "sparkstate", "state", "0")
        result[attempt]["snapshots"] = {
            part.name: sorted(f.name.split("_")[0] for f in part.glob("*.snapshot*"))
            for part in sorted(state_dir.iterdir())
        }
    state = spark.read.format("sparkstate").load(checkpoint)  # the state reader, over Connect
    result["state"] = sorted((r.key.k, r.value[0]) for r in state.collect())
    result["rescaled_batch"] = ss.repartition(spark, checkpoint, 2)  # from the client
    rescaled = spark.read.format("sparkstate").load(checkpoint).collect()
    result["rescaled_state"] = sorted((r.key.k, r.value[0]) for r in rescaled)
    result["rescaled_partitions"] = sorted({r.partition_id for r in rescaled})
    counted = ss.stream(feed.stream(spark, SCHEMA)).groupBy("k").count()
    writer = counted.writeStream.outputMode("complete").format("memory").queryName("counts")
    handle = writer.option("checkpointLocation", str(workdir / "memory")).start()
    handle.processAllAvailable()
    result["memory_table"] = sorted(tuple(r) for r in spark.table("counts").collect())
    handle.stop()
    return result


def take_over(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    """A query run by Spark's own operator for two batches, then on a copy of its checkpoint
    restarted by Spark (the expected output) and wrapped with ``ss.stream`` (which takes the
    state over, on the server's side), each on one more file; then the wrapped one's exported
    back to Spark's operator, and both run by Spark on one more file."""
    feed = FileFeed(workdir / "input")
    for i in range(2):
        feed.add(rows(i))
    checkpoint = workdir / "spark"

    def start(df: DataFrame, where: Path, collector: FileCollector) -> Any:
        writer = df.groupBy("k").count().writeStream.outputMode("update").foreachBatch(collector)
        return writer.option("checkpointLocation", str(where)).trigger(availableNow=True).start()

    start(
        feed.stream(spark, SCHEMA), checkpoint, FileCollector(workdir / "first")
    ).awaitTermination(180)
    shutil.copytree(checkpoint, workdir / "ours")
    feed.add(rows(2))
    expected = FileCollector(workdir / "expected")
    start(feed.stream(spark, SCHEMA), checkpoint, expected).awaitTermination(180)
    ours = FileCollector(workdir / "taken")
    start(ss.stream(feed.stream(spark, SCHEMA)), workdir / "ours", ours).awaitTermination(180)
    # and back: exported on the server's side, Spark's own operator goes on from it
    exported = ss.export(spark, str(workdir / "ours"))
    feed.add(rows(3))
    expected_back = FileCollector(workdir / "expected-back")
    start(feed.stream(spark, SCHEMA), checkpoint, expected_back).awaitTermination(180)
    back = FileCollector(workdir / "back")
    start(feed.stream(spark, SCHEMA), workdir / "ours", back).awaitTermination(180)
    return {
        "expected": expected.batches(),
        "ours": ours.batches(),
        "exported": exported,
        "expected_back": expected_back.batches(),
        "back": back.batches(),
    }


def main() -> None:
    url, workdir, what = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    spark = SparkSession.builder.remote(url).getOrCreate()
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    runs = {
        "differential": differential,
        "joins": joins,
        "failure": failure,
        "take_over": take_over,
    }
    result = runs[what](spark, workdir)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
