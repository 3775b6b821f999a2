"""Spark's own state rows, as an operator of ours keeps them: the take-over of a Spark checkpoint.

Spark's state data source (``spark.read.format("statestore")``) gives an operator's state as rows
of a ``key`` struct and a ``value`` struct. Each operator class says what its state is in those
rows (:meth:`sparkstate.operators.base.StatefulOperator.from_spark_state`), with the helpers here:
a struct's fields by name or by position, cast to the types of our state, and the refusal with
Spark's condition when the rows are not the state of this query (its grouping keys or its
aggregates changed since Spark wrote them), as Spark's own restart refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store import evolution

__all__ = [
    "KEY_NOT_COMPATIBLE",
    "READ",
    "VALUE_NOT_COMPATIBLE",
    "SparkRows",
    "by_name",
    "by_position",
    "fields_of",
]

KEY_NOT_COMPATIBLE = evolution.KEY_NOT_COMPATIBLE
VALUE_NOT_COMPATIBLE = evolution.NOT_COMPATIBLE

#: The field of the ``value`` struct naming the read a row is of, for an operator whose state is
#: several reads of Spark's (:meth:`~sparkstate.operators.base.StatefulOperator.spark_reads`).
READ = "__ss_read"

#: What an operator's state is in our column families: per family, its keys and values, as
#: tables of the family's key and value schemas.
SparkRows = dict[str, tuple[pa.Table, pa.Table]]


def fields_of(struct: pa.Array | pa.ChunkedArray) -> list[tuple[str, pa.Array]]:
    """A struct column's fields, in order: (name, values)."""
    if isinstance(struct, pa.ChunkedArray):
        struct = struct.combine_chunks()
    assert isinstance(struct, pa.StructArray)
    typ = struct.type
    return [(typ.field(i).name, struct.field(i)) for i in range(typ.num_fields)]


def _same_kind(spark: pa.DataType, ours: pa.DataType) -> bool:
    """Whether a column Spark keeps as ``spark`` is the column this query keeps as ``ours``:
    the same type, up to a timestamp's unit and zone, a string's or binary's offsets, and the
    names of a struct's fields (Spark compares state schemas without names)."""
    if spark == ours:
        return True
    for same in (pa.types.is_timestamp, _is_string, _is_binary):
        if same(spark) and same(ours):
            return True
    if pa.types.is_struct(spark) and pa.types.is_struct(ours):
        return spark.num_fields == ours.num_fields and all(
            _same_kind(spark.field(i).type, ours.field(i).type) for i in range(spark.num_fields)
        )
    if pa.types.is_list(spark) or pa.types.is_large_list(spark):
        inner = getattr(ours, "value_type", None)
        return inner is not None and _same_kind(spark.value_type, inner)
    return False


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _cast(values: pa.Array, target: pa.Field, condition: str, what: str) -> pa.Array:
    if values.type == target.type:
        return values
    if pa.types.is_null(values.type):  # Spark's placeholder of a value it does not keep
        return pa.nulls(len(values), target.type)
    if not _same_kind(values.type, target.type):
        msg = (
            f"Spark's state has {what} {target.name!r} as {values.type}, which this query keeps "
            f"as {target.type}: the query is not the one that wrote the checkpoint"
        )
        raise SchemaMismatchError(msg, condition)
    return values.cast(target.type)


def by_position(
    fields: Sequence[tuple[str, pa.Array]], schema: pa.Schema, condition: str, what: str
) -> pa.Table:
    """``fields`` as a table of ``schema``, the i-th field as its i-th column (Spark's names of
    aggregation buffers repeat: ``count``, ``sum``, ``sum``, ``count``)."""
    if len(fields) != len(schema):
        spark = ", ".join(f"{n} {a.type}" for n, a in fields)
        ours = ", ".join(f"{f.name} {f.type}" for f in schema)
        msg = (
            f"Spark's state has the {what}s ({spark}); this query keeps ({ours}): the query is "
            "not the one that wrote the checkpoint"
        )
        raise SchemaMismatchError(msg, condition)
    return pa.table(
        [_cast(a, f, condition, what) for (_, a), f in zip(fields, schema, strict=True)],
        schema=schema,
    )


def by_name(
    fields: Sequence[tuple[str, pa.Array]], schema: pa.Schema, condition: str, what: str
) -> pa.Table:
    """``fields`` as a table of ``schema``, each column the field of its name."""
    named = dict(fields)
    if sorted(named) != sorted(schema.names):
        msg = (
            f"Spark's state has the {what}s {sorted(named)}; this query keeps "
            f"{sorted(schema.names)}: the query is not the one that wrote the checkpoint"
        )
        raise SchemaMismatchError(msg, condition)
    return pa.table(
        [_cast(named[f.name], f, condition, what) for f in schema],
        schema=schema,
    )
