"""Crashes: a Python worker killed inside the stateful task, a driver killed between commits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import PROVIDERS, FileFeed
from .faults import KILLING, arm
from .helpers import batches_to_parquet, normalize, oracle_update, read_batches, run_batches, source

SCHEMA = "k string, v int"
BATCHES: list[list[dict[str, Any]]] = [
    [{"k": f"k{i % 7}", "v": i} for i in range(20)],
    [{"k": f"k{i % 5}", "v": i} for i in range(20, 30)] + [{"k": None, "v": 1}],
    [{"k": f"k{i % 9}", "v": None if i % 3 else i} for i in range(30, 50)],
]


def spark_aggs() -> list[Any]:
    return [F.count("*").alias("n"), F.sum("v").alias("total")]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_worker_killed_inside_the_task_is_retried_exactly_once(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"
    state = chk / "sparkstate"
    # batch 1 (version 2): a worker dies right after loading partition 0's store; batch 2
    # (version 3): one dies after partition 1's version is durable, before Spark got the output.
    markers = [arm(state, "open", 2, 0), arm(state, "commit", 3, 1)]
    q = (
        ss.stream(source(spark, feed, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .foreachBatch(batches_to_parquet(out))
        .option("checkpointLocation", str(chk))
        .option("stateStore", KILLING[provider])
        .start()
    )
    run_batches(feed, q, BATCHES)
    assert not any(m.exists() for m in markers), "the faults did not fire"
    expected = oracle_update(spark, SCHEMA, BATCHES, ["k"], spark_aggs)
    want = normalize([r for b in sorted(expected) for r in expected[b]])
    got = read_batches(spark, out, "k string, n long, total long")
    assert normalize(got) == want
    # two attempts of version 3 of partition 1 exist; the commit log names the surviving one
    attempts = sorted((state / "state" / "0" / "1").glob("3_*"))
    assert len({p.name.split(".")[0] for p in attempts}) == 2


DRIVER = textwrap.dedent(
    """
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    import sparkstate as ss
    from sparkstate.engine.run import sinks

    feed, out, chk, die_at = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    when, batch = die_at.split(":")
    # Two shuffle partitions, as the tests' session that restarts the query (PARTITIONS): a
    # restart that asks for another count rescales, which an unfinished batch refuses.
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    write_log = sinks.FileSink._write_log

    def dying_write_log(self, batch_id, entries):
        if when == "before-manifest" and batch_id == int(batch):
            os._exit(137)  # the state of the batch is committed, its files are written
        write_log(self, batch_id, entries)
        if when == "after-manifest" and batch_id == int(batch):
            os._exit(137)  # the sink committed; commits/<b>.json is not written

    sinks.FileSink._write_log = dying_write_log
    df = spark.readStream.schema("k string, v int").option("maxFilesPerTrigger", 1).json(feed)
    q = (ss.stream(df).dropDuplicates()
         .writeStream.outputMode("append").format("parquet").option("path", out)
         .option("checkpointLocation", chk).option("stateStore", sys.argv[5]).start())
    q.processAllAvailable()
    q.stop()
    """
)


@pytest.mark.parametrize("provider", PROVIDERS[-1:])
def test_driver_killed_between_state_and_sink_commits(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    for rows in BATCHES:
        feed.add(rows)
    for die_at in ("before-manifest:1", "after-manifest:2"):
        done = subprocess.run(
            [sys.executable, str(script), str(feed.path), str(out), str(chk), die_at, provider],
            capture_output=True,
            timeout=300,
        )
        assert done.returncode == 137, done.stderr.decode()[-3000:]
    more = [{"k": "k1", "v": 100}, {"k": "zz", "v": 1}]
    q = (
        ss.stream(source(spark, feed, SCHEMA))
        .dropDuplicates()
        .writeStream.outputMode("append")
        .format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(chk))
        .option("stateStore", provider)
        .start()
    )
    q.processAllAvailable()
    run_batches(feed, q, [more])
    # every distinct row once: none lost, none written twice across the deaths
    want = normalize(list({(r["k"], r["v"]) for rows in [*BATCHES, more] for r in rows}))
    got = spark.read.schema(SCHEMA).parquet(str(out)).collect()
    assert normalize(got) == want
