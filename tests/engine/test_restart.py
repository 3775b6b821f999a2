"""Restarting from a checkpoint: the state carries on exactly; a changed query is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import (
    CheckpointInUseError,
    ConfigurationError,
    CorruptStateFileError,
    ProviderMismatchError,
    SchemaMismatchError,
)

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, compat, normalize, oracle_update, run_batches, source, start_ours

SCHEMA = "k string, v int"
BATCHES: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1}, {"k": "b", "v": 2}],
    [{"k": "a", "v": 3}, {"k": None, "v": 4}],
    [{"k": "b", "v": None}, {"k": "c", "v": 5}],
    [{"k": "a", "v": 6}, {"k": None, "v": None}],
]


def ours_aggs() -> list[Any]:
    return [SF.count("*").alias("n"), SF.sum("v").alias("total")]


def spark_aggs() -> list[Any]:
    return [F.count("*").alias("n"), F.sum("v").alias("total")]


def _as_earlier_version_wrote_it(chk: Path) -> None:
    """Rewrite the checkpoint's schema records in the forms earlier versions wrote: operators'
    schemas as ``[{"name", "type"}]`` in ``metadata.json``, ``[[name, type, nullable]]`` in every
    ``_schema.json``."""
    meta_file = chk / "sparkstate" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    for op in meta["operators"]:
        for part in ("key_schema", "value_schema", "output_schema"):
            op[part] = [{"name": f["name"], "type": f["type"]} for f in op[part]["fields"]]
    meta_file.write_text(json.dumps(meta))
    schema_files = list((chk / "sparkstate" / "state").rglob("_schema.json"))
    assert schema_files
    for file in schema_files:
        described = json.loads(file.read_text())
        for family in described["column_families"].values():
            for side in ("key", "value"):
                fields = family[side]["fields"]
                family[side] = [[f["name"], f["type"], f["nullable"]] for f in fields]
        file.write_text(json.dumps(described))


@pytest.mark.parametrize(
    ("provider", "written_by"),
    compat(
        [
            pytest.param(provider, written_by, id=f"{provider}-{written_by}")
            for provider in PROVIDERS
            for written_by in ("this version", "an earlier version")
        ],
        "memory-this version",
        f"{PROVIDERS[-1]}-an earlier version",
    ),
)
def test_restart_mid_stream_continues_the_state(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str, written_by: str
) -> None:
    """Also from a checkpoint whose schema records are in the forms earlier versions wrote."""
    collector = Collector()
    chk = tmp_path / "chk"

    def start() -> Any:
        stream = ss.stream(source(spark, feed, SCHEMA)).groupBy("k").agg(*ours_aggs())
        return start_ours(stream, "update", chk, provider, collector)

    run_batches(feed, start(), BATCHES[:2])
    if written_by == "an earlier version":
        _as_earlier_version_wrote_it(chk)
    run_batches(feed, start(), BATCHES[2:])
    expected = oracle_update(spark, SCHEMA, BATCHES, ["k"], spark_aggs)
    assert collector.batches == expected
    assert (chk / "sparkstate" / "commits" / "3.json").exists()
    assert (chk / "sparkstate" / "batches" / "3.json").exists()


def test_a_watermarked_aggregation_of_an_earlier_version_restarts(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Earlier versions ran a watermarked aggregation without the clock source, and Spark cannot
    add a source to a checkpoint: such a checkpoint (``metadata.json`` without ``clock``) keeps
    running without it, its counts carrying on."""
    collector = Collector()
    chk = tmp_path / "chk"
    rows = [
        [{"k": "a", "ts": "2024-01-01 00:00:00", "v": 1}],
        [{"k": "a", "ts": "2024-01-01 00:01:00", "v": 2}],
    ]

    def start() -> Any:
        df = source(spark, feed, "k string, ts timestamp, v int")
        stream = ss.stream(df).withWatermark("ts", "10 seconds").groupBy("k").agg(*ours_aggs())
        return start_ours(stream, "update", chk, "memory", collector)

    with monkeypatch.context() as patched:  # as an earlier version wrote it
        patched.setattr(
            "sparkstate.engine.api.writer.needs_clock", lambda stages, legacy=False: False
        )
        run_batches(feed, start(), rows[:1])
    meta_file = chk / "sparkstate" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    del meta["clock"]
    meta_file.write_text(json.dumps(meta))
    run_batches(feed, start(), rows[1:])
    assert json.loads(meta_file.read_text())["clock"] is False
    assert [r for rs in collector.batches.values() for r in rs] == [("a", 1, 1), ("a", 2, 3)]


def test_a_damaged_commit_log_fails_the_restart_naming_the_file(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """A truncated ``sparkstate/commits/<last>.json`` fails ``start()`` itself (the driver reads
    the last commit before Spark starts the query), naming the file and the way out; the file
    restored, the query carries on."""
    collector = Collector()
    chk = tmp_path / "chk"

    def start() -> Any:
        stream = ss.stream(source(spark, feed, SCHEMA)).groupBy("k").agg(*ours_aggs())
        return start_ours(stream, "update", chk, "memory", collector)

    run_batches(feed, start(), BATCHES[:2])
    last = chk / "sparkstate" / "commits" / "1.json"
    backup = last.read_bytes()
    last.write_bytes(backup[: len(backup) // 2])
    with pytest.raises(CorruptStateFileError) as info:
        start()
    message = str(info.value)
    assert message.startswith(f"corrupt state file {last}: is not valid JSON (it ends too early")
    assert message.endswith(
        "Restore it from a backup of the checkpoint, or start the query from a new checkpoint "
        "location."
    )
    last.write_bytes(backup)
    run_batches(feed, start(), BATCHES[2:3])
    assert collector.batches[2] == [("b", 2, 2), ("c", 1, 5)]


def test_changed_queries_are_refused_on_restart(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    df = source(spark, feed, SCHEMA + ", g int")

    def start(stream: ss.StatefulStream, **options: str) -> Any:
        writer = (
            stream.writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(chk))
        )
        for k, v in {"stateStore": "memory", **options}.items():
            writer = writer.option(k, v)
        return writer.start()

    start(ss.stream(df).groupBy("k").agg(SF.sum("v"))).stop()
    with pytest.raises(ProviderMismatchError, match="'memory'"):
        start(ss.stream(df).groupBy("k").agg(SF.sum("v")), stateStore="rocksdb")
    with pytest.raises(ConfigurationError, match=r"\['aggregate'\].*\['dedup'\]"):
        start(ss.stream(df).dropDuplicates(["k"]))
    # a state schema Spark refuses too: the query starts, and fails its first batch as Spark's
    feed.add([{"k": "a", "v": 1, "g": 1}])
    for changed, refused in [
        (ss.stream(df).groupBy("g").agg(SF.sum("v")), "KEY.*key schema changed"),
        (ss.stream(df).groupBy("k").agg(SF.avg("v")), "VALUE.*value schema changed"),
    ]:
        query = start(changed)
        with pytest.raises(SchemaMismatchError, match=f"STATE_STORE_{refused}"):
            query.processAllAvailable()
        query.stop()
    with pytest.raises(ConfigurationError, match="stateLocation"):
        start(ss.stream(df).groupBy("k").agg(SF.sum("v")), stateLocation=str(tmp_path / "x"))
    query = start(ss.stream(df).groupBy("k").agg(SF.sum("v")))  # the original still runs
    query.processAllAvailable()
    query.stop()


def test_second_query_on_a_checkpoint_in_use_fails(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    df = source(spark, feed, SCHEMA)

    def start() -> Any:
        return (
            ss.stream(df)
            .groupBy("k")
            .count()
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(tmp_path / "chk"))
            .start()
        )

    first = start()
    try:
        with pytest.raises(CheckpointInUseError, match="in use"):
            start()
    finally:
        first.stop()
    start().stop()


def test_unsupported_shapes_fail_at_start(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    df = source(spark, feed, SCHEMA + ", d decimal(10,2)")
    chk = str(tmp_path / "chk")

    def start(stream: ss.StatefulStream, mode: str, fmt: str = "noop") -> Any:
        w = stream.writeStream.outputMode(mode).format(fmt).option("checkpointLocation", chk)
        return w.option("path", str(tmp_path / "out")).start()

    with pytest.raises(ConfigurationError, match="Append output mode not supported"):
        start(ss.stream(df).groupBy("k").count(), "append")
    with pytest.raises(ConfigurationError, match="complete output mode needs"):
        start(ss.stream(df).dropDuplicates(["k"]), "complete")
    with pytest.raises(ConfigurationError, match="at most 0.39"):
        start(ss.stream(df).groupBy("k").agg(SF.approx_count_distinct("d", 0.5)), "update")
    with pytest.raises(ConfigurationError, match="possible 'correctness' issue"):
        start(ss.stream(df).groupBy("k").count().dropDuplicates(), "update")
    with pytest.raises(ConfigurationError, match="not supported in Data Source parquet"):
        start(ss.stream(df).groupBy("k").count(), "complete", "parquet")
    with pytest.raises(ConfigurationError, match="cannot be merged"):
        start(ss.stream(df).groupBy("k").agg(F.countDistinct("v")), "update")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="keys holding a map are not supported"):
        start(ss.stream(df).groupBy(F.create_map("k", "v")).count(), "update")
    with pytest.raises(ConfigurationError, match="checkpoint"):
        ss.stream(df).groupBy("k").count().writeStream.format("noop").outputMode("update").start()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_replay_of_a_committed_batch_redelivers_the_same_output(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    """Spark died after our commit of batch 1 but before its own: foreachBatch sees 1 again."""
    calls: list[tuple[int, list[tuple[Any, ...]]]] = []
    chk = tmp_path / "chk"

    def record(df: Any, batch_id: int) -> None:
        calls.append((batch_id, normalize(df.collect())))

    def start() -> Any:
        return (
            ss.stream(source(spark, feed, SCHEMA))
            .groupBy("k")
            .agg(*ours_aggs())
            .writeStream.outputMode("update")
            .foreachBatch(record)
            .option("checkpointLocation", str(chk))
            .option("stateStore", provider)
            .start()
        )

    run_batches(feed, start(), BATCHES[:2])
    for name in ("1", ".1.crc"):
        (chk / "commits" / name).unlink()  # Spark's commit log only
    run_batches(feed, start(), BATCHES[2:3])
    expected = oracle_update(spark, SCHEMA, BATCHES[:3], ["k"], spark_aggs)
    assert [b for b, _ in calls] == [0, 1, 1, 2]
    assert calls[1] == calls[2] == (1, expected[1])
    assert calls[3] == (2, expected[2])
