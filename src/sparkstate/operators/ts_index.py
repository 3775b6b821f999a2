"""An ordered ``(timestamp, grouping key)`` index in a column family: timers, TTL, timeouts.

An entry's key is the order-preserving encoding of the timestamp (an int64 column) followed by
the encoded grouping key, so a range scan from the start of the family to ``threshold`` finds
exactly the entries due, in timestamp order, without touching the others.
Changes are buffered (``move``) and written in one batch (``flush``) so that the store sees a few
bulk calls per phase, never a call per key.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import pyarrow as pa

from sparkstate.store.base import StateStore
from sparkstate.store.codec import KeyCodec, ValueCodec

__all__ = ["MARKER", "MARKER_SCHEMA", "NO_TS", "TS_SCHEMA", "TimestampIndex", "index_key_schema"]

MARKER_SCHEMA = pa.schema([pa.field("_", pa.bool_())])
#: The value of every index entry (the key says everything), a valid row of ``MARKER_SCHEMA``.
MARKER = ValueCodec(MARKER_SCHEMA).encode((True,))
TS_SCHEMA = pa.schema([pa.field("ts_ms", pa.int64(), nullable=False)])
#: "No timestamp": never indexed.
NO_TS = -1
_TS_CODEC = KeyCodec(TS_SCHEMA)
_TS_WIDTH = len(_TS_CODEC.encode((0,)))
_INT64_MAX = (1 << 63) - 1


def index_key_schema(key_schema: pa.Schema, ts_name: str = "ts_ms") -> pa.Schema:
    """Key schema of an index over grouping keys of ``key_schema`` (the name is cosmetic: the
    encoding is the same for every index)."""
    return pa.schema([pa.field(ts_name, pa.int64(), nullable=False), *key_schema])


def encode_ts(ts: int) -> bytes:
    return _TS_CODEC.encode((ts,))


class TimestampIndex:
    """Buffered writes to, and range scans of, one ``(ts, key)`` index column family."""

    def __init__(self, cf_name: str) -> None:
        self.cf_name = cf_name
        self._puts: set[tuple[int, bytes]] = set()
        self._deletes: set[tuple[int, bytes]] = set()

    def move(self, kenc: bytes, old_ts: int, new_ts: int) -> None:
        """Re-index ``kenc`` from ``old_ts`` to ``new_ts`` (``NO_TS``: not indexed)."""
        if old_ts == new_ts:
            return
        if old_ts != NO_TS:
            self.remove(kenc, old_ts)
        if new_ts != NO_TS:
            self.add(kenc, new_ts)

    def add(self, kenc: bytes, ts: int) -> None:
        self._deletes.discard((ts, kenc))
        self._puts.add((ts, kenc))

    def remove(self, kenc: bytes, ts: int) -> None:
        self._puts.discard((ts, kenc))
        self._deletes.add((ts, kenc))

    def add_many(self, kencs: Iterable[bytes], ts: Iterable[int]) -> None:
        """``add`` of each ``(kenc, ts)`` pair."""
        entries = set(zip(ts, kencs, strict=True))
        self._deletes.difference_update(entries)
        self._puts.update(entries)

    def remove_many(self, kencs: Iterable[bytes], ts: Iterable[int]) -> None:
        """``remove`` of each ``(kenc, ts)`` pair."""
        entries = set(zip(ts, kencs, strict=True))
        self._puts.difference_update(entries)
        self._deletes.update(entries)

    @property
    def pending(self) -> int:
        return len(self._puts) + len(self._deletes)

    def flush(self, store: StateStore) -> None:
        """Write the buffered changes in two bulk calls."""
        if not self._puts and not self._deletes:
            return
        cf = self.cf_name
        if self._deletes:
            store.remove_encoded_many(_entry_keys(self._deletes), cf)
        if self._puts:
            keys = _entry_keys(self._puts)
            store.put_encoded_many(keys, [MARKER] * len(keys), cf)
        self._puts.clear()
        self._deletes.clear()

    def due(self, store: StateStore, up_to: int) -> list[tuple[int, bytes]]:
        """Entries with ``ts <= up_to`` as ``(ts, encoded key)``, in order (flush first)."""
        end = encode_ts(up_to + 1) if up_to < _INT64_MAX else None
        out: list[tuple[int, bytes]] = []
        for keys, _ in store.range_scan_encoded_chunks(None, end, self.cf_name):
            times = _TS_CODEC.decode_many_arrow([k[:_TS_WIDTH] for k in keys])
            ts = times.column(0).to_pylist()
            out += zip(ts, [k[_TS_WIDTH:] for k in keys], strict=True)
        return out

    def size(self, store: StateStore) -> int:
        """The number of entries (flush first): a scan of the family's keys."""
        return sum(len(keys) for keys, _ in store.range_scan_encoded_chunks(cf=self.cf_name))

    def earliest(self, store: StateStore) -> int | None:
        """The smallest indexed timestamp, or None if the index is empty (flush first)."""
        for k, _ in store.range_scan_encoded(cf=self.cf_name):
            ts: int = _TS_CODEC.decode(k[:_TS_WIDTH])[0]
            return ts
        return None

    def extend_removals(self, entries: Iterable[tuple[int, bytes]]) -> None:
        entries = set(entries)
        self._puts.difference_update(entries)
        self._deletes.update(entries)


def _entry_keys(entries: set[tuple[int, bytes]]) -> list[bytes]:
    """Encoded index keys of ``(ts, encoded key)`` entries, the timestamps encoded at once."""
    listed = list(entries)
    ts = pa.array(map(operator.itemgetter(0), listed), pa.int64(), size=len(listed))
    encoded = _TS_CODEC.encode_many(pa.table({"ts_ms": ts}, TS_SCHEMA))
    return list(map(operator.add, encoded, map(operator.itemgetter(1), listed)))
