"""What differs between the PySpark versions sparkstate runs on, handled in one place."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyspark
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import TimestampNTZType, TimestampType

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.spark import versions as spark_versions
from sparkstate.engine.spark.versions import PYSPARK
from sparkstate.exceptions import ConfigurationError

from .conftest import FileFeed

#: In the compatibility suite (scripts/compat).
pytestmark = pytest.mark.versions


def test_timestamps_map_to_arrow_and_back_as_on_the_newest_pyspark() -> None:
    assert spark_versions.to_arrow_type(TimestampType()) == pa.timestamp("us", tz="UTC")
    assert spark_versions.from_arrow_type(pa.timestamp("us")) == TimestampNTZType()
    assert spark_versions.from_arrow_type(pa.timestamp("us", tz="UTC")) == TimestampType()
    schema = spark_versions.from_arrow_schema(pa.schema([("ts", pa.timestamp("us"))]))
    assert schema["ts"].dataType == TimestampNTZType()


def test_what_a_newer_pyspark_has_is_refused_with_the_version_it_needs() -> None:
    spark_versions.require(spark_versions.SUPPORTED[0], "anything")  # the oldest: never refused
    with pytest.raises(ConfigurationError) as refused:
        spark_versions.require((9, 1), "a feature of the future")
    assert str(refused.value) == (
        f"a feature of the future needs PySpark 9.1 or later; this is PySpark {pyspark.__version__}"
    )


@pytest.mark.skipif(PYSPARK >= (4, 2), reason="PySpark 4.2's Python sources take availableNow")
def test_available_now_with_batches_without_data_is_refused_before_4_2(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """Before 4.2 Spark reads a Python source once per availableNow run: the batch without
    data after the last one would never run, so sparkstate refuses the query at start()."""
    feed.add([{"k": "a", "ts": "2026-01-01 00:00:00"}])
    df = feed.stream(spark, "k string, ts timestamp").withWatermark("ts", "10 seconds")
    writer = (
        ss.stream(df)
        .groupBy(SF.window("ts", "5 seconds"), "k")
        .agg(SF.count("*"))
        .writeStream.outputMode("append")
        .format("memory")
        .queryName("refused")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    with pytest.raises(ConfigurationError) as refused:
        writer.trigger(availableNow=True).start()
    assert str(refused.value).startswith(
        "trigger(availableNow=True) on a query that runs batches without data (a watermark, "
        f"timeouts, timers) needs PySpark 4.2 or later; this is PySpark {pyspark.__version__}."
    )
    query = writer.trigger(processingTime="0 seconds").start()  # what the message says to do
    query.processAllAvailable()
    query.stop()
    assert spark.table("refused").count() == 0  # the window is open: nothing to emit yet
