"""The per-batch driver: the function Spark's ``foreachBatch`` calls for every micro-batch.

For batch ``b`` (see DESIGN.md, "One micro-batch"): skip it if ``commits/<b>.json`` exists; read or
write the intent ``batches/<b>.json`` (watermark, timestamp); build the stateful stages over the
batch (shuffle by key, ``mapInArrow`` with the partition's store at version ``b``); hand the output
to the sink, whose single action runs every stateful task once; collect the tasks' reports from an
accumulator; write ``commits/<b>.json``; advance the watermark; publish progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession

from sparkstate.engine.clock import read_clock, write_clock
from sparkstate.engine.executor import StoreSettings, TaskSpec, commit_empty, run_stateful_task
from sparkstate.engine.logs import CheckpointLog
from sparkstate.engine.plan import Stage, quote
from sparkstate.engine.progress import build_progress, format_time
from sparkstate.engine.sinks import Sink
from sparkstate.engine.watermark import WatermarkTracker
from sparkstate.exceptions import QueryError

__all__ = ["BatchDriver", "ReportParam"]

log = logging.getLogger("sparkstate.engine")
AQE = "spark.sql.adaptive.enabled"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
INPUT = "input"
MAX_RECENT_PROGRESS = 100


class ReportParam(AccumulatorParam[list[dict[str, Any]]]):
    """Accumulates the tasks' report dicts into one list."""

    def zero(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []

    def addInPlace(  # noqa: N802 - PySpark's name
        self, value1: list[dict[str, Any]], value2: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        value1.extend(value2)
        return value1


def _task_function(
    spec: TaskSpec, report: Any
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return run_stateful_task(spec, batches, report)

    return run


@dataclasses.dataclass
class DriverConfig:
    query_id: str
    run_id: str
    name: str | None
    output_mode: str
    num_partitions: int
    store: StoreSettings
    watermark_column: str | None
    watermark_delay_ms: int | None
    watermark_policy: str = "min"


class BatchDriver:
    """Runs the stateful stages of every micro-batch and keeps the logs and progress."""

    def __init__(
        self,
        config: DriverConfig,
        stages: list[Stage],
        sink: Sink,
        log_: CheckpointLog,
        on_progress: Callable[[dict[str, Any]], None],
    ) -> None:
        self.config = config
        self.stages = stages
        self.sink = sink
        self.log = log_
        self.on_progress = on_progress
        delays = {INPUT: config.watermark_delay_ms} if config.watermark_delay_ms is not None else {}
        self.tracker = WatermarkTracker(delays, config.watermark_policy)
        self.recent: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        latest = log_.latest_commit()
        self.last_batch: int | None = None
        if latest is not None:
            self.tracker.restore(latest.get("watermark", {}))
            self.last_batch = int(latest["batch_id"])
        self.triggers = {s.op_id: s.operator.time_trigger() for s in stages}
        self._clock = read_clock(log_.dir) if any(self.triggers.values()) else {}

    # --- the foreachBatch function ---------------------------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        try:
            self.run_batch(df, batch_id)
        except BaseException as exc:
            self.error = exc
            raise

    def run_batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.time()
        if self.log.read_commit(batch_id) is not None:
            self._replay_committed(df, batch_id)
            return
        lineage = self._lineage(batch_id)
        intent = self.log.read_intent(batch_id)
        if intent is None:
            intent = {
                "watermark_ms": self.tracker.watermark_ms,
                "batch_timestamp_ms": int(started * 1000),
            }
            self.log.write_intent(batch_id, intent)
        session = df.sparkSession
        with _engine_settings(session, self.config.num_partitions):
            reports, timings = self._execute(df, batch_id, intent, lineage, session)
        sink_started = time.time()
        self.sink.finish_batch(batch_id)
        timings["sinkFinish"] = int((time.time() - sink_started) * 1000)
        commit_started = time.time()
        per_op = self._commit(batch_id, intent, reports)
        self._request_batch(int(intent["watermark_ms"]), per_op)
        timings["stateCommit"] = int((time.time() - commit_started) * 1000)
        timings["triggerExecution"] = int((time.time() - started) * 1000)
        progress = build_progress(
            query_id=self.config.query_id,
            run_id=self.config.run_id,
            name=self.config.name,
            batch_id=batch_id,
            started_s=started,
            durations_ms=timings,
            stages=self.stages,
            per_op=per_op,
            num_partitions=self.config.num_partitions,
            watermark_ms=int(intent["watermark_ms"]) if self.tracker.delays_ms else None,
            sink_description=self.sink.description,
        )
        with self._lock:
            self.recent.append(progress)
            del self.recent[:-MAX_RECENT_PROGRESS]
        self.log.append_progress(progress)
        self.on_progress(progress)

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
            msg = f"batch {batch_id} is committed but its intent {batch_id}.json is missing"
            raise QueryError(msg)
        log.info("batch %d is committed; re-delivering its output", batch_id)
        with _engine_settings(df.sparkSession, self.config.num_partitions):
            self._execute(
                df, batch_id, intent, self._lineage(batch_id), df.sparkSession, replay=True
            )
        self.sink.finish_batch(batch_id)

    # --- steps -----------------------------------------------------------------------------------

    def _lineage(self, batch_id: int) -> dict[int, dict[int, str | None]]:
        """Checkpoint id of version ``batch_id`` per operator and partition (previous commit)."""
        if batch_id == 0:
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
        out: dict[int, dict[int, str | None]] = {}
        for op_id, entry in previous["operators"].items():
            out[int(op_id)] = {int(p): c for p, c in entry["checkpoint_ids"].items()}
        return out

    def _spec(
        self,
        stage: Stage,
        batch_id: int,
        intent: dict[str, Any],
        lineage: dict[int, Any],
        replay: bool,
    ) -> TaskSpec:
        last = stage is self.stages[-1]
        return TaskSpec(
            op_id=stage.op_id,
            operator=stage.operator,
            batch_id=batch_id,
            output_mode=self.config.output_mode if last else "append",
            watermark_ms=int(intent["watermark_ms"]),
            batch_timestamp_ms=int(intent["batch_timestamp_ms"]),
            num_partitions=self.config.num_partitions,
            store=self.config.store,
            lineage=lineage.get(stage.op_id, {}),
            replay=replay,
        )

    def _execute(
        self,
        df: DataFrame,
        batch_id: int,
        intent: dict[str, Any],
        lineage: dict[int, Any],
        session: SparkSession,
        *,
        replay: bool = False,
    ) -> tuple[list[dict[str, Any]], dict[str, int]]:
        acc = session.sparkContext.accumulator([], ReportParam())
        n = self.config.num_partitions
        current = df
        specs: dict[int, TaskSpec] = {}
        for stage in self.stages:
            spec = self._spec(stage, batch_id, intent, lineage, replay)
            specs[stage.op_id] = spec
            shuffled = stage.input_of(current, batch_id).repartition(
                n, *[quote(c) for c in stage.partition_columns]
            )
            current = shuffled.mapInArrow(_task_function(spec, acc), stage.output_struct)
        sink_started = time.time()
        self.sink.add_batch(batch_id, current, self.config.output_mode)
        timings = {"statefulStage": int((time.time() - sink_started) * 1000)}
        if replay:
            return [], timings
        reports = _winning_reports(acc.value)
        missing = [(op_id, p) for op_id in specs for p in range(n) if (op_id, p) not in reports]
        if missing:
            if self.config.output_mode == "complete":
                msg = (
                    f"batch {batch_id}: Spark ran no task for state partitions {missing}, so "
                    "complete output would be partial. Is adaptive execution forced on?"
                )
                raise QueryError(msg)
            log.warning("batch %d: committing untouched partitions %s", batch_id, missing)
            sc = session.sparkContext
            filled = (
                sc.parallelize(missing, len(missing))
                .map(lambda item: commit_empty(specs[item[0]], item[1]))
                .collect()
            )
            for r in filled:
                reports[(r["op"], r["partition"])] = r
        return list(reports.values()), timings

    def _commit(
        self, batch_id: int, intent: dict[str, Any], reports: list[dict[str, Any]]
    ) -> dict[int, list[dict[str, Any]]]:
        per_op: dict[int, list[dict[str, Any]]] = {s.op_id: [] for s in self.stages}
        for r in reports:
            per_op[int(r["op"])].append(r)
        first = self.stages[0].op_id
        for r in per_op[first]:
            self.tracker.observe(INPUT, r["operator"].get("max_event_time_ms"))
        self.tracker.advance()
        operators = {
            str(op_id): {
                "checkpoint_ids": {
                    str(r["partition"]): r["checkpoint_id"]
                    for r in sorted(rs, key=lambda r: int(r["partition"]))
                },
                "num_rows_total": sum(int(r["store"]["num_keys"]) for r in rs),
            }
            for op_id, rs in per_op.items()
        }
        self.log.write_commit(
            batch_id,
            {
                "watermark_ms": int(intent["watermark_ms"]),
                "watermark": self.tracker.to_dict(),
                "committed_at": format_time(time.time()),
                "operators": operators,
            },
        )
        self.last_batch = batch_id
        return per_op

    def _request_batch(
        self, watermark_before: int, per_op: dict[int, list[dict[str, Any]]]
    ) -> None:
        """Ask the clock source for a no-data batch when an operator needs one (see clock.py):
        now, if the watermark moved and event-time timeouts or timers may be due; once the
        earliest processing-time timeout or timer comes due."""
        if not any(self.triggers.values()):
            return
        requested = self._clock.get("requested_at_ms")
        moved = self.tracker.watermark_ms > watermark_before
        if moved and "event" in self.triggers.values():
            requested = int(time.time() * 1000)
        due: int | None = None
        for op_id, trigger in self.triggers.items():
            if trigger != "processing":
                continue
            for r in per_op.get(op_id, []):
                ts = r.get("operator", {}).get("next_timer_ms")
                if ts is not None and (due is None or ts < due):
                    due = int(ts)
        wanted = {"requested_at_ms": requested, "due_ms": due}
        if wanted != self._clock:
            write_clock(self.log.dir, requested, due)
            self._clock = wanted

    def recent_progress(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.recent)


@contextlib.contextmanager
def _engine_settings(session: SparkSession, num_partitions: int) -> Iterator[None]:
    """Session settings for the stateful stages of one batch, restored afterwards.

    Adaptive execution off: coalesced shuffle partitions would break "partition = store".
    Shuffle partitions = state partitions: the partial aggregate's shuffle then already hashes
    by key into ``num_partitions`` and Spark drops the second shuffle of ``repartition``.
    """
    wanted = {AQE: "false", SHUFFLE_PARTITIONS: str(num_partitions)}
    previous: dict[str, str | None] = {k: session.conf.get(k, None) for k in wanted}
    for k, v in wanted.items():
        session.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in previous.items():
            if old is None:
                session.conf.unset(k)
            else:
                session.conf.set(k, old)


def _winning_reports(reports: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    """One report per (operator, partition): the newest attempt if a task ran more than once.

    Every successful attempt of a partition loaded the same version and saw the same input, so
    each committed the same state; the newest one is kept (checkpoint ids sort by time).
    """
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for r in reports:
        key = (int(r["op"]), int(r["partition"]))
        old = out.get(key)
        if old is None or str(r["checkpoint_id"]) > str(old["checkpoint_id"]):
            out[key] = r
    return out
