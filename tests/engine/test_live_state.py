"""Reading a running query's state live (``ss.state``): from the state homes that hold it while
the query runs, from the checkpoint where none does; always the state after one committed
batch, equal to what the state reader reads from the checkpoint for that batch."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.observe.reader import ReadRequest, StateReader

from .conftest import PROVIDERS, FileFeed
from .helpers import source
from .test_state_home import homes, jvm_pid

SCHEMA = "k string, v int"
KEYS = [f"k{i}" for i in range(13)]
BATCHES: list[list[dict[str, Any]]] = [
    [{"k": f"k{(i * 7) % 13}", "v": i} for i in range(5 * b, 40 + 10 * b)] for b in range(5)
]


def start(spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str) -> Any:
    return (
        ss.stream(source(spark, feed, SCHEMA))
        .groupBy("k")
        .agg(SF.count("*").alias("n"), SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("stateStore", provider)
        .option("stateStore.state_home", "true")
        .start()
    )


def offline(location: Path, batch_id: int) -> dict[str, Any]:
    """The state after ``batch_id`` as the state reader reads it from the checkpoint."""
    reader = StateReader(ReadRequest.from_options({"path": str(location), "batchId": batch_id}))
    out: dict[str, Any] = {}
    for p in range(reader.num_partitions):
        for batch in reader.read(p):
            for row in batch.to_pylist():
                out[row["key"]["k"]] = row["value"]
    return out


@pytest.mark.parametrize("provider", PROVIDERS)
def test_reads_equal_the_state_reader_while_the_query_runs_and_after(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    chk = tmp_path / "chk"
    q = start(spark, feed, tmp_path, provider)
    try:
        feed.add(BATCHES[0])
        q.processAllAvailable()
        live = ss.state(q)
        for b, rows in enumerate(BATCHES[1:], start=1):
            feed.add(rows)
            q.processAllAvailable()
            found = live.get_many(KEYS)
            assert {f.batch_id for f in found} == {b}
            assert {f.source for f in found} == {"home"}, found
            assert {f.key["k"]: f.value for f in found if f.found} == offline(chk, b)
    finally:
        q.stop()
    last = offline(chk, len(BATCHES) - 1)
    # Stopped, the homes keep the last batch's state a while: it still answers, the same.
    found = live.get_many(KEYS)
    assert {f.key["k"]: f.value for f in found if f.found} == last
    # With the homes killed, the same reads come from the checkpoint.
    for pid in homes(jvm_pid(spark)):
        os.kill(pid, signal.SIGKILL)
    found = live.get_many(KEYS)
    assert {f.source for f in found} == {"checkpoint"}
    assert {f.key["k"]: f.value for f in found if f.found} == last
    assert [f.key["k"] for f in live.scan()] and {f.key["k"]: f.value for f in live.scan()} == last
    live.close()
