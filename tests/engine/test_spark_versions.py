"""What differs between the PySpark versions sparkstate runs on, handled in one place."""

from __future__ import annotations

import pyarrow as pa
import pyspark
import pytest
from pyspark.sql.types import TimestampNTZType, TimestampType

from sparkstate.engine import spark_versions
from sparkstate.exceptions import ConfigurationError


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
