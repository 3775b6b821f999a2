"""Small batches run their state from the driver (engine/run/direct_batch.py): the driver reads the
batch's input, sends each partition's rows to the state home that holds it and hands the output
to the sink. A run's first batch, a batch after a large one, a batch whose homes are gone and a
step that calls the user's code run through Spark's tasks; every batch's output is Spark's own
query's, through a restart, in a session whose time zone is not UTC."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.run.batch_job import engine_settings
from sparkstate.runtime import home_client
from sparkstate.testing import Collector, FileFeed

from .conftest import PARTITIONS, PROVIDERS
from .helpers import assert_same_as_spark, start_ours, start_spark
from .test_state_home import homes, jvm_pid

SCHEMA = "k string, ts timestamp, v double"
ZONE = "spark.sql.session.timeZone"

Build = Callable[[DataFrame, bool], Any]


def windowed(df: DataFrame, ours: bool) -> Any:
    df = df.withWatermark("ts", "5 seconds")
    if ours:
        return ss.stream(df).groupBy(SF.window("ts", "10 seconds"), "k").agg(SF.sum("v"))
    return df.groupBy(F.window("ts", "10 seconds"), "k").agg(F.sum("v"))


def joined(df: DataFrame, ours: bool) -> Any:
    """A left outer self-join of the stream in a time range: each row with the rows of its
    key up to 2 s around it, or alone once the watermark passed it."""
    df = (ss.stream(df) if ours else df).withWatermark("ts", "5 seconds")
    left = df.select(F.col("k").alias("lk"), F.col("ts").alias("lts"), F.col("v").alias("lv"))
    right = df.select(F.col("k").alias("rk"), F.col("ts").alias("rts"), F.col("v").alias("rv"))
    time_range = "lk = rk AND rts BETWEEN lts - INTERVAL 2 SECONDS AND lts + INTERVAL 2 SECONDS"
    return left.join(right, F.expr(time_range), "leftOuter")


def by_key(df: DataFrame, ours: bool) -> Any:
    return (ss.stream(df) if ours else df).groupBy("k").count()


def rows(i: int, keys: int = 3) -> list[dict[str, Any]]:
    """Batch ``i``: ``keys`` keys, two rows each, 10 s of event time on from ``10 i`` s (a late
    row from the third batch on)."""
    out = [
        {
            "k": f"k{j % keys}",
            "ts": f"2024-01-01 00:{i // 6:02d}:{(i % 6) * 10 + j % 10:02d}",
            "v": float(j) - 0.5,
        }
        for j in range(2 * keys)
    ]
    if i >= 2:
        out.append({"k": "k0", "ts": f"2024-01-01 00:00:0{i}", "v": -0.0})
    return out


def run(
    spark: SparkSession,
    tmp: Path,
    build: Build,
    files: list[list[dict[str, Any]]],
    provider: str | None,
    restart_after: int | None = None,
    on_batch: Callable[[int], None] = lambda i: None,
    mode: str = "update",
    **options: str,
) -> tuple[Collector, list[list[dict[str, Any]]]]:
    """``build``'s query, sparkstate's on ``provider`` or (None) Spark's, fed one file a batch,
    stopped and started again after ``restart_after`` files: what it delivered, and the
    progress of each run."""
    feed = FileFeed(tmp / "input")
    collector = Collector()
    progress: list[list[dict[str, Any]]] = []
    cut = len(files) if restart_after is None else restart_after
    for part in (files[:cut], files[cut:]):
        if not part:
            continue
        stream = build(feed.stream(spark, SCHEMA), provider is not None)
        if provider is None:
            query = start_spark(stream, mode, tmp / "chk", collector)
        else:
            query = start_ours(stream, mode, tmp / "chk", provider, collector, **options)
        try:
            for file in part:
                feed.add(file)
                query.processAllAvailable()
                on_batch(len(query.recentProgress))
        finally:
            progress.append([dict(p) for p in query.recentProgress])
            query.stop()
    return collector, progress


def direct(progress: list[dict[str, Any]]) -> list[bool]:
    """Per batch: whether its state ran from the driver."""
    return ["directState" in p["durationMs"] for p in progress]


@pytest.fixture
def los_angeles(spark: SparkSession) -> Iterator[None]:
    previous = spark.conf.get(ZONE)
    spark.conf.set(ZONE, "America/Los_Angeles")
    yield
    spark.conf.set(ZONE, previous)


@pytest.mark.versions  # every supported PySpark: the output made a local DataFrame
@pytest.mark.parametrize("provider", PROVIDERS)
def test_small_batches_run_their_state_from_the_driver_with_sparks_output(
    spark: SparkSession, tmp_path: Path, provider: str, los_angeles: None
) -> None:
    files = [rows(i) for i in range(6)]
    theirs, _ = run(spark, tmp_path / "spark", windowed, files, None, restart_after=3)
    ours, progress = run(spark, tmp_path / "ours", windowed, files, provider, restart_after=3)
    assert_same_as_spark(ours, theirs)
    # Each run's first batch goes through Spark (it starts the homes); every batch after it,
    # the no-data batches that evict windows included, from the driver.
    for each_run in progress:
        ran = direct(each_run)
        assert ran == [False] + [True] * (len(ran) - 1), ran
        # The progress tells the state as a Spark stage's tasks report it.
        assert all(p["stateOperators"][0]["numRowsTotal"] > 0 for p in each_run)
    assert sum(map(len, progress)) > len(files), "no batch without data ran"


@pytest.mark.versions
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_stream_joins_small_batches_run_from_the_driver_with_sparks_output(
    spark: SparkSession, tmp_path: Path, provider: str
) -> None:
    """Both sides' rows of a batch go to the partition of their key, as Spark's shuffle of
    each side sends them; matched rows, rows left alone when the watermark passes them and
    the state's eviction are Spark's, through a restart."""
    files = [rows(i) for i in range(6)]
    theirs, _ = run(spark, tmp_path / "spark", joined, files, None, 3, mode="append")
    ours, progress = run(spark, tmp_path / "ours", joined, files, provider, 3, mode="append")
    assert_same_as_spark(ours, theirs)
    for each_run in progress:
        ran = direct(each_run)
        assert ran == [False] + [True] * (len(ran) - 1), ran


@pytest.mark.versions
def test_the_users_session_stays_the_active_one_while_queries_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch's output becomes a DataFrame of the batch's session, Spark's clone of the
    user's with the settings of the query's start. With two queries' batches made at once, the
    session the user's code gets is its own at every moment, and after."""
    queries = []
    for i in range(2):
        source = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 20).load()
        counts = ss.stream(source).groupBy((F.col("value") % 5).alias("k")).count()
        writer = counts.writeStream.outputMode("update").format("noop")
        writer = writer.option("checkpointLocation", str(tmp_path / f"chk{i}"))
        queries.append(writer.trigger(processingTime="50 milliseconds").start())
    seen = []
    try:
        while min(sum(direct(q.recentProgress)) for q in queries) < 4:
            seen.append(SparkSession.getActiveSession())
            time.sleep(0.01)
    finally:
        for query in queries:
            query.stop()
    assert all(session is spark for session in seen), {id(s) for s in seen}
    assert SparkSession.getActiveSession() is spark
    assert SparkSession.builder.getOrCreate() is spark


def test_a_batch_after_a_large_one_runs_through_spark(spark: SparkSession, tmp_path: Path) -> None:
    sizes = [3, 3, 20, 3, 3]  # distinct keys a batch: the aggregate's input is one row a key
    files = [
        [{"k": f"b{b}k{j}", "ts": None, "v": 1.0} for j in range(n)] for b, n in enumerate(sizes)
    ]
    files[3].append({"k": "b2k0", "ts": None, "v": 1.0})  # a key of the large batch again
    theirs, _ = run(spark, tmp_path / "spark", by_key, files, None)
    ours, progress = run(
        spark, tmp_path / "ours", by_key, files, "rocksdb", **{"stateStore.direct_batch_rows": "5"}
    )
    assert_same_as_spark(ours, theirs)
    # The batch after 3 rows runs from the driver, the 20 rows too (they were not known before
    # they were read); the batch after those 20 runs through Spark.
    assert direct(progress[0]) == [False, True, True, False, True]


def test_a_batch_whose_homes_are_gone_runs_through_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    files = [rows(i) for i in range(5)]
    jvm = jvm_pid(spark)

    def kill_homes(batches_done: int) -> None:
        if batches_done == 2:
            for pid in homes(jvm):
                os.kill(pid, signal.SIGKILL)

    theirs, _ = run(spark, tmp_path / "spark", windowed, files, None)
    ours, progress = run(spark, tmp_path / "ours", windowed, files, "memory", on_batch=kill_homes)
    assert_same_as_spark(ours, theirs)
    ran = direct(progress[0])
    assert ran[:2] == [False, True], ran
    assert ran[2] is False, ran  # its homes killed before it: through Spark, which starts new ones
    assert all(ran[3:]), ran


def test_homes_that_never_answer_the_driver_leave_the_run_to_sparks_tasks(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """After the run's first two batches, the driver's connections to the homes go unanswered
    until they time out (a network that drops them): that batch and every later one go through
    Spark's tasks, which reach the homes from the executors, with Spark's output; the log says
    why. Waiting out the time again at every batch would cost each batch the wait."""
    files = [rows(i) for i in range(5)]
    tried: list[str] = []  # the driver's connections, each waited out
    tried_by_file: list[int] = []

    def unanswered(address: str, credentials: object = None) -> None:
        tried.append(address)
        time.sleep(home_client.OWNER_TIMEOUT_S)

    def drop_connections(batches_done: int) -> None:
        tried_by_file.append(len(tried))
        if batches_done == 2:
            monkeypatch.setattr(home_client, "OWNER_TIMEOUT_S", 0.5)
            monkeypatch.setattr(home_client, "connect_owner", unanswered)

    theirs, _ = run(spark, tmp_path / "spark", windowed, files, None)
    with caplog.at_level(logging.WARNING, logger="sparkstate.engine"):
        ours, progress = run(
            spark, tmp_path / "ours", windowed, files, "memory", on_batch=drop_connections
        )
    assert_same_as_spark(ours, theirs)
    ran = direct(progress[0])
    assert ran[:2] == [False, True], ran
    assert not any(ran[2:]), ran
    # The driver waited in one batch only, not again in the batches after it.
    assert tried_by_file[2] > 0, tried_by_file
    assert tried_by_file[2:] == [tried_by_file[2]] * 3, tried_by_file
    assert "run their state in Spark's tasks" in caplog.text


def test_off_every_batch_runs_through_spark(spark: SparkSession, tmp_path: Path) -> None:
    files = [rows(i) for i in range(3)]
    options = {"stateStore.direct_batch_rows": "0"}
    _, progress = run(spark, tmp_path, windowed, files, "memory", **options)
    assert not any(direct(progress[0]))


def test_a_step_that_calls_the_users_code_runs_in_sparks_tasks(
    spark: SparkSession, tmp_path: Path
) -> None:
    def count(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        n = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
        state.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def counted(df: DataFrame, ours: bool) -> Any:
        grouped = (ss.stream(df) if ours else df).groupBy("k")
        return grouped.applyInPandasWithState(
            count, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout
        )

    files = [rows(i) for i in range(3)]
    theirs, _ = run(spark, tmp_path / "spark", counted, files, None)
    ours, progress = run(spark, tmp_path / "ours", counted, files, "memory")
    assert_same_as_spark(ours, theirs)
    assert not any(direct(progress[0]))


def test_each_row_goes_to_the_state_partition_sparks_shuffle_gives_it(
    spark: SparkSession,
) -> None:
    """The driver's partition of a row, ``pmod(hash(keys), n)``, is the one Spark's shuffle by
    those keys gives it, for every kind of key a state is keyed by; grouped doubles (``-0.0``
    and ``0.0``, NaNs) are one key in one partition."""
    df = spark.sql(
        """
        SELECT CAST(id AS INT) AS i, id AS l, CAST(id % 7 AS STRING) AS s,
               CAST(id AS DOUBLE) / 3 AS d, CAST(id AS DECIMAL(20, 3)) AS dec,
               timestamp_seconds(id * 1000) AS ts,
               DATE_ADD(DATE'2024-01-01', CAST(id AS INT)) AS dt,
               id % 2 = 0 AS b, CAST(CAST(id AS STRING) AS BINARY) AS bin,
               named_struct('start', timestamp_seconds(id), 'end', timestamp_seconds(id + 9))
                 AS w,
               IF(id % 5 = 0, NULL, id) AS maybe
        FROM range(0, 200)
        """
    )
    keys = [
        ["i"],
        ["l"],
        ["s"],
        ["d"],
        ["dec"],
        ["ts"],
        ["dt"],
        ["b"],
        ["bin"],
        ["w", "s"],
        ["maybe"],
    ]
    with engine_settings(spark, PARTITIONS):  # no adaptive execution, as in a batch
        _assert_placed_as_spark(spark, df, keys)


def _assert_placed_as_spark(spark: SparkSession, df: DataFrame, keys: list[list[str]]) -> None:
    for cols in keys:
        shuffled = df.repartition(PARTITIONS, *cols).select(
            F.spark_partition_id().alias("spark"),
            F.pmod(F.hash(*cols), F.lit(PARTITIONS)).alias("ours"),
        )
        assert shuffled.where("spark != ours").count() == 0, cols
    doubles = spark.createDataFrame(
        [(0.0,), (-0.0,), (float("nan"),), (float("-nan"),), (1.5,)], "d double"
    )
    grouped = doubles.groupBy("d").count()
    assert grouped.count() == 3
    placed = grouped.select(
        F.spark_partition_id().alias("spark"),
        F.pmod(F.hash("d"), F.lit(PARTITIONS)).alias("ours"),
    )
    assert placed.where("spark != ours").count() == 0
