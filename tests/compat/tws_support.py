"""What the compat ports of Spark's transformWithState tests share: Spark's suite conf and
inputs, the query with its input wrapped (or not, ``SPARKSTATE_COMPAT_SPARK=1``), batches
collected by ``foreachBatch``, and the causes of today's failures as strict xfail marks."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

import sparkstate as ss

SPARK_ONLY = os.environ.get("SPARKSTATE_COMPAT_SPARK") == "1"

#: What Spark's TransformWithStateIn{Pandas,PySpark}TestsMixin.conf() adds to the session (its
#: shuffle partitions and time zone are the package's CONF already). The provider class is for
#: Spark's own operator; a wrapped query takes ours from the ``stateStore`` option.
SUITE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.execution.arrow.transformWithStateInPandas.maxRecordsPerBatch": "2",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}

#: Spark's state readers read Spark's checkpoints; a wrapped query's state is read by ours,
#: which take Spark's options and give Spark's columns.
STATE_READER = "statestore" if SPARK_ONLY else "sparkstate"
METADATA_READER = "state-metadata" if SPARK_ONLY else "sparkstate-metadata"


@dataclasses.dataclass(frozen=True)
class Known:
    """A failure of sparkstate's today, with its cause, where it shows."""

    reason: str
    providers: tuple[str, ...] = ("memory", "rocksdb")
    modes: tuple[str, ...] = ("pandas", "row")


# No cause fails today; a new one is added here, with the cases it fails marked.


def expect_failure(request: pytest.FixtureRequest, *causes: Known) -> None:
    """Mark the test xfail (strict, so a fix flips it) for the causes that concern its provider
    and mode; never when the module runs against Spark's own operator."""
    if SPARK_ONLY:
        return
    provider = request.getfixturevalue("provider")
    mode = request.node.callspec.params.get("mode", "pandas")
    reasons = [c.reason for c in causes if provider in c.providers and mode in c.modes]
    if reasons:
        request.applymarker(pytest.mark.xfail(reason="; ".join(reasons), strict=True))


# ---------------------------------------------------------------------------------------------
# Inputs: Spark's text files, "e1, e2" a line, one file a micro-batch in the order written.


class TextFeed:
    """A directory of Spark's input text files; each file's time one second after the last, so
    the file source takes them in the order written (Spark's tests sleep for that)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._mtime = float(int(time.time()) - 3600)

    def write(self, name: str, lines: list[str]) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text("".join(line + "\n" for line in lines))
        self._mtime += 1.0
        os.utime(tmp, (self._mtime, self._mtime))
        tmp.rename(self.path / name)

    def pairs(self, name: str, col1: list[Any], col2: list[Any]) -> None:
        self.write(name, [f"{a}, {b}" for a, b in zip(col1, col2, strict=True)])

    def resource1(self) -> None:
        self.pairs("text-test1.txt", [0, 0, 1, 1], [123, 46, 146, 346])

    def resource2(self) -> None:
        self.pairs("text-test2.txt", [0, 0, 0, 1, 1], [123, 223, 323, 246, 6])

    def resource3(self) -> None:
        self.pairs("text-test3.txt", [0, 1], [123, 6])

    def resource4(self) -> None:
        self.pairs("text-test4.txt", [0, 1], [123, 6])

    def resource5(self) -> None:
        self.pairs("text-test5.txt", [0, 1], [123, 6])


def input_df(spark: Any, path: Path) -> Any:
    df = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(path))
    parts = F.split(df["value"], ",")
    return df.select(
        parts.getItem(0).alias("id").cast("string"),
        parts.getItem(1).alias("temperature").cast("int"),
    )


def input_df_3_cols(spark: Any, path: Path) -> Any:
    df = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(path))
    parts = F.split(df["value"], ",")
    return df.select(
        parts.getItem(0).alias("id1").cast("string"),
        parts.getItem(1).alias("temperature").cast("int"),
        parts.getItem(2).alias("id2").cast("string"),
    )


def event_time_input(spark: Any, path: Path, delay: str) -> Any:
    df = input_df(spark, path)
    event_time = F.from_unixtime(F.col("temperature")).alias("eventTime").cast("timestamp")
    return df.select("id", event_time).withWatermark("eventTime", delay)


# ---------------------------------------------------------------------------------------------
# The query: Spark's, with the input wrapped.


def wrap(df: Any) -> Any:
    return df if SPARK_ONLY else ss.stream(df)


def transform(
    df: Any,
    mode: str,
    processor: Any,
    output: Any,
    *,
    group: tuple[str, ...] = ("id",),
    output_mode: str = "Update",
    time_mode: str = "None",
    initial_state: Any = None,
    event_time_column: str | None = None,
) -> Any:
    grouped = wrap(df).groupBy(*group)
    api = grouped.transformWithStateInPandas if mode == "pandas" else grouped.transformWithState
    kwargs: dict[str, Any] = {
        "statefulProcessor": processor,
        "outputStructType": output,
        "outputMode": output_mode,
        "timeMode": time_mode,
        "initialState": initial_state,
    }
    if event_time_column is not None:
        kwargs["eventTimeColumnName"] = event_time_column
    return api(**kwargs)


def start(planned: Any, name: str, checkpoint: Path, provider: str) -> Any:
    writer = planned.writeStream.queryName(name).option("checkpointLocation", str(checkpoint))
    return writer if SPARK_ONLY else writer.option("stateStore", provider)


Batches = dict[int, list[Any]]


def run_batches(
    planned: Any,
    name: str,
    checkpoint: Path,
    provider: str,
    inside: Callable[[Any, int], None] | None = None,
) -> Batches:
    """Run to the end of the input with a ``foreachBatch`` sink; each batch's rows by id.
    ``inside(batch_df, batch_id)`` runs in the sink, for checks that must see the checkpoint
    while the batch is running (its failure fails the query)."""
    batches: Batches = {}

    def collect(batch_df: Any, batch_id: int) -> None:
        batches[batch_id] = batch_df.collect()
        if inside is not None:
            inside(batch_df, batch_id)

    q = (
        start(planned, name, checkpoint, provider)
        .foreachBatch(collect)
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    assert q.name == name
    q.awaitTermination()
    assert q.exception() is None
    return batches


def check_each(batches: Batches, n_batches: int, check: Callable[[int, list[Any]], None]) -> None:
    """Spark's per-batch check over every batch, and every batch of the input delivered."""
    assert set(range(n_batches)) <= set(batches), sorted(batches)
    for batch_id, rows in sorted(batches.items()):
        check(batch_id, rows)


def schema(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(name, kind, True) for name, kind in fields])


COUNT_OUTPUT = schema(("id", StringType()), ("countAsString", StringType()))
CHUNK_OUTPUT = schema(("id", StringType()), ("chunkCount", IntegerType()))


def basic_run(
    spark: Any,
    tmp_path: Path,
    provider: str,
    processor: Any,
    output: Any = COUNT_OUTPUT,
    *,
    single_batch: bool = False,
    time_mode: str = "None",
    initial_state: Any = None,
    checkpoint: Path | None = None,
    inside: Callable[[Any, int], None] | None = None,
) -> Batches:
    """Spark's ``_test_transform_with_state_basic``: resource 1 (and 2) through an Update query."""
    feed = TextFeed(tmp_path / "input")
    feed.resource1()
    if not single_batch:
        feed.resource2()
    df = input_df(spark, feed.path)
    assert df.isStreaming
    planned = transform(
        df,
        _mode_of(processor),
        processor,
        output,
        time_mode=time_mode,
        initial_state=initial_state,
    )
    chk = checkpoint or tmp_path / "checkpoint"
    return run_batches(planned, "this_query", chk, provider, inside)


def _mode_of(processor: Any) -> str:
    return "pandas" if processor.pandas else "row"
