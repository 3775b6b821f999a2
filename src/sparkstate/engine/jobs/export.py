"""``ss.export(spark, checkpoint)`` and ``sparkstate export``: a stopped query's state handed back
to Spark's own operators, as one Spark job.

The logs and their order are :mod:`sparkstate.runtime.export`'s. Per operator, the state reader
(``spark.read.format("sparkstate")``) gives the state after the batch Spark last committed in
the shape Spark's own state reader gives it (a ``key`` and a ``value`` struct, Spark's fields in
Spark's order); Spark's ``repartition(n, *key fields)`` sends each row to the partition Spark's
operator hashes its key to (the same hash of the same typed values); and each task writes its
partition as the HDFS-backed provider's snapshot of the version Spark loads next
(:mod:`sparkstate.store.spark_files`), with the store's schema file beside partition 0.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructField, StructType

from sparkstate.console import ProgressTask, job_progress
from sparkstate.engine.jobs.rescale import on_checkpoint
from sparkstate.engine.run.query import release_if_finished
from sparkstate.engine.spark.session import command_session, is_connect, said_once
from sparkstate.engine.spark.state_source import register
from sparkstate.exceptions import SparkstateError
from sparkstate.files.durable import DurableDir, canonical_location
from sparkstate.operators.registry import layout_of
from sparkstate.runtime.export import Export, commit_export, plan_export, settle_export
from sparkstate.runtime.logs import CheckpointLock, engine_root_of
from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.spark_files import lz4_block_stream, schema_file, snapshot_file, unsafe_rows

__all__ = ["export", "run_export"]

log = logging.getLogger("sparkstate.engine")
_WRITTEN = "partition int, num_rows bigint"
_STATE_DIR = "state"


def export(
    spark: SparkSession, checkpoint_location: str, *, progress: bool | None = None
) -> int | None:
    """Write the state of the stopped query at ``checkpoint_location`` (run wrapped with
    ``ss.stream``) back in the form Spark's own operators read, so that the query run without
    ``ss.stream`` goes on from the checkpoint with Spark's default (HDFS-backed) state store
    provider. Returns the batch Spark goes on after; None where the checkpoint was exported
    already. Refused while a query runs on the checkpoint, and, leaving it as it was, where an
    operator's state cannot be written in Spark's form. Safe to interrupt: run it again.
    ``progress``: show a bar per operator (default: when stderr is a terminal)."""
    location = canonical_location(checkpoint_location)
    engine_root = engine_root_of(location)
    if is_connect(spark):  # the checkpoint is the server's to lock; the job runs from here
        return _export_locked(spark, location, engine_root, progress=False)
    release_if_finished(engine_root)
    lock = CheckpointLock(engine_root)
    lock.acquire()
    try:
        shown = sys.stderr.isatty() if progress is None else progress
        return _export_locked(spark, location, engine_root, progress=shown)
    finally:
        lock.release(emptied=True)


def _export_locked(
    spark: SparkSession, location: str, engine_root: str, *, progress: bool
) -> int | None:
    started = time.perf_counter()
    if on_checkpoint(spark, _settle, (location, engine_root)):
        log.warning(
            "%s: finished an export to Spark's operators; run the query without ss.stream",
            location,
        )
        return None
    plan = on_checkpoint(spark, _plan, (location, engine_root))
    if plan is None:
        log.warning(
            "%s: exported to Spark's operators already; run the query without ss.stream",
            location,
        )
        return None
    register(spark)  # the state reader reads the state out
    stores = {
        op.op_id: layout_of(op.kind).spark_stores(op.described) or [] for op in plan.operators
    }
    # per operator, its stores' partitions written, counted where progress is shown
    written = (
        {op.op_id: spark.sparkContext.accumulator(0) for op in plan.operators} if progress else {}
    )
    bars = [
        ProgressTask(
            f"operator {op.op_id} ({op.kind}) write",
            plan.num_partitions * len(stores[op.op_id]),
            functools.partial(_value, written[op.op_id]),
        )
        for op in plan.operators
        if op.op_id in written
    ]
    rows = 0
    with job_progress(bars):
        for op in plan.operators:
            layout = layout_of(op.kind)
            for name in stores[op.op_id]:
                reader = spark.read.format("sparkstate").option("batchId", plan.batch_id)
                reader = reader.option("operatorId", op.op_id)
                if name != DEFAULT_CF:
                    reader = reader.option("storeName", name)
                state = reader.load(location)
                shown = state.schema["key"].dataType
                assert isinstance(shown, StructType)
                fields, hashed = layout.spark_partitioning(op.described, name, list(shown.names))
                state = state.select(
                    F.struct(*(F.col("key").getField(f).alias(f) for f in fields)).alias("key"),
                    "value",
                )
                store = _SparkStore(location, op.op_id, name, plan.version)
                on_checkpoint(spark, _write_schema, (store, _schema_json(state)))
                done = written.get(op.op_id)
                rows += _write_state(spark, store, plan.num_partitions, hashed, state, done)
    on_checkpoint(spark, commit_export, plan)
    log.warning(
        "%s: exported the state of %d operator(s) to Spark's HDFSBackedStateStoreProvider after "
        "batch %d (%s rows, %.1f s); run the query without ss.stream to go on",
        location,
        len(plan.operators),
        plan.batch_id,
        f"{rows:,}",
        time.perf_counter() - started,
    )
    return plan.batch_id


def _value(accumulator: Any) -> int:
    return int(accumulator.value)


def _settle(arg: tuple[str, str]) -> bool:
    return settle_export(*arg)


def _plan(arg: tuple[str, str]) -> Export | None:
    return plan_export(*arg)


def _schema_json(state: DataFrame) -> tuple[str, str]:
    """The key's and value's schemas, every field nullable (Spark's restart checks its own
    against them, and takes a nullable field where it would have written a non-nullable one,
    not the other way round)."""
    key, value = state.schema["key"].dataType, state.schema["value"].dataType
    return _nullable(key).json(), _nullable(value).json()


def _nullable(t: DataType) -> DataType:
    if isinstance(t, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in t.fields])
    return t


@dataclasses.dataclass(frozen=True)
class _SparkStore:
    """One of Spark's stores written: its operator, name and the version written."""

    location: str
    op_id: int
    name: str
    version: int

    def directory(self, partition: int) -> DurableDir:
        """Where Spark keeps a partition's files of the store (in a directory of the store's
        name under the partition's, but for the default store)."""
        own = [self.name] if self.name != DEFAULT_CF else []
        return DurableDir(self.location).child(_STATE_DIR, str(self.op_id), str(partition), *own)


def _write_schema(arg: tuple[_SparkStore, tuple[str, str]]) -> None:
    """The store's schema, where Spark's operators keep it (beside partition 0), for Spark's
    restart and its state reader to check the query against; one Spark wrote stays (the
    checkpoint was Spark's before: the same query)."""
    store, (key_json, value_json) = arg
    directory = store.directory(0).child("_metadata")
    if not directory.exists("schema"):
        _write_spark_file(directory, "schema", schema_file(key_json, value_json))


def _write_spark_file(directory: DurableDir, name: str, data: bytes) -> None:
    """A file of Spark's; a stale checksum file of an earlier one under the same name goes
    first (Hadoop's local file system would check the new file against it)."""
    if directory.exists(f".{name}.crc"):
        directory.delete(f".{name}.crc")
    directory.write_atomic(name, data)


def _write_state(
    spark: SparkSession,
    store: _SparkStore,
    n: int,
    hashed: list[str],
    state: DataFrame,
    done: Any = None,
) -> int:
    """Each of the ``n`` partitions' snapshot of the store (``hashed``: the fields of its key
    Spark's operator hashes); its rows. ``done``: an accumulator that counts the partitions
    written."""
    if hashed:
        spread = state.repartition(n, *(F.col("key").getField(f) for f in hashed))
    else:
        spread = state.coalesce(1)  # a global operator: all of it in partition 0
    everything = not hashed

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None
        partition = 0 if everything else context.partitionId()
        keys, values = [], []
        for b in batches:
            k, v = b.column(0), b.column(1)
            keys.append(unsafe_rows([k.field(i) for i in range(k.type.num_fields)], b.num_rows))
            values.append(unsafe_rows([v.field(i) for i in range(v.type.num_fields)], b.num_rows))
        key_rows = pa.concat_arrays(keys) if keys else pa.array([], pa.binary())
        value_rows = pa.concat_arrays(values) if values else pa.array([], pa.binary())
        _write_snapshot(store, partition, key_rows, value_rows)
        if done is not None:
            done.add(1)
        yield pa.record_batch(
            [pa.array([partition], pa.int32()), pa.array([len(key_rows)])],
            names=["partition", "num_rows"],
        )

    written = {r["partition"]: r["num_rows"] for r in spread.mapInArrow(write, _WRITTEN).collect()}
    for p in range(n):  # a partition no task wrote (Spark's restart loads every one)
        if p not in written:
            on_checkpoint(spark, _write_empty, (store, p))
            if done is not None:
                done.add(1)
    return sum(written.values())


def _write_empty(arg: tuple[_SparkStore, int]) -> None:
    empty = pa.array([], pa.binary())
    _write_snapshot(*arg, empty, empty)


def _write_snapshot(
    store: _SparkStore, partition: int, keys: pa.BinaryArray, values: pa.BinaryArray
) -> None:
    data = lz4_block_stream(snapshot_file(keys, values))
    _write_spark_file(store.directory(partition), f"{store.version}.snapshot", data)


def run_export(
    checkpoint: str,
    *,
    master: str | None = None,
    remote: str | None = None,
    conf: Sequence[str] = (),
) -> int:
    """``sparkstate export CHECKPOINT``: the export in a Spark session of its own; an error is
    a line on stderr and exit code 1."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers with sparkstate
    try:
        spark = command_session("sparkstate export", master=master, remote=remote, conf=conf)
        try:
            with said_once():  # the export's line: what moved, or that it had been
                export(spark, checkpoint)
        finally:
            spark.stop()
    except SparkstateError as exc:
        print(f"sparkstate export: {exc}", file=sys.stderr)
        return 1
    return 0
