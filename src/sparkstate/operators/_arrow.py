"""Arrow helpers shared by the operators: state lookups, writes and scans in whole batches."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.store.base import StateStore
from sparkstate.store.families import ColumnFamily

__all__ = [
    "conform",
    "decode_keys",
    "decode_values",
    "is_late",
    "lookup",
    "max_event_time_ms",
    "scan",
    "to_epoch_micros",
]

#: Rows per chunk when a whole family is scanned (complete mode, eviction).
SCAN_CHUNK = 65536


def decode_values(fam: ColumnFamily, raws: Sequence[bytes | None]) -> tuple[pa.Table, pa.Array]:
    """Decode stored values into a table of ``fam.value_schema`` (null rows where absent)."""
    table, found = fam.value_codec.decode_many_arrow(list(raws))
    mask = found if isinstance(found, pa.Array | pa.ChunkedArray) else pa.array(found, pa.bool_())
    return table, mask


def decode_keys(fam: ColumnFamily, raws: Sequence[bytes]) -> pa.Table:
    """Decode encoded keys (without the family prefix) into a table of ``fam.key_schema``."""
    codec: Any = fam.key_codec
    if hasattr(codec, "decode_many_arrow"):
        result = codec.decode_many_arrow(list(raws))
        table = result[0] if isinstance(result, tuple) else result
        return table
    rows = [codec.decode(r) for r in raws]
    names = fam.key_schema.names
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows], fam.key_schema)


def lookup(
    store: StateStore, fam: ColumnFamily, keys: pa.Table
) -> tuple[list[bytes], pa.Table, pa.Array]:
    """One multi-get for a batch of keys: (encoded keys, values table, found mask)."""
    kencs = fam.key_codec.encode_many(keys)
    values, found = decode_values(fam, store.get_encoded_many(kencs, fam.name))
    return kencs, values, found


def scan(
    store: StateStore,
    fam: ColumnFamily,
    chunk: int = SCAN_CHUNK,
    start: bytes | None = None,
    end: bytes | None = None,
) -> Iterator[tuple[list[bytes], pa.Table, pa.Table]]:
    """The family in key order (all of it, or the encoded keys ``start <= key < end``), in
    chunks of (encoded keys, keys table, values table)."""
    for kencs, raws in store.range_scan_encoded_chunks(start, end, fam.name, chunk):
        yield kencs, decode_keys(fam, kencs), decode_values(fam, raws)[0]


def conform(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Select and cast ``table``'s columns to ``schema`` (by name), as one record batch."""
    columns = []
    for field in schema:
        col = table.column(field.name)
        if col.type != field.type:
            col = col.cast(field.type)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def to_epoch_micros(col: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Timestamps (any unit, any zone) or dates as int64 microseconds since the epoch."""
    t = col.type
    if pa.types.is_timestamp(t):
        if t.unit != "us":
            col = col.cast(pa.timestamp("us", tz=t.tz))
        return col.cast(pa.int64())
    if pa.types.is_date(t):
        days = col.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
        return pc.multiply(days, 86_400_000_000)
    if pa.types.is_integer(t):
        return col.cast(pa.int64())
    msg = f"event-time column must be a timestamp or date, got {t}"
    raise TypeError(msg)


def is_late(col: pa.Array | pa.ChunkedArray, watermark_ms: int) -> pa.Array | pa.ChunkedArray:
    """Spark's late-row rule: ``event_time <= watermark`` (null event times are not late)."""
    late = pc.less_equal(to_epoch_micros(col), watermark_ms * 1000)
    return pc.fill_null(late, False)


@dataclasses.dataclass(frozen=True)
class EventTimeStats:
    """Spark's ``EventTimeStats`` of a column: its largest and earliest event times, their sum
    and count (for the average), in epoch milliseconds (each row's as :func:`max_event_time_ms`
    takes it; the sum a float, as Spark's average is)."""

    max_ms: int
    min_ms: int
    sum_ms: float
    count: int


def event_time_stats(col: pa.Array | pa.ChunkedArray) -> EventTimeStats | None:
    """The event-time statistics of a column's non-null values (None: there are none)."""
    if len(col) == 0:
        return None
    micros = to_epoch_micros(col)
    count = int(pc.count(micros).as_py() or 0)
    if count == 0:
        return None
    bounds = pc.min_max(micros).as_py()
    millis = pc.floor(pc.divide(micros.cast(pa.float64()), 1000.0))
    total = float(pc.sum(millis).as_py() or 0.0)
    return EventTimeStats(int(bounds["max"]) // 1000, int(bounds["min"]) // 1000, total, count)


def min_event_time_ms(col: pa.Array | pa.ChunkedArray) -> int | None:
    """Earliest event time of a column in epoch milliseconds (as :func:`max_event_time_ms`)."""
    if len(col) == 0:
        return None
    value = pc.min(to_epoch_micros(col)).as_py()
    return None if value is None else int(value) // 1000


def max_event_time_ms(col: pa.Array | pa.ChunkedArray) -> int | None:
    """Largest event time of a column in epoch milliseconds (Spark truncates micros to millis)."""
    if len(col) == 0:
        return None
    value = pc.max(to_epoch_micros(col)).as_py()
    return None if value is None else int(value) // 1000
