"""A ``transformWithStateInPandas`` query restarted with a changed ``ValueState`` schema: an added
nullable field reads old values with the field null; an incompatible change is refused as Spark
refuses it (``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``), naming the variable and both schemas; a
field widened from ``int`` to ``long`` is refused, or read widened, as Spark's own operator does
under each of its state encodings."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

import sparkstate as ss
from sparkstate.exceptions import SchemaMismatchError

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, run_batches, source, spark_rocksdb, start_ours, start_spark

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k string, v long"
OUTPUT = "k string, n long, note string"


class Counter(StatefulProcessor):
    """Counts rows per key in a ValueState of ``state_schema``; ``with_last`` also keeps the last
    value seen (a second, nullable field) and reports the one it read."""

    def __init__(self, state_schema: str, with_last: bool = False) -> None:
        self.state_schema = state_schema
        self.with_last = with_last

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", self.state_schema)

    def handleInputRows(  # noqa: N802 - PySpark's names
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        seen = sum(len(f) for f in frames)
        last_v = int(frames[-1]["v"].iloc[-1])
        if self.with_last:
            n, last = self.count.get() if self.count.exists() else (0, None)
            self.count.update((int(n) + seen, last_v))
            note = f"last={None if last is None or pd.isna(last) else int(last)}"
        else:
            n = self.count.get()[0] if self.count.exists() else 0
            self.count.update((int(n) + seen,))
            note = ""
        yield pd.DataFrame({"k": [key[0]], "n": [int(n) + seen], "note": [note]})

    def close(self) -> None:
        pass


def _start(
    spark: SparkSession, feed: FileFeed, chk: Path, processor: Counter, provider: str, c: Any
) -> Any:
    grouped = ss.stream(source(spark, feed, SCHEMA)).groupBy("k")
    planned = grouped.transformWithStateInPandas(processor, OUTPUT, "update", "None")
    return start_ours(planned, "update", chk, provider, c)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_added_nullable_field_reads_old_values_as_null(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    chk, collector = tmp_path / "chk", Collector()
    query = _start(spark, feed, chk, Counter("n long"), provider, collector)
    run_batches(feed, query, [[{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}]])
    query = _start(spark, feed, chk, Counter("n long, last long", True), provider, collector)
    run_batches(feed, query, [[{"k": "a", "v": 4}, {"k": "c", "v": 5}], [{"k": "a", "v": 6}]])
    assert collector.batches == {
        0: [("a", 2, ""), ("b", 1, "")],
        1: [("a", 3, "last=None"), ("c", 1, "last=None")],
        2: [("a", 4, "last=4")],
    }


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_incompatible_value_schema_is_refused(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, provider: str
) -> None:
    chk, collector = tmp_path / "chk", Collector()
    query = _start(spark, feed, chk, Counter("n long"), provider, collector)
    run_batches(feed, query, [[{"k": "a", "v": 1}]])
    pattern = (
        r"STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE.*state variable 'count'.*"
        r"\[n: int64\].*\[s: string\]"
    )
    feed.add([{"k": "a", "v": 2}])
    query = _start(spark, feed, chk, Counter("s string"), provider, Collector())
    with pytest.raises(SchemaMismatchError, match=pattern):  # the first batch fails, as Spark's
        query.processAllAvailable()
    query.stop()
    query = _start(spark, feed, chk, Counter("n long"), provider, collector)  # the original runs
    query.processAllAvailable()
    query.stop()
    assert collector.batches[1] == [("a", 2, "")]


ENCODING = "spark.sql.streaming.stateStore.encodingFormat"


def _widened_run(
    spark: SparkSession, feed: FileFeed, chk: Path, wrap: bool, provider: str
) -> tuple[Collector, str | None]:
    """``n int`` for one batch, then ``n long`` for another: the batches, and the error of the
    restart (None if it ran)."""
    collector = Collector()

    def start(schema: str) -> Any:
        df = source(spark, feed, SCHEMA)
        grouped = (ss.stream(df) if wrap else df).groupBy("k")
        planned = grouped.transformWithStateInPandas(Counter(schema), OUTPUT, "update", "None")
        if wrap:
            return start_ours(planned, "update", chk, provider, collector)
        return start_spark(planned, "update", chk, collector)

    with spark_rocksdb(spark, not wrap):
        run_batches(feed, start("n int"), [[{"k": "a", "v": 1}, {"k": "a", "v": 2}]])
        try:
            run_batches(feed, start("n long"), [[{"k": "a", "v": 3}, {"k": "b", "v": 4}]])
        except Exception as exc:  # noqa: BLE001 - both fail in the batch
            return collector, str(exc)
    return collector, None


@pytest.mark.parametrize("encoding", ["unsaferow", "avro"])
def test_a_widened_field_as_spark_takes_it_under_each_encoding(
    spark: SparkSession, tmp_path: Path, encoding: str
) -> None:
    """Under Spark's default encoding an ``int`` state field widened to ``long`` is refused;
    under its Avro encoding the stored count is read as a long and goes on."""
    previous = spark.conf.get(ENCODING, None)
    spark.conf.set(ENCODING, encoding)
    try:
        theirs, their_error = _widened_run(
            spark, FileFeed(tmp_path / "spark-in"), tmp_path / "spark", False, "spark"
        )
        for provider in PROVIDERS:
            feed = FileFeed(tmp_path / f"{provider}-in")
            ours, error = _widened_run(spark, feed, tmp_path / provider, True, provider)
            if encoding == "unsaferow":
                for message in (their_error, error):
                    assert message is not None
                    assert "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE]" in message, message
                assert "'n' changed type from int32 to int64" in str(error)
            else:
                assert (their_error, error) == (None, None)
                expected = {0: [("a", 2, "")], 1: [("a", 3, ""), ("b", 1, "")]}
                assert theirs.batches == expected
                assert ours.batches == expected
    finally:
        if previous is None:
            spark.conf.unset(ENCODING)
        else:
            spark.conf.set(ENCODING, previous)
