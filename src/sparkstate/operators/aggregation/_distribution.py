"""Results over every value of a key, kept as a list (``percentile``, ``median``, ``mode``),
computed as Spark's Percentile and Mode compute them from their counts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["mode", "percentiles"]


def percentiles(lists: pa.Array, percentage: float | tuple[float, ...]) -> pa.Array:
    """Per row, the percentile of its doubles at ``percentage`` (a list of them for a tuple):
    position ``(n - 1) * p`` in the sorted values (NaN last), linearly interpolated between the
    values on either side; null for a row without values."""
    n_rows = len(lists)
    counts = np.asarray(pc.fill_null(pc.list_value_length(lists), 0), np.int64)
    starts = np.zeros(n_rows, np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    values = np.asarray(pc.fill_null(lists.flatten(), np.nan), np.float64)
    rows = np.asarray(pc.list_parent_indices(lists), np.int64)
    ordered = values[np.lexsort((values, rows))] if len(values) else values
    shares = percentage if isinstance(percentage, tuple) else (percentage,)
    columns = [_at(ordered, starts, counts, p) for p in shares]
    empty = counts == 0
    if not isinstance(percentage, tuple):
        return pa.array(columns[0], pa.float64(), mask=empty)
    flat = np.stack(columns, axis=1).reshape(-1) if columns else np.zeros(0)
    offsets = np.arange(n_rows + 1, dtype=np.int32) * len(shares)
    out = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.float64()))
    return pc.if_else(pa.array(empty), pa.scalar(None, out.type), out)


def _at(ordered: np.ndarray, starts: np.ndarray, counts: np.ndarray, p: float) -> np.ndarray:
    some = counts > 0
    position = np.where(some, (counts - 1) * p, 0.0)
    lower = np.floor(position).astype(np.int64)
    higher = np.ceil(position).astype(np.int64)
    if not len(ordered):
        return np.zeros(len(counts))
    low = ordered[np.where(some, starts + lower, 0)]
    high = ordered[np.where(some, starts + higher, 0)]
    with np.errstate(all="ignore"):
        between = (higher - position) * low + (position - lower) * high
    same = (lower == higher) | (low == high)
    return np.where(same, low, between)


def mode(lists: pa.Array) -> pa.Array:
    """Per row, its most frequent value; of equally frequent ones the smallest; null for a row
    without values."""
    n_rows = len(lists)
    values = lists.flatten()
    rows = pc.list_parent_indices(lists)
    valid = pc.is_valid(values)
    table = pa.table({"row": rows, "value": values}).filter(valid)
    counted = table.group_by(["row", "value"], use_threads=False).aggregate([("row", "count")])
    ranked = counted.sort_by(
        [("row", "ascending"), ("row_count", "descending"), ("value", "ascending")]
    )
    row_of = np.asarray(ranked.column("row"), np.int64)
    first = np.ones(len(row_of), np.bool_)
    first[1:] = row_of[1:] != row_of[:-1]
    winners = ranked.filter(pa.array(first))
    where = np.full(n_rows, -1, np.int64)
    where[np.asarray(winners.column("row"), np.int64)] = np.arange(winners.num_rows)
    picked = winners.column("value").combine_chunks().take(pa.array(where, mask=where < 0))
    return picked.cast(lists.type.value_type)
