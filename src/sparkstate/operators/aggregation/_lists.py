"""List columns as the collecting aggregates merge them: per row, one list after another, and a
list without repeats (compared as Spark's hash set compares values)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["concat_lists", "distinct_lists", "no_null_lists"]


def no_null_lists(lists: pa.Array) -> pa.Array:
    """Null lists as empty ones (so that no null list hides elements behind it)."""
    if not lists.null_count:
        return lists
    return pc.if_else(lists.is_valid(), lists, pa.scalar([], lists.type))


def _lists_of(rows: npt.NDArray[np.int64], values: pa.Array, n: int, typ: pa.DataType) -> pa.Array:
    """A list column of ``n`` rows whose elements are ``values``, element i in row ``rows[i]``
    (rows ascending)."""
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=typ)


def concat_lists(state: pa.Array, batch: pa.Array) -> pa.Array:
    """Per row, the state's list then the batch's (a null list is empty)."""
    n = len(state)
    state, batch = no_null_lists(state), no_null_lists(batch.cast(state.type))
    rows = np.concatenate(
        [
            np.asarray(pc.list_parent_indices(state), np.int64),
            np.asarray(pc.list_parent_indices(batch), np.int64),
        ]
    )
    order = np.argsort(rows, kind="stable")  # the state's elements first, each side in order
    values = pa.concat_arrays([state.flatten(), batch.flatten()])
    return _lists_of(rows[order], values.take(pa.array(order)), n, state.type)


def _set_key(values: pa.Array) -> pa.Array:
    """Values as Spark's hash set compares them: every NaN one value, ``-0.0`` as ``0.0``."""
    if not pa.types.is_floating(values.type):
        return values
    zero = pa.scalar(0.0, values.type)
    nan = pa.scalar(float("nan"), values.type)
    return pc.if_else(pc.is_nan(values), nan, pc.add(values, zero))


def distinct_lists(lists: pa.Array) -> pa.Array:
    """Each list without repeats, keeping first occurrences in order."""
    values = lists.flatten()
    rows = np.asarray(pc.list_parent_indices(lists), np.int64)
    table = pa.table(
        {"row": rows, "key": _set_key(values), "at": np.arange(len(values), dtype=np.int64)}
    )
    first = table.group_by(["row", "key"], use_threads=False).aggregate([("at", "min")])
    keep = np.sort(np.asarray(first.column("at_min"), np.int64))
    return _lists_of(rows[keep], values.take(pa.array(keep)), len(lists), lists.type)
