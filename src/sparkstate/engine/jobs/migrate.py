"""``.option("stateMigration", ...)``: a restart whose state schemas changed migrates the state to
the changed query, as one Spark job, instead of being refused.

The logs and their order are :mod:`sparkstate.runtime.migration`'s. Per operator, the state
reader (``spark.read.format("sparkstate")``) gives the state after the last committed batch in
the shape Spark's own state reader gives it (a ``key`` and a ``value`` struct); an operator that
changed has its rows converted to the changed operator's shape: by ``stateMigration="auto"``
(each key and value field cast to its new type as Spark casts, a widened number say; an
aggregation's aggregates matched by function and alias, a new one starting from its empty
buffers) or by the user's function of each row (``fn(key, value)``: dicts in the old shape, to
none, one or several ``(key, value)`` pairs in the new one). Each operator's class then says
what those rows are in its column families
(:meth:`~sparkstate.operators.base.StatefulOperator.from_spark_state`, as for a take-over of
Spark's state), and the rows are written where the engine's shuffle sends their keys.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from sparkstate.engine.jobs.rescale import on_checkpoint, write_unwritten
from sparkstate.engine.jobs.take_over import (
    converted_and_written,
    families_of,
    move_of,
    write_schemas,
)
from sparkstate.engine.plan.stage import Stage
from sparkstate.engine.run.batch_job import engine_settings
from sparkstate.engine.spark.state_source import register
from sparkstate.engine.spark.versions import from_arrow_type
from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.aggregation.aggregate import StreamingAggregate
from sparkstate.operators.base import StatefulOperator
from sparkstate.operators.state_views import as_struct
from sparkstate.runtime.migration import Migration, commit_migration
from sparkstate.runtime.state_moves import OperatorMove
from sparkstate.store.base import DEFAULT_CF

__all__ = ["AUTO", "check_migration", "migrate"]

log = logging.getLogger("sparkstate.engine")
#: ``stateMigration``'s value for the changes that need no function.
AUTO = "auto"
#: An aggregation buffer's column in state: ``__ss_agg<i>_<part>``.
_BUFFER = re.compile(r"__ss_agg(\d+)_")


def check_migration(how: Any) -> None:
    """``stateMigration`` is ``"auto"`` or a function of an old state row."""
    if how != AUTO and not callable(how):
        msg = (
            f"stateMigration must be {AUTO!r} or a function (key, value) -> new (key, value) "
            f"rows, got {how!r}"
        )
        raise ConfigurationError(msg)


def migrate(spark: SparkSession, plan: Migration, stages: list[Stage], how: Any) -> None:
    """Migrate the checkpoint's state to the query of ``stages`` (the caller holds the
    checkpoint's lock)."""
    started = time.perf_counter()
    for s in stages:
        if type(s.operator).from_spark_state is StatefulOperator.from_spark_state:
            msg = (
                f"{plan.location}: the state of operator {s.op_id} ({s.operator.kind}) cannot be "
                "migrated yet (aggregations, deduplications, the streaming limit and "
                "applyInPandasWithState can). Restore the original query, or start from a new "
                "checkpoint location"
            )
            raise ConfigurationError(msg)
    register(spark)
    moves = [move_of(plan, s.op_id, s.operator) for s in stages]
    old = {int(o["id"]): o for o in plan.old_operators}
    frames = []
    for s, m in zip(stages, moves, strict=True):
        state = (
            spark.read.format("sparkstate")
            .option("batchId", plan.batch_id)
            .option("operatorId", s.op_id)
            .load(plan.location)
        )
        if s.op_id in plan.changed:
            state = _changed(state, s.operator, old[s.op_id], how)
        frames.append(converted_and_written(state, plan, m, s.operator, in_place=False))
    families = [(m, families_of(s.operator)) for m, s in zip(moves, stages, strict=True)]
    on_checkpoint(spark, write_schemas, (plan, families))
    job = frames[0]
    for frame in frames[1:]:
        job = job.unionByName(frame)
    written: dict[int, dict[int, tuple[str, int]]] = {m.op_id: {} for m in moves}
    with engine_settings(spark, plan.num_partitions):
        for r in job.collect():
            written[r["op"]][r["partition"]] = (r["checkpoint_id"], r["num_rows"])
    on_checkpoint(spark, _commit, (plan, moves, written))
    rows = sum(n for parts in written.values() for _, n in parts.values())
    log.warning(
        "%s: migrated the state of operator(s) %s to the changed query after batch %d "
        "(%s rows, %.1f s)",
        plan.location,
        plan.changed,
        plan.batch_id,
        f"{rows:,}",
        time.perf_counter() - started,
    )


def _commit(
    arg: tuple[Migration, list[OperatorMove], dict[int, dict[int, tuple[str, int]]]],
) -> None:
    plan, moves, written = arg
    write_unwritten(
        plan.state_root, plan.provider, moves, plan.num_partitions, plan.version, written
    )
    commit_migration(plan, written)


def _shape(operator: StatefulOperator) -> tuple[pa.DataType, pa.DataType]:
    """The types of the ``key`` and ``value`` the state reader shows for the operator."""
    described = {"id": 0, **operator.describe()}
    view = type(operator).state_view(described, families_of(operator), store_name=DEFAULT_CF)
    schema = view.schema
    return schema.field("key").type, schema.field("value").type


def _changed(
    state: DataFrame, operator: StatefulOperator, old: dict[str, Any], how: Any
) -> DataFrame:
    """The old operator's rows (``key``, ``value``, ``partition_id``) in the changed one's shape."""
    key_type, value_type = _shape(operator)
    if how == AUTO:
        convert = _automatic(operator, old, key_type, value_type)
    else:
        convert = _by_function(how, key_type, value_type)
    schema = pa.schema(
        [
            pa.field("key", key_type),
            pa.field("value", value_type),
            pa.field("partition_id", pa.int32()),
        ]
    )
    spark_schema = ", ".join(f"`{f.name}` {from_arrow_type(f.type).simpleString()}" for f in schema)

    def converted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            keys, values, partitions = convert(batch)
            yield pa.RecordBatch.from_arrays([keys, values, partitions], schema=schema)

    return state.mapInArrow(converted, spark_schema)


Convert = Callable[[pa.RecordBatch], tuple[pa.Array, pa.Array, pa.Array]]


def _by_function(fn: Any, key_type: pa.DataType, value_type: pa.DataType) -> Convert:
    """The user's function of each old row: none, one ``(key, value)`` pair or several."""

    def convert(batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array, pa.Array]:
        keys, values, partitions = [], [], []
        for key, value, partition in zip(
            batch.column(0).to_pylist(),
            batch.column(1).to_pylist(),
            batch.column(2).to_pylist(),
            strict=True,
        ):
            result = fn(key, value)
            if result is None:
                continue
            pairs = [result] if isinstance(result, tuple) else list(result)
            for new_key, new_value in pairs:
                keys.append(new_key)
                values.append(new_value)
                partitions.append(partition)
        return (
            pa.array(keys, key_type),
            pa.array(values, value_type),
            pa.array(partitions, pa.int32()),
        )

    return convert


def _cast(values: pa.Array, to: pa.DataType, what: str) -> pa.Array:
    try:
        return values.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        msg = (
            f"stateMigration='auto' cannot turn {what} of type {values.type} into {to} ({exc}): "
            "give a function"
        )
        raise ConfigurationError(msg) from exc


def _fields(struct: pa.Array) -> list[pa.Array]:
    assert isinstance(struct, pa.StructArray)
    return [struct.field(i) for i in range(struct.type.num_fields)]


def _automatic(
    operator: StatefulOperator, old: dict[str, Any], key_type: pa.DataType, value_type: pa.DataType
) -> Convert:
    """The changes that need no function: each key field cast to its new type (a widened
    number), as each value field; an aggregation's aggregates matched by function and alias,
    a new one starting from its empty buffers."""
    old_spans = _spans(old) if isinstance(operator, StreamingAggregate) else None
    plan: list[tuple[str, int] | tuple[str, Any]] | None = None
    if isinstance(operator, StreamingAggregate) and old_spans is not None:
        plan = []
        wanted = {(a["func"], a["name"]): i for i, a in enumerate(old.get("aggregates", []))}
        for agg in operator.aggregates:
            found = wanted.get((agg.func, agg.output_name))
            if found is not None and found < len(old_spans):
                plan += [("old", j) for j in old_spans[found]]
                continue
            empty = agg.empty_buffers()
            if empty is None:
                msg = (
                    f"stateMigration='auto' has no empty value for the new aggregate "
                    f"{agg.func}() of column {agg.output_name!r}: give a function"
                )
                raise ConfigurationError(msg)
            plan += [("empty", v) for v in empty]

    def convert(batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array, pa.Array]:
        old_keys, old_values = _fields(batch.column(0)), _fields(batch.column(1))
        if len(old_keys) != key_type.num_fields:
            msg = (
                f"stateMigration='auto': the state key has {len(old_keys)} field(s) and the "
                f"changed query's {key_type.num_fields}: give a function"
            )
            raise ConfigurationError(msg)
        keys = [
            _cast(a, key_type.field(i).type, f"key field {key_type.field(i).name!r}")
            for i, a in enumerate(old_keys)
        ]
        n = batch.num_rows
        if plan is not None:
            values = [
                old_values[int(what)] if kind == "old" else pa.repeat(pa.scalar(what), n)
                for kind, what in plan
            ]
        elif len(old_values) == value_type.num_fields:
            values = old_values
        else:
            msg = (
                f"stateMigration='auto': the state value has {len(old_values)} field(s) and "
                f"the changed query's {value_type.num_fields}: give a function"
            )
            raise ConfigurationError(msg)
        values = [
            _cast(a, value_type.field(i).type, f"value field {value_type.field(i).name!r}")
            for i, a in enumerate(values)
        ]
        key_table = pa.Table.from_arrays(keys, schema=pa.schema(list(key_type)))
        value_table = pa.Table.from_arrays(values, schema=pa.schema(list(value_type)))
        return as_struct(key_table), as_struct(value_table), batch.column(2)

    return convert


def _spans(described: dict[str, Any]) -> list[list[int]] | None:
    """The value fields of each of an aggregation's aggregates, in order (its buffers are
    ``__ss_agg<i>_<part>`` columns)."""
    value = described.get("value_schema") or {}
    fields = value.get("fields", []) if isinstance(value, dict) else value
    spans: dict[int, list[int]] = {}
    for j, f in enumerate(fields):
        name = f["name"] if isinstance(f, dict) else f[0]
        m = _BUFFER.match(str(name))
        if m is None:
            return None
        spans.setdefault(int(m.group(1)), []).append(j)
    return [spans[i] for i in sorted(spans)]
