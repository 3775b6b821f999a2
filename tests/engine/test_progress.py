"""A query's progress as PySpark hands it out: ``StreamingQueryProgress`` objects (attributes,
keys, ``json``) on the handle and in the events given to listeners, as Spark's own query's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryProgressEvent,
    StateOperatorProgress,
    StreamingQueryProgress,
)

import sparkstate as ss
from sparkstate import functions as SF

from .conftest import FileFeed
from .helpers import run_batches, source

BATCHES = [[{"k": "a"}, {"k": "b"}], [{"k": "a"}, {"k": "c"}, {"k": "d"}]]


class Received(StreamingQueryListener):
    """A PySpark listener, as a user writes one."""

    def __init__(self) -> None:
        self.events: list[QueryProgressEvent] = []

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - PySpark's name
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
        self.events.append(event)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def _seen(q: Any) -> list[Any]:
    last = q.lastProgress
    op = last.stateOperators[0]
    return [
        type(last),
        type(op),
        last.batchId,
        last["batchId"],
        op.operatorName,
        op.numRowsTotal,
        op.numRowsUpdated,
        last["stateOperators"][0]["numRowsTotal"],
        json.loads(last.json)["stateOperators"][0]["numRowsTotal"],
        json.loads(last.prettyJson)["batchId"],
        last.numInputRows,
        last.sink.numOutputRows,
        str(last.id) == last["id"],
        [p.batchId for p in q.recentProgress],
    ]


def test_progress_is_pysparks_object_as_for_sparks_own_query(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    theirs: list[list[Any]] = []
    q = (
        source(spark, feed, "k string")
        .groupBy("k")
        .agg(F.count("*").alias("n"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "spark"))
        .start()
    )
    run_batches(feed, q, BATCHES, on_batch=lambda _: theirs.append(_seen(q)))
    feed.reset()
    listener = Received()
    ss.add_listener(listener)
    ours: list[list[Any]] = []
    try:
        q = (
            ss.stream(source(spark, feed, "k string"))
            .groupBy("k")
            .agg(SF.count("*").alias("n"))
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(tmp_path / "ours"))
            .start()
        )
        run_batches(feed, q, BATCHES, on_batch=lambda _: ours.append(_seen(q)))
    finally:
        ss.remove_listener(listener)
    assert ours == theirs
    assert theirs[-1][:2] == [StreamingQueryProgress, StateOperatorProgress]
    assert theirs[-1][5] == 4  # four keys in state after the second batch
    mine = [e for e in listener.events if e.progress.id == q.lastProgress.id]
    assert [type(e) for e in mine] == [QueryProgressEvent] * 2
    assert [e.progress.stateOperators[0].numRowsTotal for e in mine] == [2, 4]
    assert "customMetrics" in mine[-1].progress.stateOperators[0]
