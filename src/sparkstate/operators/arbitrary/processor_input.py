"""The rows a ``transformWithState`` processor reads and writes: its input's columns, a key's rows
cut into frames as PySpark cuts them, Spark's check of emitted event times, and Avro's rule that a
state schema be nullable."""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, QueryError
from sparkstate.operators.arbitrary.state_vars import VarSpec
from sparkstate.operators.arbitrary.user_types import rebuilt_from_rows
from sparkstate.store.evolution import show_fields
from sparkstate.store.schema_json import fields_of

__all__ = [
    "UNLIMITED",
    "check_nullable",
    "frame_rows",
    "frames_of",
    "not_older_than",
    "select_columns",
]

#: No limit on a frame's rows or bytes (Spark's ``Int.MaxValue``).
UNLIMITED = 2**31 - 1


def frame_rows(table: pa.Table, max_records: int, max_bytes: int) -> int:
    """How many rows one frame of a key holds: Spark closes a frame at ``maxRecordsPerBatch``
    rows, or once its rows times the average Arrow size of an input row reach
    ``maxBytesPerBatch`` (here the average over the partition's input)."""
    size = max_records if max_records > 0 else UNLIMITED
    if max_bytes != UNLIMITED and table.num_rows:
        average = table.nbytes / table.num_rows
        if average > 0:
            size = min(size, max(1, math.ceil(max_bytes / average)))
    return size


def check_nullable(specs: dict[str, VarSpec]) -> None:
    """Spark's Avro state encoding refuses a state variable with a non-nullable field."""
    for name, spec in specs.items():
        if not spec.pickled and not all(f.nullable for f in spec.schema):
            msg = (
                "[TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE] If Avro encoding is enabled "
                "(spark.sql.streaming.stateStore.encodingFormat avro), all the fields in the "
                f"schema for column family {name} must be nullable when using the "
                "TransformWithState operator. Please make the schema nullable. Current schema: "
                f"{show_fields(fields_of(spec.schema))}"
            )
            raise ConfigurationError(msg)


def frames_of(frame: Any, size: int) -> Iterator[Any]:
    """A key's rows as frames of at most ``size`` rows, each rebuilt as PySpark builds it."""
    import pandas as pd

    if len(frame) <= size:
        yield rebuilt_from_rows(frame)
        return
    for start in range(0, len(frame), size):
        part = frame.iloc[start : start + size]
        part.index = pd.RangeIndex(len(part))
        yield rebuilt_from_rows(part)


def select_columns(
    table: pa.Table, schema: pa.Schema, names: Sequence[str] | None = None
) -> pa.Table:
    """``schema``'s columns of ``table``, read from the columns ``names`` (default: its own)."""
    names = schema.names if names is None else list(names)
    missing = [n for n in names if n not in table.column_names]
    if missing:
        msg = f"input has no column(s) {missing}; it has {table.column_names}"
        raise ConfigurationError(msg)
    columns = []
    for field, name in zip(schema, names, strict=True):
        col = table.column(name)
        columns.append(col if col.type == field.type else col.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def not_older_than(
    batches: Iterator[pa.RecordBatch], column: str, watermark_ms: int
) -> Iterator[pa.RecordBatch]:
    """``batches``, failing at the first row whose ``column`` is older than the watermark (Spark's
    check on an operator's ``eventTimeColumnName``)."""
    for batch in batches:
        values = batch.column(column)
        if batch.num_rows and values.null_count < len(values):
            oldest = pc.min(values.cast(pa.timestamp("us"))).value
            if oldest is not None and oldest < watermark_ms * 1000:
                emitted = datetime.datetime.fromtimestamp(oldest / 1e6, tz=datetime.UTC)
                msg = (
                    "[EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED] the processor emitted a row "
                    f"with {column}={emitted.isoformat()}, older than the current watermark "
                    f"({watermark_ms} ms). This can lead to correctness issues in the stateful "
                    "operators downstream; emit rows at or after the watermark."
                )
                raise QueryError(msg)
        yield batch
