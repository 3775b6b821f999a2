"""The state reader as PySpark data sources, in the shape of Spark's own.

``spark.read.format("sparkstate").load(checkpoint)`` reads an operator's state (or, with
``readChangeFeed``, its changes) with the options and columns of Spark's ``statestore`` source;
``spark.read.format("sparkstate-metadata").load(checkpoint)`` lists the operators with the columns
of Spark's ``state-metadata``. One Spark partition reads one state partition, on an executor,
from the durable files (a local path or ``s3://``), never from a running query's databases.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sparkstate.engine.spark.versions import from_arrow_schema
from sparkstate.observe.reader import METADATA_SCHEMA, ReadRequest, StateReader, state_metadata

__all__ = ["METADATA_SOURCE", "STATE_SOURCE", "register", "register_once"]

log = logging.getLogger("sparkstate.engine")

STATE_SOURCE = "sparkstate"
METADATA_SOURCE = "sparkstate-metadata"
_LOCK = threading.Lock()
#: Sessions the sources were registered with (by id; a session lives as long as the process).
_REGISTERED: set[int] = set()


def _spark_schema(schema: pa.Schema) -> StructType:
    spark_schema: StructType = from_arrow_schema(schema)
    return spark_schema


class _StateReader(DataSourceReader):
    def __init__(self, request: ReadRequest, num_partitions: int) -> None:
        self.request = request
        self.num_partitions = num_partitions

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(p) for p in range(self.num_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from StateReader(self.request).read(int(partition.value))


class StateSource(DataSource):
    """``spark.read.format("sparkstate")``: Spark's ``statestore`` options and columns."""

    @classmethod
    def name(cls) -> str:
        return STATE_SOURCE

    def _found(self) -> tuple[ReadRequest, pa.Schema, int]:
        """The request, its columns and partitions, checked once on the driver (kept as plain
        values: the source itself is pickled)."""
        if not hasattr(self, "_checked"):
            reader = StateReader(ReadRequest.from_options(dict(self.options)))
            self._checked = (reader.request, reader.schema, reader.num_partitions)
        return self._checked

    def schema(self) -> StructType:
        return _spark_schema(self._found()[1])

    def reader(self, schema: StructType) -> DataSourceReader:
        request, _, num_partitions = self._found()
        return _StateReader(request, num_partitions)


class _MetadataReader(DataSourceReader):
    def __init__(self, location: str) -> None:
        self.location = location

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from state_metadata(self.location).to_batches()


class StateMetadataSource(DataSource):
    """``spark.read.format("sparkstate-metadata")``: Spark's ``state-metadata`` columns."""

    @classmethod
    def name(cls) -> str:
        return METADATA_SOURCE

    def schema(self) -> StructType:
        return _spark_schema(METADATA_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        options: dict[str, Any] = dict(self.options)
        unknown = sorted(k for k in options if k.lower() != "path")
        if unknown:
            msg = f"the sparkstate-metadata reader takes no options, got {unknown}"
            raise ValueError(msg)
        location = options.get("path")
        if not location:
            msg = "give the checkpoint: spark.read.format('sparkstate-metadata').load(checkpoint)"
            raise ValueError(msg)
        state_metadata(str(location))  # fails here, on the driver, for a bad checkpoint
        return _MetadataReader(str(location))


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("sparkstate")`` and ``"sparkstate-metadata"`` available."""
    with _LOCK:
        for source in (StateSource, StateMetadataSource):
            try:
                spark.dataSource.register(source)
            except Exception as exc:
                if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
                    raise


def register_once(spark: SparkSession) -> None:
    """:func:`register`, once per session, for a query's session: a reader that cannot be
    registered is no reason to refuse the query (``ss.register`` says why)."""
    if id(spark) in _REGISTERED:
        return
    try:
        register(spark)
    except Exception:  # noqa: BLE001
        log.warning("the state reader was not registered with this session", exc_info=True)
        return
    _REGISTERED.add(id(spark))
