"""The records that pass between the per-batch driver and its tasks, and into the batch logs.

A task ends with a :class:`TaskReport` (which attempt of a partition committed, and what it did);
the driver writes a :class:`BatchIntent` before batch ``b`` runs and a :class:`BatchCommit` once
every partition committed. Each has ``to_json`` / ``from_json`` so that it can travel as a small
file or a string: nothing here needs an accumulator or the driver's process.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from sparkstate.operators.base import OperatorMetrics
from sparkstate.store.base import StoreMetrics

__all__ = ["BatchCommit", "BatchIntent", "OperatorCommit", "StoreReport", "TaskReport"]


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

    def to_json(self) -> str:
        return _dumps(dataclasses.asdict(self))

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
        )


@dataclasses.dataclass(frozen=True)
class OperatorCommit:
    """The attempt that counts for every partition of one operator, and its total rows."""

    checkpoint_ids: dict[int, str | None]
    num_rows_total: int

    @classmethod
    def of(cls, reports: list[TaskReport]) -> OperatorCommit:
        ordered = sorted(reports, key=lambda r: r.partition)
        return cls(
            checkpoint_ids={r.partition: r.checkpoint_id for r in ordered},
            num_rows_total=sum(r.store.num_keys for r in reports),
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

    def lineage(self) -> dict[int, dict[int, str | None]]:
        """Checkpoint id of version ``batch_id + 1`` per operator and partition."""
        return {op: dict(c.checkpoint_ids) for op, c in self.operators.items()}

    def to_json(self) -> str:
        return _dumps(
            {
                "batch_id": self.batch_id,
                "watermark_ms": self.watermark_ms,
                "watermark": self.watermark,
                "committed_at": self.committed_at,
                "operators": {
                    str(op): {
                        "checkpoint_ids": {str(p): c for p, c in entry.checkpoint_ids.items()},
                        "num_rows_total": entry.num_rows_total,
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
                )
                for op, entry in data["operators"].items()
            },
        )
