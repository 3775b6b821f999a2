"""What Spark's JVM sees of a wrapped query: the state operators of Spark's own run of the same
query, in the JVM query's ``lastProgress`` and ``recentProgress``, in the metrics system's gauges
(``spark.sql.streaming.metricsEnabled``) and in a JVM listener's events (Spark's UI listener,
``StreamingQueryStatusListener``, added on ``spark.streams`` as a Scala listener is); and Spark's
own progress, the query running on, where that rewrite fails."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.engine.spark import jvm_progress

from .helpers import FileFeed, at

SCHEMA = "k string, ts timestamp"
FILES = [
    [{"k": "a", "ts": at(1)}, {"k": "b", "ts": at(2)}],
    [{"k": "a", "ts": at(12)}, {"k": "c", "ts": at(13)}, {"k": "d", "ts": at(14)}],
    [{"k": "e", "ts": at(25)}],
]
IDLE_INTERVAL = "spark.sql.streaming.noDataProgressEventInterval"
FIELDS = ("numRowsTotal", "numRowsUpdated", "numRowsRemoved", "numRowsDroppedByWatermark")


class UiListener:
    """Spark's own JVM listener of its UI's Structured Streaming tab, over a store of its own:
    the progress events it kept, by run id."""

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        conf = spark.sparkContext._jsc.sc().conf()  # type: ignore[union-attr]
        store = jvm.org.apache.spark.status.ElementTrackingStore(
            jvm.org.apache.spark.util.kvstore.InMemoryStore(), conf
        )
        self.listener = jvm.org.apache.spark.sql.streaming.ui.StreamingQueryStatusListener(
            conf, store
        )
        self.status = jvm.org.apache.spark.sql.execution.ui.StreamingQueryStatusStore(store)

    def progress_of(self, run_id: str, batches: int) -> list[dict[str, Any]]:
        """The run's progress as the listener kept it, once it has ``batches`` batches' (an
        idle trigger's progress aside)."""
        deadline = time.monotonic() + 60
        while True:
            runs = self.status.allQueryUIData()
            kept = []
            for i in range(runs.length()):
                data = runs.apply(i)
                if str(data.summary().runId()) == run_id:
                    kept = [json.loads(p.json()) for p in data.recentProgress()]
            ran = sum(1 for p in kept if "addBatch" in p["durationMs"])
            if ran >= batches or time.monotonic() > deadline:
                return kept
            time.sleep(0.1)


@pytest.fixture(scope="module")
def ui(spark: SparkSession) -> Iterator[UiListener]:
    listener = UiListener(spark)
    streams = spark._jsparkSession.streams()
    streams.addListener(listener.listener)
    spark.conf.set("spark.sql.streaming.metricsEnabled", "true")
    spark.conf.set(IDLE_INTERVAL, "2s")  # Spark's progress of an idle trigger, 2 s after
    yield listener
    spark.conf.unset("spark.sql.streaming.metricsEnabled")
    spark.conf.unset(IDLE_INTERVAL)
    streams.removeListener(listener.listener)


def _run(spark: SparkSession, feed: FileFeed, tmp_path: Path, ours: bool) -> Any:
    df = feed.stream(spark, SCHEMA).withWatermark("ts", "5 seconds")
    counts = (ss.stream(df) if ours else df).groupBy(F.window("ts", "10 seconds"), "k").count()
    writer = counts.writeStream.outputMode("append").foreachBatch(lambda d, _: d.collect())
    handle = writer.option("checkpointLocation", str(tmp_path / f"chk-{ours}")).start()
    handle.processAllAvailable()
    return handle


def _shown(progress: list[dict[str, Any]]) -> list[Any]:
    return [
        (
            p["batchId"],
            [[op[f] for f in FIELDS] for op in p.get("stateOperators", [])],
            p["sink"]["description"],
            [s["description"] for s in p["sources"]],
            p.get("eventTime", {}),
        )
        for p in progress
    ]


def _ran(progress: Any) -> bool:
    """Whether a JVM progress is a batch's (an idle trigger's has no ``addBatch``)."""
    return "addBatch" in json.loads(progress.json())["durationMs"]


def _idle(jquery: Any) -> dict[str, Any]:
    """The newest progress of an idle trigger, once the state operators are on it (Spark's
    own query has them at once; ours a moment later, from our listener)."""
    deadline = time.monotonic() + 60
    while True:
        last = jquery.lastProgress()
        shown = json.loads(last.json()) if last is not None else {}
        if last is not None and not _ran(last) and shown.get("stateOperators"):
            return shown
        assert time.monotonic() < deadline, (
            f"no idle progress with state operators: {shown}",
            [
                (q["batchId"], q["numInputRows"], len(q["stateOperators"]), sorted(q["durationMs"]))
                for q in (json.loads(p.json()) for p in jquery.recentProgress())
            ],
        )
        time.sleep(0.2)


def test_jvm_sees_the_state_operators_of_spark_s_run(
    spark: SparkSession, ui: UiListener, tmp_path: Path
) -> None:
    """The JVM listener, the JVM query's progress and the metrics gauges show the wrapped
    query's state operators as Spark's run shows its own, batch by batch and in the progress
    of an idle trigger after them; the sink the user wrote, the user's sources only (not
    sparkstate's clock)."""
    feed = FileFeed(tmp_path / "input")
    for rows in FILES:
        feed.add(rows)
    seen: dict[bool, dict[str, Any]] = {}
    for ours in (False, True):
        handle = _run(spark, feed, tmp_path, ours)
        try:
            jquery = handle._jsq
            # Once an idle trigger's progress is out, no batch runs (a no-data batch after the
            # last file's may start after processAllAvailable() returned).
            idle = _idle(jquery)
            ran = [json.loads(p.json()) for p in jquery.recentProgress() if _ran(p)]
            heard = [  # the batches' (our listener has run before); idle triggers' aside
                p
                for p in ui.progress_of(str(handle.runId), len(ran))
                if "addBatch" in p["durationMs"]
            ]
            gauges = jquery.streamingQuery().streamMetrics().metricRegistry().getGauges()
            seen[ours] = {
                "listener": _shown(heard),
                "recentProgress": _shown(ran),
                "idle lastProgress": _shown([idle]),
                "states-rowsTotal": gauges.get("states-rowsTotal").getValue(),
            }
        finally:
            handle.stop()
    assert seen[True] == seen[False]
    assert len(seen[True]["listener"]) >= len(FILES)
    assert all(batch[1] for batch in seen[True]["listener"])  # the state operators on each


def test_a_failed_rewrite_leaves_spark_s_progress_and_the_query_runs_on(
    spark: SparkSession,
    ui: UiListener,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where the JVM's progress cannot be rewritten (here: Spark's parser fails), a warning is
    logged, the JVM keeps Spark's own progress, and the query's batches run as before."""

    def broken(self: Any, text: str) -> Any:
        message = "no parser"
        raise ValueError(message)

    monkeypatch.setattr(jvm_progress.ProgressRewriter, "_parse", broken)
    feed = FileFeed(tmp_path / "input")
    for rows in FILES:
        feed.add(rows)
    handle = _run(spark, feed, tmp_path, ours=True)
    try:
        batches = sum(1 for p in handle._jsq.recentProgress() if _ran(p))
        heard = ui.progress_of(str(handle.runId), batches)
        assert handle.isActive
    finally:
        handle.stop()
    assert [p["stateOperators"] for p in heard] == [[]] * batches  # Spark's own progress
    assert [p.stateOperators[0].numRowsTotal for p in handle.recentProgress][:3] == [2, 5, 6]
    assert "could not put sparkstate's progress on the JVM's" in caplog.text
