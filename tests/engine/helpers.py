"""Run the same input through sparkstate and through Spark's own operator, batch by batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

import sparkstate as ss
from sparkstate.testing.differential import Batches as Batches
from sparkstate.testing.differential import Collector as Collector
from sparkstate.testing.differential import FileFeed as FileFeed
from sparkstate.testing.differential import normalize as normalize


def source(spark: SparkSession, feed: FileFeed, schema: str) -> DataFrame:
    """A streaming DataFrame over the feed: one file per micro-batch."""
    return feed.stream(spark, schema)


def run_batches(
    feed: FileFeed,
    query: Any,
    batches: list[list[dict[str, Any]]],
    *,
    on_batch: Callable[[int], None] | None = None,
) -> None:
    """Feed one file per batch and wait for each to be processed; stop the query at the end."""
    try:
        for i, rows in enumerate(batches):
            feed.add(rows)
            query.processAllAvailable()
            if on_batch is not None:
                on_batch(i)
    finally:
        query.stop()


def start_ours(
    stream: ss.StatefulStream,
    mode: str,
    checkpoint: Path,
    provider: str,
    collector: Collector,
    **options: str,
) -> Any:
    writer = (
        stream.writeStream.outputMode(mode)
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .option("stateStore", provider)
    )
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def start_spark(df: DataFrame, mode: str, checkpoint: Path, collector: Collector) -> Any:
    return (
        df.writeStream.outputMode(mode)
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def same_schema(ours: StructType | None, theirs: StructType | None) -> bool:
    assert ours is not None and theirs is not None
    return [(f.name, f.dataType) for f in ours] == [(f.name, f.dataType) for f in theirs]


def oracle_update(
    spark: SparkSession,
    schema: str,
    batches: list[list[dict[str, Any]]],
    keys: list[str],
    aggregates: Callable[[], list[Any]],
) -> Batches:
    """Update-mode output per batch, from Spark batch queries over the rows seen so far."""
    out: Batches = {}
    seen: list[dict[str, Any]] = []
    for b, rows in enumerate(batches):
        seen += rows
        touched = {tuple(r.get(k) for k in keys) for r in rows}
        if not seen:
            out[b] = []
            continue
        df = spark.createDataFrame(seen, schema=schema)
        result = df.groupBy(*keys).agg(*aggregates()).collect()
        out[b] = normalize([r for r in result if tuple(r[k] for k in keys) in touched])
    return out


def run_in_two_runs(
    spark: SparkSession,
    tmp: Path,
    schema: str,
    files: list[list[dict[str, Any]]],
    build: Callable[[DataFrame], Any],
    mode: str,
    provider: str | None,
) -> tuple[Collector, list[dict[str, Any]]]:
    """``build(input)``'s query with ``availableNow`` over the first half of ``files`` until it
    ends, then over all of them on the same checkpoint (a restart in the middle of the query);
    ``provider`` None runs it as Spark's own query. The batches it delivered, and its progress."""
    feed = FileFeed(tmp / "input")
    collector = Collector()
    progress: list[dict[str, Any]] = []
    half = len(files) // 2
    for rows in files[:half]:
        feed.add(rows)
    for run in range(2):
        if run == 1:
            for rows in files[half:]:
                feed.add(rows)
        writer = build(feed.stream(spark, schema)).writeStream.outputMode(mode)
        writer = writer.foreachBatch(collector)
        writer = writer.option("checkpointLocation", str(tmp / "checkpoint"))
        if provider is not None:
            writer = writer.option("stateStore", provider)
        handle = writer.trigger(availableNow=True).start()
        assert handle.awaitTermination(180), f"run {run} did not end"
        progress += [p if isinstance(p, dict) else p.asDict() for p in handle.recentProgress]
    return collector, progress
