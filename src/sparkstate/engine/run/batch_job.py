"""One batch's stateful stages as Spark runs them: each stage's input shuffled by key into the
state partitions, ``mapInArrow`` with the partition's store, the sink's action running every task
once, and the tasks' reports read back (one per operator and partition)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from sparkstate.engine.plan.stage import Stage
from sparkstate.engine.run import batch_payload, direct_batch
from sparkstate.engine.run.attempts import CountedAttempts, winning_reports
from sparkstate.engine.run.batch_plan import RunPlan
from sparkstate.engine.run.driver_config import DriverConfig
from sparkstate.engine.run.executor import commit_untouched_task, snapshot_in_owner, task_function
from sparkstate.engine.run.sinks import Sink
from sparkstate.exceptions import QueryError
from sparkstate.runtime.logs import ReportDir
from sparkstate.runtime.records import BatchCommit, BatchIntent, TaskReport
from sparkstate.runtime.tasks import TaskSpec

__all__ = ["engine_settings", "run_stages", "session_conf", "snapshot_at_stop", "task_spec"]

log = logging.getLogger("sparkstate.engine")
AQE = "spark.sql.adaptive.enabled"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def task_spec(
    config: DriverConfig,
    stage: Stage,
    last: bool,
    intent: BatchIntent,
    lineage: dict[int, dict[int, str | None]],
    replay: bool,
    owners: dict[int, dict[int, str]] | None = None,
) -> TaskSpec:
    """What the tasks of ``stage`` run in the batch of ``intent`` (``last``: the stage whose
    output goes to the sink, in the query's output mode)."""
    return TaskSpec(
        op_id=stage.op_id,
        operator=stage.operator,
        batch_id=intent.batch_id,
        output_mode=stage.output_mode or (config.output_mode if last else "append"),
        watermark_ms=max(0, intent.watermark_ms - stage.watermark_lag_ms),
        late_watermark_ms=max(0, intent.watermark_for_late_rows_ms - stage.watermark_lag_ms),
        batch_timestamp_ms=intent.batch_timestamp_ms,
        num_partitions=config.num_partitions,
        store=config.store,
        lineage=lineage.get(stage.op_id, {}),
        replay=replay,
        run=config.start_id,
        owners=(owners or {}).get(stage.op_id, {}),
    )


def run_stages(
    config: DriverConfig,
    stages: list[Stage],
    sink: Sink,
    reports_dir: ReportDir,
    df: DataFrame,
    intent: BatchIntent,
    lineage: dict[int, dict[int, str | None]],
    *,
    replay: bool = False,
    owners: dict[int, dict[int, str]] | None = None,
    counted: CountedAttempts | None = None,
    plan: RunPlan | None = None,
) -> tuple[list[TaskReport], dict[str, int]]:
    """Run the stateful stages over batch ``df``: each stage's input shuffled by its key into
    the state partitions, its task over each partition's store; the sink's action runs them
    all once. Returns the tasks' reports (one per operator and partition: that of the attempt
    Spark kept, as ``counted`` tells in a classic session; the partitions Spark ran no task for
    are committed untouched) and the time the stateful job took.

    ``plan`` (a classic session's): the run's task functions and plan, made at its first batch
    and reused by the others, the batch told to the tasks by its payload."""
    batch_id = intent.batch_id
    session = df.sparkSession
    n = config.num_partitions
    specs = {
        s.op_id: task_spec(config, s, s is stages[-1], intent, lineage, replay, owners)
        for s in stages
    }
    direct = None if replay else direct_batch.wanted(config, stages, plan, batch_id)
    if direct is not None and plan is not None:
        timings = direct_batch.run_direct(
            config, direct, specs[direct.op_id], sink, reports_dir, df, plan
        )
        if timings is not None:
            return list(winning_reports(reports_dir.read()).values()), timings
    current = plan.reused(df) if plan is not None else None
    if current is None:
        current = df
        outputs: dict[int, DataFrame] = {}
        for stage in stages:
            spec = specs[stage.op_id]
            source = current if stage.source is None else stage.source(df, outputs)
            shuffled = stage.shuffled(source, batch_id, n)
            run = (
                plan.task_function(stage, spec)
                if plan is not None
                else task_function(spec, reports_dir, counted)
            )
            current = outputs[stage.op_id] = stage.output_of(
                shuffled.mapInArrow(run, stage.output_struct)
            )
            if stage.query_output is not None:  # a union of its output with another input's
                current = stage.query_output(df, outputs)
        if plan is not None:  # batch 0's initial state is not in the batches after it
            plan.record(df, current, batch_id > 0 or all(s.initial is None for s in stages))
    if counted is not None:
        counted.start_batch()
    sink_started = time.time()
    try:
        with _payload(session, plan, config, batch_id, specs, reports_dir):
            sink.add_batch(batch_id, current, config.output_mode)
    except Exception as exc:
        failure = reports_dir.first_failure()
        if failure is None:
            raise
        error = failure.error()  # sparkstate's error, not Spark's text of it
        if error.__cause__ is None:
            error.__cause__ = exc
        raise error from error.__cause__
    timings = {"statefulStage": int((time.time() - sink_started) * 1000)}
    if replay:
        return [], timings
    kept = counted.kept() if counted is not None else None
    reports = winning_reports(reports_dir.read(), kept)
    missing = [(op_id, p) for op_id in specs for p in range(n) if (op_id, p) not in reports]
    if missing:
        if config.output_mode == "complete":
            msg = (
                f"batch {batch_id}: Spark ran no task for state partitions {missing}, so "
                "complete output would be partial. Is adaptive execution forced on?"
            )
            raise QueryError(msg)
        log.warning("batch %d: committing untouched partitions %s", batch_id, missing)
        _commit_untouched(session, specs, missing, reports_dir)
        reports = winning_reports(reports_dir.read(), kept)
    return list(reports.values()), timings


@contextlib.contextmanager
def _payload(
    session: SparkSession,
    plan: RunPlan | None,
    config: DriverConfig,
    batch_id: int,
    specs: dict[int, TaskSpec],
    reports: ReportDir,
) -> Iterator[None]:
    """The batch's payload set for the jobs this thread starts from now on (with ``plan``: its
    task functions read their batch from it). It stays set after the sink's action: the
    foreachBatch function runs after it, and its jobs compute the stateful stages again where
    Spark lost their cached output (an executor lost); the next batch sets its own, and a task
    of an earlier batch's plan run in a later one refuses it (Spark's batch id differs)."""
    if plan is not None:
        session.sparkContext.setLocalProperty(
            batch_payload.PAYLOAD_KEY,
            batch_payload.encode(config.start_id, batch_id, specs, reports),
        )
    yield


@contextlib.contextmanager
def engine_settings(session: SparkSession, num_partitions: int) -> Iterator[None]:
    """Session settings for the stateful stages of one batch, restored afterwards.

    Adaptive execution off: coalesced shuffle partitions would break "partition = store".
    Shuffle partitions = state partitions: the partial aggregate's shuffle then already hashes
    by key into ``num_partitions`` and Spark drops the second shuffle of ``repartition``.
    """
    with session_conf(session, {AQE: "false", SHUFFLE_PARTITIONS: str(num_partitions)}):
        yield


@contextlib.contextmanager
def session_conf(session: SparkSession, wanted: dict[str, str]) -> Iterator[None]:
    """The session's settings ``wanted`` while inside, each restored after. A setting the
    session already has is left as it is (a py4j round trip less each way)."""
    previous: dict[str, str | None] = {k: session.conf.get(k, None) for k in wanted}
    previous = {k: old for k, old in previous.items() if old != wanted[k]}  # the ones to set
    for k in previous:
        session.conf.set(k, wanted[k])
    try:
        yield
    finally:
        for k, old in previous.items():
            if old is None:
                session.conf.unset(k)
            else:
                session.conf.set(k, old)


def _commit_untouched(
    session: SparkSession,
    specs: dict[int, TaskSpec],
    missing: list[tuple[int, int]],
    reports: ReportDir,
) -> None:
    """Commit the partitions Spark ran no task for, one Spark task each, reports beside the
    others (a DataFrame job: no ``SparkContext`` needed)."""

    def commit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for op_id, partition in zip(
                batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
            ):
                reports(commit_untouched_task(specs[op_id], partition))
        return iter(())

    pairs = session.createDataFrame(missing, "op int, partition int")
    pairs.repartition(len(missing)).mapInArrow(commit, pairs.schema).collect()


def snapshot_at_stop(config: DriverConfig, stages: list[Stage], last: BatchCommit) -> int:
    """Snapshot every partition's newest version (that of ``last``) in the state home that
    holds it, where none is stored yet, so that a restart on any executor downloads one
    snapshot and replays no changelog. The driver asks each partition's owner directly (the
    address the commit recorded); returns the snapshots written."""
    if not config.store.conf.state_home:
        return 0
    intent = BatchIntent(last.batch_id + 1, last.watermark_ms, 0)
    owners, lineage = last.owners(), last.lineage()
    specs = [task_spec(config, s, False, intent, lineage, False, owners) for s in stages]
    work = [(spec, p, address) for spec in specs for p, address in spec.owners.items()]
    with ThreadPoolExecutor(4, thread_name_prefix="sparkstate-stop") as pool:
        return sum(pool.map(lambda w: snapshot_in_owner(*w), work))
