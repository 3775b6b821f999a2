"""The state reader against Spark's own: the same query through Spark and through sparkstate,
then Spark's ``statestore`` source on Spark's checkpoint and ours on ours must return the same
key/value rows (after the last batch and after an earlier one), the same change feed, and the
same ``state-metadata`` rows.

Both queries read the same files with ``maxFilesPerTrigger=1`` and ``availableNow``, in two runs
(a stop and a restart between), so that they run the same batches. Every query runs on
sparkstate's RocksDB provider, and the aggregation on its memory provider too (the reader reads
each provider's files); one ``transformWithState`` query holds every kind of state variable and
timers.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType
from tests.store.conftest import S3Endpoint
from tests.store.conftest import s3_endpoint as s3_endpoint  # the loopback S3 server fixture

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.exceptions import ConfigurationError, MissingVersionError
from sparkstate.testing import FileFeed

from .helpers import spark_rocksdb

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long, ts timestamp"
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
#: Two runs of one file each; keys repeat within and across batches, and the watermark moves.
RUNS = [
    [
        [("a", 1, 0), ("b", 2, 10), ("a", 3, 20), ("a", 4, 70), ("c", 5, 80), ("b", 6, 90)],
    ],
    [
        # a's row at 10 s is late by then
        [("c", 7, 150), ("d", 8, 160), ("a", 9, 10), ("e", 10, 250), ("a", 11, 260)],
    ],
]
SPARK_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def _rows(batch: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    return [
        {"k": k, "v": v, "ts": (T0 + datetime.timedelta(seconds=s)).isoformat()}
        for k, v, s in batch
    ]


class Counter:
    """A ``StatefulProcessor`` with every kind of state: a count, the values seen, the values by
    their text, and an event-time timer per batch of a key, far in the future (2100), at a time
    that depends on the key's count."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))
        self.seen = handle.getListState("seen", StructType([StructField("v", LongType())]))
        self.named = handle.getMapState(
            "named",
            StructType([StructField("v", LongType())]),
            StructType([StructField("text", StringType())]),
        )

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:  # noqa: N802, N803
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            n += len(pdf)
            values = [int(v) for v in pdf["v"]]
            self.seen.appendList([(v,) for v in values])
            for v in values:
                self.named.updateValue((v,), (f"v{v}",))
        if n >= 3:
            self.named.clear()
        self.count.update((n,))
        self.handle.registerTimer(4_102_444_800_000 + n)
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self) -> None:
        pass


def _processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return type("CounterProcessor", (Counter, StatefulProcessor), {})()


def _count_rows(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    n = state.get[0] if state.exists else 0
    n += sum(len(pdf) for pdf in pdfs)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def _group_state(df: Any, fn: Any) -> Any:
    return df.groupBy("k").applyInPandasWithState(
        _count_rows, "k string, n long", "n long", "update", "NoTimeout"
    )


def _aggregate(df: Any, fn: Any) -> Any:
    return df.groupBy("k").agg(
        fn.count("*").alias("n"), fn.sum("v"), fn.avg("v"), fn.max("v"), fn.min("k")
    )


def _windows(df: Any, fn: Any) -> Any:
    return df.groupBy(fn.window("ts", "1 minute"), "k").agg(fn.count("*").alias("n"), fn.sum("v"))


def _sessions(df: Any, fn: Any) -> Any:
    return df.groupBy(fn.session_window("ts", "20 seconds"), "k").agg(
        fn.count("*").alias("n"), fn.sum("v")
    )


def _join(df: Any, fn: Any) -> Any:
    """The stream joined with itself read again: each row with the rows of its key in the
    minute after it."""
    right = (
        SparkSession.getActiveSession()
        .readStream.schema(SCHEMA)  # type: ignore[union-attr]
        .option("maxFilesPerTrigger", 1)
        .json(JOIN_INPUT[0])
        .selectExpr("k AS k2", "v AS v2", "ts AS ts2")
        .withWatermark("ts2", "30 seconds")
    )
    condition = "k = k2 AND ts2 >= ts AND ts2 <= ts + INTERVAL 1 MINUTE"
    return df.join(right, F.expr(condition), "inner")


#: Where the join's second input reads from (set by the fixture).
JOIN_INPUT: list[str] = []

#: name -> (build the query on a DataFrame, functions module -> query, output mode, watermark)
QUERIES: dict[str, tuple[Callable[[Any, Any], Any], str, bool]] = {
    "aggregate": (_aggregate, "update", False),
    "aggregate-memory": (_aggregate, "update", False),
    "join": (_join, "append", True),
    "applyInPandasWithState": (_group_state, "update", False),
    "windows": (_windows, "update", True),
    "sessions": (_sessions, "append", True),
    # two operators: the limit (operator 0) over the deduplication (operator 1)
    "dedup-limit": (lambda df, fn: df.dropDuplicates(["k"]).limit(4), "append", False),
    "dedup-watermark": (lambda df, fn: df.dropDuplicates(["k", "ts"]), "append", True),
    "dedup-within": (lambda df, fn: df.dropDuplicatesWithinWatermark(["k"]), "append", True),
    "transformWithState": (
        lambda df, fn: df.groupBy("k").transformWithStateInPandas(
            _processor(), "k string, n long", "update", "EventTime"
        ),
        "update",
        True,
    ),
}


def _plain(value: Any) -> Any:
    """Spark rows as nested tuples, maps as sorted item tuples, lists sorted."""
    if isinstance(value, Row):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((_plain(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(sorted((_plain(v) for v in value), key=repr))
    if isinstance(value, float):
        return round(value, 9)
    return value


#: Operators whose state partitions differ from Spark's, as (query, operatorId): ours shuffle a
#: window by its end and start columns, Spark's by the window struct, so a (window, key) may sit
#: in another partition. Spark's limit keeps its count in partition 0 (its one task), ours where
#: the null key hashes.
OWN_PARTITIONING = (("windows", 0), ("dedup-limit", 0))


def _collect(df: DataFrame, name: str = "", options: dict[str, Any] | None = None) -> list[Any]:
    if (name, int((options or {}).get("operatorId", 0))) in OWN_PARTITIONING:
        df = df.drop("partition_id")
    return sorted((_plain(r) for r in df.collect()), key=repr)


@pytest.fixture(scope="module")
def checkpoints(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each query run through Spark and through sparkstate (RocksDB), the same two runs."""
    root = tmp_path_factory.mktemp("reader")
    feed = FileFeed(root / "input")
    JOIN_INPUT[:] = [str(root / "input")]
    out: dict[str, Any] = {name: {} for name in QUERIES}
    spark.conf.set(SPARK_CHANGELOG, "true")
    try:
        with spark_rocksdb(spark):
            for run in RUNS:
                for batch in run:
                    feed.add(_rows(batch))
                for name, (build, mode, watermark) in QUERIES.items():
                    for system in ("spark", "ours"):
                        if system == "spark" and name.endswith("-memory"):  # Spark's is one
                            out[name]["spark"] = out[name.removesuffix("-memory")]["spark"]
                            continue
                        df = feed.stream(spark, SCHEMA)
                        if watermark:
                            df = df.withWatermark("ts", "30 seconds")
                        wrapped = df if system == "spark" else ss.stream(df)
                        chk = str(root / f"{name}-{system}")
                        writer = build(wrapped, F if system == "spark" else SF).writeStream
                        if system == "ours":
                            provider = "memory" if name.endswith("-memory") else "rocksdb"
                            writer = writer.option("stateStore", provider)
                        q = (
                            writer.outputMode(mode)
                            .format("noop")
                            .option("checkpointLocation", chk)
                            .trigger(availableNow=True)
                            .start()
                        )
                        q.awaitTermination()
                        out[name][system] = chk
    finally:
        spark.conf.unset(SPARK_CHANGELOG)
    return out


def _read(spark: SparkSession, chk: str, system: str, **options: Any) -> DataFrame:
    reader = spark.read.format("statestore" if system == "spark" else "sparkstate")
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load(chk)


@pytest.fixture(scope="module")
def metadata(spark: SparkSession, checkpoints: dict[str, Any]) -> dict[str, Any]:
    """Each checkpoint's ``state-metadata`` rows as Spark reads its own and ours reads ours:
    name -> system -> (schema, rows), read once for every test."""
    read: dict[str, Any] = {}  # by checkpoint: the two aggregations share Spark's
    for systems in checkpoints.values():
        for system, chk in systems.items():
            if chk not in read:
                source = "state-metadata" if system == "spark" else "sparkstate-metadata"
                df = spark.read.format(source).load(chk)
                read[chk] = (df.schema, [r.asDict() for r in df.collect()])
    return {
        name: {system: read[chk] for system, chk in systems.items()}
        for name, systems in checkpoints.items()
    }


def _last_batch(metadata: dict[str, Any], name: str, system: str) -> int:
    return int(metadata[name][system][1][0]["maxBatchId"])


READS: list[tuple[str, dict[str, Any]]] = [
    ("aggregate", {}),
    ("aggregate-memory", {}),
    ("join", {"joinSide": "left"}),
    ("join", {"joinSide": "right"}),
    ("join", {"storeName": "left-keyWithIndexToValue"}),
    ("join", {"storeName": "right-keyToNumValues"}),
    ("applyInPandasWithState", {}),
    ("windows", {}),
    ("sessions", {}),
    ("dedup-limit", {}),
    ("dedup-limit", {"operatorId": 1}),
    ("dedup-watermark", {}),
    ("dedup-within", {}),
    ("transformWithState", {"stateVarName": "count"}),
    ("transformWithState", {"stateVarName": "seen"}),
    ("transformWithState", {"stateVarName": "named"}),
    ("transformWithState", {"stateVarName": "seen", "flattenCollectionTypes": "false"}),
    ("transformWithState", {"stateVarName": "named", "flattenCollectionTypes": "false"}),
    ("transformWithState", {"readRegisteredTimers": "true"}),
]


def test_state_rows_equal_sparks(
    spark: SparkSession, checkpoints: dict[str, Any], metadata: dict[str, Any]
) -> None:
    """After the last batch and after batch 0 (the first run's), every query's state as Spark
    reads its own (the views that only reshape rows, after the last batch only)."""
    seen = 0
    for name, options in READS:
        spark_chk, ours_chk = checkpoints[name]["spark"], checkpoints[name]["ours"]
        last = _last_batch(metadata, name, "spark")
        assert _last_batch(metadata, name, "ours") == last, name  # the same batches ran
        reshaped = {"flattenCollectionTypes", "readRegisteredTimers"} & set(options)
        for batch in (None,) if reshaped else (None, 0):
            opts = dict(options) if batch is None else {**options, "batchId": batch}
            theirs = _read(spark, spark_chk, "spark", **opts)
            ours = _read(spark, ours_chk, "ours", **opts)
            assert ours.schema.names == theirs.schema.names, (name, opts)
            expected = _collect(theirs, name, opts)
            assert _collect(ours, name, opts) == expected, (name, opts)
            seen += len(expected)
    assert seen > 50  # the state is not empty


CHANGES: list[tuple[str, dict[str, Any]]] = [
    ("aggregate", {}),
    ("aggregate-memory", {}),
    ("windows", {}),
    ("dedup-limit", {"operatorId": 1}),
    ("dedup-within", {}),
    ("transformWithState", {"stateVarName": "count"}),
]


def test_change_feed_equals_sparks(
    spark: SparkSession, checkpoints: dict[str, Any], metadata: dict[str, Any]
) -> None:
    """The changes of every batch, and of a range that starts later, as Spark's feed has them."""
    for name, options in CHANGES:
        spark_chk, ours_chk = checkpoints[name]["spark"], checkpoints[name]["ours"]
        last = _last_batch(metadata, name, "spark")
        for start, end in ((0, last), (1, last)):
            opts = {
                **options,
                "readChangeFeed": "true",
                "changeStartBatchId": start,
                "changeEndBatchId": end,
            }
            theirs = _collect(_read(spark, spark_chk, "spark", **opts), name, opts)
            ours = _collect(_read(spark, ours_chk, "ours", **opts), name, opts)
            assert ours == theirs, (name, start, end)
            assert theirs, (name, start, end)


def test_metadata_equals_sparks(metadata: dict[str, Any]) -> None:
    for name in QUERIES:
        (their_schema, theirs), (our_schema, ours) = metadata[name]["spark"], metadata[name]["ours"]
        assert our_schema == their_schema
        expected = [dict(r) for r in theirs]
        found = [dict(r) for r in ours]
        if name == "transformWithState":  # Spark's Python processor in Spark: same variables
            assert found[0]["operatorProperties"] is not None
            for row in expected + found:
                row.pop("operatorProperties")
        assert found == expected, name


def test_bad_reads_say_what_to_do(spark: SparkSession, checkpoints: dict[str, Any]) -> None:
    chk = checkpoints["transformWithState"]["ours"]
    with pytest.raises(Exception, match="stateVarName"):
        _read(spark, chk, "ours").collect()
    with pytest.raises(Exception, match="no state variable 'nope'"):
        _read(spark, chk, "ours", stateVarName="nope").collect()
    agg = checkpoints["aggregate"]["ours"]
    with pytest.raises(Exception, match="batch 99 .* is not committed"):
        _read(spark, agg, "ours", batchId=99).collect()
    with pytest.raises(Exception, match="no stateful operator 3"):
        _read(spark, agg, "ours", operatorId=3).collect()
    with pytest.raises(Exception, match="needs changeStartBatchId"):
        _read(spark, agg, "ours", readChangeFeed="true").collect()
    with pytest.raises(Exception, match="unknown option 'batch'"):
        _read(spark, agg, "ours", batch=1).collect()
    join = checkpoints["join"]["ours"]
    with pytest.raises(Exception, match="pick one with .option.'joinSide'"):
        _read(spark, join, "ours").collect()
    with pytest.raises(Exception, match="option.'joinSide', 'left'"):
        _read(spark, join, "ours", storeName="left-keyToNothing").collect()
    with pytest.raises(Exception, match="statestore"):
        _read(spark, checkpoints["aggregate"]["spark"], "ours").collect()


def test_reader_without_spark(checkpoints: dict[str, Any]) -> None:
    """The reader core runs without a session (what ``inspect`` uses)."""
    from sparkstate.observe.reader import ReadRequest, StateReader

    reader = StateReader(ReadRequest(checkpoints["dedup-limit"]["ours"], operator_id=1))
    keys = sorted(
        k["k"]
        for p in range(reader.num_partitions)
        for b in reader.read(p)
        for k in b.column("key").to_pylist()
    )
    assert keys == ["a", "b", "c", "d", "e"]
    with pytest.raises(ConfigurationError, match="nothing does not exist"):
        StateReader(ReadRequest(str(Path(checkpoints["dedup-limit"]["ours"]) / "nothing")))
    with pytest.raises(ConfigurationError, match="not a sparkstate checkpoint"):
        StateReader(ReadRequest(str(Path(checkpoints["dedup-limit"]["ours"]).parent)))
    with pytest.raises(MissingVersionError, match="changes of batch|committed batches up to"):
        StateReader(
            ReadRequest(checkpoints["dedup-limit"]["ours"], change_feed=True, change_start=50)
        )


def _all_rows(reader: Any) -> list[Any]:
    return sorted(
        (
            tuple(str(v) for v in row.values())
            for p in range(reader.num_partitions)
            for batch in reader.read(p)
            for row in batch.to_pylist()
        ),
    )


def test_reader_on_s3(checkpoints: dict[str, Any], s3_endpoint: S3Endpoint) -> None:  # noqa: F811
    """A checkpoint on S3 reads as it did on the local disk: state, change feed, metadata."""
    from pyarrow import fs as pafs

    from sparkstate.files.durable import DurableDir
    from sparkstate.observe.reader import ReadRequest, StateReader, state_metadata

    for name, options in (("dedup-within", {}), ("transformWithState", {"stateVarName": "seen"})):
        local = checkpoints[name]["ours"]
        remote = s3_endpoint.uri(f"reader/{name}")
        target = DurableDir(remote)
        target.write_atomic(".keep", b"")
        pafs.copy_files(local, target.path, destination_filesystem=target.fs)
        for extra in ({}, {"readChangeFeed": "true", "changeStartBatchId": "1"}):
            opts = {**options, **extra}
            ours = _all_rows(StateReader(ReadRequest.from_options(opts, remote)))
            assert ours == _all_rows(StateReader(ReadRequest.from_options(opts, local)))
            assert ours, (name, opts)
        assert state_metadata(remote) == state_metadata(local)
