"""``initialState`` of transformWithState(InPandas) against Spark's own, batch by batch.

The initial state is applied in the query's first batch only: a key only in the initial state
keeps it until its first input, a key in both sees it before its input, and a restart from the
checkpoint does not apply it again. ``handleInitialState`` runs per row in rows mode and per
key's frame in pandas mode, so the processor counts its calls too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, same_schema, source, spark_rocksdb

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

SCHEMA = "k string, v long"
OUTPUT = "k string, count long, inits long"
INIT_SCHEMA = "name string, start long"
#: z is only in the initial state (until batch 1), with two rows; b is only in the stream.
INIT_ROWS = [("a", 10), ("z", 100), ("z", 5)]
BATCHES: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": 3}],
    [{"k": "z", "v": 4}],
    [{"k": "a", "v": 5}, {"k": "z", "v": 6}],  # the restarted run starts here
]
RESTART_AFTER = 2


def _processor_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class StartedCount(_processor_base()):  # type: ignore[misc]
    """A count per key that starts from the initial state's ``start`` values."""

    def __init__(self, pandas: bool) -> None:
        self.pandas = pandas

    def init(self, handle: Any) -> None:
        self._count = handle.getValueState("count", "count long, inits long")

    def _current(self) -> tuple[int, int]:
        current = self._count.get()
        return (int(current[0]), int(current[1])) if current is not None else (0, 0)

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802,N803
        n, inits = self._current()
        if isinstance(initialState, pd.DataFrame):
            n += int(initialState["start"].sum())
        else:
            n += int(initialState["start"])
        self._count.update((n, inits + 1))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        n, inits = self._current()
        for item in rows:
            n += len(item) if isinstance(item, pd.DataFrame) else 1
        self._count.update((n, inits))
        if self.pandas:
            yield pd.DataFrame({"k": [key[0]], "count": [n], "inits": [inits]})
        else:
            yield Row(k=key[0], count=n, inits=inits)

    def close(self) -> None:
        pass


def _initial(spark: SparkSession) -> Any:
    return spark.createDataFrame(INIT_ROWS, INIT_SCHEMA).groupBy("name")


def _apply(grouped: Any, pandas: bool, initial: Any, spark_side: bool = False) -> Any:
    api = grouped.transformWithStateInPandas if pandas else grouped.transformWithState
    return api(StartedCount(pandas), OUTPUT, "Update" if spark_side else "update", "None", initial)


def _run(
    feed: FileFeed,
    collector: Collector,
    start: Callable[[], Any],
    batches: list[list[dict[str, Any]]],
) -> None:
    query = start()
    try:
        for rows in batches:
            feed.add(rows)
            query.processAllAvailable()
    finally:
        query.stop()


def _writer(df: Any, checkpoint: Path, collector: Collector, **options: str) -> Any:
    writer = (
        df.writeStream.outputMode("update")
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
    )
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def _spark_run(spark: SparkSession, path: Path, pandas: bool) -> Collector:
    feed = FileFeed(path / "input")
    collector = Collector()
    with spark_rocksdb(spark):
        df = _apply(source(spark, feed, SCHEMA).groupBy("k"), pandas, _initial(spark), True)
        _run(feed, collector, lambda: _writer(df, path / "chk", collector), BATCHES)
    return collector


def _ours_run(
    spark: SparkSession, path: Path, pandas: bool, provider: str, restart: bool
) -> Collector:
    feed = FileFeed(path / "input")
    collector = Collector()
    parts = [BATCHES[:RESTART_AFTER], BATCHES[RESTART_AFTER:]] if restart else [BATCHES]
    for part in parts:  # a restart builds the query again, initial state included
        grouped = ss.stream(source(spark, feed, SCHEMA)).groupBy("k")
        planned = _apply(grouped, pandas, _initial(spark))
        start = lambda p=planned: _writer(p, path / "chk", collector, stateStore=provider)  # noqa: E731
        _run(feed, collector, start, part)
    return collector


def test_initial_state_matches_spark_tws(spark: SparkSession, tmp_path: Path) -> None:
    # pandas mode straight through; rows mode stopped and restarted on its checkpoint
    for pandas, provider, restart in ((True, PROVIDERS[0], False), (False, PROVIDERS[-1], True)):
        theirs = _spark_run(spark, tmp_path / f"spark-{pandas}", pandas)
        inits_z = 1 if pandas else 2  # per key's frame / per row
        assert theirs.batches == {
            0: [("a", 12, 1), ("b", 1, 0)],
            1: [("z", 106, inits_z)],
            2: [("a", 13, 1), ("z", 107, inits_z)],
        }, pandas
        ours = _ours_run(spark, tmp_path / f"ours-{pandas}", pandas, provider, restart)
        assert same_schema(ours.schema, theirs.schema)
        assert ours.batches == theirs.batches, (pandas, provider, restart)


def test_narrower_initial_state_keys_are_cast_to_the_stream_keys(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """An int key against a long stream key: both sides of a key meet in one partition."""
    keys = range(1, 9)
    initial = spark.createDataFrame([(i, 100 * i) for i in keys], "id int, start long")
    collector = Collector()
    grouped = ss.stream(source(spark, feed, "k long, v long")).groupBy("k")
    planned = grouped.transformWithState(
        StartedCount(False),
        "k long, count long, inits long",
        "update",
        "None",
        initial.groupBy("id"),
    )
    batches = [[{"k": i, "v": 0} for i in keys if i != 8], [{"k": 8, "v": 0}]]
    _run(feed, collector, lambda: _writer(planned, tmp_path / "chk", collector), batches)
    assert collector.batches == {
        0: [(i, 100 * i + 1, 1) for i in keys if i != 8],
        1: [(8, 801, 1)],
    }


def test_initial_state_errors(spark: SparkSession, feed: FileFeed, tmp_path: Path) -> None:
    feed.add([])
    grouped = ss.stream(source(spark, feed, SCHEMA)).groupBy("k")
    init = spark.createDataFrame(INIT_ROWS, INIT_SCHEMA)

    def start(initial: Any) -> None:
        planned = grouped.transformWithState(StartedCount(False), OUTPUT, "update", "None", initial)
        query = _writer(planned, tmp_path / "chk", Collector())
        query.stop()

    with pytest.raises(ConfigurationError, match="grouped batch DataFrame.*got DataFrame"):
        start(init)
    streaming: DataFrame = source(spark, feed, INIT_SCHEMA)
    with pytest.raises(ConfigurationError, match="batch DataFrame.*not a streaming one"):
        start(streaming.groupBy("name"))
    with pytest.raises(ConfigurationError, match="by column names"):
        start(init.groupBy(F.upper("name")))
    with pytest.raises(ConfigurationError, match="not rollup"):
        start(init.rollup("name"))
    with pytest.raises(ConfigurationError, match=r"grouped by \['name', 'start'\] but"):
        start(init.groupBy("name", "start"))
    with pytest.raises(ConfigurationError, match="key 'start' is bigint but.*'k' is string"):
        start(init.groupBy("start"))
