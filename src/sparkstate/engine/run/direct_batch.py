"""A small batch's stateful stage run from the driver: its input read to the driver by one
Spark task, each partition's rows sent to the state home that holds the partition, the output
handed to the sink as a local DataFrame.

Through Spark, a stateful batch is a job of two stages, however few its rows: the input read
and shuffled by key, then a task per state partition. At 200 rows a batch, on 2 cores, that
job alone takes as long as Spark's own whole stateful batch (a shuffle into 4 partitions and a
``mapInArrow`` that passes the rows on: a batch p50 of 206-228 ms against 205-264 ms for Spark's
windowed count), while reading the same rows to the driver takes one task of 20 ms and writing
them back to a sink as a local DataFrame another 20. The state work of such a batch is a few
ms a partition, and the homes that hold the partitions already listen on TCP (the driver asks
them for snapshots when a query stops), so the driver can give them the rows itself.

A batch runs so when its query's run is a classic session's, its state is in state homes, it
has one stateful step that runs no user code and is fed by the query's input only (an
aggregation, a deduplication, a stream-stream join: both sides' rows are read in the one task,
each with the partition of its key), the homes that hold its partitions can be reached, and
the query's last batch with data read at most
``stateStore.direct_batch_rows`` rows (Spark's ``numInputRows``: a run's first batch, and the
batch after a large one, run through Spark). A burst after small batches runs so once: its
rows are read in one task, as Spark's stage would read them in several. The input is read
with the batch's rows in one partition (``coalesce(1)``: a grouping then needs no shuffle
either) and with the partition of each row as Spark's shuffle would give it
(``pmod(hash(keys), n)``, the expression of Spark's hash partitioning). Each partition runs
as the task of a Spark attempt would in its home, the same job, the same commit; the reports go
where the tasks' go.

What the driver does when it cannot: anything that fails before a home commits sends the batch
through Spark as before (a home that cannot be reached moves there, as a task moves it); an
operator's own error fails the batch, as its task's failure does. A partition committed before
another failed is run again by Spark's task from the same version, as a retried task is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.conversion import SparkConversionMixin
from pyspark.sql.types import StructType

from sparkstate.engine.plan.stage import Stage
from sparkstate.engine.run.batch_plan import RunPlan
from sparkstate.engine.run.driver_config import DriverConfig
from sparkstate.engine.run.executor import run_in_owner
from sparkstate.engine.run.joined_homes import executors_listed, unplaced
from sparkstate.engine.run.sinks import Sink
from sparkstate.engine.spark.schema import arrow_schema, quote, session_time_zone
from sparkstate.operators.arbitrary.user_types import in_session_zone
from sparkstate.runtime import home_client
from sparkstate.runtime.logs import ReportDir
from sparkstate.runtime.tasks import TaskSpec

__all__ = ["run_direct", "wanted"]

log = logging.getLogger("sparkstate.engine")

#: The column of each input row's state partition, dropped before the rows reach the homes.
PARTITION = "__sparkstate_partition"
#: The recorded plan of a direct batch's input (:meth:`RunPlan.reused`).
DIRECT_INPUT = "direct input"
#: Rows a frame to a home holds at most (Spark's ``arrow.maxRecordsPerBatch`` default).
FRAME_ROWS = 10_000
#: Partitions the driver runs at once.
THREADS = 8


class Unreachable(Exception):
    """A partition's home could not be reached from the driver; ``timed_out``: the attempt
    waited out its time (no answer at all, as behind a firewall that drops what it refuses),
    not refused at once (a home that is gone)."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def wanted(
    config: DriverConfig, stages: list[Stage], plan: RunPlan | None, batch_id: int
) -> Stage | None:
    """The stage to run from the driver in this batch, or None: the batch goes through Spark."""
    conf = config.store.conf
    if (
        plan is None
        or plan.direct_off is not None
        or not conf.state_home
        or conf.direct_batch_rows <= 0
        or len(stages) != 1
    ):
        return None
    stage = stages[0]
    if (
        stage.source is not None
        or stage.query_output is not None
        or not stage.partition_columns
        or stage.operator.calls_user_code
        or (batch_id == 0 and stage.initial is not None)
    ):
        return None
    rows = _rows_read(plan)
    if rows is None or rows > conf.direct_batch_rows:
        return None
    if conf.balance_homes and _executors_unplaced(plan, config.num_partitions):
        return None
    return stage


def _executors_unplaced(plan: RunPlan, num_partitions: int) -> bool:
    """Whether the application has executors that hold no state home the driver knows of (one
    joined, that the driver's search before the batch did not find: :mod:`.joined_homes`): a
    batch through Spark's tasks may reach them, and the next batch spreads the partitions over
    them too (:mod:`sparkstate.engine.run.placement`)."""
    if plan.executors_placed is None or plan.spark_query is None:
        return False
    try:
        context = plan.spark_query.sparkSession().sparkContext()
    except Exception:  # noqa: BLE001 - a status that cannot be read: run as before
        return False
    listed = executors_listed(context)
    return listed is not None and unplaced(plan.executors_placed, len(listed), num_partitions)


def _rows_read(plan: RunPlan) -> int | None:
    """The rows the run's last batch that read any read from the sources (Spark's
    ``numInputRows``, of the progress Spark made of it before this batch); None before the
    run's first batch ended. A batch without data (a watermark's, a timer's) is left out: the
    next batch's input is told by the last that had some."""
    if plan.spark_query is None:
        return None
    progress = plan.spark_query.lastProgress()
    if progress is not None:
        rows = int(progress.numInputRows())
        if rows > 0 or plan.input_rows is None:
            plan.input_rows = rows
    return plan.input_rows


def run_direct(
    config: DriverConfig,
    stage: Stage,
    spec: TaskSpec,
    sink: Sink,
    reports: ReportDir,
    df: DataFrame,
    plan: RunPlan,
) -> dict[str, int] | None:
    """Run ``stage`` over batch ``df`` from the driver and its output into ``sink``; the time
    its parts took (reading the input, the homes' work, the sink's), or None if it could not
    (nothing committed or delivered: run it through Spark). An operator's error is raised as
    its task's would be."""
    n = config.num_partitions
    if len(spec.owners) != n:
        return None
    started = time.time()
    try:
        table = _input(stage, df, spec.batch_id, n, plan)
    except Exception as exc:  # noqa: BLE001 - Spark's job runs it again, and raises
        log.info("batch %d: reading the input to the driver failed (%s)", spec.batch_id, exc)
        return None
    read = time.time()
    parts = _partitions(table, n)
    try:
        with ThreadPoolExecutor(min(n, THREADS), thread_name_prefix="sparkstate-direct") as pool:
            outputs = list(pool.map(lambda p: _run(spec, p, parts[p], reports), range(n)))
    except Unreachable as exc:
        if not exc.timed_out:  # a home gone: Spark's tasks start another, then the driver's again
            log.info("batch %d: %s; the batch runs through Spark", spec.batch_id, exc)
            return None
        # The driver cannot reach the executors' homes (a network that drops its connections):
        # trying again would cost every batch the wait.
        plan.direct_off = str(exc)
        log.warning(
            "batch %d: %s (no answer in %.0f s); this run's batches run their state in "
            "Spark's tasks, not from the driver",
            spec.batch_id,
            exc,
            home_client.OWNER_TIMEOUT_S,
        )
        return None
    except Exception as exc:
        failure = reports.first_failure()
        if failure is None:
            log.warning(
                "batch %d: running the state from the driver failed (%s); the batch runs "
                "through Spark",
                spec.batch_id,
                exc,
            )
            return None
        error = failure.error()  # sparkstate's error, as a failed task raises it
        raise error from exc
    ran = time.time()
    schema = arrow_schema(stage.output_struct)
    batches = [b for out in outputs for b in out]
    if not batches:  # a column of no chunks is refused where it is nested (PySpark 4.3)
        batches = [pa.RecordBatch.from_pylist([], schema)]
    output = pa.Table.from_batches(batches, schema)
    sink.add_batch(
        spec.batch_id,
        stage.output_of(_local_frame(df.sparkSession, output, stage.output_struct)),
        config.output_mode,
    )
    done = time.time()
    # Parts of the batch as ``statefulStage`` is of a batch through Spark, each its own.
    return {
        "directInput": int((read - started) * 1000),
        "directState": int((ran - read) * 1000),
        "directSink": int((done - ran) * 1000),
    }


def _local_frame(session: SparkSession, table: pa.Table, struct: StructType) -> DataFrame:
    """``table`` as a DataFrame of ``session`` (the batch's, Spark's clone of the user's for
    the stream), the process's active session untouched. PySpark's ``createDataFrame`` first
    makes its session the active one, for every thread: the clone, with the settings of the
    query's start, would then be what ``SparkSession.getActiveSession()`` and
    ``builder.getOrCreate()`` give the user's code, and saving and restoring around it races
    with another query's batch doing the same. The conversion it hands an Arrow table to
    touches no active session."""
    return SparkConversionMixin.createDataFrame(session, table, schema=struct)


def _input(stage: Stage, df: DataFrame, batch_id: int, n: int, plan: RunPlan) -> pa.Table:
    """The operator's input in one partition, each row with its state partition, as the task
    of that partition would see it (timestamps in the session's zone). Its plan over the
    batch is made once a run and reused, as the stages' is (engine/run/batch_plan.py)."""
    query = plan.reused(df, DIRECT_INPUT)
    if query is None:
        prepared = stage.input_of(df.coalesce(1), batch_id)
        keys = [quote(c) for c in stage.partition_columns]
        query = prepared.select("*", F.pmod(F.hash(*keys), F.lit(n)).alias(PARTITION))
        plan.record(df, query, batch_id > 0 or stage.initial is None, DIRECT_INPUT)
    return in_session_zone(query.toArrow(), session_time_zone(df))


def _partitions(table: pa.Table, n: int) -> list[pa.Table]:
    """``table``'s rows by their state partition, the partition column dropped."""
    partition = table.column(PARTITION).to_numpy()
    rows = table.drop_columns([PARTITION])
    if n == 1:
        return [rows]
    order = np.argsort(partition, kind="stable")
    ordered = rows.take(pa.array(order))
    sizes = np.bincount(partition, minlength=n)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    return [ordered.slice(int(s), int(e - s)) for s, e in zip(starts, ends, strict=True)]


def _run(
    spec: TaskSpec, partition: int, rows: pa.Table, reports: ReportDir
) -> list[pa.RecordBatch]:
    """Partition ``partition``'s task in its home, over ``rows``: its output."""
    frames: Iterator[pa.RecordBatch] = iter(rows.to_batches(max_chunksize=FRAME_ROWS))
    tried = time.monotonic()
    output = run_in_owner(spec, partition, frames, reports)
    if output is None:
        owner = spec.owners[partition].partition("/")[0]
        msg = f"the state home {owner} of partition {partition} cannot be reached"
        raise Unreachable(msg, time.monotonic() - tried >= home_client.OWNER_TIMEOUT_S / 2)
    return list(output)
