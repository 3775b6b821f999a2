"""The two Python examples Spark ships for windowed aggregation, wrapped as they are.

``structured_network_wordcount_windowed.py`` and ``structured_sessionization.py`` read lines from
a socket with ``includeTimestamp``; here the same columns (``value``, ``timestamp``) come from a
file source, one file per micro-batch, and the query is the example's code unchanged but for
``ss.stream(...)`` around its input and a ``foreachBatch`` collector instead of the console.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
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
