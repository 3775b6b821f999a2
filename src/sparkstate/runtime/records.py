"""The records that pass between the per-batch driver and its tasks, and into the batch logs.

A task ends with a :class:`TaskReport` (which attempt of a partition committed, and what it did),
or a :class:`TaskFailure` (why it failed, for the driver to raise as sparkstate's error);
the driver writes a :class:`BatchIntent` before batch ``b`` runs and a :class:`BatchCommit` once
every partition committed. Each has ``to_json`` / ``from_json`` so that it can travel as a small
file or a string: nothing here needs an accumulator or the driver's process.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pickle
import traceback
from typing import Any

from sparkstate.exceptions import ConfigurationError, QueryError, SparkstateError, UserFunctionError
from sparkstate.operators.base import OperatorMetrics
from sparkstate.store.base import StoreMetrics

__all__ = [
    "BatchCommit",
    "BatchIntent",
    "OperatorCommit",
    "StoreReport",
    "TaskFailure",
    "TaskReport",
    "raised_by_user_function",
    "user_traceback",
]


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class StoreReport:
    """What a partition's store held and cost after the commit."""

    num_keys: int = 0
    memory_used_bytes: int = 0
    custom: dict[str, float] = dataclasses.field(default_factory=dict)
    load_time_ms: float = 0.0
    commit_time_ms: float = 0.0
    task_time_ms: float = 0.0

    @classmethod
    def of(cls, metrics: StoreMetrics, **times: float) -> StoreReport:
        return cls(
            num_keys=metrics.num_keys,
            memory_used_bytes=metrics.memory_used_bytes,
            custom=dict(metrics.custom),
            **times,
        )


@dataclasses.dataclass(frozen=True)
class TaskReport:
    """One attempt of one operator partition in one batch, after it committed ``version``."""

    op: int
    partition: int
    checkpoint_id: str | None
    version: int
    operator: OperatorMetrics
    store: StoreReport
    #: Spark's attempt number and task attempt id (-1 outside a Spark task), and the worker's pid.
    attempt: int = 0
    task_attempt_id: int = -1
    pid: int = 0
    #: Rows a catch-up commit's timeout pass emitted after the sink had consumed the batch.
    num_output_rows_dropped: int = 0
    #: The address of the state home the attempt ran in (None: it ran in its Python worker).
    home: str | None = None
    #: The state homes the attempt saw, as (address, executor, the executor's cores): the one
    #: it ran in, and the one its worker keeps on its own executor where that is another (the
    #: driver spreads partitions over the executors it hears of so).
    homes_seen: tuple[tuple[str, str, int], ...] = ()

    @property
    def rows_in_state(self) -> int:
        """Rows in the partition's state: the operator's count where it keeps one, else the
        store's keys; a store that does not count them (-1) reports 0, as Spark does."""
        counted = self.operator.num_rows_total
        return max(0, self.store.num_keys) if counted is None else counted

    def to_json(self) -> str:
        return _dumps(
            {
                **dataclasses.asdict(self),
                "operator": self.operator.to_dict(),
                "store": dataclasses.asdict(self.store),
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskReport:
        data = json.loads(text)
        return cls(
            **{
                **data,
                "operator": OperatorMetrics.from_dict(data["operator"]),
                "store": StoreReport(**data["store"]),
                "homes_seen": tuple(
                    (str(a), str(e), int(c)) for a, e, c in data.get("homes_seen", ())
                ),
            }
        )

    def wins_over(self, other: TaskReport) -> bool:
        """Whether this attempt counts instead of ``other`` (same operator and partition).

        Every successful attempt of a partition loaded the same version and saw the same input,
        so each committed the same state; the newest is kept (checkpoint ids sort by time).
        """
        return str(self.checkpoint_id) > str(other.checkpoint_id)


@dataclasses.dataclass(frozen=True)
class BatchIntent:
    """What batch ``batch_id`` runs with, chosen before it runs and reused by a replay."""

    batch_id: int
    watermark_ms: int
    batch_timestamp_ms: int
    #: The digest of the source offsets Spark's batch read (``runtime/spark_checkpoint.py``);
    #: None where it could not be read, and in intents written before it was recorded.
    input_digest: str | None = None
    #: The watermark late rows are judged by: the previous batch's (Spark's
    #: ``eventTimeWatermarkForLateEvents``); None in intents written before it was recorded.
    late_watermark_ms: int | None = None
    #: Set on a batch that rescales the state instead of reading input
    #: (:mod:`sparkstate.runtime.rescale`): ``{"from": n, "to": m}`` partitions, and ``after``:
    #: the batch whose state it holds (and whose end of input it takes).
    repartition: dict[str, int] | None = None

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        if self.repartition is None:
            del data["repartition"]
        return _dumps(data)

    @property
    def watermark_for_late_rows_ms(self) -> int:
        return self.watermark_ms if self.late_watermark_ms is None else self.late_watermark_ms

    def same_input(self, digest: str | None) -> bool:
        """Whether a batch that read ``digest`` is this batch run again (as far as can be told:
        a digest missing on either side counts as the same input)."""
        return self.input_digest is None or digest is None or self.input_digest == digest

    @classmethod
    def from_json(cls, text: str | bytes) -> BatchIntent:
        data = json.loads(text)
        return cls(
            batch_id=int(data["batch_id"]),
            watermark_ms=int(data["watermark_ms"]),
            batch_timestamp_ms=int(data["batch_timestamp_ms"]),
            input_digest=data.get("input_digest"),
            late_watermark_ms=_optional_int(data.get("late_watermark_ms")),
            repartition=_partition_counts(data.get("repartition")),
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _partition_counts(value: Any) -> dict[str, int] | None:
    return None if value is None else {k: int(v) for k, v in value.items()}


@dataclasses.dataclass(frozen=True)
class OperatorCommit:
    """The attempt that counts for every partition of one operator, and its total rows."""

    checkpoint_ids: dict[int, str | None]
    num_rows_total: int
    #: The state home that holds each partition's committed version (its owner): the next
    #: batch's tasks send the partition's input there, wherever Spark runs them.
    homes: dict[int, str] = dataclasses.field(default_factory=dict)
    #: The executor (``host/executor-id``) of each partition's home, where its task said.
    executors: dict[int, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_written(
        cls, op_id: int, parts: dict[int, tuple[str, int]], num_partitions: int, by: str
    ) -> OperatorCommit:
        """The outcome of a job that wrote every partition's state (a rescale, a take-over):
        ``parts``, per partition, the checkpoint id written and the rows in it; ``by`` names
        the job in the error where a partition is missing."""
        missing = [p for p in range(num_partitions) if p not in parts]
        if missing:
            msg = f"operator {op_id}: {by} wrote no state for partitions {missing}"
            raise ConfigurationError(msg)
        return cls(
            checkpoint_ids={p: parts[p][0] for p in range(num_partitions)},
            num_rows_total=sum(parts[p][1] for p in range(num_partitions)),
        )

    @classmethod
    def of(cls, reports: list[TaskReport]) -> OperatorCommit:
        ordered = sorted(reports, key=lambda r: r.partition)
        return cls(
            checkpoint_ids={r.partition: r.checkpoint_id for r in ordered},
            num_rows_total=sum(r.rows_in_state for r in reports),
            homes={r.partition: r.home for r in ordered if r.home},
            executors={r.partition: r.homes_seen[0][1] for r in ordered if r.homes_seen},
        )


@dataclasses.dataclass(frozen=True)
class BatchCommit:
    """The outcome of batch ``batch_id``: per operator, which attempts count; the watermark."""

    batch_id: int
    #: The watermark the batch ran with, and the tracker's state after it (for the next batch).
    watermark_ms: int
    watermark: dict[str, Any]
    committed_at: str
    operators: dict[int, OperatorCommit]
    #: A batch that rescaled the state: ``{"from": n, "to": m}`` partitions (see
    #: :class:`BatchIntent`).
    repartition: dict[str, int] | None = None
    #: A batch whose outcome a migration rewrote (:mod:`sparkstate.runtime.migration`).
    migration: dict[str, Any] | None = None

    def lineage(self) -> dict[int, dict[int, str | None]]:
        """Checkpoint id of version ``batch_id + 1`` per operator and partition."""
        return {op: dict(c.checkpoint_ids) for op, c in self.operators.items()}

    def owners(self) -> dict[int, dict[int, str]]:
        """The state home holding version ``batch_id + 1``, per operator and partition."""
        return {op: dict(c.homes) for op, c in self.operators.items()}

    def to_json(self) -> str:
        extra: dict[str, Any] = {}
        if self.repartition is not None:
            extra["repartition"] = self.repartition
        if self.migration is not None:
            extra["migration"] = self.migration
        return _dumps(
            {
                **extra,
                "batch_id": self.batch_id,
                "watermark_ms": self.watermark_ms,
                "watermark": self.watermark,
                "committed_at": self.committed_at,
                "operators": {
                    str(op): {
                        "checkpoint_ids": {str(p): c for p, c in entry.checkpoint_ids.items()},
                        "num_rows_total": entry.num_rows_total,
                        **(
                            {"homes": {str(p): h for p, h in entry.homes.items()}}
                            if entry.homes
                            else {}
                        ),
                        **(
                            {"executors": {str(p): e for p, e in entry.executors.items()}}
                            if entry.executors
                            else {}
                        ),
                    }
                    for op, entry in self.operators.items()
                },
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> BatchCommit:
        data = json.loads(text)
        return cls(
            batch_id=int(data["batch_id"]),
            watermark_ms=int(data["watermark_ms"]),
            watermark=dict(data.get("watermark", {})),
            committed_at=str(data.get("committed_at", "")),
            operators={
                int(op): OperatorCommit(
                    checkpoint_ids={int(p): c for p, c in entry["checkpoint_ids"].items()},
                    num_rows_total=int(entry.get("num_rows_total", 0)),
                    homes={int(p): str(h) for p, h in entry.get("homes", {}).items()},
                    executors={int(p): str(e) for p, e in entry.get("executors", {}).items()},
                )
                for op, entry in data["operators"].items()
            },
            repartition=_partition_counts(data.get("repartition")),
            migration=data.get("migration"),
        )


def _homes_json(homes: dict[int, str]) -> dict[str, dict[str, str]]:
    return {"homes": {str(p): h for p, h in homes.items()}} if homes else {}


#: Frames of sparkstate's own code, left out of a user function's traceback.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: A pickled exception larger than this is not brought back (its message and traceback are).
_MAX_PICKLE = 1 << 20
#: The note operators add to an exception raised by a function of the user's.
USER_FUNCTION_NOTE = "sparkstate: raised by "


def raised_by_user_function(exc: BaseException) -> bool:
    """Whether a function of the user's raised ``exc`` (an operator or the driver noted so)."""
    if isinstance(exc, SparkstateError):
        return False
    return any(str(n).startswith(USER_FUNCTION_NOTE) for n in getattr(exc, "__notes__", ()))


def user_traceback(exc: BaseException) -> str:
    """The traceback of an error a user's function raised, as Python prints it, without the
    frames of sparkstate that called the function."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if not f.filename.startswith(_PACKAGE_DIR)]
    summary = traceback.StackSummary.from_list(mine or frames)
    text = "Traceback (most recent call last):\n" + "".join(summary.format())
    return text + "".join(traceback.format_exception_only(exc))


@dataclasses.dataclass(frozen=True)
class TaskFailure:
    """Why a task failed, written where the driver finds it: Spark brings only the text of a
    Python worker's error back, and the driver raises sparkstate's own error instead."""

    op: int
    partition: int
    #: ``module.QualName`` of the exception.
    type_name: str
    message: str
    #: The traceback as Python prints it; for a user function's error, the user's frames only.
    traceback: str
    #: Whether a function of the user's raised it (an operator noted so).
    user_function: bool
    #: The exception pickled (base64), where it pickles.
    pickled: str | None = None

    @classmethod
    def of(cls, exc: BaseException, op: int, partition: int) -> TaskFailure:
        user = raised_by_user_function(exc)
        text = user_traceback(exc) if user else "".join(traceback.format_exception(exc))
        try:
            data = pickle.dumps(exc)
            pickled = base64.b64encode(data).decode("ascii") if len(data) <= _MAX_PICKLE else None
        except Exception:  # noqa: BLE001 - any exception may be unpicklable; the text stays
            pickled = None
        kind = type(exc)
        return cls(
            op=op,
            partition=partition,
            type_name=f"{kind.__module__}.{kind.__qualname__}",
            message=str(exc),
            traceback=text,
            user_function=user,
            pickled=pickled,
        )

    def to_json(self) -> str:
        return _dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskFailure:
        data = json.loads(text)
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    def original(self) -> BaseException | None:
        """The exception itself, where it pickled and unpickles here."""
        if self.pickled is None:
            return None
        try:
            exc = pickle.loads(base64.b64decode(self.pickled))  # noqa: S301 - our own task's file
        except Exception:  # noqa: BLE001 - a class the driver cannot import
            return None
        return exc if isinstance(exc, BaseException) else None

    def error(self) -> SparkstateError:
        """The error the driver raises for this failure."""
        original = self.original()
        where = (
            f"in the task of operator {self.op}, partition {self.partition}"
            if self.op >= 0
            else "in the driver"
        )
        if isinstance(original, SparkstateError):
            original.add_note(f"sparkstate: {where}")
            return original
        error: SparkstateError
        if self.user_function:
            error = UserFunctionError(self.traceback.rstrip("\n"))
        else:
            error = QueryError(f"{self.type_name}: {self.message} ({where})\n{self.traceback}")
        error.__cause__ = original
        return error
