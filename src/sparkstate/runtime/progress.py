"""Progress dicts in the shape of Spark's ``StreamingQueryProgress.json``.

``stateOperators`` carries Spark's field names; the numbers come from the tasks' reports (summed
over partitions, as Spark sums its SQL metrics) and from the stores' metrics (custom metrics
combined as Spark's progress combines them, :func:`sparkstate.store.spark_metrics.combine`).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from sparkstate.operators.base import OperatorMetrics, StatefulOperator
from sparkstate.runtime.records import TaskReport
from sparkstate.store.spark_metrics import combine

__all__ = [
    "build_progress",
    "format_time",
    "format_time_ms",
    "progress_as_dict",
    "state_operator_progress",
]


def format_time(seconds: float) -> str:
    """Spark's progress timestamp format: ``2024-01-01T00:00:00.000Z``."""
    return format_time_ms(round(seconds * 1_000_000) // 1000)


#: The days of 400 Gregorian years, after which the calendar repeats.
_CYCLE_DAYS = 146_097
_CYCLE_MS = _CYCLE_DAYS * 86_400_000
_EPOCH = datetime.datetime(1970, 1, 1)


def format_time_ms(ms: int) -> str:
    """The progress timestamp of ``ms`` after the epoch as Spark writes it, for every time an
    event time can hold: the year of the era in at least four digits, ``+`` before a year past
    9999 (java.time's ``yyyy``). Python's datetime ends at 9999: it formats the time's place in
    its 400-year cycle, and the year is counted on."""
    cycles, in_cycle = divmod(ms, _CYCLE_MS)
    t = _EPOCH + datetime.timedelta(milliseconds=in_cycle)
    year = t.year + 400 * cycles
    of_era = year if year > 0 else 1 - year
    text = f"{of_era:04d}" if of_era < 10_000 else f"+{of_era}"
    return f"{text}-{t:%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"


def state_operator_progress(
    operator: StatefulOperator, reports: Sequence[TaskReport], num_partitions: int
) -> tuple[dict[str, Any], OperatorMetrics]:
    """One ``stateOperators`` entry and the operator's summed metrics."""
    total = OperatorMetrics()
    commit_ms = load_ms = 0.0
    rows_total = memory = 0
    for r in reports:
        total.merge(r.operator)
        rows_total += r.rows_in_state
        memory += r.store.memory_used_bytes
        commit_ms += r.store.commit_time_ms
        load_ms += r.store.load_time_ms
    custom = combine(r.store.custom for r in reports)
    custom["loadTimeMs"] = round(load_ms)
    for name, ms in total.phase_ms.items():  # where the tasks' time went, summed over partitions
        custom[name] = round(ms)
    for name, value in total.custom.items():
        custom[name] = value
    entry = {
        "operatorName": operator.operator_name,
        "numRowsTotal": rows_total,
        "numRowsUpdated": total.num_rows_updated,
        "allUpdatesTimeMs": total.all_updates_time_ms,
        "numRowsRemoved": total.num_rows_removed,
        "allRemovalsTimeMs": total.all_removals_time_ms,
        "commitTimeMs": round(commit_ms),
        "memoryUsedBytes": memory,
        "numRowsDroppedByWatermark": total.num_rows_dropped_by_watermark,
        "numShufflePartitions": num_partitions,
        # Spark's count: its stores per partition (a join keeps four), each partition's own.
        "numStateStoreInstances": num_partitions * len(operator.spark_store_names),
        "customMetrics": {k: _number(v) for k, v in sorted(custom.items())},
    }
    return entry, total


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def build_progress(
    *,
    query_id: str,
    run_id: str,
    name: str | None,
    batch_id: int,
    started_s: float,
    durations_ms: dict[str, int],
    operators: dict[int, StatefulOperator],
    per_op: dict[int, list[TaskReport]],
    num_partitions: int,
    watermark_ms: int | None,
    sink_description: str,
    event_times: OperatorMetrics | None = None,
) -> dict[str, Any]:
    """The progress of one batch (without ``sources``, which Spark's own progress adds);
    ``event_times``: the statistics of the input's event times where the driver read them
    (else the first operator's)."""
    entries = []
    totals = []
    for op_id, operator in operators.items():
        entry, total = state_operator_progress(operator, per_op.get(op_id, []), num_partitions)
        entries.append(entry)
        totals.append(total)
    num_input = totals[0].num_input_rows if totals else 0
    duration_s = max(durations_ms.get("triggerExecution", 0), 1) / 1000
    progress: dict[str, Any] = {
        "id": query_id,
        "runId": run_id,
        "name": name,
        "timestamp": format_time(started_s),
        "batchId": batch_id,
        "batchDuration": durations_ms.get("triggerExecution", 0),
        "numInputRows": num_input,
        "processedRowsPerSecond": num_input / duration_s,
        "durationMs": dict(durations_ms),
        "stateOperators": entries,
        "sources": [],
        "sink": {
            "description": sink_description,
            "numOutputRows": totals[-1].num_output_rows if totals else 0,
        },
    }
    if watermark_ms is not None:
        event_time: dict[str, str] = {"watermark": format_time_ms(watermark_ms)}
        first = event_times if event_times is not None else (totals[0] if totals else None)
        if first is not None and first.max_event_time_ms is not None:
            event_time["max"] = format_time_ms(first.max_event_time_ms)
        if first is not None and first.min_event_time_ms is not None and first.event_time_count:
            event_time["min"] = format_time_ms(first.min_event_time_ms)
            average = first.event_time_sum_ms / first.event_time_count
            event_time["avg"] = format_time_ms(int(average))  # truncated, as Spark's
        progress["eventTime"] = event_time
    return progress


#: Fields of Spark's progress that are sums over its sources; a progress that comes over Spark
#: Connect lacks them at the top (PySpark's ``StreamingQueryProgress`` computes them).
SOURCE_TOTALS = ("numInputRows", "inputRowsPerSecond", "processedRowsPerSecond")


def progress_as_dict(progress: Any) -> dict[str, Any]:
    """One of Spark's progress objects (or dicts) as a plain dict, nested objects included,
    with the per-source totals filled in where they are missing."""
    raw = getattr(progress, "json", None)
    data: dict[str, Any] = json.loads(raw) if isinstance(raw, str) else dict(progress)
    sources = data.get("sources") or []
    for field in SOURCE_TOTALS:
        if data.get(field) is None and sources:
            data[field] = _number(sum(float(s.get(field) or 0) for s in sources))
    return data
