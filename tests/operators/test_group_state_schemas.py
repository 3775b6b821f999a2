"""State and output schemas as PySpark users write them: DDL strings, StructType, pyarrow."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.schemas import parse_ddl, to_arrow_schema


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
        ("a interval", "not supported"),
        ("a map<int>", "expected map<key type, value type>"),
        ("a struct<x int, x: long>", "repeats"),
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


def _nested_cases() -> list[tuple[str, Any]]:
    """DDL strings and the StructType Spark parses each to."""
    from pyspark.sql import types as t

    def one(name: str, dtype: Any) -> Any:
        return t.StructType([t.StructField(name, dtype)])

    ab = t.StructType([t.StructField("a", t.IntegerType()), t.StructField("b", t.StringType())])
    ab_nn = t.StructType(
        [t.StructField("a", t.IntegerType()), t.StructField("b", t.StringType(), False)]
    )
    x = t.StructType([t.StructField("x", t.DoubleType())])
    lt = t.StructType(
        [
            t.StructField("l", t.ArrayType(t.ArrayType(t.DateType()))),
            t.StructField("t", t.TimestampType()),
        ]
    )
    return [
        ("v array<int>", one("v", t.ArrayType(t.IntegerType()))),
        ("s struct<a:int,b:string>", one("s", ab)),
        ("s struct<a: int, b string not null>", one("s", ab_nn)),
        ("m map<string,bigint>", one("m", t.MapType(t.StringType(), t.LongType()))),
        (
            "m MAP< string , array<struct<x: double>> >",
            one("m", t.MapType(t.StringType(), t.ArrayType(x))),
        ),
        (
            "d array<map<int, struct<l: array<array<date>>, t: timestamp>>>",
            one("d", t.ArrayType(t.MapType(t.IntegerType(), lt))),
        ),
        ("e struct<>", one("e", t.StructType([]))),
    ]


@pytest.mark.parametrize("case", range(7))
def test_nested_ddl_maps_as_pyspark_maps_it(case: int) -> None:
    """Arrays, structs and maps (nested, with Spark's spacing variants) give the Arrow types
    PySpark's own ``to_arrow_schema`` gives for the StructType Spark parses from the same DDL."""
    from pyspark.sql.pandas.types import to_arrow_schema as pyspark_to_arrow

    ddl, struct = _nested_cases()[case]
    expected = pyspark_to_arrow(struct, timezone="UTC")
    assert parse_ddl(ddl) == expected
    assert to_arrow_schema(struct) == expected  # the StructType itself, read by duck type


def test_nested_struct_type_keeps_nullability() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema as pyspark_to_arrow
    from pyspark.sql.types import (
        ArrayType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    inner = StructType([StructField("x", IntegerType(), False)])
    struct = StructType(
        [
            StructField("v", ArrayType(IntegerType(), containsNull=False)),
            StructField("m", MapType(StringType(), inner, valueContainsNull=False), False),
            StructField("s", StructType([StructField("l", ArrayType(inner))]), False),
        ]
    )
    schema = to_arrow_schema(struct)
    assert schema == pyspark_to_arrow(struct)
    assert not schema.field("v").type.value_field.nullable
    assert not schema.field("m").type.item_field.nullable
