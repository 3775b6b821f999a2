"""List columns of values, a whole Arrow column at a time: each list's bytes as
:class:`sparkstate.store.codec._columns.ListLayout` lays out one, built with numpy and Arrow
compute (element bytes, then one join per list) instead of a Python loop over the elements.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store.codec._arrow import LB, LB_EMPTY, fsb_to_large_binary, le_bytes, validity
from sparkstate.store.codec._columns import Column

__all__ = ["element_bytes", "joined", "list_payloads"]


def element_bytes(el: Column, values: pa.Array) -> pa.Array:
    """One large_binary per element: its fixed-width bytes, or its length and bytes."""
    valid = validity(values)
    if el.phys != "var":
        m = le_bytes(values, el).copy()
        if valid is not None:
            m[~valid] = 0
        return fsb_to_large_binary(m)
    lengths = np.asarray(pc.binary_length(values).fill_null(0), dtype=np.int64)
    if len(lengths) and lengths.max() >= 1 << 32:
        msg = f"list element of {el.type} has a value of 4 GiB or more"
        raise SchemaMismatchError(msg)
    prefix = fsb_to_large_binary(lengths.astype("<u4").view(np.uint8).reshape(-1, 4))
    data = values.cast(LB)
    if values.null_count:
        data = data.fill_null(LB_EMPTY)
    return pc.binary_join_element_wise(prefix, data, LB_EMPTY)


def joined(offsets: np.ndarray, pieces: pa.Array) -> pa.Array:
    """Per list, the concatenation of its pieces (``offsets`` into ``pieces``)."""
    lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pieces)
    return pc.binary_join(lists, LB_EMPTY)


def list_payloads(col: Column, arr: pa.Array) -> pa.Array:
    """The bytes of every list of ``arr`` (a list column of ``col``'s type) as large_binary; a
    null list gives empty bytes (the value's null bitmap says it is null)."""
    el = col.element
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    values = arr.values.slice(start, end - start)
    offsets = offsets - start
    counts = np.diff(offsets)
    n = len(arr)
    body = joined(offsets, element_bytes(el, values))
    header = np.zeros((n, 2), "<u4")
    header[:, 0] = counts
    valid = validity(values)
    if valid is None:
        payload = pc.binary_join_element_wise(
            fsb_to_large_binary(header.view(np.uint8)), body, LB_EMPTY
        )
    else:
        if not el.nullable:
            msg = f"column {col.name!r} ({col.type}) does not take null elements"
            raise SchemaMismatchError(msg)
        at = np.flatnonzero(~valid)
        row = np.searchsorted(offsets, at, side="right") - 1
        header[:, 1] = np.bincount(row, minlength=n)
        positions = (at - offsets[row]).astype("<u4").view(np.uint8).reshape(-1, 4)
        null_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(header[:, 1], out=null_offsets[1:])
        nulls = joined(null_offsets, fsb_to_large_binary(positions))
        payload = pc.binary_join_element_wise(
            fsb_to_large_binary(header.view(np.uint8)), nulls, body, LB_EMPTY
        )
    if arr.null_count:
        payload = pc.if_else(arr.is_valid(), payload, LB_EMPTY)
    return payload
