"""Sinks: exactly-once files across replays, memory, console, foreachBatch; progress and logs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import ConfigurationError

from .conftest import PARTITIONS, PROVIDERS, FileFeed
from .helpers import normalize, oracle_update, run_batches, source

SCHEMA = "k string, v int"
BATCHES: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1}, {"k": "b", "v": 2}],
    [{"k": "a", "v": 3}, {"k": None, "v": 4}],
    [{"k": "b", "v": None}, {"k": "c", "v": 5}],
    [{"k": "a", "v": 6}, {"k": "c", "v": 1}],
]


NAN = float("nan")
#: The first two batches with a double column holding NaN and NULL.
SCHEMA_X = "k string, v int, x double"
BATCHES_X: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1, "x": NAN}, {"k": "b", "v": 2, "x": None}],
    [{"k": "a", "v": 3, "x": 1.5}, {"k": None, "v": 4, "x": NAN}, {"k": "c", "v": 5, "x": 2.5}],
]


def ours_aggs_x() -> list[Any]:
    """Count, sum of ``v``; max, sum and avg of the double ``x`` (NaN in, NaN out)."""
    return [SF.count("*").alias("n"), SF.sum("v").alias("total"), SF.max("x").alias("hi"),
            SF.sum("x").alias("sum_x"), SF.avg("x").alias("mean_x")]  # fmt: skip


def spark_aggs_x() -> list[Any]:
    return [F.count("*").alias("n"), F.sum("v").alias("total"), F.max("x").alias("hi"),
            F.sum("x").alias("sum_x"), F.avg("x").alias("mean_x")]  # fmt: skip


def forget_batch(chk: Path, batch: int, *, ours: bool = True, sink: Path | None = None) -> None:
    """Make the last batch look unfinished, as if the driver died before its commits."""
    for name in (str(batch), f".{batch}.crc"):
        (chk / "commits" / name).unlink(missing_ok=True)  # Spark's own commit log
    if ours:
        (chk / "sparkstate" / "commits" / f"{batch}.json").unlink()
    if sink is not None:
        (sink / "_spark_metadata" / str(batch)).unlink()


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_file_sink_is_exactly_once_across_replays(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str, fmt: str
) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"

    def start() -> Any:
        return (
            ss.stream(source(spark, feed, SCHEMA))
            .dropDuplicates(["k"])
            .writeStream.outputMode("append")  # a file sink's only mode, as in Spark
            .format(fmt)
            .option("path", str(out))
            .option("checkpointLocation", str(chk))
            .option("stateStore", provider)
            .start()
        )

    run_batches(feed, start(), BATCHES[:2])
    # Died after the state and sink commits of batch 1, before the commit logs.
    forget_batch(chk, 1)
    q = start()
    q.processAllAvailable()
    q.stop()
    # Died after the state commit of batch 2, before the sink's manifest.
    feed.add(BATCHES[2])
    q = start()
    q.processAllAvailable()
    q.stop()
    forget_batch(chk, 2, sink=out)
    run_batches(feed, start(), BATCHES[3:])

    firsts: dict[str | None, tuple[Any, ...]] = {}
    for row in (r for rows in BATCHES for r in rows):  # no batch has a key twice
        firsts.setdefault(row["k"], (row["k"], row["v"]))
    got = spark.read.schema(SCHEMA).format(fmt).load(str(out))
    assert normalize(got.select("k", "v").collect()) == normalize(list(firsts.values()))
    listed = {
        json.loads(line)["path"].removeprefix("file://")
        for m in (out / "_spark_metadata").iterdir()
        for line in m.read_text().splitlines()[1:]
    }
    on_disk = {str(p) for p in out.glob("part-*")}
    assert listed < on_disk  # the first attempt of batch 2 left files no manifest lists


def test_memory_sink_appends_in_update_and_replaces_in_complete(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """Also: NaN stays NaN and NULL stays NULL (``normalize`` shows NaN as "NaN"), as in the
    rows of Spark's own query."""
    for mode in ("update", "complete"):
        q = (
            ss.stream(source(spark, feed, SCHEMA_X))
            .groupBy("k")
            .agg(*ours_aggs_x())
            .writeStream.outputMode(mode)
            .format("memory")
            .queryName(f"mem_{mode}")
            .option("checkpointLocation", str(tmp_path / mode))
            .start()
        )
        if mode == "update":
            run_batches(feed, q, BATCHES_X)
        else:  # the same two files, read by a new query
            q.processAllAvailable()
            q.stop()
    rows = normalize(spark.table("mem_update").collect())
    assert rows == [
        ("a", 1, 1, "NaN", "NaN", "NaN"),
        ("a", 2, 4, "NaN", "NaN", "NaN"),
        ("b", 1, 2, None, None, None),
        ("c", 1, 5, 2.5, 2.5, 2.5),
        (None, 1, 4, "NaN", "NaN", "NaN"),
    ]
    expected = oracle_update(spark, SCHEMA_X, BATCHES_X, ["k"], spark_aggs_x)
    assert rows == normalize(expected[0] + expected[1])
    rows = normalize(spark.table("mem_complete").collect())
    assert rows == [
        ("a", 2, 4, "NaN", "NaN", "NaN"),
        ("b", 1, 2, None, None, None),
        ("c", 1, 5, 2.5, 2.5, 2.5),
        (None, 1, 4, "NaN", "NaN", "NaN"),
    ]
    everything = spark.createDataFrame(BATCHES_X[0] + BATCHES_X[1], SCHEMA_X)
    assert rows == normalize(everything.groupBy("k").agg(*spark_aggs_x()).collect())


def test_foreach_batch_gets_a_materialized_frame(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    seen: list[int] = []

    def fn(df: DataFrame, batch_id: int) -> None:
        # the user's code runs with the user's settings, not the engine's
        assert df.sparkSession.conf.get("spark.sql.shuffle.partitions") == str(PARTITIONS)
        assert df.sparkSession.conf.get("spark.sql.adaptive.enabled") == "true"
        seen.append(df.count())
        seen.append(len(df.collect()))
        seen.append(df.where("n > 1").count())

    chk = tmp_path / "chk"
    q = (
        ss.stream(source(spark, feed, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"))
        .writeStream.outputMode("update")
        .foreachBatch(fn)
        .option("checkpointLocation", str(chk))
        .option("numPartitions", "3")
        .start()
    )
    run_batches(feed, q, BATCHES[:2])
    assert seen == [2, 2, 0, 2, 2, 1]
    deltas = sorted(
        p.name.split("_")[0] for p in (chk / "sparkstate" / "state" / "0").rglob("*.delta")
    )
    # each batch committed each of the 3 partitions exactly once: the stage ran once per batch
    assert deltas == ["1"] * 3 + ["2"] * 3


def test_console_sink_prints_each_batch(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As Spark shows the same rows: NaN as NaN, NULL as NULL."""
    q = (
        ss.stream(source(spark, feed, SCHEMA_X))
        .groupBy("k")
        .agg(*ours_aggs_x())
        .writeStream.outputMode("update")
        .format("console")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    run_batches(feed, q, BATCHES_X[:1])
    printed = capsys.readouterr().out
    spark.createDataFrame(BATCHES_X[0], SCHEMA_X).groupBy("k").agg(*spark_aggs_x()).show()
    shown_by_spark = capsys.readouterr().out
    assert "Batch: 0" in printed
    rows = sorted(line for line in printed.splitlines() if line.startswith("|"))
    assert rows == sorted(line for line in shown_by_spark.splitlines() if line.startswith("|"))
    assert "|  a|  1|    1| NaN|  NaN|   NaN|" in rows
    assert "|  b|  1|    2|NULL| NULL|  NULL|" in rows


def test_progress_listener_json_lines_and_state_location(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    received: list[dict[str, Any]] = []
    ss.add_listener(received.append)
    chk, state = tmp_path / "chk", tmp_path / "state"
    try:
        q = (
            ss.stream(source(spark, feed, SCHEMA))
            .groupBy("k")
            .agg(SF.count("*").alias("n"))
            .writeStream.outputMode("update")
            .format("noop")
            .queryName("progress_q")
            .option("checkpointLocation", str(chk))
            .option("stateLocation", str(state))
            .start()
        )
        holder: list[Any] = []
        run_batches(feed, q, BATCHES[:2], on_batch=lambda _: holder.append(q.lastProgress))
    finally:
        ss.remove_listener(received.append)
    last = holder[-1]
    assert last["batchId"] == 1 and last["name"] == "progress_q"
    assert last["numInputRows"] == 2
    assert last["sources"][0]["numInputRows"] == 2
    op = last["stateOperators"][0]
    assert op["operatorName"] == "stateStoreSave"
    assert op["numRowsTotal"] == 3 and op["numRowsUpdated"] == 2
    assert op["numShufflePartitions"] == PARTITIONS and op["numRowsDroppedByWatermark"] == 0
    for field in ("commitTimeMs", "memoryUsedBytes", "numRowsRemoved", "customMetrics"):
        assert field in op
    assert [p["batchId"] for p in received if p["name"] == "progress_q"] == [0, 1]
    lines = (chk / "sparkstate" / "progress.jsonl").read_text().splitlines()
    assert [json.loads(line)["batchId"] for line in lines] == [0, 1]
    assert list((state / "state" / "0").iterdir()) and not (chk / "sparkstate" / "state").exists()
    shutil.rmtree(state)


def test_each_sink_takes_the_output_modes_spark_takes(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """Every sink in every mode, over a query valid in every mode: where Spark's ``start()``
    refuses, ours refuses with Spark's AnalysisException (the same condition and parameters),
    also a ConfigurationError; where Spark starts, ours goes on to ask for the checkpoint it was
    not given (so a refusal comes before the checkpoint is touched)."""
    stamped = "k string, ts timestamp"

    def query(df: Any, fn: Any) -> Any:
        return df.withWatermark("ts", "1 minute").groupBy(fn.window("ts", "1 minute")).count()

    def outcome(stream: Any, fmt: str, mode: str, checkpoint: str | None) -> Any:
        writer = stream.writeStream.outputMode(mode).queryName(f"modes_{fmt}_{mode}")
        if fmt == "foreachBatch":
            writer = writer.foreachBatch(lambda df, batch_id: None)
        else:
            writer = writer.format(fmt).option("path", str(tmp_path / "out" / fmt / mode))
        if checkpoint is not None:
            writer = writer.option("checkpointLocation", checkpoint)
        try:
            writer.start().stop()
        except AnalysisException as exc:
            assert isinstance(exc, ConfigurationError) or checkpoint is not None
            return exc.getCondition(), exc.getMessageParameters(), exc.getSqlState()
        except ConfigurationError as exc:
            assert "checkpoint" in str(exc), exc
        return "started"

    sinks = ["parquet", "json", "csv", "orc", "memory", "console", "noop", "foreachBatch"]
    pairs = [(fmt, mode) for fmt in sinks for mode in ("append", "update", "complete")]
    theirs = {
        (fmt, mode): outcome(
            query(source(spark, feed, stamped), F), fmt, mode, str(tmp_path / fmt / mode)
        )
        for fmt, mode in pairs
    }
    ours = {
        (fmt, mode): outcome(query(ss.stream(source(spark, feed, stamped)), SF), fmt, mode, None)
        for fmt, mode in pairs
    }
    assert ours == theirs
    refused = [pair for pair, got in theirs.items() if got != "started"]
    assert refused and len(refused) < len(pairs)
