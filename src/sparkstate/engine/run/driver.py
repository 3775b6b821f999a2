"""The per-batch driver: the function Spark's ``foreachBatch`` calls for every micro-batch.

For batch ``b`` (docs/architecture.md, "One micro-batch"): roll back to the state before ``b``
if Spark planned it again with other input; replay it if ``commits/<b>.json`` exists; read or
write the intent ``batches/<b>.json`` (watermark, timestamp, input digest); build the stateful
stages over the batch (shuffle by key, ``mapInArrow`` with the partition's store at version
``b``); hand the output to the sink, whose single action runs every stateful task once; read the
tasks' reports (small files under ``reports/<b>/``, :class:`~sparkstate.runtime.logs.ReportDir`);
write ``commits/<b>.json``; advance the watermark; ask for a no-data batch if an operator needs
one; publish progress. The Spark jobs of a batch are :mod:`sparkstate.engine.run.batch_job`; what
runs inside a task is :mod:`sparkstate.runtime`. Once ``stop()`` is
called, the driver starts no batch and commits nothing of the one in flight
(:mod:`sparkstate.engine.run.stopping`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from sparkstate.engine.plan.input_times import input_event_times
from sparkstate.engine.plan.stage import Stage
from sparkstate.engine.run.attempts import CountedAttempts
from sparkstate.engine.run.batch_job import engine_settings, run_stages, snapshot_at_stop
from sparkstate.engine.run.batch_plan import RunPlan
from sparkstate.engine.run.driver_config import DriverConfig
from sparkstate.engine.run.joined_homes import JoinedHomes, executors_listed, home_job
from sparkstate.engine.run.placement import HomeSeen, Placement
from sparkstate.engine.run.sinks import Sink
from sparkstate.engine.run.stopping import StopRequest, batch_jobs, hide_cancelled_from_py4j
from sparkstate.engine.spark.session import is_connect
from sparkstate.exceptions import ConfigurationError, QueryError
from sparkstate.files.durable import DurableDir
from sparkstate.operators.base import OperatorMetrics
from sparkstate.runtime.logs import CheckpointLock, CheckpointLog
from sparkstate.runtime.progress import build_progress, format_time
from sparkstate.runtime.records import (
    USER_FUNCTION_NOTE,
    BatchCommit,
    BatchIntent,
    OperatorCommit,
    TaskFailure,
    TaskReport,
)
from sparkstate.runtime.spark_checkpoint import input_digest
from sparkstate.runtime.triggers import next_request
from sparkstate.runtime.watermark import WatermarkTracker

__all__ = ["BatchDriver", "BatchRelay", "DriverConfig", "engine_settings"]

log = logging.getLogger("sparkstate.engine")
MAX_RECENT_PROGRESS = 100
RUN_ID_WAIT_S = 30.0


class BatchDriver:
    """Runs the stateful stages of every micro-batch and keeps the logs and progress."""

    def __init__(
        self,
        config: DriverConfig,
        stages: list[Stage],
        sink: Sink,
        log_: CheckpointLog,
        on_progress: Callable[[dict[str, Any]], None],
        *,
        remote: bool = False,
    ) -> None:
        """``remote``: the driver runs in a process of the Spark Connect server's, and reads
        the checkpoint there, not here."""
        self.config = config
        self.stages = stages
        self.sink = sink
        self.log = log_
        self.on_progress = on_progress
        self.tracker = self._tracker_after(None)
        self.recent: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._stop: StopRequest | None = None
        self._in_batch = threading.Event()
        self._started = threading.Event()
        #: Taken by the first batch where the driver runs in a process of its own (Connect).
        self._checkpoint_lock: CheckpointLock | None = None
        #: Whether this is the copy in the Spark Connect server's process (unpickled there).
        self._in_server = False
        self.last_batch: int | None = None
        #: The state homes holding the version the next batch loads (from the last commit).
        self._owners: dict[int, dict[int, str]] = {}
        #: The homes the last batch's tasks reported, to spread the partitions over.
        self._placement = Placement()
        #: Looks for the homes of executors that joined (made at the first batch; classic
        #: sessions only).
        self._joined: JoinedHomes | None = None
        #: Which task attempts Spark kept in a batch's job (made at the first batch; None under
        #: Spark Connect).
        self._counted: CountedAttempts | None = None
        #: The run's task functions and plan of its stages (classic sessions; made with
        #: ``_counted``).
        self._plan: RunPlan | None = None
        self._spark_query: Any = None
        self._counted_made = False
        self.triggers = {
            s.op_id: s.operator.time_trigger()
            for s in stages
            if config.clock and config.no_data_batches
        }
        self._clock: dict[str, Any] = {}
        self.spark_checkpoint: DurableDir | None = None
        if not remote:
            self._restore()

    def _restore(self) -> None:
        """Read where the checkpoint's batches stand: the watermark after the last commit, the
        clock's request; and where Spark's checkpoint is."""
        latest = self.log.latest_commit()
        self.tracker = self._tracker_after(latest, resume=True)
        self.last_batch = latest.batch_id if latest is not None else None
        #: Spark's checkpoint, where the driver reads what each batch read (None: unreachable).
        self.spark_checkpoint = _spark_checkpoint(self.config.checkpoint)
        self._clock = self.log.read_clock() if any(self.triggers.values()) else {}
        if self.config.clock and not self.config.no_data_batches:
            self._withdraw_clock_request()

    def _withdraw_clock_request(self) -> None:
        """No-data batches are off: a request an earlier run left for the clock is withdrawn."""
        left = self.log.read_clock()
        if any(v is not None for v in left.values()):
            self.log.write_clock({"requested_at_ms": None, "due_ms": None})

    def _tracker_after(
        self, commit: BatchCommit | None, *, resume: bool = False
    ) -> WatermarkTracker:
        """The watermark tracker as batch ``commit`` left it (fresh for None); ``resume``: for
        a new run of the query, which keeps the watermark and the policy, not what each input
        saw (:meth:`WatermarkTracker.resume`)."""
        tracker = WatermarkTracker(self.config.watermark_inputs(), self.config.watermark_policy)
        if commit is not None and resume:
            tracker.resume(commit.watermark)
        elif commit is not None:
            tracker.restore(commit.watermark)
        return tracker

    # --- pickling (Spark Connect runs the foreachBatch function in a process of the server's) --

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_lock", "_stop", "_in_batch", "_started", "recent", "error"):
            del state[name]
        for name in ("_counted", "_plan", "_spark_query", "_joined"):  # made at the first batch
            del state[name]
        state["_counted_made"] = False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled once per run in the server's foreachBatch process: Spark's run id is not
        known there (the client's handle adds it to the progress it reads back), and the
        checkpoint is locked by this process, which lives as long as the run."""
        self.__dict__.update(state)
        self.recent = []
        self.error = None
        self._counted = None
        self._plan = None
        self._spark_query = None
        self._joined = None
        self._lock = threading.Lock()
        self._stop = None
        self._in_batch = threading.Event()
        self._started = threading.Event()
        self._started.set()
        self._checkpoint_lock = CheckpointLock(self.log.root)
        self._in_server = True

    # --- the foreachBatch function ---------------------------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self._in_batch.set()
        try:
            self._run_or_abandon(df, batch_id)
        finally:
            self._in_batch.clear()

    def _run_or_abandon(self, df: DataFrame, batch_id: int) -> None:
        try:
            self._check_stop()
            if self._checkpoint_lock is not None:
                lock, self._checkpoint_lock = self._checkpoint_lock, None
                lock.acquire()  # held until this process ends with the run
                self._restore()
            remote = is_connect(df)
            with contextlib.nullcontext() if remote else batch_jobs(df.sparkSession.sparkContext):
                self.run_batch(df, batch_id)
            return
        except BaseException as exc:
            stop = self._stop
            if stop is None:
                self.error = exc
                self._record_failure(exc)
                raise
            log.info("batch %d abandoned, the query is stopping: %s", batch_id, type(exc).__name__)
        raise stop.cancelled(batch_id)  # outside the handler: a short traceback for Spark

    def _record_failure(self, exc: BaseException) -> None:
        """Where a client of another process (Spark Connect) finds the error that failed the
        query (:meth:`CheckpointLog.read_failure`)."""
        if self._in_server and isinstance(exc, Exception):
            self.log.write_failure(self.config.start_id, TaskFailure.of(exc, -1, -1))

    def started(self, run_id: str, spark_query: Any = None) -> None:
        """Spark started the query under ``run_id`` (progress carries it); ``spark_query``: the
        JVM's query of a classic session, whose progress tells how many rows its batches read."""
        self.config.run_id = run_id
        self._spark_query = spark_query
        self._started.set()

    def snapshot_at_stop(self) -> None:
        """The query stopped cleanly: snapshot each partition's newest version where its state
        home holds it and no snapshot is stored, so a restart replays nothing. Best effort: a
        failure is logged (the changelogs are durable) and never fails the stop."""
        last = self.last_batch
        if last is None or self.error is not None:
            return
        started = time.monotonic()
        try:
            commit = self.log.read_commit(last)
            if commit is None:
                return
            written = snapshot_at_stop(self.config, self.stages, commit)
        except Exception:  # noqa: BLE001 - the stop goes on; the next start replays instead
            log.warning("could not snapshot the state at stop", exc_info=True)
            return
        if written:
            log.info(
                "stopped: %d snapshot(s) of version %d written in %.2f s",
                written,
                last + 1,
                time.monotonic() - started,
            )

    def request_stop(self, request: StopRequest) -> None:
        """From now on start no batch, and end the one in flight without committing it."""
        hide_cancelled_from_py4j()
        self._stop = request

    def holds_batch(self) -> bool:
        """True while a batch runs that has not let go for a stop."""
        stop = self._stop
        return self._in_batch.is_set() and not (stop is not None and stop.let_go.is_set())

    def _check_stop(self) -> None:
        if self._stop is not None:
            msg = "the query is stopping"
            raise QueryError(msg)

    def run_batch(self, df: DataFrame, batch_id: int) -> None:
        if self.config.refusal is not None:  # Spark's check of the state schemas, at planning
            raise self.config.refusal
        started = time.time()
        timed, times = df, self.config.input_time_columns
        df = df.drop(*times) if times else df
        digest = input_digest(self.spark_checkpoint, batch_id) if self.spark_checkpoint else None
        intent = self.log.read_intent(batch_id)
        if intent is not None and not intent.same_input(digest):
            self._roll_back(batch_id)
            intent = None
        if self.log.read_commit(batch_id) is not None:
            self._replay_committed(df, batch_id)
            return
        self._find_joined_homes(df)
        lineage = self._lineage(batch_id)
        if intent is None:
            previous = self.log.read_commit(batch_id - 1) if batch_id > 0 else None
            intent = BatchIntent(
                batch_id,
                self.tracker.watermark_ms,
                int(started * 1000),
                input_digest=digest,
                late_watermark_ms=previous.watermark_ms if previous is not None else 0,
            )
            self.log.write_intent(intent)
        session = df.sparkSession
        inputs = None
        if times:  # each watermark's own event times (a union, or watermarks on two columns)
            inputs = input_event_times(timed, times)
        self._check_stop()  # the last moment before the batch's Spark job
        with engine_settings(session, self.config.num_partitions):
            reports, timings = self._execute(df, batch_id, intent, lineage)
            self._placement.saw(HomeSeen(*h) for r in reports for h in r.homes_seen)
        sink_started = time.time()
        _finish(self.sink, batch_id)
        timings["sinkFinish"] = int((time.time() - sink_started) * 1000)
        commit_started = time.time()
        per_op = self._commit(intent, reports, inputs)
        self._request_batch(intent.watermark_ms, reports)
        timings["stateCommit"] = int((time.time() - commit_started) * 1000)
        timings["triggerExecution"] = int((time.time() - started) * 1000)
        if not self.config.run_id:  # start() sets it right after Spark started the query
            self._started.wait(RUN_ID_WAIT_S)
        progress = build_progress(
            query_id=self.config.query_id,
            run_id=self.config.run_id,
            name=self.config.name,
            batch_id=batch_id,
            started_s=started,
            durations_ms=timings,
            operators={s.op_id: s.operator for s in sorted(self.stages, key=_op_id)},
            per_op=per_op,
            num_partitions=self.config.num_partitions,
            watermark_ms=intent.watermark_ms if self.tracker.delays_ms else None,
            sink_description=self.sink.description,
            event_times=_merged(inputs) if inputs is not None else None,
        )
        with self._lock:
            self.recent.append(progress)
            del self.recent[:-MAX_RECENT_PROGRESS]
        self.log.append_progress(progress)
        self.on_progress(progress)

    def _roll_back(self, batch_id: int) -> None:
        """Spark plans batch ``batch_id`` again with other input: its offsets were deleted from
        the Spark checkpoint (a rollback). As Spark does, run it from the state before it: the
        outcome of it and of later batches is forgotten, the watermark goes back to what it
        was after the batch before. A file sink keeps the files it committed for those batches
        and writes nothing for them again, as Spark's file sink does."""
        dropped = self.log.roll_back(batch_id)
        previous = self.log.read_commit(batch_id - 1) if batch_id > 0 else None
        self.tracker = self._tracker_after(previous)
        self.last_batch = previous.batch_id if previous is not None else None
        log.warning(
            "batch %d reads other input than when it ran before (Spark's offsets of it "
            "changed: the Spark checkpoint was rolled back); running it again from the state "
            "before it%s",
            batch_id,
            f", and batches {dropped} again after it" if len(dropped) > 1 else "",
        )

    def _replay_committed(self, df: DataFrame, batch_id: int) -> None:
        """Spark re-runs a batch whose state we committed (it died before its own commit).

        The output is reproduced from the state before the batch, which is not changed, and
        delivered again unless the sink already holds it: a file sink skips it, a foreachBatch
        function sees it again (at-least-once, as with Spark's own foreachBatch).
        """
        if self.sink.committed(batch_id):
            log.info("batch %d is committed and in the sink; nothing to replay", batch_id)
            return
        intent = self.log.read_intent(batch_id)
        if intent is None:
            msg = (
                f"batch {batch_id} is committed but its intent "
                f"{self.log.batches.where(f'{batch_id}.json')} is missing; restore it from a "
                "backup of the checkpoint, or start from a new checkpoint location"
            )
            raise QueryError(msg)
        log.info("batch %d is committed; re-delivering its output", batch_id)
        with engine_settings(df.sparkSession, self.config.num_partitions):
            self._execute(df, batch_id, intent, self._lineage(batch_id), replay=True)
        _finish(self.sink, batch_id)

    # --- steps -----------------------------------------------------------------------------------

    def _find_joined_homes(self, df: DataFrame) -> None:
        """The homes of executors that joined since the last batch's reports, added to those
        the placement spreads the partitions over, and those of executors gone dropped
        (:mod:`sparkstate.engine.run.joined_homes`)."""
        conf = self.config.store.conf
        if not (conf.balance_homes and conf.state_home) or self._placement.executors() is None:
            return
        if self._joined is None:
            if is_connect(df):
                return
            sc = df.sparkSession.sparkContext
            context = sc._jsc.sc()
            self._joined = JoinedHomes(
                lambda: executors_listed(context), home_job(sc, conf), self.config.num_partitions
            )
        started = time.monotonic()
        known = self._placement.executor_names()
        try:
            found = self._joined.find(self._placement)
        except Exception as exc:  # noqa: BLE001 - the batch's own tasks may find them
            self._check_stop()
            log.info("looking for the state homes of executors that joined failed: %s", exc)
            return
        gone = known - self._placement.executor_names()
        if found or gone:
            log.info(
                "found the state homes of %d executor(s) that joined in %.2f s%s",
                found,
                time.monotonic() - started,
                f"; those of {', '.join(sorted(gone))} are gone" if gone else "",
            )

    def _lineage(self, batch_id: int) -> dict[int, dict[int, str | None]]:
        """Checkpoint id of version ``batch_id`` per operator and partition (previous commit)."""
        if batch_id == 0:
            self._owners = {}
            return {s.op_id: {} for s in self.stages}
        previous = self.log.read_commit(batch_id - 1)
        if previous is None:
            msg = (
                f"batch {batch_id} needs the state of batch {batch_id - 1}, but "
                f"{self.log.commits.where(f'{batch_id - 1}.json')} does not exist. The Spark "
                "checkpoint and the sparkstate logs disagree: restore both from the same point, "
                "or start from a new checkpoint location."
            )
            raise QueryError(msg)
        self._owners = previous.owners()  # the state homes that hold version ``batch_id``
        if self.config.store.conf.balance_homes:
            self._owners = self._placement.owners(self._owners)
        return previous.lineage()

    def _execute(
        self,
        df: DataFrame,
        batch_id: int,
        intent: BatchIntent,
        lineage: dict[int, dict[int, str | None]],
        *,
        replay: bool = False,
    ) -> tuple[list[TaskReport], dict[str, int]]:
        reports_dir = self.log.new_report_dir(batch_id)
        if not self._counted_made:
            self._counted = CountedAttempts.of(df.sparkSession)
            self._plan = None if is_connect(df) else RunPlan(self._counted)
            self._counted_made = True
        if self._plan is not None and self._plan.spark_query is None:
            self._plan.spark_query = self._spark_query  # known once start() returned
        if self._plan is not None:
            self._plan.executors_placed = self._placement.executors()
        return run_stages(
            self.config,
            self.stages,
            self.sink,
            reports_dir,
            df,
            intent,
            lineage,
            replay=replay,
            owners=self._owners,
            counted=self._counted,
            plan=self._plan,
        )

    def _commit(
        self,
        intent: BatchIntent,
        reports: list[TaskReport],
        inputs: list[OperatorMetrics] | None = None,
    ) -> dict[int, list[TaskReport]]:
        """Record batch ``intent``'s outcome, and advance the watermark by the event times the
        batch saw: ``inputs``, each watermark's, where the driver read them from the batch (a
        union), else those the operators that read the query's input observed."""
        per_op: dict[int, list[TaskReport]] = {s.op_id: [] for s in self.stages}
        for r in reports:
            per_op[r.op].append(r)
        for name, seen in zip(self.tracker.delays_ms, inputs or [], strict=inputs is not None):
            self.tracker.observe(name, seen.max_event_time_ms)
        # The operators that read the query's input observe its event times: the first one,
        # or, for a join of stateful steps' outputs, the first step of each side and the join.
        observers = [
            s for s in self.stages if s.event_time_inputs or s.inputs is not None
        ] or self.stages[:1]
        if inputs is not None:  # the driver read them
            observers = []
        for stage in observers:
            for r in per_op[stage.op_id]:
                if stage.event_time_inputs:
                    for name in stage.event_time_inputs:
                        self.tracker.observe(name, r.operator.max_event_time_ms)
                elif stage.inputs is not None:  # each input's own event time (a join's sides)
                    for side, name in stage.inputs.items():
                        self.tracker.observe(name, r.operator.max_event_time_by_input.get(side))
                else:  # every watermark is on the event-time column
                    for name in self.tracker.delays_ms:
                        self.tracker.observe(name, r.operator.max_event_time_ms)
        self.tracker.advance()
        self.log.write_commit(
            BatchCommit(
                batch_id=intent.batch_id,
                watermark_ms=intent.watermark_ms,
                watermark=self.tracker.to_dict(),
                committed_at=format_time(time.time()),
                operators={op_id: OperatorCommit.of(rs) for op_id, rs in per_op.items()},
            )
        )
        self.last_batch = intent.batch_id
        return per_op

    def _request_batch(self, watermark_before: int, reports: list[TaskReport]) -> None:
        """Ask the clock source for a no-data batch when an operator needs one
        (:func:`sparkstate.runtime.triggers.next_request`)."""
        if not any(self.triggers.values()):
            return
        moved = self.tracker.watermark_ms > watermark_before
        wanted = next_request(self._clock, self.triggers, moved, reports, int(time.time() * 1000))
        if wanted != self._clock:
            self.log.write_clock(wanted)
            self._clock = wanted

    def recent_progress(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.recent)

    def progress_reader(self) -> Callable[[], list[dict[str, Any]]]:
        """:meth:`recent_progress`, without this driver: what outlives the run (Spark's
        listeners) keeps the progress, not the query's plans."""
        recent, lock = self.recent, self._lock

        def read() -> list[dict[str, Any]]:
            with lock:
                return list(recent)

        return read


class BatchRelay:
    """What Spark's ``foreachBatch`` calls: the driver's batches, until the query's handle lets
    go of it (:meth:`release`, at stop). The JVM keeps the function it was given for as long
    as it keeps the query, and the handle keeps the JVM's query: a cycle across the gateway
    that neither side's collector sees. Through the relay, what stays of a stopped query is
    the relay alone, not its driver and plans (about a megabyte a query, in a process that
    starts and stops many)."""

    def __init__(self, driver: BatchDriver) -> None:
        self._driver: BatchDriver | None = driver

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        driver = self._driver
        if driver is None:
            msg = f"batch {batch_id} reached a sparkstate query that was stopped"
            raise RuntimeError(msg)
        driver(df, batch_id)

    def release(self) -> None:
        self._driver = None


def _merged(inputs: list[OperatorMetrics]) -> OperatorMetrics:
    """The event times of every watermark's input together (Spark merges the statistics of
    its ``EventTimeWatermark`` nodes for the progress)."""
    out = OperatorMetrics()
    for seen in inputs:
        out.merge(seen)
    return out


def _finish(sink: Sink, batch_id: int) -> None:
    """The sink's user code (a ``foreachBatch`` function); its error is noted as the user's."""
    try:
        sink.finish_batch(batch_id)
    except Exception as exc:
        exc.add_note(f"{USER_FUNCTION_NOTE}the foreachBatch function in batch {batch_id}")
        raise


def _spark_checkpoint(location: str) -> DurableDir | None:
    if not location:
        return None
    try:
        return DurableDir(location)
    except ConfigurationError:  # a Hadoop file system pyarrow does not reach
        log.info("cannot read Spark's checkpoint %s: rolled-back batches go unnoticed", location)
        return None


def _op_id(stage: Stage) -> int:
    return stage.op_id
