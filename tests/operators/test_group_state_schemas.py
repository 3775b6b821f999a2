"""State and output schemas as PySpark users write them: DDL strings, StructType, pyarrow."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.schemas import parse_ddl, to_arrow_schema


def test_ddl_forms() -> None:
    assert parse_ddl("count long, last string") == pa.schema(
        [("count", pa.int64()), ("last", pa.string())]
    )
    assert parse_ddl("struct<a:int,b: double>") == pa.schema(
        [("a", pa.int32()), ("b", pa.float64())]
    )
    schema = parse_ddl(
        "`odd name` DECIMAL(10, 2) NOT NULL, at timestamp comment 'when, exactly', "
        "day date, flag boolean, raw binary, small tinyint, v varchar(5), naive timestamp_ntz"
    )
    assert schema.names == ["odd name", "at", "day", "flag", "raw", "small", "v", "naive"]
    assert schema.field("odd name").type == pa.decimal128(10, 2)
    assert not schema.field("odd name").nullable
    assert schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("naive").type == pa.timestamp("us")
    assert schema.field("v").type == pa.string()


@pytest.mark.parametrize(
    ("ddl", "match"),
    [
        ("a array<int>", "not supported"),
        ("a", "expected 'name type'"),
        ("a int, a long", "repeats"),
        ("", "no fields"),
    ],
)
def test_bad_ddl(ddl: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse_ddl(ddl)


def test_struct_type_pairs_and_arrow() -> None:
    from pyspark.sql.types import (
        DecimalType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    struct = StructType(
        [
            StructField("n", LongType(), False),
            StructField("name", StringType()),
            StructField("price", DecimalType(12, 3)),
            StructField("at", TimestampType()),
        ]
    )
    schema = to_arrow_schema(struct)
    assert schema.types == [
        pa.int64(),
        pa.string(),
        pa.decimal128(12, 3),
        pa.timestamp("us", "UTC"),
    ]
    assert not schema.field("n").nullable
    assert to_arrow_schema([("a", "bigint"), ("b", pa.string())]).types == [pa.int64(), pa.string()]
    arrow = pa.schema([("x", pa.float32())])
    assert to_arrow_schema(arrow) is arrow
    with pytest.raises(ConfigurationError, match="DDL string"):
        to_arrow_schema(42, "state schema")
