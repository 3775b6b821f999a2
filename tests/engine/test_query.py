"""The query handle: triggers, termination, failures, maintenance; the public API surface."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.plan.aggregate.plan import AggregateStep
from sparkstate.engine.plan.chain import plan_stages
from sparkstate.engine.run.driver import BatchDriver, DriverConfig
from sparkstate.engine.run.sinks import ForeachBatchSink
from sparkstate.engine.spark.conf import store_options_from_spark
from sparkstate.runtime.logs import CheckpointLog
from sparkstate.runtime.providers import StoreSettings
from sparkstate.store import StoreConf

from .conftest import FileFeed
from .helpers import Collector, normalize, source

SCHEMA = "k string, v long"


def test_public_api_is_sorted_and_importable() -> None:
    assert list(ss.__all__) == sorted(ss.__all__)
    for name in ss.__all__:
        assert getattr(ss, name) is not None
    assert SF.mean is SF.avg
    assert repr(SF.sum("v").alias("t")) == "sum('v').alias('t')"


def test_available_now_runs_to_the_end_and_frees_the_checkpoint(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    collector = Collector()

    def start() -> Any:
        return (
            ss.stream(source(spark, feed, SCHEMA))
            .groupBy("k")
            .agg(SF.sum("v").alias("total"))
            .writeStream.outputMode("complete")
            .foreachBatch(collector)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .option("stateStore.min_deltas_for_snapshot", "2")
            .option("stateStore.maintenanceIntervalSeconds", "0")
            .trigger(availableNow=True)
            .start()
        )

    feed.add([{"k": "a", "v": 1}])
    feed.add([{"k": "a", "v": 2}, {"k": "b", "v": 5}])
    feed.add([{"k": "b", "v": 1}])
    q = start()
    q.awaitTermination(120)
    assert not q.isActive
    assert collector.batches[2] == [("a", 3), ("b", 6)]
    feed.add([{"k": "c", "v": 7}])
    q = start()  # the first query ended by itself: its checkpoint is free again
    q.awaitTermination(120)
    assert collector.batches[3] == [("a", 3), ("b", 6), ("c", 7)]
    state = tmp_path / "chk" / "sparkstate" / "state" / "0"
    assert list(state.rglob("*.snapshot")), "maintenance took no snapshot"


def test_a_stopped_query_leaves_nothing_of_itself_in_the_process(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """A driver that starts and stops many queries: once stopped and dropped, a query's driver
    (its plans, operators and state settings) is freed, though Spark's JVM keeps the function
    its ``foreachBatch`` was given for as long as it keeps the stopped query."""
    feed.add([{"k": "a", "v": 1}])
    drivers = []
    for run in range(3):
        q = (
            ss.stream(source(spark, feed, SCHEMA))
            .groupBy("k")
            .agg(SF.sum("v").alias("total"))
            .writeStream.outputMode("update")
            .foreachBatch(Collector())
            .option("checkpointLocation", str(tmp_path / f"chk{run}"))
            .start()
        )
        q.processAllAvailable()
        q.stop()
        drivers.append(weakref.ref(q._driver))  # noqa: SLF001 - what the handle holds
        del q
    gc.collect()
    assert [d() for d in drivers] == [None, None, None]


def test_a_failing_batch_fails_the_query_with_a_clear_message(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    q = (
        ss.stream(source(spark, feed, SCHEMA))
        .groupBy("k")
        .agg(SF.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .format("memory")
        .queryName("overflowing")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    feed.add([{"k": "a", "v": 2**62}])
    q.processAllAvailable()
    feed.add([{"k": "a", "v": 2**62}, {"k": "a", "v": 2**62 - 1}])
    with pytest.raises(StreamingQueryException, match="overflowed int64"):
        q.processAllAvailable()
    assert q.exception() is not None and not q.isActive
    q.stop()
    assert normalize(spark.table("overflowing").collect()) == [("a", 2**62)]


def test_partitions_spark_runs_no_task_for_are_still_committed(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An input Spark knows to be empty gets no tasks at all; the state still moves on."""
    stages = plan_stages(
        source(spark, feed, SCHEMA), [AggregateStep(("k",), (SF.sum("v"),))], "update", None
    )
    collector = Collector()
    log = CheckpointLog(str(tmp_path / "chk"))
    store = StoreSettings(str(tmp_path / "chk"), "memory", StoreConf(num_partitions=4))
    config = DriverConfig("q", None, "update", 4, store, run_id="r")
    driver = BatchDriver(config, stages, ForeachBatchSink(collector), log, lambda p: None)
    empty = spark.createDataFrame([("a", 1)], SCHEMA).where("false")  # a LocalTableScan <empty>
    driver.run_batch(empty, 0)
    driver.run_batch(spark.createDataFrame([("a", 1)], SCHEMA), 1)
    assert "committing untouched partitions" in caplog.text
    assert collector.batches == {0: [], 1: [("a", 1)]}
    deltas = sorted(p.name.split("_")[0] for p in (tmp_path / "chk" / "state").rglob("*.delta"))
    assert deltas == ["1"] * 4 + ["2"] * 4


def test_the_store_takes_the_spark_state_store_settings_the_session_sets(
    spark: SparkSession,
) -> None:
    """Only a setting the session sets counts, not Spark's default of one it leaves unset."""
    name = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
    assert store_options_from_spark(spark) == {}  # Spark's default (10) is not a setting
    spark.conf.set(name, "3")
    try:
        assert store_options_from_spark(spark) == {"min_deltas_for_snapshot": "3"}
    finally:
        spark.conf.unset(name)
