"""A query changed between two runs on one checkpoint: what Spark's own restart keeps, ours keeps,
with Spark's output; what it refuses, ours refuses with Spark's condition."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.console import plain
from sparkstate.exceptions import ConfigurationError
from sparkstate.observe import inspect_text
from sparkstate.observe.inspect import inspect_checkpoint
from sparkstate.runtime.migration import MIGRATED

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long"
FILES = [
    [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}],
    [{"k": "a", "v": 4}, {"k": "c", "v": 5}],
    [{"k": "b", "v": 6}, {"k": "c", "v": 7}, {"k": "d", "v": 8}],
]


def counted(df: DataFrame) -> DataFrame:
    return df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))


def counted_renamed(df: DataFrame) -> DataFrame:
    """The same aggregation, its grouping column and its aliases renamed."""
    renamed = df.withColumnRenamed("k", "key")
    return renamed.groupBy("key").agg(F.count("*").alias("rows"), F.sum("v").alias("amount"))


def deduplicated(df: DataFrame) -> DataFrame:
    return df.dropDuplicates(["k"])


def deduplicated_renamed(df: DataFrame) -> DataFrame:
    return df.withColumnRenamed("k", "key").dropDuplicates(["key"])


@pytest.mark.parametrize(
    ("first", "second", "mode"),
    [
        pytest.param(counted, counted_renamed, "update", id="aggregation"),
        pytest.param(deduplicated, deduplicated_renamed, "append", id="deduplication"),
    ],
)
def test_a_restart_that_renames_columns_keeps_the_state_as_sparks_does(
    spark: SparkSession,
    tmp_path: Path,
    first: Callable[[Any], Any],
    second: Callable[[Any], Any],
    mode: str,
) -> None:
    """Spark compares state schemas without names: a grouping column or an alias renamed
    between two runs goes on with the counts so far."""
    out = {name: Collector() for name in ("spark", "ours")}
    feeds = {name: FileFeed(tmp_path / f"input-{name}") for name in out}
    for query, files in ((first, FILES[:2]), (second, FILES[2:])):
        for name in out:
            for rows in files:
                feeds[name].add(rows)
            df = feeds[name].stream(spark, SCHEMA)
            writer = query(ss.stream(df) if name == "ours" else df).writeStream
            writer = writer.outputMode(mode).foreachBatch(out[name])
            if name == "ours":
                writer = writer.option("stateStore", PROVIDERS[-1])
            handle = writer.option("checkpointLocation", str(tmp_path / name)).start()
            handle.processAllAvailable()
            handle.stop()
    assert out["ours"].batches == out["spark"].batches
    assert len(out["spark"].batches) == 3  # the run after the rename ran its batch


NUMBERS = "k string, v long"


def _run(
    spark: SparkSession,
    feed: FileFeed,
    chk: Path,
    query: Callable[[Any], Any],
    out: Collector,
    *,
    wrapped: bool = True,
    **options: Any,
) -> None:
    df = feed.stream(spark, NUMBERS)
    writer = query(ss.stream(df) if wrapped else df).writeStream.outputMode("update")
    writer = writer.foreachBatch(out)
    if wrapped:
        writer = writer.option("stateStore", PROVIDERS[0])
    for key, value in options.items():
        writer = writer.option(key, value)
    handle = writer.option("checkpointLocation", str(chk)).start()
    handle.processAllAvailable()
    handle.stop()


def by_int_group(df: DataFrame) -> DataFrame:
    return df.groupBy((F.col("v") % 3).cast("int").alias("g")).agg(F.count("*").alias("n"))


def by_long_group(df: DataFrame) -> DataFrame:
    return df.groupBy((F.col("v") % 3).cast("long").alias("g")).agg(F.count("*").alias("n"))


def test_a_widened_grouping_key_is_refused_as_sparks_or_migrated_with_auto(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``int`` to ``long``: refused as Spark refuses it, with its condition, and the checkpoint
    left as it was; with ``stateMigration="auto"`` the counts go on, as a run of the changed
    query from the start counts."""
    feed, chk, ours = FileFeed(tmp_path / "input"), tmp_path / "chk", Collector()
    for rows in FILES[:2]:
        feed.add(rows)
    _run(spark, feed, chk, by_int_group, ours)
    feed.add(FILES[2])
    with pytest.raises(Exception, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
        _run(spark, feed, chk, by_long_group, Collector())
    _run(spark, feed, chk, by_long_group, ours, stateMigration="auto")
    expected = Collector()
    _run(spark, FileFeed(tmp_path / "input"), tmp_path / "spark", by_long_group, expected,
         wrapped=False)  # fmt: skip
    assert ours.batches == expected.batches
    with pytest.raises(Exception, match="before its migration after batch 1"):
        spark.read.format("sparkstate").option("batchId", 0).load(str(chk)).collect()
    state = spark.read.format("sparkstate").load(str(chk)).collect()
    assert sorted((r["key"]["g"], r["value"]["count"]) for r in state) == [(0, 2), (1, 3), (2, 3)]
    doc = inspect_checkpoint(str(chk))
    assert [e["event"] for e in doc["history"]] == ["migrated"]
    assert "migrated the state of operator(s) [0] to a changed query after batch 1" in plain(
        inspect_text.summary(doc)
    )


def count_only(df: DataFrame) -> DataFrame:
    return df.groupBy("k").agg(F.count("*").alias("n"))


def count_sum_max(df: DataFrame) -> DataFrame:
    return df.groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v").alias("total"), F.max("v").alias("top")
    )


def count_sum(df: DataFrame) -> DataFrame:
    return df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))


def _by_key(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r["k"], []).append(r["v"])
    return out


def test_a_new_aggregate_starts_from_its_empty_value_with_auto(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An aggregate added to the query: the keys' counts go on, and the new ones start from
    nothing (a sum of no rows is null, a maximum of none too) at the migration."""
    feed, chk, ours = FileFeed(tmp_path / "input"), tmp_path / "chk", Collector()
    for rows in FILES[:2]:
        feed.add(rows)
    _run(spark, feed, chk, count_only, ours)
    feed.add(FILES[2])
    _run(spark, feed, chk, count_sum_max, ours, stateMigration="auto")
    before = _by_key(FILES[0] + FILES[1])
    after = _by_key(FILES[2])
    expected = sorted(
        (k, len(before.get(k, [])) + len(vs), sum(vs), max(vs)) for k, vs in after.items()
    )
    assert sorted(tuple(r) for r in ours.batches[2]) == expected
    # Spark's logs deleted back before the migration: refused, and fine again once put back
    aside = {}
    for log in ("commits", "offsets"):
        for batch in ("1", "2"):
            aside[chk / log / batch] = (chk / log / batch).read_bytes()
            (chk / log / batch).unlink()
    with pytest.raises(ConfigurationError, match="migrated to a changed query after batch 1"):
        _run(spark, feed, chk, count_sum_max, Collector())
    for path, data in aside.items():
        path.write_bytes(data)
    _run(spark, feed, chk, count_sum_max, ours)
    assert max(ours.batches) == 2


def test_a_migration_function_maps_each_old_row_to_new_ones(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``fn(key, value)`` in the state reader's shape: a key dropped, the new sum's buffer set
    from the old count."""
    feed, chk, ours = FileFeed(tmp_path / "input"), tmp_path / "chk", Collector()
    for rows in FILES[:2]:
        feed.add(rows)
    _run(spark, feed, chk, count_only, ours)
    feed.add(FILES[2])

    def fn(key: dict[str, Any], value: dict[str, Any]) -> Any:
        if key["k"] == "b":
            return None
        return key, {"count": value["count"], "sum": 10 * value["count"]}

    _run(spark, feed, chk, count_sum, ours, stateMigration=fn)
    before = _by_key(FILES[0] + FILES[1])
    before.pop("b")
    after = _by_key(FILES[2])
    expected = sorted(
        (k, len(before.get(k, [])) + len(vs), 10 * len(before.get(k, [])) + sum(vs))
        for k, vs in after.items()
    )
    assert sorted(tuple(r) for r in ours.batches[2]) == expected


#: A driver that starts the changed query with ``stateMigration="auto"`` and is SIGKILLed in
#: the middle of the migration: before its commit point (the new generation written, nothing
#: committed) or after it (the last batch's outcome rewritten, ``metadata.json`` not).
KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    import sparkstate as ss
    from sparkstate.engine.jobs import migrate as migrate_job
    from sparkstate.runtime import migration

    chk, feed, point = sys.argv[1], sys.argv[2], sys.argv[3]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "commit":
        migrate_job.commit_migration = die
    else:
        migration.settle_migration = die
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = builder.config("spark.sql.shuffle.partitions", "2").getOrCreate()
    df = spark.readStream.schema("k string, v long").option("maxFilesPerTrigger", 1).json(feed)
    counted = ss.stream(df).groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v").alias("total"), F.max("v").alias("top")
    )
    writer = counted.writeStream.outputMode("update").format("noop")
    writer.option("stateMigration", "auto").option("checkpointLocation", chk).start()
    """
)


@pytest.mark.parametrize("dies_in", ["commit", "settle"])
def test_a_killed_migration_leaves_the_old_state_or_completes(
    spark: SparkSession, tmp_path: Path, dies_in: str
) -> None:
    """The driver SIGKILLed in the middle of the migration: before its commit point the old
    query still runs on the checkpoint, and the migration runs again at the next start that
    asks for it; after it, the next start finishes it. The counts go on either way."""
    feed, chk, ours = FileFeed(tmp_path / "input"), tmp_path / "chk", Collector()
    for rows in FILES[:2]:
        feed.add(rows)
    _run(spark, feed, chk, count_only, ours)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(chk), str(feed.path), dies_in],
        env=env,
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    metadata = json.loads((chk / "sparkstate" / "metadata.json").read_text())
    assert MIGRATED not in metadata  # killed before metadata.json followed, either way
    if dies_in == "commit":  # the old query goes on from the old state
        feed.add(FILES[2][:1])
        _run(spark, feed, chk, count_only, ours)
        assert sorted(tuple(r) for r in ours.batches[2]) == [("b", 2)]
    feed.add(FILES[2][1:])
    _run(spark, feed, chk, count_sum_max, ours, stateMigration="auto")
    last = max(ours.batches)
    counts = {k: len(vs) for k, vs in _by_key(FILES[0] + FILES[1] + FILES[2]).items()}
    assert {r[0]: r[1] for r in ours.batches[last]} == {k: counts[k] for k in _by_key(FILES[2][1:])}
    (migrated,) = json.loads((chk / "sparkstate" / "metadata.json").read_text())[MIGRATED]
    assert migrated["changed"] == [0]
