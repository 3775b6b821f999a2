"""A query restarted on its checkpoint with a state schema Spark refuses fails as Spark's does.

Spark's own run of each query and ours (only the input wrapped) are restarted on their
checkpoints with the same change: a grouping key's type, an aggregate's buffer (``sum`` to
``avg``), a ``dropDuplicates`` key, ``applyInPandasWithState``'s state. Both start; both fail in
the first batch; ``awaitTermination()``, ``processAllAvailable()`` and ``exception()`` raise an
exception of the same PySpark classes (``StreamingQueryException``) with the same condition
(``STREAM_FAILED``), SQLSTATE and parameters (the query's ``id`` and ``runId``, the ``message``
starting with the refusal's condition, ``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE`` or
``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``). Ours is still a ``SchemaMismatchError``, whose
``condition`` is that of the refusal and whose message is sparkstate's.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyspark.errors
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.exceptions import SchemaMismatchError

from .conftest import PROVIDERS, FileFeed

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k int, s string, v long"
FIRST = [{"k": 1, "s": "a", "v": 2}, {"k": 2, "s": "b", "v": 3}]
#: The input of the restarted query: a batch to plan, whose planning Spark's check is part of.
SECOND = [{"k": 1, "s": "c", "v": 4}]
KEY = "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
VALUE = "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"


def count_rows(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Any:
    """``applyInPandasWithState``: the rows of each key, counted in its state."""
    n = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def counted(state_schema: str) -> Callable[[DataFrame], DataFrame]:
    def build(df: DataFrame) -> DataFrame:
        grouped = df.groupBy("k")
        return grouped.applyInPandasWithState(  # type: ignore[no-any-return]
            count_rows, "k int, n long", state_schema, "update", "NoTimeout"
        )

    return build


@dataclasses.dataclass(frozen=True)
class Change:
    """A query (``before``) restarted as another (``after``) whose state Spark refuses with
    ``condition``; each is built over a DataFrame, Spark's input or the wrapped one."""

    name: str
    before: Callable[[DataFrame], DataFrame]
    after: Callable[[DataFrame], DataFrame]
    condition: str


CHANGES = [
    Change(
        "aggregation-key",
        lambda df: df.groupBy("k").agg(F.sum("v")),
        lambda df: df.groupBy("s").agg(F.sum("v")),
        KEY,
    ),
    Change(
        "aggregation-value",
        lambda df: df.groupBy("k").agg(F.sum("v")),
        lambda df: df.groupBy("k").agg(F.avg("v")),
        VALUE,
    ),
    Change(
        "dedup-key",
        lambda df: df.dropDuplicates(["k"]),
        lambda df: df.dropDuplicates(["s"]),
        KEY,
    ),
    Change("applyInPandasWithState", counted("n long"), counted("n string"), VALUE),
]


@dataclasses.dataclass
class Failure:
    """What a restarted query raised: from ``awaitTermination()``, then
    ``processAllAvailable()``, and what ``exception()`` returned; its id and run id."""

    awaited: BaseException
    processed: BaseException
    reported: Any
    query_id: str
    run_id: str


def restart_failure(spark: SparkSession, tmp: Path, change: Change, store: str | None) -> Failure:
    """``change.before`` over :data:`FIRST`, then ``change.after`` on its checkpoint over
    :data:`SECOND`: Spark's queries (``store`` None) or ours on ``store``."""
    feed = FileFeed(tmp / "input")
    feed.add(FIRST)

    def start(build: Callable[[DataFrame], DataFrame]) -> Any:
        df = feed.stream(spark, SCHEMA)
        query = build(df if store is None else ss.stream(df))
        writer = query.writeStream.outputMode("update").format("noop")
        writer = writer.option("checkpointLocation", str(tmp / "checkpoint"))
        if store is not None:
            writer = writer.option("stateStore", store)
        return writer.trigger(availableNow=True).start()

    assert start(change.before).awaitTermination(180)
    feed.add(SECOND)
    handle = start(change.after)  # Spark's check is in the batch's planning: start() passes
    with pytest.raises(Exception) as awaited:  # noqa: PT011 - the class is what is compared
        handle.awaitTermination(180)
    with pytest.raises(Exception) as processed:  # noqa: PT011
        handle.processAllAvailable()
    return Failure(
        awaited.value, processed.value, handle.exception(), str(handle.id), str(handle.runId)
    )


def pyspark_classes(exc: BaseException) -> set[str]:
    """The exception classes of ``pyspark.errors`` that ``exc`` is an instance of: what a
    PySpark user's ``except`` clauses catch it by."""
    classes = {name: getattr(pyspark.errors, name) for name in pyspark.errors.__all__}
    return {
        name
        for name, cls in classes.items()
        if isinstance(cls, type) and issubclass(cls, BaseException) and isinstance(exc, cls)
    }


def refused_condition(exc: Any) -> str | None:
    """The condition the ``message`` parameter of a ``STREAM_FAILED`` starts with."""
    found = re.match(r"\[([A-Z_]+)\]", exc.getMessageParameters()["message"])
    return found.group(1) if found else None


def spark_view(exc: Any) -> dict[str, Any]:
    """What a PySpark user's handler reads off a raised query failure."""
    parameters = exc.getMessageParameters()
    return {
        "classes": pyspark_classes(exc),
        "condition": exc.getCondition(),
        "sql_state": exc.getSqlState(),
        "parameters": sorted(parameters) if parameters is not None else None,
    }


@pytest.fixture(scope="module")
def spark_failures(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Failure]:
    """Spark's own failure of each change, run once for the module."""
    return {
        c.name: restart_failure(spark, tmp_path_factory.mktemp(f"spark-{c.name}"), c, None)
        for c in CHANGES
    }


@pytest.mark.parametrize("store", PROVIDERS)
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.name)
def test_a_refused_state_schema_fails_as_sparks_query_fails(
    spark: SparkSession,
    spark_failures: dict[str, Failure],
    tmp_path: Path,
    change: Change,
    store: str,
) -> None:
    theirs = spark_failures[change.name]
    ours = restart_failure(spark, tmp_path, change, store)
    for failure in (theirs, ours):
        for raised in (failure.awaited, failure.processed):
            assert spark_view(raised) == {
                "classes": {"PySparkException", "StreamingQueryException"},
                "condition": "STREAM_FAILED",
                "sql_state": "XXKST",
                "parameters": ["id", "message", "runId"],
            }
            parameters = raised.getMessageParameters()  # type: ignore[attr-defined]
            assert (parameters["id"], parameters["runId"]) == (failure.query_id, failure.run_id)
            assert refused_condition(raised) == change.condition, parameters["message"]
        # PySpark's exception() gives the failure without Spark's condition
        assert pyspark_classes(failure.reported) == {"PySparkException", "StreamingQueryException"}
        assert failure.reported.getCondition() is None
        assert f"[{change.condition}]" in str(failure.reported)
    for raised in (ours.awaited, ours.processed, ours.reported):
        assert isinstance(raised, SchemaMismatchError)
        assert raised.condition == change.condition
        assert str(raised).startswith(f"[{change.condition}] operator 0 (")
