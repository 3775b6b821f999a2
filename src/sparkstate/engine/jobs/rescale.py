"""``ss.repartition(spark, checkpoint, n)``: a checkpoint's state rescaled to ``n`` partitions.

Shaped as Spark's ``StreamingCheckpointManager.repartition``: with the query stopped, it writes
a batch holding every operator's state in the new partitioning, and the next start goes on from
it. The batch's logs are :mod:`sparkstate.runtime.rescale`'s; the state moves in one Spark job:
a task per old partition reads its state (:func:`~sparkstate.observe.rescale.read_partition`),
Spark's ``repartition(n, *key columns)`` sends each key where the next batch's shuffle will
(the same hash on the same typed columns), and a task per new partition writes what it got
(:func:`~sparkstate.runtime.state_moves.write_partition`). The same runs at a start that asks for
another partition count (:func:`rescale_at_start`), into the last batch's outcome: Spark's
batch ids go on there, as Spark's restart keeps its count.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from sparkstate.console import ProgressTask, job_progress
from sparkstate.engine.run.batch_job import engine_settings
from sparkstate.engine.run.query import release_if_finished
from sparkstate.engine.spark.session import command_session, is_connect, run_on_server, said_once
from sparkstate.engine.spark.versions import from_arrow_type
from sparkstate.exceptions import ConfigurationError, SparkstateError
from sparkstate.files.durable import canonical_location
from sparkstate.observe.rescale import plan_moves, read_partition
from sparkstate.operators.registry import layout_of
from sparkstate.runtime.logs import CheckpointLock, engine_root_of
from sparkstate.runtime.rescale import (
    RescalePlan,
    commit_rescale,
    plan_rescale,
    rescale_without_state,
    settle_rescale,
)
from sparkstate.runtime.state_moves import OperatorMove, admit, write_partition
from sparkstate.store.capabilities import provider_over_files
from sparkstate.store.conf import StoreId

__all__ = [
    "WRITTEN",
    "on_checkpoint",
    "repartition",
    "rescale_at_start",
    "rescale_locked",
    "run_repartition",
    "write_moved",
    "write_unwritten",
    "written_by_key",
]

log = logging.getLogger("sparkstate.engine")
A = TypeVar("A")
R = TypeVar("R")

#: What a task that wrote a partition's state answers: a row per partition.
WRITTEN = "op int, partition int, checkpoint_id string, num_rows bigint"
_WRITTEN_SCHEMA = pa.schema(
    [
        ("op", pa.int32()),
        ("partition", pa.int32()),
        ("checkpoint_id", pa.string()),
        ("num_rows", pa.int64()),
    ]
)


def repartition(
    spark: SparkSession,
    checkpoint_location: str,
    num_partitions: int,
    enforce_exactly_once_sink: bool = True,
    *,
    progress: bool | None = None,
) -> int:
    """Rescale the state of the stopped query at ``checkpoint_location`` to ``num_partitions``
    partitions; returns the id of the batch that holds it.

    As Spark's ``StreamingCheckpointManager.repartition``: the last batch must have committed,
    unless ``enforce_exactly_once_sink`` is False, which skips a failed last batch (its input
    is read again by the next run). Refused while a query runs on the checkpoint. Safe to
    interrupt: the checkpoint stays as it was until the new state is committed, and running it
    again completes it. ``progress``: show a bar per operator (default: when stderr is a
    terminal). From a Spark Connect client, the checkpoint is read and written on the server's
    side, and a query running there is found when the rescale starts (the client cannot hold
    the checkpoint's lock for the whole rescale).
    """
    _check_arguments(checkpoint_location, num_partitions)
    if is_connect(spark):  # the server's side reaches the checkpoint; the job runs from here
        return rescale_locked(
            spark,
            checkpoint_location,
            num_partitions,
            enforce_exactly_once_sink=enforce_exactly_once_sink,
        )
    location = canonical_location(checkpoint_location)
    engine_root = engine_root_of(location)
    release_if_finished(engine_root)
    lock = CheckpointLock(engine_root)
    lock.acquire()
    try:
        return rescale_locked(
            spark,
            location,
            num_partitions,
            enforce_exactly_once_sink=enforce_exactly_once_sink,
            progress=sys.stderr.isatty() if progress is None else progress,
        )
    finally:
        lock.release()


def _check_arguments(checkpoint_location: Any, num_partitions: Any) -> None:
    """Spark's refusals of a missing location or a count below one, under its error classes
    (a user's handler that matches on them keeps working)."""
    if checkpoint_location is None:
        msg = "[STATE_REPARTITION_INVALID_PARAMETER.IS_NULL] the checkpoint location is None"
        raise ConfigurationError(msg)
    if isinstance(checkpoint_location, str) and not checkpoint_location.strip():
        msg = "[STATE_REPARTITION_INVALID_PARAMETER.IS_EMPTY] the checkpoint location is empty"
        raise ConfigurationError(msg)
    counted = isinstance(num_partitions, int) and not isinstance(num_partitions, bool)
    if counted and num_partitions < 1:
        msg = (
            "[STATE_REPARTITION_INVALID_PARAMETER.IS_NOT_GREATER_THAN_ZERO] the number of "
            f"partitions must be at least 1, got {num_partitions}"
        )
        raise ConfigurationError(msg)


def rescale_locked(
    spark: SparkSession,
    location: str,
    num_partitions: int,
    *,
    enforce_exactly_once_sink: bool = True,
    progress: bool = False,
    in_place: bool = False,
) -> int:
    """:func:`repartition` for a caller that holds the checkpoint's lock; ``in_place``: into
    the last batch's outcome, taking no batch id (:mod:`sparkstate.runtime.rescale`)."""
    started = time.perf_counter()
    plan, moves = on_checkpoint(
        spark,
        _plan,
        (location, num_partitions, enforce_exactly_once_sink, is_connect(spark), in_place),
    )
    written = _move(spark, plan, moves, progress and not is_connect(spark))
    on_checkpoint(spark, _commit, (plan, moves, written))
    rows = sum(n for parts in written.values() for _, n in parts.values())
    log.warning(
        "%s: rescaled the state of %d operator(s) from %d to %d partitions %s batch %d "
        "(%d keys, %.1f s)",
        plan.location,
        len(moves),
        plan.from_partitions,
        plan.to_partitions,
        "after" if plan.in_place else "in",
        plan.batch_id,
        rows,
        time.perf_counter() - started,
    )
    return plan.batch_id


def on_checkpoint(spark: SparkSession, func: Callable[[A], R], arg: A) -> R:
    """``func(arg)`` where the checkpoint is reachable: here, or over Spark Connect in a task
    on the server's side (the client may not see the checkpoint's file system)."""
    return run_on_server(spark, func, arg) if is_connect(spark) else func(arg)


def _plan(arg: tuple[str, int, bool, bool, bool]) -> tuple[RescalePlan, list[OperatorMove]]:
    location, num_partitions, enforce, probe_lock, in_place = arg
    if probe_lock:  # from a Spark Connect client, which cannot hold it: refused if in use
        lock = CheckpointLock(engine_root_of(canonical_location(location)))
        lock.acquire()
        lock.release()
    plan = plan_rescale(
        location, num_partitions, enforce_exactly_once_sink=enforce, in_place=in_place
    )
    try:
        moves = plan_moves(plan.location, plan.last_batch, plan.from_partitions, plan.to_partitions)
        for move in moves:
            admit(plan.state_root, plan.provider, move, plan.to_partitions)
    except BaseException:
        settle_rescale(plan.location)  # drops the intent: the checkpoint is as it was
        raise
    return plan, moves


def _commit(
    arg: tuple[RescalePlan, list[OperatorMove], dict[int, dict[int, tuple[str, int]]]],
) -> None:
    plan, moves, written = arg
    write_unwritten(
        plan.state_root, plan.provider, moves, plan.to_partitions, plan.version, written
    )
    commit_rescale(plan, written)


def write_unwritten(
    state_root: str,
    provider: str,
    moves: list[OperatorMove],
    num_partitions: int,
    version: int,
    written: dict[int, dict[int, tuple[str, int]]],
) -> None:
    """Give each partition no key went to (no task wrote it) an empty version, into
    ``written`` (per operator and partition: the checkpoint id written and its rows)."""
    for m in moves:
        for p in range(num_partitions):
            if p not in written[m.op_id]:
                written[m.op_id][p] = write_partition(
                    state_root, provider, m.op_id, p, version, [], m.derive
                )


def _move(
    spark: SparkSession, plan: RescalePlan, moves: list[OperatorMove], progress: bool
) -> dict[int, dict[int, tuple[str, int]]]:
    """Run the job that moves every operator's state; per operator and new partition, the
    checkpoint id written and its key count."""
    moving = [m for m in moves if m.partitions]
    counters = {m.op_id: _Counters.of(spark, m) for m in moving} if progress else {}
    frames = [_moved(spark, plan, m, counters.get(m.op_id)) for m in moving]
    written: dict[int, dict[int, tuple[str, int]]] = {m.op_id: {} for m in moves}
    if frames:
        job = frames[0]
        for frame in frames[1:]:
            job = job.unionByName(frame)
        bars = [bar for _, c in sorted(counters.items()) for bar in c.bars(plan.to_partitions)]
        with job_progress(bars), engine_settings(spark, plan.to_partitions):
            rows = job.collect()
        for r in rows:
            written[r["op"]][r["partition"]] = (r["checkpoint_id"], r["num_rows"])
    return written


def _rows_in_state(
    state_root: str,
    provider: str,
    move: OperatorMove,
    partition: int,
    version: int,
    checkpoint_id: str,
    num_keys: int,
) -> int:
    """The operator's rows in the version a new partition wrote (its ``numRowsTotal``): its
    keys, or where they are not its rows (a join's, an index's entries), its own count."""
    layout = layout_of(move.kind)
    if layout.rows_are_keys:
        return num_keys
    with provider_over_files(provider, StoreId(state_root, move.op_id, partition)) as bound:
        assert bound is not None  # write_partition wrote the version under its _schema.json
        store = bound.get_read_store(version, checkpoint_id)
        try:
            return layout.rows_in_state(store)
        finally:
            store.abort()


@dataclasses.dataclass
class _Counters:
    """What one operator's tasks have done, counted in accumulators (the driver sees a task's
    counts when it finishes): old partitions read and rows read, new partitions written."""

    move: OperatorMove
    read: Any
    rows: Any
    written: Any

    @classmethod
    def of(cls, spark: SparkSession, move: OperatorMove) -> _Counters:
        sc = spark.sparkContext
        return cls(move, sc.accumulator(0), sc.accumulator(0), sc.accumulator(0))

    def bars(self, to_partitions: int) -> list[ProgressTask]:
        """The operator's old partitions read (and the rows in them), its new ones written."""
        what = f"operator {self.move.op_id} ({self.move.kind})"
        return [
            ProgressTask(f"{what} read", len(self.move.partitions), self._read, self._rows),
            ProgressTask(f"{what} write", to_partitions, self._written),
        ]

    def _read(self) -> int:
        return int(self.read.value)

    def _rows(self) -> str:
        return f"{self.rows.value:,} rows"

    def _written(self) -> int:
        return int(self.written.value)


def _moved(
    spark: SparkSession, plan: RescalePlan, move: OperatorMove, counters: _Counters | None
) -> DataFrame:
    """One operator's state, read per old partition, shuffled by key, written per new one."""
    spark_schema = ", ".join(
        f"`{f.name}` {from_arrow_type(f.type).simpleString()}" for f in move.schema
    )
    old = move.partitions
    read_acc: Any = counters.read if counters else None
    rows_acc: Any = counters.rows if counters else None

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for p in batch.column(0).to_pylist():
                n = 0
                for rows in read_partition(move, old[p]):
                    n += rows.num_rows
                    yield rows
                if counters is not None:
                    read_acc.add(1)
                    rows_acc.add(n)

    rows = spark.range(0, len(old), 1, len(old)).mapInArrow(read, spark_schema)
    return written_by_key(
        rows,
        move,
        plan.state_root,
        plan.provider,
        plan.version,
        plan.to_partitions,
        counters.written if counters else None,
    )


def written_by_key(
    rows: DataFrame,
    move: OperatorMove,
    state_root: str,
    provider: str,
    version: int,
    to: int,
    written_acc: Any = None,
) -> DataFrame:
    """``rows`` (of ``move.schema``: the shuffle's columns, family, key, value) sent where the
    next batch's shuffle sends their keys, and written there as version ``version`` of each of
    ``to`` partitions: a row per partition written (operator, partition, checkpoint id, rows)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # The job is a union of every operator's stage of ``to`` partitions, numbered on:
        # operator k's partition p is the union's k * to + p.
        partition = TaskContext.get().partitionId() % to  # type: ignore[union-attr]
        yield write_moved(state_root, provider, move, partition, version, batches)
        if written_acc is not None:
            written_acc.add(1)

    shuffled = rows.repartition(to, *move.shuffle_columns)
    return shuffled.mapInArrow(write, WRITTEN)


def write_moved(
    state_root: str,
    provider: str,
    move: OperatorMove,
    partition: int,
    version: int,
    batches: Iterable[pa.RecordBatch],
) -> pa.RecordBatch:
    """Write the rows ``batches`` (of ``move.schema``) as version ``version`` of partition
    ``partition``: the row (of :data:`WRITTEN`) that says so, with the operator's rows in it."""
    ckpt, n = write_partition(
        state_root, provider, move.op_id, partition, version, batches, move.derive
    )
    n = _rows_in_state(state_root, provider, move, partition, version, ckpt, n)
    return pa.RecordBatch.from_pylist(
        [{"op": move.op_id, "partition": partition, "checkpoint_id": ckpt, "num_rows": n}],
        schema=_WRITTEN_SCHEMA,
    )


def rescale_at_start(spark: SparkSession, location: str, num_partitions: int) -> int:
    """Rescale at a start that asks for ``num_partitions`` partitions (the caller holds the
    checkpoint's lock), in place: the batch the query runs next loads its state in the new
    partitioning and has the id it would have had, as Spark's restart goes on with its ids.
    Returns the last committed batch (-1: none)."""
    if on_checkpoint(spark, _without_state, (location, num_partitions)):
        log.warning(
            "%s: no batch has committed: the state starts with %d partitions",
            location,
            num_partitions,
        )
        return -1
    return rescale_locked(
        spark, location, num_partitions, progress=sys.stderr.isatty(), in_place=True
    )


def _without_state(arg: tuple[str, int]) -> bool:
    return rescale_without_state(*arg)


def run_repartition(
    checkpoint: str,
    num_partitions: int,
    *,
    skip_uncommitted: bool = False,
    master: str | None = None,
    remote: str | None = None,
    conf: Sequence[str] = (),
) -> int:
    """``sparkstate repartition CHECKPOINT --partitions N``: the rescale in a Spark session of
    its own (``--master`` a cluster's, ``--remote`` a Spark Connect server); an error is a line
    on stderr and exit code 1."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers with sparkstate
    try:
        spark = command_session("sparkstate repartition", master=master, remote=remote, conf=conf)
        try:
            with said_once():  # the rescale's line: what moved, in how long
                repartition(
                    spark,
                    checkpoint,
                    num_partitions,
                    enforce_exactly_once_sink=not skip_uncommitted,
                    progress=sys.stderr.isatty(),
                )
        finally:
            spark.stop()
    except SparkstateError as exc:
        print(f"sparkstate repartition: {exc}", file=sys.stderr)
        return 1
    return 0
