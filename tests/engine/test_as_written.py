"""Queries as PySpark users write them, with only the input wrapped: the same batches as Spark's
own run of the same query, across a restart.

Aggregates inside and around expressions (``F.sum(F.col("v") * 2)``, ``F.round(F.avg("v"), 2)``,
``F.sum("v") / F.count("v")``, ``F.expr("sum(v) FILTER (WHERE v > 2)")``, ...) are read off
Spark's analyzed plan: the operator merges the aggregate functions inside, Spark evaluates the
expressions around them (engine/plan/aggregate/analysis.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.spark.errors import SparkAnalysisError

from .conftest import PROVIDERS
from .helpers import Collector, Differential, FileFeed, SparkRuns, at, run_available

SCHEMA = "k string, v long, d double, ts timestamp"


def row(k: str, v: int | None, d: float | None, t: int) -> dict[str, Any]:
    return {"k": k, "v": v, "d": d, "ts": at(t)}


FILES = [
    [row("a", 1, 0.5, 1), row("a", 7, 2.0, 2), row("b", 3, None, 3), row("c", None, 1.0, 4)],
    [row("a", 4, 1.5, 12), row("b", None, 2.5, 14), row("b", 6, 0.25, 15)],
    # a restart on the checkpoint here
    [row("c", 9, 3.0, 25), row("a", 2, 4.0, 26), row("d", 5, None, 27)],
    [row("b", 8, 1.0, 41), row("d", 1, 2.0, 42)],
]


def expressions(fn: Any) -> list[Any]:
    """The aggregates of the update-mode query: the issue's shapes, beside a plain aggregate
    written with ``fn`` (PySpark's, or SF on our side)."""
    return [
        fn.count("*").alias("n"),
        F.sum(F.col("v") * 2),
        F.round(F.avg("v"), 2),
        (F.sum("v") / F.count("v")).alias("mean"),
        F.size(F.collect_set("v")),
        F.count_if(F.col("v") > 5),
        F.max(F.when(F.col("v") > 3, F.col("v"))),
        F.max("v").cast("string"),
        F.expr("sum(v) FILTER (WHERE v > 2)"),
        F.expr("count(*) FILTER (WHERE d > 1)"),
        (F.max("v") - F.min("v") + F.sum("v")).alias("spread_plus_sum"),
        F.first(F.upper("k")),
        F.coalesce(F.max("d"), F.lit(-1.0)).alias("top_d"),
    ]


def update_case() -> Differential:
    def build(df: DataFrame, ours: bool) -> Any:
        return (ss.stream(df) if ours else df).groupBy("k").agg(*expressions(SF if ours else F))

    return Differential("expressions-update", SCHEMA, FILES, "update", build)


def append_case() -> Differential:
    """A windowed aggregation in append mode, expressions over its aggregates, and steps after
    it, as a user writes them."""

    def build(df: DataFrame, ours: bool) -> Any:
        df = df.withWatermark("ts", "5 seconds")
        grouped = (ss.stream(df) if ours else df).groupBy(F.window("ts", "10 seconds"), "k")
        out = grouped.agg(
            F.round(F.avg("v"), 1).alias("avg_v"),
            (F.sum("v") / F.count("v")).alias("mean"),
            F.expr("count(*) FILTER (WHERE v > 2)").alias("big"),
        )
        return out.where(F.col("big") >= 0).withColumn("twice", F.col("avg_v") * 2)

    return Differential("expressions-append", SCHEMA, FILES, "append", build)


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_aggregates_in_expressions_match_spark(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path, provider: str
) -> None:
    """Every shape of the issue in one ``agg()``, in update mode: Spark's names, types and rows,
    batch by batch, across a restart (the operator's own names for the aggregates inside stay
    those of the checkpoint)."""
    case = update_case()
    ours, _ = spark_runs.check(case, tmp_path, provider)
    expected = spark_runs.of(case).batches
    assert any(len(rows) > 1 for rows in expected.values())
    assert ours.schema is not None and "round(avg(v), 2)" in ours.schema.names


def test_expressions_over_a_windowed_aggregation_in_append_mode(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path
) -> None:
    """Windows closed by the watermark, with expressions over their aggregates and the steps a
    user writes after them: Spark's batches."""
    case = append_case()
    ours, _ = spark_runs.check(case, tmp_path, PROVIDERS[-1])
    assert sum(len(rows) for rows in ours.batches.values()) >= 5


def projected_case(name: str, mode: str) -> Differential:
    """A projection before the aggregation drops the watermarked column: the event time lives
    on in a window struct, an alias of the column's own name, or nowhere (Spark's watermark is
    still the largest event time read, and its no-data batches follow it)."""
    shapes = {
        "window-alias": lambda df: (
            df.select(F.window("ts", "10 seconds").alias("ts"), "k", "v")
            .groupBy("ts", "k")
            .agg(F.sum("v").alias("total"))
        ),
        "session-alias": lambda df: (
            df.select(F.session_window("ts", "5 seconds").alias("s"), "k").groupBy("s", "k").count()
        ),
        "dropped": lambda df: df.select("k", "v").groupBy("k").agg(F.max("v")),
    }

    def build(df: DataFrame, ours: bool) -> Any:
        df = df.withWatermark("ts", "5 seconds")
        return shapes[name](ss.stream(df) if ours else df)

    return Differential(f"{name}-{mode}", SCHEMA, FILES, mode, build)


@pytest.mark.parametrize(
    ("name", "mode", "provider"),
    [
        ("window-alias", "append", PROVIDERS[-1]),
        ("session-alias", "append", PROVIDERS[0]),
        ("dropped", "update", PROVIDERS[0]),
    ],
)
def test_a_projection_before_the_aggregation_keeps_spark_s_watermark(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path, name: str, mode: str, provider: str
) -> None:
    """``select(F.window("ts", ...).alias("ts"), ...).groupBy("ts", ...)`` and its kin: Spark's
    batches, windows closed by the watermark, no-data batches included."""
    case = projected_case(name, mode)
    ours, _ = spark_runs.check(case, tmp_path, provider)
    assert sum(len(rows) for rows in ours.batches.values()) >= 3


class ProgressEvents(StreamingQueryListener):
    """A user's listener, added with ``spark.streams.addListener``: the progress of every
    batch of every query, by run id."""

    def __init__(self) -> None:
        self.runs: dict[str, list[dict[str, Any]]] = {}

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - PySpark's names
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = json.loads(event.progress.json)
        self.runs.setdefault(progress["runId"], []).append(progress)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass

    def of(self, query: Any) -> list[dict[str, Any]]:
        """The query's progress events, once as many have come as it ran batches."""
        wanted = len(query.recentProgress)
        deadline = time.monotonic() + 30
        while len(self.runs.get(str(query.runId), [])) < wanted and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.runs.get(str(query.runId), [])


def test_spark_s_own_listeners_see_the_state_operators_as_in_spark_s_run(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's ``StreamingQueryListener`` sees, for the wrapped query, the state operators'
    counts of Spark's own run, batch by batch, the sink the user wrote and the user's sources
    only (not sparkstate's clock). The started query is PySpark's ``StreamingQuery``, whose
    ``explain()`` prints Spark's plan of what it runs, and sparkstate's operators."""
    listener = ProgressEvents()
    spark.streams.addListener(listener)
    feed = FileFeed(tmp_path / "input")
    for rows in FILES:
        feed.add(rows)
    seen = {}
    try:
        for ours in (False, True):
            df = feed.stream(spark, SCHEMA).withWatermark("ts", "5 seconds")
            counts = (ss.stream(df) if ours else df).groupBy(F.window("ts", "10 seconds")).count()
            writer = counts.writeStream.outputMode("append").foreachBatch(lambda d, _: d.collect())
            writer = writer.option("checkpointLocation", str(tmp_path / f"chk-{ours}"))
            handle = run_available(writer, "listened")
            seen[ours] = listener.of(handle)
            assert isinstance(handle, StreamingQuery)  # PySpark's, wrapped or not
            handle.explain()
            shown = capsys.readouterr().out
            assert "== Physical Plan ==" in shown  # Spark's plan of what it runs
            assert ("op 0: aggregate" in shown) == ours  # and sparkstate's operators
    finally:
        spark.streams.removeListener(listener)
    fields = ("numRowsTotal", "numRowsUpdated", "numRowsRemoved", "numRowsDroppedByWatermark")

    def shown(events: list[dict[str, Any]]) -> list[Any]:
        return [
            (
                p["batchId"],
                [[op[f] for f in fields] for op in p.get("stateOperators", [])],
                p["sink"]["description"],
                [s["description"] for s in p["sources"]],
            )
            for p in events
        ]

    assert shown(seen[True]) == shown(seen[False])
    assert len(seen[True]) >= len(FILES) and all(p["stateOperators"] for p in seen[True])


#: Queries keyed by collated strings, as a user writes them: Spark keeps state by a key's bytes,
#: so it refuses every collation but UTF8_BINARY in a state key (at the first batch).
COLLATED: dict[str, Any] = {
    "count-lcase": lambda df: df.groupBy(F.collate("k", "UTF8_LCASE").alias("k")).count(),
    "dedup-ci": lambda df: df.withColumn("k", F.collate("k", "UNICODE_CI")).dropDuplicates(["k"]),
    "window-rtrim": lambda df: (
        df.withWatermark("ts", "5 seconds")
        .groupBy(F.window("ts", "10 seconds"), F.collate("k", "UTF8_BINARY_RTRIM").alias("k"))
        .agg(F.sum("v"))
    ),
    "count-binary": lambda df: df.groupBy(F.collate("k", "UTF8_BINARY").alias("k")).count(),
}


@pytest.mark.parametrize("name", list(COLLATED))
def test_collated_string_keys_are_refused_as_spark_refuses_them(
    spark: SparkSession, tmp_path: Path, name: str
) -> None:
    """Where Spark's query fails (a collated key of an aggregation, of a window's aggregation,
    of a deduplication), ours fails at ``start()`` with Spark's condition, before it touches
    the checkpoint; where Spark's runs (UTF8_BINARY), ours delivers Spark's batch."""
    feed = FileFeed(tmp_path / "input")
    feed.add([row("Abc", 1, None, 1), row("abc", 2, None, 2), row("Abc ", 3, None, 3)])

    def writer(ours: bool, collector: Collector) -> Any:
        df = feed.stream(spark, SCHEMA)
        query = COLLATED[name](ss.stream(df) if ours else df)
        out = query.writeStream.outputMode("update").foreachBatch(collector)
        return out.option("checkpointLocation", str(tmp_path / f"checkpoint-{ours}"))

    theirs, ours = Collector(), Collector()
    try:
        run_available(writer(False, theirs), name)
    except StreamingQueryException as failure:
        with pytest.raises(SparkAnalysisError) as refused:
            writer(True, ours).start()
        error = refused.value
        assert f"[{error.getCondition()}]" in str(failure)
        assert f"SQLSTATE: {error.getSqlState()}" in str(failure)
        # The key's collations as Spark names them (the key's column names are Spark's own).
        collations = re.findall(r'"(?:spark|icu)\.\w+"', error.getMessageParameters()["schema"])
        assert collations and all(c in str(failure) for c in collations)
        assert not (tmp_path / "checkpoint-True").exists()
        assert name != "count-binary"
        return
    assert name == "count-binary"
    run_available(writer(True, ours).option("stateStore", PROVIDERS[0]), name)
    assert ours.batches == theirs.batches
    assert len(ours.batches[0]) == 3


def test_the_getting_started_page_s_first_query_runs_as_written(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' first query, a PySpark query with its input wrapped, runs as the page writes
    it and shows the windows it closed."""
    page = (Path(__file__).parents[2] / "docs" / "getting-started.md").read_text()
    found = re.search(r"## A first query\n.*?```python\n(.*?)```", page, re.S)
    assert found is not None
    exec(compile(found.group(1), "getting-started.md", "exec"), {})  # noqa: S102 - the page's code
    shown = capsys.readouterr().out
    assert "| bob|  1|1.25|" in shown and "| ann|  1| 3.5|" in shown
