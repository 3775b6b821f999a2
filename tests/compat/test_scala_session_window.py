"""Spark's ``StreamingSessionWindowSuite`` (Scala), its ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/
StreamingSessionWindowSuite.scala`` in Apache Spark: the same inputs, query and expected
answers, the query's input wrapped (``stream_test.py``), each scenario run on both providers at
once. Spark runs each ``testWithAllOptions`` scenario four times: on its two state store
providers (here: our two stores) and with
``spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition`` on and off, a choice of
Spark's physical plan (whether sessions are merged before the shuffle) that changes no answer
and that sparkstate's session operator has no use for: each is ported once, with the
setting's default.

=========================================================  ====================================
Spark's test                                               here
=========================================================  ====================================
complete mode - session window                             ported
complete mode - session window - nested tuple key          ported
complete mode - session window - multiple col key          ported
complete mode - session window - no key                    ported (ours refuses at ``start()``,
                                                           Spark's in its first batch)
append mode - session window                               ported
SPARK-36465: dynamic gap duration                          ported (the UDF in Python)
dynamic gap duration - nested tuple key                    ported
dynamic gap duration - multiple col key                    ported
append mode - session window - no key                      ported (as the complete mode's)
update mode - session window                               ported (Spark 4.3's message: see
                                                           ``UPDATE_REFUSED``)
update mode - session window - no key                      ported (as above)
session window with async state checkpointing              left out: a Databricks state store
                                                           provider and its conf
session window with first/last function                    ported
session window - with more aggregation functions and       left out: a Scala ``Aggregator``
UDAFs                                                      registered as a UDAF (``udaf``)
=========================================================  ====================================
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from .stream_test import Action, AddData, AssertOnQuery, CheckAnswer, CheckNewAnswer, progresses

pytestmark = pytest.mark.spark


def assertNumRowsDroppedByWatermark(  # noqa: N802 - Spark's name
    numRowsDroppedByWatermark: int,  # noqa: N803
) -> Action:
    """The suite's own check: the last progress of a batch with input dropped that many rows
    as late in the first state operator."""

    def check(run: Any) -> None:
        run.process()
        with_data = [p for p in progresses(run) if p["inputRowsPerSecond"] != 0][-1]
        got = with_data["stateOperators"][0]["numRowsDroppedByWatermark"]
        if got != numRowsDroppedByWatermark:
            msg = f"rows dropped by watermark: expected {numRowsDroppedByWatermark}, got {got}"
            raise AssertionError(msg)

    return AssertOnQuery(check)


def session_window_query(input_data, session_window=None):
    if session_window is None:
        session_window = F.session_window(F.col("eventTime"), "10 seconds")
    # Split the lines into words, treat words as sessionId of events
    events = (
        input_data.toDF()
        .select(F.col("_1").alias("value"), F.col("_2").alias("timestamp"))
        .withColumn("eventTime", F.col("timestamp").cast("timestamp"))
        .withWatermark("eventTime", "30 seconds")
        .selectExpr("explode(split(value, ' ')) AS sessionId", "eventTime")
    )
    return (
        events.groupBy(session_window.alias("session"), F.col("sessionId"))
        .agg(F.count("*").alias("numEvents"))
        .selectExpr(
            "sessionId",
            "CAST(session.start AS LONG)",
            "CAST(session.end AS LONG)",
            "CAST(session.end AS LONG) - CAST(session.start AS LONG) AS durationMs",
            "numEvents",
        )
    )


def session_window_query_on_global_key(input_data):
    return (
        input_data.toDF()
        .selectExpr("*")
        .withColumn("eventTime", F.col("value").cast("timestamp"))
        .withWatermark("eventTime", "10 seconds")
        .groupBy(F.session_window(F.col("eventTime"), "5 seconds").alias("session"))
        .agg(F.count("*").alias("count"), F.sum("value").alias("sum"))
        .select(
            F.col("session").getField("start").cast("long"),
            F.col("session").getField("end").cast("long"),
            F.col("count"),
            F.col("sum"),
        )
    )


def _words_as_nested_tuples(input_data):
    """Each word ``w`` as ``((w, w), w)``: ``sessionIdTriple``."""
    return (
        input_data.toDF()
        .select(F.col("_1").alias("value"), F.col("_2").alias("timestamp"))
        .withColumn("eventTime", F.col("timestamp").cast("timestamp"))
        .withColumn("sessionIdSingle", F.split(F.col("value"), " "))
        .withColumn(
            "sessionIdDouble", F.arrays_zip(F.col("sessionIdSingle"), F.col("sessionIdSingle"))
        )
        .withColumn(
            "sessionIdTriple", F.arrays_zip(F.col("sessionIdDouble"), F.col("sessionIdSingle"))
        )
    )


def session_window_query_nested_key(input_data, session_window=None):
    if session_window is None:
        session_window = F.session_window(F.col("eventTime"), "10 seconds")
    events = (
        _words_as_nested_tuples(input_data)
        .withWatermark("eventTime", "30 seconds")
        .selectExpr("explode(sessionIdTriple) AS sessionId", "eventTime")
    )
    return (
        events.groupBy(session_window.alias("session"), F.col("sessionId"))
        .agg(F.count("*").alias("numEvents"))
        .selectExpr(
            "sessionId",
            "CAST(session.start AS LONG)",
            "CAST(session.end AS LONG)",
            "CAST(session.end AS LONG) - CAST(session.start AS LONG) AS durationMs",
            "numEvents",
        )
    )


def session_window_query_multi_col_key(input_data, session_window=None):
    if session_window is None:
        session_window = F.session_window(F.col("eventTime"), "10 seconds")
    events = (
        _words_as_nested_tuples(input_data)
        .withColumn("sessionIdTriple", F.explode(F.col("sessionIdTriple")))
        .withWatermark("eventTime", "30 seconds")
        .selectExpr(
            "sessionIdTriple.sessionIdDouble AS aggKeyDouble",
            "sessionIdTriple.sessionIdSingle AS aggKeySingle",
            "eventTime",
        )
    )
    return (
        events.groupBy(
            session_window.alias("session"), F.col("aggKeyDouble"), F.col("aggKeySingle")
        )
        .agg(F.count("*").alias("numEvents"))
        .selectExpr(
            "aggKeyDouble",
            "aggKeySingle",
            "CAST(session.start AS LONG)",
            "CAST(session.end AS LONG)",
            "CAST(session.end AS LONG) - CAST(session.start AS LONG) AS durationMs",
            "numEvents",
        )
    )


# The complete-mode scenarios' answers, each session as (key, start, end, duration, events):
# the key is the word, its nested tuple, or its two columns (``key(word)`` gives it).
FIRST_SESSIONS = [
    ("hello", 40, 51, 11, 2),
    ("world", 40, 51, 11, 2),
    ("streaming", 40, 51, 11, 2),
    ("spark", 40, 50, 10, 1),
    ("structured", 41, 51, 10, 1),
]
BEFORE_SESSIONS = [("spark", 25, 35, 10, 1), ("streaming", 25, 35, 10, 1), *FIRST_SESSIONS]
CONCATENATED_SESSIONS = [
    ("spark", 25, 50, 25, 3),
    ("streaming", 25, 51, 26, 4),
    ("hello", 40, 51, 11, 2),
    ("world", 40, 51, 11, 2),
    ("structured", 41, 51, 10, 1),
]
AFTER_SESSIONS = [
    *CONCATENATED_SESSIONS,
    ("hello", 60, 70, 10, 1),
    ("apache", 60, 70, 10, 1),
    ("spark", 60, 70, 10, 1),
]
LAST_SESSIONS = [*AFTER_SESSIONS, ("structured", 90, 100, 10, 1), ("streaming", 90, 100, 10, 1)]


def _complete_mode_actions(input_data, key) -> list[Action]:
    def answer(sessions):
        return CheckNewAnswer(*(key(word, *rest) for word, *rest in sessions))

    return [
        AddData(
            input_data,
            ("hello world spark streaming", 40),
            ("world hello structured streaming", 41),
        ),
        answer(FIRST_SESSIONS),
        # placing new sessions "before" previous sessions
        AddData(input_data, ("spark streaming", 25)),
        answer(BEFORE_SESSIONS),
        # concatenating multiple previous sessions into one
        AddData(input_data, ("spark streaming", 30)),
        answer(CONCATENATED_SESSIONS),
        # placing new sessions after previous sessions
        AddData(input_data, ("hello apache spark", 60)),
        answer(AFTER_SESSIONS),
        AddData(input_data, ("structured streaming", 90)),
        answer(LAST_SESSIONS),
    ]


def _word(word, *rest):
    return (word, *rest)


def _nested(word, *rest):
    return (((word, word), word), *rest)


def _two_columns(word, *rest):
    return ((word, word), word, *rest)


def test_complete_mode_session_window(st) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    st.test_stream(
        session_window_query(input_data),
        "complete",
        *_complete_mode_actions(input_data, _word),
    )


def test_complete_mode_session_window_nested_tuple_key(st) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    st.test_stream(
        session_window_query_nested_key(input_data),
        "complete",
        *_complete_mode_actions(input_data, _nested),
    )


def test_complete_mode_session_window_multiple_col_key(st) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    st.test_stream(
        session_window_query_multi_col_key(input_data),
        "complete",
        *_complete_mode_actions(input_data, _two_columns),
    )


def _refused(
    st, df, output_mode: str, input_data, messages: list[str], error: type = Exception
) -> None:
    """``intercept[error] { testStream(df, mode)(AddData(input, 40), CheckAnswer()) }``: the
    failure's message names each of ``messages`` (case aside)."""
    with pytest.raises(error) as failure:
        st.test_stream(df, output_mode, AddData(input_data, 40), CheckAnswer())
    text = str(failure.value).lower()
    for message in messages:
        assert message.lower() in text, text


GLOBAL_REFUSED = ["Global aggregation with session window", "not supported"]
#: Spark's test names "Update output mode"; Spark 4.3 says "Invalid streaming output mode:
#: update", under the condition named here.
UPDATE_REFUSED = [
    "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
    "output mode: update",
    "not supported",
    "for session window",
]


def test_complete_mode_session_window_no_key(st) -> None:
    input_data = st.memory_stream()
    _refused(
        st, session_window_query_on_global_key(input_data), "complete", input_data, GLOBAL_REFUSED
    )


def test_append_mode_session_window(st) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    st.test_stream(
        session_window_query(input_data),
        "append",
        AddData(
            input_data,
            ("hello world spark streaming", 40),
            ("world hello structured streaming", 41),
        ),
        # watermark: 11; the sessions of FIRST_SESSIONS
        CheckNewAnswer(),
        # placing new sessions "before" previous sessions
        AddData(input_data, ("spark streaming", 25)),
        CheckNewAnswer(),
        # late event which session's end 10 would be later than watermark 11: should be dropped
        AddData(input_data, ("spark streaming", 0)),
        CheckNewAnswer(),
        assertNumRowsDroppedByWatermark(2),
        # concatenating multiple previous sessions into one
        AddData(input_data, ("spark streaming", 30)),
        CheckNewAnswer(),
        # placing new sessions after previous sessions (watermark: 30)
        AddData(input_data, ("hello apache spark", 60)),
        CheckNewAnswer(),
        # watermark: 60
        AddData(input_data, ("structured streaming", 90)),
        CheckNewAnswer(*CONCATENATED_SESSIONS),
    )


def _gap_duration(is_word):
    """The suite's ``gapDuration`` UDF: 1 second for hello, 0 for structured and negative for
    world (both filtered out of the aggregation), 10 seconds for the others."""

    def gap(*key):
        if is_word(key, "hello"):
            return "1 second"
        if is_word(key, "structured"):
            # zero gap duration will be filtered out from aggregation
            return "0 second"
        if is_word(key, "world"):
            # negative gap duration will be filtered out from aggregation
            return "-10 seconds"
        return "10 seconds"

    return gap


def _dynamic_gap_actions(input_data, key) -> list[Action]:
    return [
        AddData(
            input_data,
            ("hello world spark streaming", 40),
            ("world hello structured streaming", 41),
        ),
        CheckNewAnswer(),
        # placing new sessions "before" previous sessions
        AddData(input_data, ("spark streaming", 25)),
        CheckNewAnswer(),
        # late event which session's end 10 would be later than watermark 11: should be dropped
        AddData(input_data, ("spark streaming", 0)),
        CheckNewAnswer(),
        assertNumRowsDroppedByWatermark(2),
        # concatenating multiple previous sessions into one
        AddData(input_data, ("spark streaming", 30)),
        CheckNewAnswer(),
        # placing new sessions after previous sessions
        AddData(input_data, ("hello apache spark", 60)),
        CheckNewAnswer(),
        AddData(input_data, ("structured streaming", 90)),
        CheckNewAnswer(
            key("spark", 25, 50, 25, 3),
            key("streaming", 25, 51, 26, 4),
            key("hello", 40, 42, 2, 2),
        ),
    ]


def test_spark_36465_dynamic_gap_duration(st, spark) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    udf = spark.udf.register("gapDuration", _gap_duration(lambda key, w: key == (w,)), "string")
    session_updates = session_window_query(
        input_data, F.session_window(F.col("eventTime"), udf(F.col("sessionId")))
    )
    st.test_stream(session_updates, "append", *_dynamic_gap_actions(input_data, _word))


def test_dynamic_gap_duration_nested_tuple_key(st, spark) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    udf = spark.udf.register(
        "gapDuration", _gap_duration(lambda key, w: key == (((w, w), w),)), "string"
    )
    session_updates = session_window_query_nested_key(
        input_data, F.session_window(F.col("eventTime"), udf(F.col("sessionId")))
    )
    st.test_stream(session_updates, "append", *_dynamic_gap_actions(input_data, _nested))


def test_dynamic_gap_duration_multiple_col_key(st, spark) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    udf = spark.udf.register(
        "gapDuration", _gap_duration(lambda key, w: key == ((w, w), w)), "string"
    )
    session_updates = session_window_query_multi_col_key(
        input_data,
        F.session_window(F.col("eventTime"), udf(F.col("aggKeyDouble"), F.col("aggKeySingle"))),
    )
    st.test_stream(session_updates, "append", *_dynamic_gap_actions(input_data, _two_columns))


def test_append_mode_session_window_no_key(st) -> None:
    input_data = st.memory_stream()
    _refused(
        st, session_window_query_on_global_key(input_data), "append", input_data, GLOBAL_REFUSED
    )


def test_update_mode_session_window(st) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    with pytest.raises(AnalysisException) as failure:
        st.test_stream(
            session_window_query(input_data),
            "update",
            AddData(input_data, ("hello", 40)),
            CheckAnswer(),
        )
    text = str(failure.value).lower()
    for message in UPDATE_REFUSED:
        assert message.lower() in text, text


def test_update_mode_session_window_no_key(st) -> None:
    input_data = st.memory_stream()
    _refused(
        st,
        session_window_query_on_global_key(input_data),
        "update",
        input_data,
        UPDATE_REFUSED,
        AnalysisException,
    )


def test_session_window_with_first_last_function(st) -> None:
    input_data = st.memory_stream("_1 string, _2 bigint")
    # Split the lines into words, treat words as sessionId of events
    events = (
        input_data.toDF()
        .select(F.col("_1").alias("value"), F.col("_2").alias("timestamp"))
        .withColumn("eventTime", F.col("timestamp").cast("timestamp"))
        .withWatermark("eventTime", "30 seconds")
        .selectExpr("explode(split(value, ' ')) AS sessionId", "eventTime")
    )
    session_window = F.session_window(F.col("eventTime"), "10 seconds")
    session_with_agg = (
        events.groupBy(session_window.alias("session"), F.col("sessionId"))
        .agg(
            F.first(F.col("eventTime")).alias("firstTime"),
            F.last(F.col("eventTime")).alias("lastTime"),
            F.min_by(F.col("eventTime"), F.col("eventTime")).alias("minTime"),
            F.max_by(F.col("eventTime"), F.col("eventTime")).alias("maxTime"),
        )
        .selectExpr(
            "sessionId",
            "CAST(session.start AS LONG)",
            "CAST(session.end AS LONG)",
            # "CAST(firstTime AS LONG)", "CAST(lastTime AS LONG)",  # Non deterministic
            "CAST(minTime AS LONG)",
            "CAST(maxTime AS LONG)",
        )
    )
    st.test_stream(
        session_with_agg,
        "append",
        AddData(input_data, ("a", 41)),
        AddData(input_data, ("a", 42)),
        AddData(input_data, ("a", 40)),
        CheckAnswer(),
        AddData(input_data, ("b", 100)),  # Move the watermark past the end of the session.
        AddData(input_data, ("b", 101)),  # Trigger the session production.
        CheckAnswer(("a", 40, 52, 40, 42)),
    )
