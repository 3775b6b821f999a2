"""Spark's ``EventTimeWatermarkSuite`` (Scala), its ``testStream`` scenarios ported.

Re-stated from ``sql/core/src/test/scala/org/apache/spark/sql/streaming/
EventTimeWatermarkSuite.scala`` in Apache Spark: the same inputs, query and expected answers,
the query's input wrapped (``stream_test.py``), run on both providers.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from .stream_test import (
    AddData,
    CheckNewAnswer,
    StartStream,
    StopStream,
    assertNumStateRows,
    assertWatermark,
)

pytestmark = pytest.mark.spark


def _windowed_count(st, input_data):
    return (
        input_data.toDF()
        .withColumn("eventTime", F.col("value").cast("timestamp"))
        .withWatermark("eventTime", "10 seconds")
        .groupBy(F.window(F.col("eventTime"), "5 seconds").alias("window"))
        .agg(F.count("*").alias("count"))
        .select(F.col("window").getField("start").cast("long"), F.col("count"))
    )


def test_append_mode(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _windowed_count(st, input_data),
        "append",
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer(),
        AddData(input_data, 25),  # advance the watermark to 15 seconds
        CheckNewAnswer((10, 5)),
        assertNumStateRows(2),
        AddData(input_data, 10),  # nothing: below the watermark
        CheckNewAnswer(),
        assertNumStateRows(2),
    )


def test_update_mode(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _windowed_count(st, input_data),
        "update",
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer((10, 5), (15, 1)),
        AddData(input_data, 25),
        CheckNewAnswer((25, 1)),
        assertNumStateRows(2),
        AddData(input_data, 10, 25),
        CheckNewAnswer((25, 2)),
        assertNumStateRows(2),
        AddData(input_data, 10),
        CheckNewAnswer(),
        assertNumStateRows(2),
    )


def test_append_mode_session(st) -> None:
    input_data = st.memory_stream()
    df = (
        input_data.toDF()
        .selectExpr("*", "CAST(value / 10 AS INT) AS valuegroup")
        .withColumn("eventTime", F.col("value").cast("timestamp"))
        .withWatermark("eventTime", "10 seconds")
        .groupBy(F.session_window(F.col("eventTime"), "5 seconds").alias("session"), "valuegroup")
        .agg(F.count("*").alias("count"), F.sum("value").alias("sum"))
        .select(
            "valuegroup",
            F.col("session").getField("start").cast("long"),
            F.col("session").getField("end").cast("long"),
            "count",
            "sum",
        )
    )
    st.test_stream(
        df,
        "append",
        AddData(input_data, 10, 11),
        CheckNewAnswer(),
        AddData(input_data, 17),
        CheckNewAnswer(),
        AddData(input_data, 25),
        CheckNewAnswer(),
        AddData(input_data, 35),
        CheckNewAnswer((1, 10, 16, 2, 21), (1, 17, 22, 1, 17)),
        AddData(input_data, 10),
        CheckNewAnswer(),
        AddData(input_data, 40),
        CheckNewAnswer((2, 25, 30, 1, 25)),
    )


def test_recovery(st) -> None:
    input_data = st.memory_stream()
    st.test_stream(
        _windowed_count(st, input_data),
        "append",
        AddData(input_data, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer(),
        AddData(input_data, 25),
        CheckNewAnswer((10, 5)),
        assertWatermark(15_000),
        StopStream,
        StartStream(),
        CheckNewAnswer(),
        AddData(input_data, 10),
        CheckNewAnswer(),
        AddData(input_data, 30),
        CheckNewAnswer((15, 1)),
    )
