"""The two Python examples Spark ships for windowed aggregation, wrapped as they are.

``structured_network_wordcount_windowed.py`` and ``structured_sessionization.py`` read lines from
a socket with ``includeTimestamp``; here the same columns (``value``, ``timestamp``) come from a
file source, one file per micro-batch, and the query is the example's code unchanged but for
``ss.stream(...)`` around its input and a ``foreachBatch`` collector instead of the console.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import count, explode, session_window, split, window

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError
from sparkstate.testing import Collector, FileFeed

from .conftest import PROVIDERS
from .helpers import Differential, SparkRuns

SCHEMA = "value string, timestamp timestamp"
TEXT = [
    ["the cat sat", "the dog"],
    ["cat and dog"],
    ["the end", "dog days"],
    ["cat nap"],
]


def lines_of(i: int) -> list[dict[str, Any]]:
    """File ``i``: its lines, 4 s apart, starting 7 s after the previous file's."""
    return [
        {"value": line, "timestamp": f"2024-01-01 00:00:{7 * i + 4 * j:02d}"}
        for j, line in enumerate(TEXT[i])
    ]


def windowed_word_count(lines: DataFrame, wrap: bool) -> Any:
    """``structured_network_wordcount_windowed.py`` with window 10 s, slide 5 s."""
    window_duration, slide_duration = "10 seconds", "5 seconds"
    words = lines.select(explode(split(lines.value, " ")).alias("word"), lines.timestamp)
    stream = ss.stream(words) if wrap else words
    return (
        stream.groupBy(window(words.timestamp, window_duration, slide_duration), words.word)
        .count()
        .orderBy("window")
    )


def sessionization(lines: DataFrame, wrap: bool) -> Any:
    """``structured_sessionization.py``."""
    events = lines.select(
        explode(split(lines.value, " ")).alias("sessionId"), lines.timestamp.alias("eventTime")
    )
    stream = ss.stream(events) if wrap else events
    return (
        stream.groupBy(
            session_window(events.eventTime, "10 seconds").alias("session"), events.sessionId
        )
        .agg(count("*").alias("numEvents"))
        .selectExpr(
            "sessionId",
            "CAST(session.start AS LONG)",
            "CAST(session.end AS LONG)",
            "CAST(session.end AS LONG) - CAST(session.start AS LONG) AS durationMs",
            "numEvents",
        )
    )


EXAMPLES = {"windowed-word-count": windowed_word_count, "sessionization": sessionization}


def example(name: str) -> Differential:
    """Both in complete mode: the word count's own mode; sessionization's own mode (update) is
    refused by Spark for session windows, see below."""
    files = [lines_of(i) for i in range(len(TEXT))]
    return Differential(name, SCHEMA, files, "complete", EXAMPLES[name])


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_matches_spark(spark_runs: SparkRuns, tmp_path: Path, name: str) -> None:
    """On one provider: the window and session modules run each mode on every provider."""
    ours, _ = spark_runs.check(example(name), tmp_path, PROVIDERS[-1])
    assert sum(len(rows) for rows in ours.batches.values()) > 0


def test_sessionization_in_update_mode_fails_as_in_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The example asks for update mode, which Spark 4 refuses for session windows; so do we,
    with Spark's words."""
    feed = FileFeed(tmp_path / "input")
    errors = []
    for wrap, error in ((False, AnalysisException), (True, ConfigurationError)):
        query = sessionization(feed.stream(spark, SCHEMA), wrap).writeStream
        with pytest.raises(error) as caught:
            query.outputMode("update").foreachBatch(Collector()).option(
                "checkpointLocation", str(tmp_path / f"c{wrap}")
            ).start()
        errors.append(str(caught.value))
    expected = "This output mode is not supported for session window streaming aggregations"
    assert all(expected in e for e in errors)


def network_word_count(lines: Any) -> Any:
    """``structured_network_wordcount.py`` from its input to its ``writeStream``."""
    words = lines.select(explode(split(lines.value, " ")).alias("word"))
    return words.groupBy("word").count()


def test_the_wrapped_stream_answers_as_sparks_dataframe(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What code asks a streaming DataFrame before it writes it (its columns, types, schema
    tree, a column by attribute, name or index), asked of the network word count's input and
    of its count, Spark's and wrapped: the same answers."""

    def answers(stream: Any, names: list[str]) -> list[Any]:
        tree = io.StringIO()
        with contextlib.redirect_stdout(tree):
            stream.printSchema()
        picked = [getattr(stream, names[0]), stream[names[-1]], stream[0]]
        return [
            stream.columns,
            stream.dtypes,
            stream.schema,
            tree.getvalue(),
            stream.isStreaming,
            [str(c) for c in picked],
            [stream.select(c).schema for c in picked],
            stream[names].columns,
        ]

    theirs, ours = (FileFeed(tmp_path / name).stream(spark, "value string") for name in "ab")
    inputs = [answers(lines, ["value"]) for lines in (theirs, ss.stream(ours))]
    assert inputs[0] == inputs[1]
    counts = [
        answers(network_word_count(lines), ["word", "count"]) for lines in (theirs, ss.stream(ours))
    ]
    assert counts[0] == counts[1]
    assert counts[0][0] == ["word", "count"]
    with pytest.raises(AttributeError, match="nope"):
        _ = network_word_count(ss.stream(ours)).nope


# --- PySpark's stateful example programs, as shipped ----------------------------------------------

#: Where the installed PySpark keeps Spark's Python examples of Structured Streaming.
SHIPPED = Path(pyspark.__file__).parent / "examples/src/main/python/sql/streaming"
#: The stateful ones, with the arguments each takes (host and port go to the swapped source).
PROGRAMS = {
    "structured_kafka_wordcount.py": ["localhost:9092", "subscribe", "topic"],
    "structured_network_wordcount.py": ["localhost", "9999"],
    "structured_network_wordcount_session_window.py": ["localhost", "9999"],
    "structured_network_wordcount_windowed.py": ["localhost", "9999", "10", "5"],
    "structured_sessionization.py": ["localhost", "9999"],
}
#: Two batches of lines, as the socket source gives them with ``includeTimestamp``.
PROGRAM_INPUT = [lines_of(0), lines_of(1)]


def _chain(node: ast.expr) -> list[ast.Call]:
    """The calls of a method chain ``a.b(...).c(...)``, outermost first."""
    calls = []
    while isinstance(node, ast.Call | ast.Attribute):
        if isinstance(node, ast.Call):
            calls.append(node)
            node = node.func
        else:
            node = node.value
    return calls


def swapped(text: str) -> str:
    """The program ``text`` with its source (the ``readStream ... load()`` expression) read by
    ``__source__()``, its console sink (``format('console')``) swapped for
    ``foreachBatch(__sink__)`` on the checkpoint ``__checkpoint__``, and
    ``query.awaitTermination()`` for ``__run__(query)``; the rest of the text as shipped."""
    raw = text.encode()
    starts = [0]
    for line in raw.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(line: int | None, col: int | None) -> int:
        assert line is not None and col is not None
        return starts[line - 1] + col

    def start_of(node: ast.expr) -> int:
        return offset(node.lineno, node.col_offset)

    def end_of(node: ast.expr) -> int:
        return offset(node.end_lineno, node.end_col_offset)

    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        segment = ast.get_source_segment(text, node) or ""
        if node.func.attr == "load" and "readStream" in segment:
            edits.append((start_of(node), end_of(node), "__source__()"))
        elif node.func.attr == "start" and "writeStream" in segment:
            for call in _chain(node):
                if isinstance(call.func, ast.Attribute) and call.func.attr == "format":
                    sink = '.foreachBatch(__sink__).option("checkpointLocation", __checkpoint__)'
                    edits.append((end_of(call.func.value), end_of(call), sink))
        elif node.func.attr == "awaitTermination":
            query = ast.get_source_segment(text, node.func.value)
            edits.append((start_of(node), end_of(node), f"__run__({query})"))
    assert len(edits) == 3, edits  # one source, one sink, one wait
    for start, end, new in sorted(edits, reverse=True):
        raw = raw[:start] + new.encode() + raw[end:]
    return raw.decode()


def files_read(query: Any) -> int:
    """How many files of the file source the query's batches have read, by its last progress."""
    progress = query.lastProgress
    if progress is None:
        return 0
    data = progress if isinstance(progress, dict) else json.loads(progress.json)
    for source in data["sources"]:
        if source["description"].startswith("FileStreamSource"):
            end = source["endOffset"]
            end = json.loads(end) if isinstance(end, str) else end
            return int(end["logOffset"]) + 1 if end else 0
    return 0


def run_files(feed: FileFeed, query: Any, batches: list[list[dict[str, Any]]]) -> None:
    """Feed one file per batch, wait until the query has read it, and stop the query at the
    end. (``processAllAvailable`` never returns for Spark's query with a processing-time
    timeout: Spark runs a batch without data after every batch.)"""
    try:
        for i, rows in enumerate(batches):
            feed.add(rows)
            deadline = time.monotonic() + 120
            while files_read(query) <= i:
                assert query.exception() is None, query.exception()
                assert time.monotonic() < deadline, f"file {i} not read"
                time.sleep(0.1)
    finally:
        query.stop()


def outcome(run: Callable[[], Collector]) -> Any:
    """What ``run`` gave: the schema and the batches with rows, or the type and condition of
    the AnalysisException it raised."""
    try:
        sink = run()
    except AnalysisException as exc:
        return AnalysisException, exc.getCondition(), exc.getMessageParameters()
    assert sink.schema is not None
    return sink.schema, {b: rows for b, rows in sink.batches.items() if rows}


@pytest.mark.skipif(not SHIPPED.is_dir(), reason="this PySpark ships no examples")
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_pysparks_example_programs_run_wrapped_as_shipped(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str
) -> None:
    """Each stateful program PySpark ships, its text as shipped but for the source (a file
    source of the same columns), the console sink (``foreachBatch``) and the wait (two batches,
    then a stop), run plain and with ``ss.stream()`` around its input: the same rows batch by
    batch, or the same AnalysisException. The session-window program's sessions close after a
    processing-time timeout of 10 s, longer than its run here: its output is empty both ways
    (what it checks is that the program runs wrapped, applyInPandasWithState included)."""
    text = (SHIPPED / program).read_text()
    schema = SCHEMA if "includeTimestamp" in text else "value string"
    monkeypatch.setattr(sys, "argv", [program, *PROGRAMS[program]])
    code = compile(swapped(text), program, "exec")

    def run(wrap: bool) -> Collector:
        feed, sink = FileFeed(tmp_path / f"input-{wrap}"), Collector()

        def source() -> Any:
            lines = feed.stream(spark, schema)
            return ss.stream(lines) if wrap else lines

        names = {
            "__name__": "__main__",
            "__source__": source,
            "__sink__": sink,
            "__checkpoint__": str(tmp_path / f"checkpoint-{wrap}"),
            "__run__": lambda query: run_files(feed, query, PROGRAM_INPUT),
        }
        exec(code, names)  # noqa: S102 - PySpark's own program
        return sink

    theirs, ours = outcome(lambda: run(False)), outcome(lambda: run(True))
    assert ours == theirs


# --- the wrapped stream as a DataFrame ------------------------------------------------------------

#: DataFrame methods that Spark takes on a stream, each called as a user would: before the
#: stateful step and after it (where it applies to each batch's output).
STREAM_METHODS: dict[str, Callable[[Any, DataFrame], Any]] = {
    "alias": lambda s, _: s.alias("t"),
    "toDF": lambda s, _: s.toDF(*[f"c{i}" for i in range(len(s.columns))]),
    "hint": lambda s, _: s.hint("broadcast"),
    "dropna": lambda s, _: s.dropna(subset=["k"]),
    "fillna": lambda s, _: s.fillna("none"),
    "na.drop": lambda s, _: s.na.drop(how="all"),
    "na.fill": lambda s, _: s.na.fill({"k": "none"}),
    "na.replace": lambda s, _: s.na.replace("a", "b"),
    "replace": lambda s, _: s.replace({"a": "b"}, subset=["k"]),
    "join": lambda s, static: s.join(static, "k"),
    "join left": lambda s, static: s.join(static, on="k", how="left"),
    "crossJoin": lambda s, static: s.crossJoin(static.select("label")),
    "transform": lambda s, _: s.transform(lambda d, n: d.withColumn("n", F.lit(n)), 2),
    "repartition": lambda s, _: s.repartition(3, "k"),
    "repartitionByRange": lambda s, _: s.repartitionByRange(2, "k"),
    "coalesce": lambda s, _: s.coalesce(1),
    "sample": lambda s, _: s.sample(0.5, seed=3),
    "sortWithinPartitions": lambda s, _: s.sortWithinPartitions("k"),
    "withMetadata": lambda s, _: s.withMetadata("k", {"note": "key"}),
    "union": lambda s, _: s.union(s),
}
#: Taken before the stateful step only (see the test).
INPUT_METHODS: dict[str, Callable[[Any, DataFrame], Any]] = {
    "unionByName": lambda s, _: s.unionByName(s.select("v", "k")),
    "distinct": lambda s, _: s.distinct(),
}
#: What Spark refuses on a stream, each called as a user would.
REFUSED: dict[str, Callable[[Any], Any]] = {
    "count": lambda s: s.count(),
    "collect": lambda s: s.collect(),
    "show": lambda s: s.show(),
    "toPandas": lambda s: s.toPandas(),
    "head": lambda s: s.head(),
    "take": lambda s: s.take(1),
    "first": lambda s: s.first(),
    "tail": lambda s: s.tail(1),
    "isEmpty": lambda s: s.isEmpty(),
    "foreach": lambda s: s.foreach(print),
    "foreachPartition": lambda s: s.foreachPartition(print),
    "toLocalIterator": lambda s: list(s.toLocalIterator()),
    "toArrow": lambda s: s.toArrow(),
    "cache": lambda s: s.cache(),
    "persist": lambda s: s.persist(),
    "checkpoint": lambda s: s.checkpoint(),
    "localCheckpoint": lambda s: s.localCheckpoint(),
    "inputFiles": lambda s: s.inputFiles(),
    "rdd": lambda s: s.rdd,
    "write": lambda s: s.write,
}


def plan_text(stream: Any) -> str:
    """What ``explain(True)`` prints from the analyzed plan on (the parsed plan spells a count
    as it was written: ``count(*)`` or ``count(1)``), without Spark's expression ids."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        stream.explain(True)
    text = out.getvalue()
    text = re.sub(r"#\d+L?", "#", text[text.index("== Analyzed Logical Plan ==") :])
    text = re.sub(r"plan_id=\d+", "plan_id=", text)
    return re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "<id>", text)


def test_the_wrapped_stream_takes_sparks_dataframe_methods(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Each DataFrame method Spark takes on a stream, called on Spark's stream and on the
    wrapped one, before a ``groupBy("k").count()`` and after it: the same columns and schema;
    each method Spark refuses on a stream (an action, ``cache``, ``rdd``, ``write``): the same
    AnalysisException (type, condition); ``explain(True)``: the same plans.

    Left out: ``distinct`` after a stateful step (sparkstate refuses a deduplication after an
    aggregation there; Spark takes it when defined, and refuses it at start), ``unionByName``
    after it (the input's columns are not the count's), ``observe`` (its metrics would need
    the progress sparkstate builds), ``createOrReplaceTempView`` (a view of the wrapped stream
    would be Spark's own query), ``randomSplit``, ``describe``/``summary`` (aggregations Spark
    runs unwrapped), ``stat``, ``groupingSets``/``cube``/``rollup``, ``mapInPandas`` and the
    other Python UDF steps."""
    static = spark.createDataFrame([("a", 1), ("b", 2)], "k string, label int")
    theirs = FileFeed(tmp_path / "input").stream(spark, "k string, v long")
    ours = ss.stream(theirs)
    counts = (theirs.groupBy("k").count(), ours.groupBy("k").count())
    steps = {  # after the count, a few refusals: they go the same way as before it
        "input": (theirs, ours, {**STREAM_METHODS, **INPUT_METHODS}, list(REFUSED)),
        "count": (*counts, STREAM_METHODS, ["count", "collect", "toPandas", "rdd", "write"]),
    }
    for where, (spark_stream, wrapped, methods, refused_names) in steps.items():
        for name, method in methods.items():
            expected, got = method(spark_stream, static), method(wrapped, static)
            assert isinstance(got, ss.StatefulStream), (where, name)
            assert (got.columns, got.schema) == (expected.columns, expected.schema), (where, name)
        for name in refused_names:
            refused = REFUSED[name]
            errors = []
            for stream in (spark_stream, wrapped):
                with pytest.raises(AnalysisException) as caught, warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # toPandas warns of Arrow before the error
                    refused(stream)
                errors.append((type(caught.value), caught.value.getCondition()))
            assert errors[0] == errors[1], (where, name)
        assert plan_text(wrapped) == plan_text(spark_stream), where
