"""The numbers of a progress log as columns: one value per batch, None where the batch's line
lacks the field (older lines carry fewer of them), per operator where Spark reports them so."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from sparkstate.observe.units import parse_time_ms

__all__ = ["DISK_METRICS", "WRITTEN_METRICS", "Columns", "OperatorColumns", "Run", "columns"]

Values = list[float | None]

#: ``customMetrics`` of the state on an operator's local disks -> how the report names them.
DISK_METRICS = {"sstBytes": "SST files"}
#: ``customMetrics`` of the bytes a batch wrote to the checkpoint -> how the report names them.
WRITTEN_METRICS = {
    "changelogBytesWritten": "changelog",
    "deltaBytesWritten": "delta",
    "bytesUploaded": "snapshot upload",
}
#: The phase of ``durationMs`` that spans the whole batch (the others are parts of it).
TOTAL_PHASE = "triggerExecution"
#: The part of a batch's time that no phase accounts for.
OTHER_PHASE = "other"


@dataclasses.dataclass(frozen=True)
class OperatorColumns:
    """One entry of ``stateOperators`` over the batches."""

    label: str
    rows_total: Values
    rows_dropped: Values
    memory_bytes: Values
    #: ``customMetrics`` name -> values, for the metrics some batch reports.
    disk_bytes: dict[str, Values]
    written_bytes: dict[str, Values]


@dataclasses.dataclass(frozen=True)
class Run:
    """Consecutive batches of one run of the query (a restart starts another)."""

    run_id: str | None
    first_batch: int
    last_batch: int
    batches: int
    started_ms: float | None


@dataclasses.dataclass(frozen=True)
class Columns:
    batch_ids: list[int]
    times_ms: Values
    run_ids: list[str | None]
    input_rows: Values
    output_rows: Values
    input_rate: Values
    processed_rate: Values
    total_ms: Values
    #: ``durationMs`` phase -> milliseconds (0 where not reported), largest phase first.
    phases: dict[str, list[float]]
    watermark_ms: Values
    max_event_ms: Values
    operators: list[OperatorColumns]

    def runs(self) -> list[Run]:
        out: list[Run] = []
        for i, (batch, run_id) in enumerate(zip(self.batch_ids, self.run_ids, strict=True)):
            if out and out[-1].run_id == run_id:
                last = out[-1]
                out[-1] = dataclasses.replace(last, last_batch=batch, batches=last.batches + 1)
            else:
                out.append(Run(run_id, batch, batch, 1, self.times_ms[i]))
        return out


def columns(batches: Sequence[dict[str, Any]]) -> Columns:
    """The columns of ``batches`` (progress dicts in batch order)."""
    n_ops = max((len(_list(b.get("stateOperators"))) for b in batches), default=0)
    return Columns(
        batch_ids=[int(b["batchId"]) for b in batches],
        times_ms=[parse_time_ms(b.get("timestamp")) for b in batches],
        run_ids=[_text(b.get("runId")) for b in batches],
        input_rows=[_number(b, "numInputRows") for b in batches],
        output_rows=[_number(b, "sink", "numOutputRows") for b in batches],
        input_rate=[_number(b, "inputRowsPerSecond") for b in batches],
        processed_rate=[_number(b, "processedRowsPerSecond") for b in batches],
        total_ms=[_number(b, "durationMs", TOTAL_PHASE) for b in batches],
        phases=_phases(batches),
        watermark_ms=[_event_time(b, "watermark") for b in batches],
        max_event_ms=[_event_time(b, "max") for b in batches],
        operators=[_operator(batches, i) for i in range(n_ops)],
    )


def _operator(batches: Sequence[dict[str, Any]], index: int) -> OperatorColumns:
    entries = [_entry(b, index) for b in batches]
    names = [e.get("operatorName") for e in entries if isinstance(e.get("operatorName"), str)]
    label = f"op {index} {names[-1]}" if names else f"op {index}"

    def custom(names: dict[str, str]) -> dict[str, Values]:
        found = {k: [_number(e, "customMetrics", k) for e in entries] for k in names}
        return {k: v for k, v in found.items() if any(x is not None for x in v)}

    return OperatorColumns(
        label=label,
        rows_total=[_number(e, "numRowsTotal") for e in entries],
        rows_dropped=[_number(e, "numRowsDroppedByWatermark") for e in entries],
        memory_bytes=[_number(e, "memoryUsedBytes") for e in entries],
        disk_bytes=custom(DISK_METRICS),
        written_bytes=custom(WRITTEN_METRICS),
    )


def _phases(batches: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """The phases of every batch's time, and what they leave of its total as ``other``."""
    names: dict[str, None] = {}
    for b in batches:
        for name in _dict(b.get("durationMs")):
            if name != TOTAL_PHASE:
                names[name] = None
    phases = {n: [_number(b, "durationMs", n) or 0.0 for b in batches] for n in names}
    totals = [_number(b, "durationMs", TOTAL_PHASE) or 0.0 for b in batches]
    other = [max(0.0, t - sum(p[i] for p in phases.values())) for i, t in enumerate(totals)]
    if any(other):
        phases[OTHER_PHASE] = other
    return dict(sorted(phases.items(), key=lambda kv: -sum(kv[1])))


def _event_time(batch: dict[str, Any], field: str) -> float | None:
    """A time of ``eventTime`` in ms; None before any is known (Spark reports the epoch then)."""
    ms = parse_time_ms(_dict(batch.get("eventTime")).get(field))
    return ms if ms is not None and ms > 0 else None


def _entry(batch: dict[str, Any], index: int) -> dict[str, Any]:
    ops = _list(batch.get("stateOperators"))
    return _dict(ops[index]) if index < len(ops) else {}


def _number(data: dict[str, Any], *path: str) -> float | None:
    """The number at ``path`` in ``data``; None if any step is missing or not of its type."""
    value: Any = data
    for key in path:
        value = _dict(value).get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
