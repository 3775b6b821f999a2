"""Columns, schemas and watermarks as the planners read them from Spark's analysis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sparkstate.engine.spark.versions import to_arrow_type
from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY

__all__ = [
    "ColumnSeq",
    "arrow_safe",
    "arrow_schema",
    "event_time_of",
    "is_binary_stable",
    "is_time",
    "output_shape",
    "quote",
    "repartition_by",
    "session_time_zone",
    "struct_of",
    "with_watermark",
    "with_watermark_on",
]


def quote(name: str) -> Column:
    """A column reference that survives any character in ``name``."""
    return F.col("`" + name.replace("`", "``") + "`")


class ColumnSeq:
    """A fixed list of columns the driver hands Spark in every batch, made into the JVM's
    ``Seq`` once: PySpark converts a list of columns at every call, a py4j round trip per
    column (and a column by name, a dozen: ``F.col`` looks its class up). Where ``df`` is a
    Spark Connect DataFrame (the driver in the server's process), the columns as they are."""

    def __init__(self, columns: Sequence[Column | str]) -> None:
        self._given = list(columns)
        self._columns: list[Column] | None = None
        self._seq: tuple[Any, Any] | None = None  # (the SparkContext, its JVM Seq)

    def columns(self) -> list[Column]:
        """The columns, a name as :func:`quote` refers to it."""
        if self._columns is None:
            self._columns = [quote(c) if isinstance(c, str) else c for c in self._given]
        return self._columns

    def seq(self, df: DataFrame) -> Any | None:
        """The columns as the JVM ``Seq`` of ``df``'s session, None for a Spark Connect one."""
        if getattr(df, "_jdf", None) is None:
            return None
        sc = df.sparkSession.sparkContext
        if self._seq is None or self._seq[0] is not sc:
            jvm: Any = sc._jvm
            self._seq = (sc, jvm.PythonUtils.toSeq([c._jc for c in self.columns()]))
        return self._seq[1]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (the driver, for the Spark Connect server's process) without JVM objects."""
        return {"_given": self._given, "_columns": None, "_seq": None}


def repartition_by(df: DataFrame, num_partitions: int, columns: ColumnSeq) -> DataFrame:
    """``df.repartition(num_partitions, *columns)``."""
    seq = columns.seq(df)
    if seq is None:
        return df.repartition(num_partitions, *columns.columns())
    jdf: Any = getattr(df, "_jdf")  # noqa: B009 - classic only
    return type(df)(jdf.repartition(num_partitions, seq), df.sparkSession)


def arrow_schema(struct: StructType, *, nullable: bool | None = None) -> pa.Schema:
    return pa.schema(
        [
            pa.field(
                f.name,
                to_arrow_type(f.dataType),
                nullable=f.nullable if nullable is None else nullable,
            )
            for f in struct.fields
        ]
    )


def arrow_safe(data_type: DataType) -> DataType:
    """``data_type`` with the repeated field names of its structs suffixed ``_0``, ``_1``... as
    PySpark names them: Spark's Arrow transfer to Python refuses a struct whose fields share a
    name (``DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT``, as ``arrays_zip(c, c)`` makes), and a cast
    (Spark's casts a struct by position) turns one type into the other and back."""
    if isinstance(data_type, StructType):
        names = _distinct_names(data_type.names)
        return StructType(
            [
                StructField(name, arrow_safe(f.dataType), f.nullable, f.metadata)
                for name, f in zip(names, data_type.fields, strict=True)
            ]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(arrow_safe(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, MapType):
        key, value = arrow_safe(data_type.keyType), arrow_safe(data_type.valueType)
        return MapType(key, value, data_type.valueContainsNull)
    return data_type


def _distinct_names(names: list[str]) -> list[str]:
    """Each name that repeats suffixed with its occurrence, ``_0``, ``_1``... (PySpark's)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        if names.count(name) > 1:
            out.append(f"{name}_{seen.get(name, 0)}")
            seen[name] = seen.get(name, 0) + 1
        else:
            out.append(name)
    return out


def is_time(data_type: Any) -> bool:
    return isinstance(data_type, TimestampType | TimestampNTZType)


#: The one collation whose equal strings are equal bytes (Spark's ``supportsBinaryEquality``).
BINARY_COLLATION = "UTF8_BINARY"


def is_binary_stable(data_type: DataType) -> bool:
    """Whether equal values of ``data_type`` are equal bytes, as Spark's state store needs of a
    key (``UnsafeRowUtils.isBinaryStable``): no string inside it has a collation but
    UTF8_BINARY (``UTF8_LCASE``, ``UNICODE_CI`` and even ``UTF8_BINARY_RTRIM`` compare other
    bytes equal)."""
    if isinstance(data_type, StringType):
        return str(getattr(data_type, "collation", BINARY_COLLATION)).upper() == BINARY_COLLATION
    if isinstance(data_type, StructType):
        return all(is_binary_stable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return is_binary_stable(data_type.elementType)
    if isinstance(data_type, MapType):
        return is_binary_stable(data_type.keyType) and is_binary_stable(data_type.valueType)
    return True


def with_watermark(df: DataFrame, event_time: str | None, delay_ms: int | None) -> DataFrame:
    """``df`` with the query's watermark as Spark records it (on the event-time column's metadata,
    which the analyzer carries to a ``window()`` of it), for planning only."""
    if event_time is None or delay_ms is None or event_time not in df.columns:
        return df
    meta = df.schema[event_time].metadata or {}
    if WATERMARK_DELAY_KEY in meta:
        return df
    return df.withWatermark(event_time, f"{delay_ms} milliseconds")


def with_watermark_on(struct: StructType, column: str, delay_ms: int | None) -> StructType:
    """``struct`` with the watermark on ``column``, as Spark re-assigns it to the output column of
    ``eventTimeColumnName`` (the delay in the column's metadata, where PySpark records it)."""
    fields = []
    for f in struct.fields:
        if f.name == column and delay_ms is not None:
            metadata = {**(f.metadata or {}), WATERMARK_DELAY_KEY: delay_ms}
            f = StructField(f.name, f.dataType, f.nullable, metadata)
        fields.append(f)
    return StructType(fields)


def event_time_of(df: DataFrame) -> str | None:
    """The column of ``df`` the watermark is on (its delay in the column's metadata, where
    Spark carries it through the operators), if any."""
    for f in df.schema.fields:
        if WATERMARK_DELAY_KEY in (f.metadata or {}) and is_time(f.dataType):
            return f.name
    return None


def event_time_columns(df: DataFrame) -> list[str]:
    """The columns of ``df`` that carry a watermark's delay, each attribute once (Spark tells
    them by expression id: a column projected twice is one; by name where Spark's analysis
    cannot be read, under Spark Connect)."""
    jvm_df = getattr(df, "_jdf", None)
    if jvm_df is None:
        return list(dict.fromkeys(f.name for f in df.schema.fields if _has_delay(f)))
    output = jvm_df.queryExecution().analyzed().output()
    found: dict[int, str] = {}
    for i in range(output.size()):
        attribute = output.apply(i)
        if attribute.metadata().contains(WATERMARK_DELAY_KEY):
            found.setdefault(int(attribute.exprId().id()), str(attribute.name()))
    return list(found.values())


def _has_delay(field: StructField) -> bool:
    return WATERMARK_DELAY_KEY in (field.metadata or {})


def session_time_zone(df: DataFrame) -> str:
    """``spark.sql.session.timeZone``: the zone user functions see timestamps in."""
    return str(df.sparkSession.conf.get("spark.sql.session.timeZone"))


def struct_of(schema: Any, what: str) -> StructType:
    """A Spark ``StructType`` from a StructType or a DDL string (``"key long, count long"``)."""
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        from pyspark.sql.types import _parse_datatype_string

        try:
            parsed = _parse_datatype_string(schema)
        except Exception as exc:
            msg = f"{what}: cannot parse the schema {schema!r}: {exc}"
            raise ConfigurationError(msg) from exc
        if not isinstance(parsed, StructType):
            msg = f"{what}: {schema!r} is not a struct schema (e.g. 'key long, count long')"
            raise ConfigurationError(msg)
        return parsed
    msg = f"{what}: give a StructType or a DDL string, not {type(schema).__name__}"
    raise ConfigurationError(msg)


def output_shape(df: DataFrame, struct: StructType) -> DataFrame:
    """A DataFrame of the operator's output schema, as the driver's ``mapInArrow`` makes it
    each batch, for Spark to analyse the steps after it against (it never runs)."""
    return df.mapInArrow(_planned_only, struct)


def _planned_only(batches: Any) -> Any:
    msg = "a planning placeholder ran: the driver replaces it with the operator's task"
    raise AssertionError(msg)
