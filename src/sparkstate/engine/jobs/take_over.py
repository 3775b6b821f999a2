"""The take-over of a checkpoint Spark's own stateful operators wrote, as one Spark job.

The logs and their order are :mod:`sparkstate.runtime.take_over`'s. The state moves as a rescale
moves it (:mod:`sparkstate.engine.jobs.rescale`): per operator, Spark's state data source reads
the state Spark's operator holds after the batch taken over on (``spark.read.format("statestore")``,
for either of Spark's providers and any of their checkpoint formats), the operator's class says
what each of its rows is in our column families
(:meth:`~sparkstate.operators.base.StatefulOperator.from_spark_state`), and each partition is
written as the version the next batch loads. Where the engine's shuffle sends the keys to the
partition Spark's operator kept them in
(:meth:`~sparkstate.operators.base.StatefulOperator.spark_partitioned`), the task that read a
partition writes it; otherwise Spark's ``repartition(n, *key columns)`` sends each key where
the next batch's shuffle sends it first.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from sparkstate.engine.jobs.rescale import (
    WRITTEN,
    on_checkpoint,
    write_moved,
    write_unwritten,
    written_by_key,
)
from sparkstate.engine.plan.stage import Stage
from sparkstate.engine.run.batch_job import engine_settings, session_conf
from sparkstate.engine.spark.versions import from_arrow_type, to_arrow_type
from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.files.durable import DurableDir
from sparkstate.observe.key_lookup import partition_columns
from sparkstate.observe.spark_hash import spark_partition
from sparkstate.operators.base import StatefulOperator
from sparkstate.operators.join import MATCHED, SPARK_INDEX
from sparkstate.operators.join_state import KEY_WITH_INDEX_TO_VALUE
from sparkstate.operators.registry import layout_of
from sparkstate.operators.spark_state import READ, VALUE_NOT_COMPATIBLE
from sparkstate.runtime.state_moves import FAMILY, KEY, VALUE, OperatorMove
from sparkstate.runtime.take_over import TakeOver, begin_take_over, commit_take_over
from sparkstate.runtime.triggers import next_request
from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.capabilities import WritesVersions
from sparkstate.store.conf import StoreId
from sparkstate.store.families import ColumnFamily
from sparkstate.store.registry import provider_class
from sparkstate.store.rocksdb.spark_checkpoint import ROW_START, snapshot_name, spark_rocksdb_rows
from sparkstate.store.spark_files import UnreadableRows, arrow_of_unsafe_rows

__all__ = [
    "SparkFiles",
    "StateTarget",
    "converted_and_written",
    "families_of",
    "move_of",
    "take_over",
    "write_schemas",
]

log = logging.getLogger("sparkstate.engine")
#: The column beside a converted row: the Spark partition it was read from.
SPARK_PARTITION = "__spark_partition"
#: The rows of each partition whose partition under the engine's shuffle is checked (a
#: partitioning that differs, differs for nearly every key).
CHECKED_ROWS = 64


def take_over(spark: SparkSession, plan: TakeOver, stages: list[Stage]) -> None:
    """Take the checkpoint of ``plan`` over from Spark's operators, for the query of ``stages``
    (the caller holds the checkpoint's lock)."""
    started = time.perf_counter()
    for s in stages:  # an operator that cannot take Spark's state over says so first
        if type(s.operator).from_spark_state is StatefulOperator.from_spark_state:
            StatefulOperator.from_spark_state(s.operator, pa.array([]), pa.array([]))
    moves = [move_of(plan, s.op_id, s.operator) for s in stages]
    with session_conf(spark, plan.read_conf):
        states = [_spark_state(spark, plan, s) for s in stages]
    for state, s in zip(states, stages, strict=True):  # refused here, before anything is written
        _check_schema(state, s.operator)
    on_checkpoint(spark, begin_take_over, plan)
    on_checkpoint(
        spark,
        write_schemas,
        (plan, [(m, families_of(s.operator)) for m, s in zip(moves, stages, strict=True)]),
    )
    operators = [s.operator for s in stages]
    in_place = all(
        s.operator.spark_partitioned() and m.columns for s, m in zip(stages, moves, strict=True)
    )
    files = [_files_of(plan, s, state) for s, state in zip(stages, states, strict=True)]
    # Where Spark's partitions are the engine's, each task writes the state it read (and a task
    # that finds a row of another partition fails the job, which runs again with the shuffle);
    # where a task cannot read Spark's files, the job runs again with Spark's state reader
    while True:
        try:
            written = _run(spark, plan, states, files, moves, operators, in_place=in_place)
            break
        except Exception as exc:
            if _Misplaced.MARK in str(exc) and in_place:
                log.info(
                    "%s: Spark's state partitions are not the engine's: shuffling", plan.location
                )
                in_place = False
            elif SparkFiles.MARK in str(exc) and any(files):
                log.info(
                    "%s: Spark's state files not read (%s): its state reader reads them",
                    plan.location,
                    _cause(exc, SparkFiles.MARK),
                )
                files = [None] * len(files)
            else:
                raise
    triggers = {s.op_id: s.operator.time_trigger() for s in stages}
    moved = plan.next_watermark_ms > plan.batch_watermark_ms
    clock = next_request({}, triggers, moved, [], int(time.time() * 1000))
    on_checkpoint(
        spark, _commit, (plan, moves, written, clock if plan.metadata.get("clock") else None)
    )
    rows = sum(n for parts in written.values() for _, n in parts.values())
    log.warning(
        "%s: took over the state of %d operator(s) from Spark's %s after its batch %d "
        "(%s rows, %.1f s; %s)",
        plan.location,
        len(moves),
        plan.spark_provider.rsplit(".", 1)[-1],
        plan.batch_id,
        f"{rows:,}",
        time.perf_counter() - started,
        f"{sum(f is not None for f in files)} read from Spark's files, "
        f"{sum(f is None for f in files)} by its state reader",
    )


def _run(
    spark: SparkSession,
    plan: TakeOver,
    states: list[DataFrame],
    files: list[SparkFiles | None],
    moves: list[OperatorMove],
    operators: list[StatefulOperator],
    *,
    in_place: bool,
) -> dict[int, dict[int, tuple[str, int]]]:
    """The job that writes every operator's state (read by Spark's state reader, or from its
    ``files`` where they are given); per operator and partition, the checkpoint id written and
    the operator's rows in it."""
    frames = [
        converted_and_written(
            state if f is None else f.frame(spark),
            plan,
            m,
            op,
            in_place=in_place,
            read=None if f is None else f.read,
        )
        for state, f, m, op in zip(states, files, moves, operators, strict=True)
    ]
    job = frames[0]
    for frame in frames[1:]:
        job = job.unionByName(frame)
    written: dict[int, dict[int, tuple[str, int]]] = {m.op_id: {} for m in moves}
    with engine_settings(spark, plan.num_partitions), session_conf(spark, plan.read_conf):
        for r in job.collect():
            written[r["op"]][r["partition"]] = (r["checkpoint_id"], r["num_rows"])
    return written


class StateTarget(Protocol):
    """Where converted state is written: a take-over's, or a migration's
    (:mod:`sparkstate.engine.jobs.migrate`)."""

    @property
    def location(self) -> str: ...
    @property
    def state_root(self) -> str: ...
    @property
    def batch_id(self) -> int: ...
    @property
    def num_partitions(self) -> int: ...
    @property
    def provider(self) -> str: ...
    @property
    def version(self) -> int: ...
    def schema_record(self, families: dict[str, Any]) -> dict[str, Any]: ...


def families_of(operator: StatefulOperator) -> dict[str, tuple[pa.Schema, pa.Schema]]:
    return {
        DEFAULT_CF: (operator.key_schema, operator.value_schema),
        **operator.column_families(),
    }


def move_of(plan: StateTarget, op_id: int, operator: StatefulOperator) -> OperatorMove:
    """How the operator's state moves: the columns its rows are shuffled by, as a rescale's."""
    described = operator.describe()
    columns = partition_columns(described, operator.key_schema)
    _, derive = layout_of(operator.kind).derived_families()
    fields = [
        pa.field(f"__p{i}", operator.key_schema.field(c).type, nullable=True)
        for i, c in enumerate(columns)
    ]
    schema = pa.schema(
        [
            *fields,
            pa.field(FAMILY, pa.string()),
            pa.field(KEY, pa.binary()),
            pa.field(VALUE, pa.binary()),
        ]
    )
    partitions = list(range(plan.num_partitions))
    return OperatorMove(
        plan.location,
        op_id,
        operator.kind,
        plan.batch_id,
        columns,
        schema,
        partitions,
        derive=derive,
    )


def write_schemas(arg: tuple[StateTarget, list[tuple[OperatorMove, dict[str, Any]]]]) -> None:
    """Step 1's ``_schema.json`` of every store the state is written into, written by the
    provider (:class:`~sparkstate.store.capabilities.WritesVersions`)."""
    plan, moves = arg
    writer = WritesVersions.require_class(
        provider_class(plan.provider), "the state is written into each partition"
    )
    for move, families in moves:
        record = plan.schema_record(families)
        for p in range(plan.num_partitions):
            store_id = StoreId(plan.state_root, move.op_id, p)
            writer.admit_partition_count(store_id, record, [], plan.num_partitions)


def _read(
    spark: SparkSession, plan: TakeOver, op_id: int, options: dict[str, str] | None = None
) -> DataFrame:
    reader = spark.read.format("statestore").option("batchId", plan.batch_id)
    return reader.options(**(options or {})).option("operatorId", op_id).load(plan.location)


def _reads_state(
    spark: SparkSession, plan: TakeOver, op_id: int, reads: dict[str, dict[str, str]]
) -> DataFrame:
    """Several reads of one operator's state (a processor's state variables and timers) as one
    DataFrame: the ``key``, and a ``value`` of the read's name (:data:`READ`) and a field per
    read, each the read's columns beside the key, null on the other reads' rows."""
    frames = {name: _read(spark, plan, op_id, options) for name, options in reads.items()}
    payloads = {
        name: F.struct(*(c for c in df.columns if c not in ("key", "partition_id")))
        for name, df in frames.items()
    }
    types = {name: frames[name].select(p).schema[0].dataType for name, p in payloads.items()}
    union = None
    for name, df in frames.items():
        value = F.struct(
            F.lit(name).alias(READ),
            *((payloads[n] if n == name else F.lit(None).cast(types[n])).alias(n) for n in frames),
        )
        rows = df.select("key", value.alias("value"), "partition_id")
        union = rows if union is None else union.unionByName(rows)
    assert union is not None
    return union


def _spark_state(spark: SparkSession, plan: TakeOver, stage: Stage) -> DataFrame:
    """The state Spark's operator of ``stage`` holds after the batch taken over on: its ``key``
    and ``value``, the value's fields named by position (Spark's aggregation buffers repeat
    names, ``count, sum, sum, count``, which Arrow refuses)."""
    if stage.side_rows is not None:
        return _join_state(spark, plan, stage)
    reads = stage.operator.spark_reads()
    if reads is not None:
        return _reads_state(spark, plan, stage.op_id, reads)
    state = _read(spark, plan, stage.op_id)
    value = state.schema["value"].dataType
    assert isinstance(value, StructType)
    positional = StructType(
        [StructField(f"_{i}", f.dataType, f.nullable) for i, f in enumerate(value.fields)]
    )
    return state.select(
        "key", F.col("value").cast(positional).alias("value"), F.col("partition_id")
    )


def _join_state(spark: SparkSession, plan: TakeOver, stage: Stage) -> DataFrame:
    """The rows both sides of a stream-stream join keep in Spark's state, from each side's
    ``keyWithIndexToValue`` store (a row under its join key and its place there, with its
    ``matched`` flag), as the operator's input holds them (the join key and the columns the
    condition and the watermark read computed as a batch computes them): the ``key`` is the
    join key, the ``value`` the row with the side it is of, its flag and its place."""
    assert stage.side_rows is not None
    sides = []
    for side in ("left", "right"):
        state = _read(spark, plan, stage.op_id, {"storeName": f"{side}-{KEY_WITH_INDEX_TO_VALUE}"})
        key, value = (state.schema[c].dataType for c in ("key", "value"))
        assert isinstance(key, StructType) and isinstance(value, StructType)
        *columns, flag = value.fieldNames()
        if flag != "matched":
            msg = (
                f"Spark keeps the join's {side} rows without their matched flag (its join state "
                "format 1): sparkstate takes over join state of format 2 (Spark's default since "
                "3.0); run the query from a new checkpoint location"
            )
            raise ConfigurationError(msg)
        rows = state.select(
            *(F.col("value").getField(c).alias(c) for c in columns),
            F.col("value").getField(flag).alias(MATCHED),
            F.col("key").getField(key.fieldNames()[-1]).alias(SPARK_INDEX),
            "partition_id",
        )
        try:
            shaped = stage.side_rows(side, rows, (MATCHED, SPARK_INDEX, "partition_id"))
            shaped.schema  # noqa: B018 - analysed here, where a missing column is refused
        except AnalysisException as exc:
            msg = (
                f"Spark's state of the join's {side} side keeps the columns {columns}, which do "
                f"not make this query's {side} side ({exc.getMessage().splitlines()[0]}): the "
                "query is not the one that wrote the checkpoint"
            )
            raise SchemaMismatchError(msg, VALUE_NOT_COMPATIBLE) from exc
        sides.append(shaped)
    union = sides[0].unionByName(sides[1])
    keys = list(stage.partition_columns)
    carried = [c for c in union.columns if c not in keys and c != "partition_id"]
    return union.select(
        F.struct(*keys).alias("key"), F.struct(*carried).alias("value"), "partition_id"
    )


@dataclasses.dataclass(frozen=True)
class SparkFiles:
    """One operator's state read from the files of Spark's RocksDB provider, by one task per
    partition, rather than by Spark's state data source: the snapshot each partition holds of
    the version after the batch taken over on (:mod:`sparkstate.store.rocksdb.spark_checkpoint`),
    its keys and values decoded as the data source's ``key`` and ``value`` (the value's fields
    by position). What a task cannot read it raises with :data:`MARK`, and the take-over runs
    again with the data source."""

    MARK: ClassVar[str] = "SPARKSTATE_SPARK_FILES_UNREAD"

    operator_dir: str
    version: int
    unique_ids: tuple[str | None, ...]
    key_type: pa.StructType
    value_type: pa.StructType

    def frame(self, spark: SparkSession) -> DataFrame:
        """A partition id per task."""
        n = len(self.unique_ids)
        return spark.range(0, n, 1, n).select(F.col("id").cast("int").alias("partition"))

    def read(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The rows of Spark's state of each partition id in ``batches``."""
        for batch in batches:
            for p in batch.column(0).to_pylist():
                yield self.rows_of(p)

    def rows_of(self, partition: int) -> pa.RecordBatch:
        directory = DurableDir(self.operator_dir).child(str(partition))
        try:
            keys, values = spark_rocksdb_rows(directory, self.version, self.unique_ids[partition])
            key = arrow_of_unsafe_rows(keys, self.key_type, ROW_START)
            value = arrow_of_unsafe_rows(values, self.value_type, ROW_START)
        except UnreadableRows as exc:
            msg = f"{self.MARK}: {exc}"
            raise UnreadableRows(msg) from exc
        n = len(keys)
        return pa.RecordBatch.from_arrays(
            [key, value, pa.repeat(pa.scalar(partition, pa.int32()), n)],
            ["key", "value", "partition_id"],
        )


def _files_of(plan: TakeOver, stage: Stage, state: DataFrame) -> SparkFiles | None:
    """How the take-over reads the state of ``stage`` from Spark's files, where it can: Spark's
    RocksDB provider, an operator whose store Spark keeps plain, of types the decoder reads,
    and a snapshot of the version in every partition (else None: the data source reads it)."""
    if not (
        plan.spark_provider.endswith("RocksDBStateStoreProvider")
        and stage.operator.spark_plain_store
    ):
        return None
    if stage.side_rows is not None or stage.operator.spark_reads() is not None:
        return None
    types = [to_arrow_type(state.schema[c].dataType) for c in ("key", "value")]
    try:
        for t in types:
            arrow_of_unsafe_rows(pa.array([], pa.binary()), t)
    except UnreadableRows:
        return None
    ids = plan.unique_ids.get(stage.op_id)
    if plan.read_conf and (ids is None or len(ids) != plan.num_partitions):
        return None
    unique_ids = tuple(ids) if plan.read_conf and ids else (None,) * plan.num_partitions
    operator_dir = DurableDir(plan.location).child("state", str(stage.op_id))
    for p, uid in enumerate(unique_ids):
        if not operator_dir.child(str(p)).exists(snapshot_name(plan.version, uid)):
            return None
    return SparkFiles(operator_dir.uri, plan.version, unique_ids, types[0], types[1])


def _cause(exc: Exception, mark: str) -> str:
    text = str(exc)
    at = text.find(mark)
    return text[at + len(mark) + 2 :].splitlines()[0] if at >= 0 else text.splitlines()[0]


def _check_schema(state: DataFrame, operator: StatefulOperator) -> None:
    """The operator's refusal of Spark's state where it is not this query's, raised here on
    the driver, with Spark's condition (the conversion in the tasks would raise it there)."""
    empty = [pa.array([], to_arrow_type(state.schema[c].dataType)) for c in ("key", "value")]
    operator.from_spark_state(*empty)


def _converter(
    move: OperatorMove, operator: StatefulOperator
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """What turns Spark's state of one operator (its ``key``, ``value`` and ``partition_id``)
    into our rows of it: :attr:`OperatorMove.schema`, and the Spark partition each was in."""
    schema = pa.schema([*move.schema, pa.field(SPARK_PARTITION, pa.int32())])
    described = families_of(operator)
    columns = move.columns

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        families = {name: ColumnFamily(name, k, v) for name, (k, v) in described.items()}
        # The task's rows at once: an operator's rows of one key may be in several batches
        # (a session window's sessions, which its list of starts gathers).
        read = [b for b in batches if b.num_rows]
        if read:
            batch = pa.Table.from_batches(read).combine_chunks().to_batches()[0]
            rows = operator.from_spark_state(batch.column(0), batch.column(1))
            # Spark's partition of the task's rows (-1 where they are of several: not in place)
            bounds = pc.min_max(batch.column(2))
            one = bounds["min"].as_py() == bounds["max"].as_py()
            partition = pa.scalar(bounds["min"].as_py() if one else -1, pa.int32())
            for name, (keys, values) in rows.items():
                family = families[name]
                n = keys.num_rows
                yield pa.RecordBatch.from_arrays(
                    [
                        *(
                            keys.column(c).combine_chunks().cast(schema.field(i).type)
                            for i, c in enumerate(columns)
                        ),
                        pa.repeat(pa.scalar(name, pa.string()), n),
                        family.key_codec.encode_many_arrow(keys, family.prefix).cast(pa.binary()),
                        family.value_codec.encode_many_arrow(values).cast(pa.binary()),
                        pa.repeat(partition, n),
                    ],
                    schema=schema,
                )

    return convert


def converted_and_written(
    state: DataFrame,
    plan: StateTarget,
    move: OperatorMove,
    operator: StatefulOperator,
    *,
    in_place: bool,
    read: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] | None = None,
) -> DataFrame:
    """Spark's state of one operator, converted, written as the version the next batch loads:
    ``in_place``, each Spark partition's rows by the task that read them (its first rows
    checked to be in the partition the engine's shuffle sends them to: :class:`_Misplaced`
    where one is not); else sent there by a shuffle first. ``read``: what makes the rows of
    Spark's state (``key``, ``value``, ``partition_id``) of ``state``'s batches, where they
    are not ``state``'s own (:meth:`SparkFiles.read`)."""
    provider = plan.provider
    conversion = _converter(move, operator)

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return conversion(batches if read is None else read(batches))

    if not in_place:
        schema = move.schema
        spark_schema = ", ".join(
            f"`{f.name}` {from_arrow_type(f.type).simpleString()}" for f in schema
        )

        def converted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in convert(batches):
                yield batch.select(schema.names)

        rows = state.mapInArrow(converted, spark_schema)
        return written_by_key(
            rows, move, plan.state_root, provider, plan.version, plan.num_partitions
        )
    state_root, version, names, n = (
        plan.state_root,
        plan.version,
        move.schema.names,
        plan.num_partitions,
    )

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = (b for b in convert(batches) if b.num_rows)
        first = next(rows, None)
        if first is None:  # a partition without state: written empty at the commit
            return
        partition = int(first.column(SPARK_PARTITION)[0].as_py())
        sample = first.slice(0, CHECKED_ROWS)
        for i in range(sample.num_rows):
            key = [sample.column(c)[i] for c in move.shuffle_columns]
            if spark_partition(key, n) != partition:
                raise _Misplaced(move.op_id, partition)

        def checked() -> Iterator[pa.RecordBatch]:
            for batch in itertools.chain([first], rows):
                if pc.any(pc.not_equal(batch.column(SPARK_PARTITION), partition)).as_py():
                    raise _Misplaced(move.op_id, partition)
                yield batch.select(names)

        yield write_moved(state_root, provider, move, partition, version, checked())

    return state.mapInArrow(write, WRITTEN)


class _Misplaced(Exception):  # noqa: N818 - a finding, raised in a task to the driver
    """A row of Spark's state is not where the engine's shuffle sends its key."""

    MARK = "SPARKSTATE_TAKE_OVER_MISPLACED"

    def __init__(self, op_id: int, partition: int) -> None:
        super().__init__(
            f"{self.MARK}: a row of operator {op_id}'s state in Spark's partition {partition} "
            "is not where the engine's shuffle sends its key"
        )


def _commit(
    arg: tuple[
        TakeOver, list[OperatorMove], dict[int, dict[int, tuple[str, int]]], dict[str, Any] | None
    ],
) -> None:
    plan, moves, written, clock = arg
    provider = plan.provider
    write_unwritten(plan.state_root, provider, moves, plan.num_partitions, plan.version, written)
    commit_take_over(plan, written, clock)
