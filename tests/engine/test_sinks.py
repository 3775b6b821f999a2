"""Sinks: exactly-once files across replays, memory, console, foreachBatch; progress and logs."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from pyspark import cloudpickle
from pyspark.errors import (
    AnalysisException,
    IllegalArgumentException,
    PySparkAttributeError,
    PySparkValueError,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import ConfigurationError

from .conftest import PARTITIONS, PROVIDERS, FileFeed
from .helpers import normalize, oracle_update, run_batches, source

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the foreach writer, to workers

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
@pytest.mark.parametrize(
    ("fmt", "partition_by"), [("parquet", ()), ("json", ("k",))], ids=["parquet", "json-by-k"]
)
def test_file_sink_is_exactly_once_across_replays(
    spark: SparkSession,
    feed: FileFeed,
    tmp_path: Path,
    provider: str,
    fmt: str,
    partition_by: tuple[str, ...],
) -> None:
    """Replays after deaths before the commit logs and before the sink's manifest: each row
    read back once, in files laid out flat or under partition directories (``k=a/``)."""
    out, chk = tmp_path / "out", tmp_path / "chk"

    def start() -> Any:
        return (
            ss.stream(source(spark, feed, SCHEMA))
            .dropDuplicates(["k"])
            .writeStream.outputMode("append")  # a file sink's only mode, as in Spark
            .format(fmt)
            .partitionBy(*partition_by)
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
        unquote(json.loads(line)["path"].removeprefix("file://"))
        for m in (out / "_spark_metadata").iterdir()
        for line in m.read_text().splitlines()[1:]
    }
    on_disk = {str(p) for p in out.glob("*/" * len(partition_by) + "part-*")}
    assert listed < on_disk  # the first attempt of batch 2 left files no manifest lists
    assert {Path(p).parent.name for p in on_disk} == (
        {"k=a", "k=b", "k=c", "k=__HIVE_DEFAULT_PARTITION__"} if partition_by else {out.name}
    )


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


#: Keys of the partition directories Spark writes (``k=b c``), escapes (``k=d%2Fe%25``) and
#: writes for a null (``k=__HIVE_DEFAULT_PARTITION__``); a manifest names them percent-encoded.
SURFACE_BATCHES: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1}, {"k": "b c", "v": 2}],
    [{"k": "a", "v": 3}, {"k": "d/e%", "v": 4}, {"k": None, "v": 5}, {"k": "a", "v": 1}],
]


class RowsByEpoch:
    """A ``foreach`` writer as Spark's docs write one: each partition's rows of each epoch
    into a file of their own under ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = str(out)

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.path = f"{self.out}/{epoch_id}-{partition_id}.json"
        self.rows: list[list[Any]] = []
        return True

    def process(self, row: Any) -> None:
        self.rows.append(list(row))

    def close(self, error: Any) -> None:
        Path(self.path).write_text(json.dumps(self.rows))


def rows_by_epoch(out: Path) -> dict[int, list[tuple[Any, ...]]]:
    seen: dict[int, list[tuple[Any, ...]]] = {}
    for f in out.iterdir():
        seen.setdefault(int(f.name.split("-")[0]), []).extend(map(tuple, json.loads(f.read_text())))
    return {epoch: normalize(rows) for epoch, rows in seen.items() if rows}


def partition_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith("_"))


def test_the_writer_takes_sparks_surface(spark: SparkSession, tmp_path: Path) -> None:
    """The same query run by Spark unwrapped and by sparkstate on each store, through three
    sinks and three triggers: ``start(path, format=, outputMode=, partitionBy=, queryName=,
    **options)`` into a Parquet sink partitioned by a key that Spark escapes in directory names
    (availableNow); ``foreach`` with an object's open/process/close (once); ``toTable`` of a
    new JSON table, partitioned (processingTime). The same partition directories and rows read
    back, the same rows per epoch, the same table (provider, columns, partitioning, rows)."""
    feed = FileFeed(tmp_path / "input")
    for batch in SURFACE_BATCHES:
        feed.add(batch)
    got: dict[str, dict[str, Any]] = {}
    for runner in ["spark", *PROVIDERS]:
        df = source(spark, feed, SCHEMA)
        ours = runner != "spark"
        query: Any = (ss.stream(df) if ours else df).dropDuplicates(["k", "v"])
        store = {"stateStore": runner} if ours else {}
        base = tmp_path / runner
        out, each, table = base / "out", base / "each", f"surface_{runner}"
        each.mkdir(parents=True)
        files = query.writeStream.trigger(availableNow=True).start(
            str(out),
            format="parquet",
            outputMode="append",
            partitionBy="k",
            queryName=f"surface_files_{runner}",
            checkpointLocation=str(base / "chk-files"),
            **store,
        )
        rowwise = (
            query.writeStream.foreach(RowsByEpoch(each))
            .trigger(once=True)
            .options(checkpointLocation=str(base / "chk-each"), **store)
            .start()
        )
        into_table = query.writeStream.trigger(processingTime="0 seconds").toTable(
            table,
            format="json",
            partitionBy=["k"],
            path=str(base / "table"),
            checkpointLocation=str(base / "chk-table"),
            **store,
        )
        files.awaitTermination()
        rowwise.awaitTermination()
        into_table.processAllAvailable()
        into_table.stop()
        assert files.name == f"surface_files_{runner}"
        got[runner] = {
            "directories": partition_dirs(out),
            "rows": normalize(spark.read.parquet(str(out)).collect()),
            "epochs": rows_by_epoch(each),
            "table": table_facts(spark, table),
            "table directories": partition_dirs(base / "table"),
        }
        spark.sql(f"DROP TABLE {table}")
    for runner in PROVIDERS:
        assert got[runner] == got["spark"], runner
    theirs = got["spark"]
    assert theirs["directories"] == ["k=__HIVE_DEFAULT_PARTITION__", "k=a", "k=b c", "k=d%2Fe%25"]
    kept = normalize([("a", 1), ("a", 3), ("b c", 2), ("d/e%", 4), (None, 5)])
    assert theirs["epochs"] == {0: kept}  # once: one batch of all there is
    read_back = normalize([(v, k) for k, v in kept])  # the partition column last
    assert theirs["rows"] == read_back and theirs["table"]["rows"] == read_back
    assert theirs["table directories"] == theirs["directories"]


def table_facts(spark: SparkSession, name: str) -> dict[str, Any]:
    """What the catalog says of table ``name`` (its provider, its columns, their partitioning and
    clustering), and its rows."""
    described = [tuple(r) for r in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()]
    about = {r[0]: r[1] for r in described}
    columns = [(c.name, c.dataType, c.nullable) for c in spark.catalog.listColumns(name)]
    return {
        "provider": about["Provider"],
        "type": about["Type"],
        "columns": columns,
        "layout": described[: described.index(("# Detailed Table Information", "", ""))],
        "rows": normalize(spark.table(name).collect()),
    }


class WithoutProcess:
    """A ``foreach`` writer without ``process``, which PySpark refuses."""

    def open(self, partition_id: int, epoch_id: int) -> bool:
        return True


#: The writer's calls that Spark refuses, each given a writer, a name and a directory of its own.
REFUSED: dict[str, Callable[[Any, str, str], Any]] = {
    "memory, partitioned": lambda w, n, d: w.format("memory").queryName(n).partitionBy("k").start(),
    "foreachBatch, partitioned": lambda w, n, d: w.foreachBatch(print).partitionBy("k").start(),
    "foreach, partitioned": lambda w, n, d: w.foreach(print).partitionBy(["k"]).start(),
    "no such partition column": lambda w, n, d: w.partitionBy("zz").start(d),
    "a file sink without a path": lambda w, n, d: w.start(),
    "an unknown output mode": lambda w, n, d: w.outputMode("sideways"),
    "continuous, foreachBatch": lambda w, n, d: (
        w.foreachBatch(print).trigger(continuous="1 second").start()
    ),
    "continuous, memory": lambda w, n, d: w.trigger(continuous="1 second").start(
        format="memory", queryName=n
    ),
    "no trigger": lambda w, n, d: w.trigger(),
    "two triggers": lambda w, n, d: w.trigger(once=True, availableNow=True),
    "once=False": lambda w, n, d: w.trigger(once=False),
    "an interval Spark cannot read": lambda w, n, d: w.trigger(processingTime="soon"),
    "an empty query name": lambda w, n, d: w.queryName(""),
    "a foreach writer without process": lambda w, n, d: w.foreach(WithoutProcess()),
    "a table of another provider": lambda w, n, d: w.toTable("refused_json"),
    "a temporary view": lambda w, n, d: w.toTable("refused_temp"),
    "a view": lambda w, n, d: w.toTable("refused_view"),
    "a new table in update mode": lambda w, n, d: (
        w.outputMode("update").clusterBy("k").toTable(n, path=d)
    ),
}


def test_the_writer_refuses_what_spark_refuses(spark: SparkSession, tmp_path: Path) -> None:
    """Each call of :data:`REFUSED` on Spark's writer and on ours: the same exception (PySpark's
    class), condition, parameters and SQLSTATE. Ours refuses before it asks for a checkpoint
    (it is given none), and, as Spark's, creates the table of a ``toTable`` it then refuses:
    the same table (clustered)."""
    feed = FileFeed(tmp_path / "input")
    spark.sql(f"CREATE TABLE refused_json (k string, v int) USING json LOCATION '{tmp_path}/j'")
    spark.sql("CREATE OR REPLACE TEMPORARY VIEW refused_temp AS SELECT 1 AS k")
    spark.sql("CREATE OR REPLACE VIEW refused_view AS SELECT 1 AS k")
    kinds = (
        AnalysisException,
        IllegalArgumentException,
        PySparkValueError,
        PySparkAttributeError,
    )

    def outcome(call: Callable[[Any, str, str], Any], writer: Any, name: str) -> Any:
        try:
            call(writer, name, str(tmp_path / name))
        except Exception as exc:  # noqa: BLE001 - compared below
            if not isinstance(exc, kinds):
                raise
            kind = next(k.__name__ for k in kinds if isinstance(exc, k))
            return kind, exc.getCondition(), exc.getMessageParameters(), exc.getSqlState()
        return "accepted"

    got: dict[str, dict[str, Any]] = {"spark": {}, "ours": {}}
    try:
        for runner, outcomes in got.items():
            for i, (case, call) in enumerate(REFUSED.items()):
                df = source(spark, feed, SCHEMA)
                query: Any = ss.stream(df) if runner == "ours" else df
                writer = query.dropDuplicates(["k", "v"]).writeStream
                if runner == "spark":  # Spark's file sinks ask for one
                    writer = writer.option("checkpointLocation", str(tmp_path / f"chk{i}"))
                name = f"refused_{runner}_{i}"
                outcomes[case] = outcome(call, writer, name)
        created = [table_facts(spark, f"refused_{r}_{len(REFUSED) - 1}") for r in got]
    finally:
        for table in ("refused_json", *(f"refused_{r}_{len(REFUSED) - 1}" for r in got)):
            spark.sql(f"DROP TABLE IF EXISTS {table}")
        spark.sql("DROP VIEW IF EXISTS refused_view")
    assert got["ours"] == got["spark"]
    assert "accepted" not in got["spark"].values()
    assert created[0] == created[1] and ("# Clustering Information", "", "") in created[0]["layout"]


def test_the_file_sinks_log_compacts_as_sparks(spark: SparkSession, tmp_path: Path) -> None:
    """``spark.sql.streaming.fileSink.log.compactInterval`` sets when the file sink's log is
    compacted, as in Spark's own file sink; across a restart with another interval, the log keeps
    the one it was written with, by Spark's rule. The logs name the same batches, each lists as
    many files, and both outputs read back the same rows."""
    conf = "spark.sql.streaming.fileSink.log.compactInterval"
    batches = [[{"k": f"k{b}-{i}", "v": b * 10 + i} for i in range(b + 1)] for b in range(7)]
    feeds = {ours: FileFeed(tmp_path / f"in-{ours}") for ours in (False, True)}

    def start(ours: bool) -> Any:
        events = source(spark, feeds[ours], SCHEMA)
        return (
            (ss.stream(events) if ours else events)
            .dropDuplicates(["k"])
            .writeStream.format("parquet")
            .option("path", str(tmp_path / f"out-{ours}"))
            .option("checkpointLocation", str(tmp_path / f"chk-{ours}"))
            .start()
        )

    def log_of(ours: bool) -> dict[str, int]:
        meta = tmp_path / f"out-{ours}" / "_spark_metadata"
        return {
            m.name: len(m.read_text().splitlines()) - 1
            for m in meta.iterdir()
            if not m.name.startswith(".")
        }

    previous = spark.conf.get(conf, None)
    try:
        for interval, phase in ((3, batches[:4]), (5, batches[4:])):
            spark.conf.set(conf, str(interval))
            for ours in (False, True):
                query = start(ours)
                for rows in phase:
                    feeds[ours].add(rows)
                    query.processAllAvailable()
                query.stop()
        spark.conf.set(conf, "0")
        with pytest.raises(ConfigurationError, match="to a positive value"):
            start(True)
    finally:
        if previous is None:
            spark.conf.unset(conf)
        else:
            spark.conf.set(conf, previous)

    assert log_of(True) == log_of(False)
    assert {"2.compact", "5.compact"} <= set(log_of(True))  # every 3 batches, the first interval
    read = {ours: spark.read.parquet(str(tmp_path / f"out-{ours}")) for ours in (False, True)}
    assert normalize(read[True].collect()) == normalize(read[False].collect())
    assert read[True].count() == sum(len(rows) for rows in batches)
