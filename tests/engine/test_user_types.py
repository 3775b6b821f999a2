"""What users' arbitrary-state functions receive and return, against Spark's own operators.

Each test runs one query as a PySpark user writes it, through Spark's ``applyInPandasWithState`` /
``transformWithStateInPandas`` / ``transformWithState`` and through ``ss.stream(...)`` with only
the input wrapped; the functions report what they were handed (pandas dtypes, Python types,
``ts.astype("int64") // 10**9`` as Spark's own tests compute it) and return timestamps built in
pandas, so both directions of the conversion are compared. The session time zone is not UTC
(``America/Los_Angeles``) for the whole module: a conversion that ignores it shows.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row, SparkSession
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

import sparkstate as ss
from sparkstate.engine.plan.arbitrary.user_state import SPARK_GROUP_STATES
from sparkstate.operators.arbitrary.group_state import GroupStateClock
from sparkstate.operators.arbitrary.state_errors import UnsupportedStateOperationError

from .conftest import FileFeed
from .helpers import Collector

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ZONE = "America/Los_Angeles"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"

SCHEMA = "k string, ts timestamp, n long, flag boolean, day date, amount decimal(10,2), raw binary"
#: Key "a" has no nulls, key "b" has some: PySpark types each group's frame on its own.
BATCHES: list[list[dict[str, Any]]] = [
    [
        {
            "k": "a",
            "ts": "2024-03-10 00:30:00",
            "n": 1,
            "flag": True,
            "day": "2024-03-10",
            "amount": "1.25",
            "raw": "eHk=",
        },
        {
            "k": "b",
            "ts": "2024-11-03 00:30:00",
            "n": None,
            "flag": None,
            "day": None,
            "amount": None,
            "raw": None,
        },
        {
            "k": "b",
            "ts": "2024-07-01 12:00:00.123456",
            "n": 7,
            "flag": False,
            "day": "2024-07-01",
            "amount": "3.50",
            "raw": "AAE=",
        },
    ],
    [
        {
            "k": "a",
            "ts": None,
            "n": 2,
            "flag": True,
            "day": "2024-01-01",
            "amount": "0.01",
            "raw": "eHk=",
        }
    ],
]
OUTPUT = "k string, kinds string, secs long, later timestamp"


@pytest.fixture(scope="module", autouse=True)
def session_zone(spark: SparkSession) -> Iterator[None]:
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    yield
    spark.conf.set("spark.sql.session.timeZone", previous)


@contextlib.contextmanager
def spark_rocksdb(spark: SparkSession) -> Iterator[None]:
    """Spark's transformWithState needs its RocksDB provider."""
    previous = spark.conf.get(PROVIDER_CONF, None)
    spark.conf.set(PROVIDER_CONF, ROCKSDB)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, previous)


# --- the user logic, identical for Spark and sparkstate ------------------------------------------


def kinds_of(pdf: pd.DataFrame) -> str:
    """Each column's dtype and the Python type of its first value."""
    return ";".join(
        f"{c}:{pdf[c].dtype}:{type(pdf[c].iloc[0]).__name__ if len(pdf) else '-'}"
        for c in pdf.columns
    )


def describe_frame(key: Any, pdf: pd.DataFrame) -> pd.DataFrame:
    """One row per input row: what the function saw, epoch seconds as Spark's tests compute
    them (wall clock in the session zone), and a timestamp built in pandas to send back."""
    secs = pdf["ts"].astype("int64") // 10**9
    return pd.DataFrame(
        {
            "k": [str(key[0])] * len(pdf),
            "kinds": [kinds_of(pdf)] * len(pdf),
            "secs": secs.where(pdf["ts"].notna(), None),
            "later": pdf["ts"] + pd.Timedelta(hours=1),
        }
    )


def seen_by_pandas(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[Any]:
    for pdf in pdfs:
        yield describe_frame(key, pdf)


class SeenByProcessor(StatefulProcessor):
    """``transformWithStateInPandas`` / ``transformWithState``: the same report, in both modes;
    ``handleInitialState`` keeps what it saw in a ValueState that the first input reports."""

    def init(self, handle: Any) -> None:
        self.initial = handle.getValueState("initial", "kinds string")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802,N803
        if isinstance(initialState, pd.DataFrame):
            self.initial.update((kinds_of(initialState),))
        else:
            self.initial.update((_row_kinds(initialState),))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        stored = self.initial.get()
        initial = stored[0] if stored is not None else ""
        for item in rows:
            if isinstance(item, pd.DataFrame):
                out = describe_frame(key, item)
                out["kinds"] = out["kinds"] + "|" + initial
                yield out
            else:
                ts = item["ts"]
                yield Row(
                    k=str(key[0]),
                    kinds=_row_kinds(item) + "|" + initial,
                    secs=None if ts is None else int(ts.timestamp()),
                    later=None if ts is None else ts.replace(tzinfo=None),
                )

    def close(self) -> None:
        pass


def _row_kinds(row: Any) -> str:
    out = []
    for name, value in row.asDict().items():
        zone = getattr(getattr(value, "tzinfo", None), "key", "")
        out.append(f"{name}:{type(value).__name__}:{zone}")
    return ";".join(out)


# --- running both sides ---------------------------------------------------------------------------


def _run(feed: FileFeed, start: Callable[[Collector], Any], batches: list[Any]) -> Collector:
    feed.reset()
    collector = Collector()
    query = start(collector)
    try:
        for rows in batches:
            feed.add(rows)
            query.processAllAvailable()
    finally:
        query.stop()
    return collector


def first_difference(ours: Collector, theirs: Collector) -> str:
    """The first output row that differs, in full (the reports are long strings)."""
    for batch in sorted(set(ours.batches) | set(theirs.batches)):
        mine, spark = ours.batches.get(batch, []), theirs.batches.get(batch, [])
        for a, b in zip(mine, spark, strict=False):
            if a != b:
                return f"batch {batch}:\n ours:  {a}\n spark: {b}"
        if len(mine) != len(spark):
            return f"batch {batch}: {len(mine)} rows, Spark's {len(spark)}"
    return ""


def _writer(df: Any, checkpoint: Path, collector: Collector) -> Any:
    return (
        df.writeStream.outputMode("update")
        .foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def _initial(spark: SparkSession) -> Any:
    rows = [("a", "2024-03-10 01:30:00", 5), ("c", None, None)]
    frame = spark.createDataFrame(rows, "k string, ts string, n long")
    return frame.selectExpr("k", "CAST(ts AS TIMESTAMP) AS ts", "n").groupBy("k")


# --- tests ----------------------------------------------------------------------------------------


def test_group_state_refusals_are_pysparks_runtime_errors() -> None:
    """PySpark's ``GroupState`` raises ``PySparkRuntimeError`` for the watermark of a query that
    has none and for a timeout its timeout conf does not allow; a ported function catches that
    class, so ours are of it too (and still sparkstate's own)."""
    clock = GroupStateClock(GroupStateTimeout.NoTimeout, 1000, -1, False, "applyInPandasWithState")
    for cls in SPARK_GROUP_STATES:
        state = cls(clock, None, 1)
        refused = (
            state.getCurrentWatermarkMs,
            lambda s=state: s.setTimeoutDuration(1000),
            lambda s=state: s.setTimeoutTimestamp(1000),
        )
        for call in refused:
            with pytest.raises(PySparkRuntimeError) as info:
                call()
            assert isinstance(info.value, UnsupportedStateOperationError)


def test_apply_in_pandas_with_state_sees_and_returns_what_spark_does(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def query(wrap: Callable[[Any], Any], name: str) -> Callable[[Collector], Any]:
        def start(c: Collector) -> Any:
            grouped = wrap(feed.stream(spark, SCHEMA)).groupBy("k")
            planned = grouped.applyInPandasWithState(
                seen_by_pandas, OUTPUT, "n long", "update", GroupStateTimeout.NoTimeout
            )
            return _writer(planned, tmp_path / name, c)

        return start

    theirs = _run(feed, query(lambda df: df, "spark"), BATCHES)
    ours = _run(feed, query(ss.stream, "ours"), BATCHES)
    assert ours.batches == theirs.batches, first_difference(ours, theirs)
    first = dict((r[0], r) for r in theirs.batches[0])
    assert "ts:datetime64[ns]:Timestamp" in first["a"][1]
    assert "n:int64" in first["a"][1] and "n:float64" in first["b"][1]


def test_transform_with_state_in_pandas_sees_what_spark_does_initial_state_included(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def query(wrap: Callable[[Any], Any], name: str) -> Callable[[Collector], Any]:
        def start(c: Collector) -> Any:
            grouped = wrap(feed.stream(spark, SCHEMA)).groupBy("k")
            planned = grouped.transformWithStateInPandas(
                statefulProcessor=SeenByProcessor(),
                outputStructType=OUTPUT,
                outputMode="Update",
                timeMode="None",
                initialState=_initial(spark),
            )
            return _writer(planned, tmp_path / name, c)

        return start

    with spark_rocksdb(spark):
        theirs = _run(feed, query(lambda df: df, "spark"), BATCHES)
    ours = _run(feed, query(ss.stream, "ours"), BATCHES)
    assert ours.batches == theirs.batches, first_difference(ours, theirs)
    assert any("|k:object:str;ts:datetime64[ns]" in r[1] for r in theirs.batches[0])


def test_transform_with_state_rows_see_what_spark_does(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def query(wrap: Callable[[Any], Any], name: str) -> Callable[[Collector], Any]:
        def start(c: Collector) -> Any:
            grouped = wrap(feed.stream(spark, SCHEMA)).groupBy("k")
            planned = grouped.transformWithState(
                SeenByProcessor(), OUTPUT, "Update", "None", initialState=_initial(spark)
            )
            return _writer(planned, tmp_path / name, c)

        return start

    with spark_rocksdb(spark):
        theirs = _run(feed, query(lambda df: df, "spark"), BATCHES)
    ours = _run(feed, query(ss.stream, "ours"), BATCHES)
    assert ours.batches == theirs.batches, first_difference(ours, theirs)
    assert any(f"ts:datetime:{ZONE}" in r[1] for r in theirs.batches[0])


def count_with_state_class(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[Any]:
    n = sum(len(pdf) for pdf in pdfs) + (int(state.get[0]) if state.exists else 0)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "count": [n], "pyspark": [isinstance(state, GroupState)]})


def test_group_by_a_column_and_the_state_is_pysparks_group_state(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def query(wrap: Callable[[Any], Any], name: str) -> Callable[[Collector], Any]:
        def start(c: Collector) -> Any:
            df = feed.stream(spark, SCHEMA)
            planned = (
                wrap(df)
                .groupBy(df["k"])
                .applyInPandasWithState(
                    count_with_state_class,
                    "k string, count long, pyspark boolean",
                    "n long",
                    "update",
                    GroupStateTimeout.NoTimeout,
                )
            )
            return _writer(planned, tmp_path / name, c)

        return start

    theirs = _run(feed, query(lambda df: df, "spark"), BATCHES)
    ours = _run(feed, query(ss.stream, "ours"), BATCHES)
    assert ours.batches == theirs.batches
    assert theirs.batches[1] == [("a", 2, True)]


def extra_column(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[Any]:
    for pdf in pdfs:
        yield pd.DataFrame({"k": [key[0]], "count": [len(pdf)], "extra": [1]})


def text_count(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[Any]:
    for _pdf in pdfs:
        yield pd.DataFrame({"k": [key[0]], "count": ["many"]})


def _failure(feed: FileFeed, start: Callable[[Collector], Any]) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark's and ours differ in class
        _run(feed, start, BATCHES[:1])
    return str(info.value)


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (extra_column, "RESULT_COLUMN_SCHEMA_MISMATCH"),
        (text_count, "column 'count'"),
    ],
)
def test_returned_frames_that_do_not_fit_fail_the_batch_as_in_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, func: Any, expected: str
) -> None:
    def query(wrap: Callable[[Any], Any], name: str) -> Callable[[Collector], Any]:
        def start(c: Collector) -> Any:
            grouped = wrap(feed.stream(spark, SCHEMA)).groupBy("k")
            planned = grouped.applyInPandasWithState(
                func, "k string, count long", "n long", "update", GroupStateTimeout.NoTimeout
            )
            return _writer(planned, tmp_path / name, c)

        return start

    assert expected in _failure(feed, query(lambda df: df, "spark"))
    assert expected in _failure(feed, query(ss.stream, "ours"))


class StaleAfterDelete(StatefulProcessor):
    """Keeps a ValueState obtained before ``deleteIfExists`` deleted it."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")
        handle.deleteIfExists("count")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        current = self.count.get()
        yield pd.DataFrame({"k": [key[0]], "count": [0 if current is None else current[0]]})

    def close(self) -> None:
        pass


def test_a_state_variable_used_after_delete_if_exists_fails_as_in_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    def query(wrap: Callable[[Any], Any], name: str) -> Callable[[Collector], Any]:
        def start(c: Collector) -> Any:
            grouped = wrap(feed.stream(spark, SCHEMA)).groupBy("k")
            planned = grouped.transformWithStateInPandas(
                StaleAfterDelete(), "k string, count long", "Update", "None"
            )
            return _writer(planned, tmp_path / name, c)

        return start

    expected = "Error getting value state: Value state count is not initialized."
    with spark_rocksdb(spark):
        assert expected in _failure(feed, query(lambda df: df, "spark"))
    assert expected in _failure(feed, query(ss.stream, "ours"))
