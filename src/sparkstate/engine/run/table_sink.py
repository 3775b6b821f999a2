"""``toTable(name)``: the table found, or created as Spark's ``toTable`` creates it, then written
through the exactly-once file sink at its location, as Spark writes a file source's table.

Spark's refusals are kept, in Spark's order: a temporary view, then (the table created if it
is missing) a view, then a table of another provider than the writer's format (the session's
default source when none was chosen). A table of a provider that is not a file format is one
sparkstate cannot write (Spark writes it through the provider's streaming writer).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from sparkstate.engine.run.sinks import FILE_FORMATS
from sparkstate.engine.spark.errors import SparkAnalysisError
from sparkstate.exceptions import ConfigurationError

__all__ = ["default_source", "table_sink"]

#: Spark's default data source: a writer's format until one is chosen.
DEFAULT_SOURCE = "spark.sql.sources.default"


def default_source(spark: Any) -> str:
    """The format of a writer that was not given one (``spark.sql.sources.default``)."""
    return str(spark.conf.get(DEFAULT_SOURCE, "parquet"))


def table_sink(
    spark: Any,
    name: str,
    source: str,
    schema: StructType,
    path: str | None,
    *,
    partition_by: tuple[str, ...] = (),
    cluster_by: tuple[str, ...] = (),
) -> str:
    """The location the query writes table ``name`` at, with the writer's format ``source``.

    A missing table is created as Spark's ``toTable`` creates it: the stream's columns, all
    nullable, ``USING source``, ``PARTITIONED BY`` and ``CLUSTER BY`` the writer's columns, at
    ``path`` (an external table) if the writer has one; no file is written until the first
    batch."""
    found = _table(spark, name)
    if found is not None and found.isTemporary:
        msg = f"Temporary view {name} doesn't support streaming write."
        raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_1190", {"viewName": name})
    if found is None:
        spark.sql(_create_table(name, source, schema, path, partition_by, cluster_by))
        found = _table(spark, name)
    if found is None or found.tableType == "VIEW":
        msg = f"Streaming into views {name} is not supported."
        raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_1191", {"viewName": name})
    about = {row[0]: row[1] for row in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()}
    provider = str(about.get("Provider", "")).lower()
    if provider != source:
        msg = (
            f"The input source({source}) is different from the table {name}'s data source "
            f"provider({provider})."
        )
        parameters = {"source": source, "tableName": name, "provider": provider}
        raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_1192", parameters)
    if provider not in FILE_FORMATS:
        msg = (
            f"toTable({name!r}): the table's provider {provider!r} is not one sparkstate writes; "
            f"it writes tables of a file format ({', '.join(FILE_FORMATS)}). Use foreachBatch "
            "to write each batch's rows with the table's own writer"
        )
        raise ConfigurationError(msg)
    return str(about["Location"])


def _table(spark: Any, name: str) -> Any:
    """The catalog's entry of ``name`` (a table or a view), or None."""
    return spark.catalog.getTable(name) if spark.catalog.tableExists(name) else None


def _create_table(
    name: str,
    source: str,
    schema: StructType,
    path: str | None,
    partition_by: tuple[str, ...],
    cluster_by: tuple[str, ...],
) -> str:
    """Spark's ``CREATE TABLE`` of ``toTable``'s missing table (``name`` as the user wrote it,
    a multi-part identifier, as Spark parses it)."""
    columns = _nullable(schema)
    assert isinstance(columns, StructType)
    ddl = f"CREATE TABLE {name} ({columns.toDDL()}) USING {_identifier(source)}"
    if partition_by:
        ddl += f" PARTITIONED BY ({', '.join(_identifier(c) for c in partition_by)})"
    if cluster_by:
        ddl += f" CLUSTER BY ({', '.join(_identifier(c) for c in cluster_by)})"
    if path is not None:
        ddl += " LOCATION '" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return ddl


def _identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _nullable(data_type: DataType) -> DataType:
    """``data_type`` with every field, element and value nullable (Spark's ``asNullable``)."""
    if isinstance(data_type, StructType):
        return StructType(
            [StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in data_type]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type
