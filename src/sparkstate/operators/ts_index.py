"""An ordered ``(timestamp, grouping key)`` index in a column family: timers, TTL, timeouts.

An entry's key is the order-preserving encoding of the timestamp (an int64 column) followed by
the encoded grouping key, so a range scan from the start of the family to ``threshold`` finds
exactly the entries due, in timestamp order, without touching the others.
Changes are buffered (``move``) and written in one batch (``flush``) so that the store sees a few
bulk calls per phase, never a call per key.

An index given a count family keeps its number of entries there (one row, keyed by the index's
family name), changed at each flush by the entries its writes add and remove, so the entries are
known without a scan. A caller that knows whether entries are stored says so (``stored`` of
``add_many`` / ``remove_many``: a session's old end was read from state, a new session's end is
not indexed yet); the others are read back in one multi-get. A version without the row (written
before the count was kept, or by a rescale, which does not move the count) is counted once by
a scan.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

from sparkstate.store.base import StateStore
from sparkstate.store.codec import KeyCodec, ValueCodec

__all__ = [
    "COUNT_KEY_SCHEMA",
    "COUNT_SCHEMA",
    "MARKER",
    "MARKER_SCHEMA",
    "NO_TS",
    "TS_SCHEMA",
    "TimestampIndex",
    "index_entries",
    "index_key_schema",
]

MARKER_SCHEMA = pa.schema([pa.field("_", pa.bool_())])
#: The value of every index entry (the key says everything), a valid row of ``MARKER_SCHEMA``.
MARKER = ValueCodec(MARKER_SCHEMA).encode((True,))
TS_SCHEMA = pa.schema([pa.field("ts_ms", pa.int64(), nullable=False)])
#: "No timestamp": never indexed.
NO_TS = -1
_TS_CODEC = KeyCodec(TS_SCHEMA)
_TS_WIDTH = len(_TS_CODEC.encode((0,)))
_INT64_MAX = (1 << 63) - 1
#: A count family's key (the counted index's family name) and value (its entries).
COUNT_KEY_SCHEMA = pa.schema([pa.field("index", pa.string(), nullable=False)])
COUNT_SCHEMA = pa.schema([pa.field("entries", pa.int64(), nullable=False)])


def index_key_schema(key_schema: pa.Schema, ts_name: str = "ts_ms") -> pa.Schema:
    """Key schema of an index over grouping keys of ``key_schema`` (the name is cosmetic: the
    encoding is the same for every index)."""
    return pa.schema([pa.field(ts_name, pa.int64(), nullable=False), *key_schema])


def index_entries(times: pa.Array, keys: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The entries of an index of ``keys`` (a table of grouping keys) by ``times`` (int64, one
    per key; null: not indexed), each once: as tables of the index's key schema and of
    :data:`MARKER_SCHEMA`."""
    present = times.is_valid()
    stamped = pa.table(
        [times.filter(present), *(c.filter(present) for c in keys.columns)],
        schema=index_key_schema(keys.schema),
    )
    unique = stamped.group_by(stamped.column_names, use_threads=False).aggregate([])
    unique = unique.select(stamped.column_names).cast(stamped.schema)
    return unique, pa.table({"_": pa.repeat(True, unique.num_rows)}, schema=MARKER_SCHEMA)


def encode_ts(ts: int) -> bytes:
    return _TS_CODEC.encode((ts,))


class TimestampIndex:
    """Buffered writes to, and range scans of, one ``(ts, key)`` index column family; with
    ``count_cf``, its number of entries kept there."""

    def __init__(self, cf_name: str, count_cf: str | None = None) -> None:
        self.cf_name = cf_name
        self.count_cf = count_cf
        self._puts: set[tuple[int, bytes]] = set()
        self._deletes: set[tuple[int, bytes]] = set()
        #: Entries known to be stored, or not, as the store stands until the flush.
        self._stored: set[tuple[int, bytes]] = set()
        self._absent: set[tuple[int, bytes]] = set()

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

    def add_many(
        self, kencs: Iterable[bytes], ts: Iterable[int], *, stored: bool | None = None
    ) -> None:
        """``add`` of each ``(kenc, ts)`` pair. ``stored=False``: the caller knows these entries
        are not stored, apart from those removed before as stored (an entry put back); None:
        not known, read back at the flush where a count is kept."""
        entries = set(zip(ts, kencs, strict=True))
        self._deletes.difference_update(entries)
        self._puts.update(entries)
        if stored is not None:
            self._known(entries, stored)

    def remove_many(
        self, kencs: Iterable[bytes], ts: Iterable[int], *, stored: bool | None = None
    ) -> None:
        """``remove`` of each ``(kenc, ts)`` pair. ``stored=True``: the caller knows these
        entries are stored (read from the state they index); None: not known."""
        entries = set(zip(ts, kencs, strict=True))
        self._puts.difference_update(entries)
        self._deletes.update(entries)
        if stored is not None:
            self._known(entries, stored)

    def _known(self, entries: set[tuple[int, bytes]], stored: bool) -> None:
        """Note what the caller knows of ``entries``. A "not stored" does not undo an earlier
        "stored": an entry removed as stored and put back (a session written again at its old
        end) is stored."""
        if stored:
            self._absent.difference_update(entries)
            self._stored.update(entries)
        else:
            self._absent.update(entries.difference(self._stored) if self._stored else entries)

    @property
    def pending(self) -> int:
        return len(self._puts) + len(self._deletes)

    def flush(self, store: StateStore) -> None:
        """Write the buffered changes in a few bulk calls (entries known stored, known not
        stored, and not known), and the count of entries where it is kept (also with nothing
        buffered, if the version has no count yet)."""
        cf = self.cf_name
        deletes = self._by_knowledge(self._deletes)
        puts = self._by_knowledge(self._puts)
        if self.count_cf is not None:
            self._count(store, deletes, puts)
        for stored, entries in deletes.items():
            if entries:
                store.remove_encoded_many(entries, cf, stored=stored)
        for stored, entries in puts.items():
            if entries:
                store.put_encoded_many(entries, [MARKER] * len(entries), cf, stored=stored)
        self._puts.clear()
        self._deletes.clear()
        self._stored.clear()
        self._absent.clear()

    def _by_knowledge(self, entries: set[tuple[int, bytes]]) -> dict[bool | None, list[bytes]]:
        """The encoded keys of ``entries``, by whether they are known to be stored (None: not
        known)."""
        if not entries:
            return {}
        if not self._stored and not self._absent:
            return {None: _entry_keys(entries)}
        stored, absent = entries & self._stored, entries & self._absent
        unknown = entries - stored - absent if len(stored) + len(absent) < len(entries) else set()
        return {k: _entry_keys(e) for k, e in ((True, stored), (False, absent), (None, unknown))}

    def _count(
        self,
        store: StateStore,
        deletes: dict[bool | None, list[bytes]],
        puts: dict[bool | None, list[bytes]],
    ) -> None:
        """Write the entries there will be once ``deletes`` and ``puts`` are written: those
        of the deletes that are stored go, those of the puts that are not come (read back
        where not known)."""
        assert self.count_cf is not None
        counted = store.get((self.cf_name,), self.count_cf)
        written = any(deletes.values()) or any(puts.values())
        if counted is None:
            entries = self._scanned(store)
            if not entries and not written:
                return  # no index: no count either (nothing to subtract from the rows)
        else:
            entries = int(counted[0])
            if not written:
                return
        gone, come = len(deletes.get(True, ())), len(puts.get(False, ()))
        unknown_deletes, unknown_puts = deletes.get(None, []), puts.get(None, [])
        if unknown_deletes or unknown_puts:
            found = store.get_encoded_many(unknown_deletes + unknown_puts, self.cf_name)
            gone += len(unknown_deletes) - found[: len(unknown_deletes)].count(None)
            come += found[len(unknown_deletes) :].count(None)
        store.put((self.cf_name,), (entries - gone + come,), self.count_cf)

    def due(self, store: StateStore, up_to: int) -> list[tuple[int, bytes]]:
        """Entries with ``ts <= up_to`` as ``(ts, encoded key)``, in order (flush first)."""
        out: list[tuple[int, bytes]] = []
        for keys in self._due_chunks(store, up_to):
            ts = decode_ts_many(keys).tolist()
            out += zip(ts, [k[_TS_WIDTH:] for k in keys], strict=True)
        return out

    def due_keys(self, store: StateStore, up_to: int) -> list[bytes]:
        """The encoded keys of the entries with ``ts <= up_to``, in order (flush first):
        :meth:`due` without the timestamps."""
        out: list[bytes] = []
        for keys in self._due_chunks(store, up_to):
            out += [k[_TS_WIDTH:] for k in keys]
        return out

    def _due_chunks(self, store: StateStore, up_to: int) -> Iterator[list[bytes]]:
        """The index keys with ``ts <= up_to``, a chunk at a time, from past the removals
        before."""
        end = encode_ts(up_to + 1) if up_to < _INT64_MAX else None
        start = store.scan_start(None, self.cf_name)
        for keys, _ in store.range_scan_encoded_chunks(start, end, self.cf_name):
            yield keys

    def removed_due(self, store: StateStore, up_to: int) -> None:
        """Say that every entry with ``ts <= up_to`` was removed (flushed): the next versions'
        :meth:`due` start past them."""
        if up_to < _INT64_MAX:
            store.mark_removed(None, encode_ts(up_to + 1), self.cf_name)

    def remove_due(self, store: StateStore, up_to: int) -> None:
        """Remove every entry with ``ts <= up_to`` (flush first) as one range deletion, and
        count them off: the store records one range, not a delete per entry, and the next
        versions' :meth:`due` start past it."""
        if up_to >= _INT64_MAX:
            self.extend_removals(self.due(store, up_to))
            self.flush(store)
            return
        removed = store.remove_range(None, encode_ts(up_to + 1), self.cf_name)
        if self.count_cf is None or not removed:
            return
        counted = store.get((self.cf_name,), self.count_cf)
        if counted is None:  # no count kept yet: the entries left, counted once
            store.put((self.cf_name,), (self._scanned(store),), self.count_cf)
        else:
            store.put((self.cf_name,), (int(counted[0]) - removed,), self.count_cf)

    def size(self, store: StateStore) -> int:
        """The number of entries (flush first): the count where one is kept, else a scan."""
        return self.stored_keys(store)[0]

    def stored_keys(self, store: StateStore) -> tuple[int, int]:
        """The index's entries and its count rows (0 or 1) in the store (flush first)."""
        if self.count_cf is not None and store.has_column_family(self.count_cf):
            counted = store.get((self.cf_name,), self.count_cf)
            if counted is not None:
                return int(counted[0]), 1
        return self._scanned(store), 0

    def _scanned(self, store: StateStore) -> int:
        return sum(len(keys) for keys, _ in store.range_scan_encoded_chunks(cf=self.cf_name))

    def earliest(self, store: StateStore) -> int | None:
        """The smallest indexed timestamp, or None if the index is empty (flush first)."""
        for k, _ in store.range_scan_encoded(cf=self.cf_name):
            ts: int = _TS_CODEC.decode(k[:_TS_WIDTH])[0]
            return ts
        return None

    def extend_removals(self, entries: Iterable[tuple[int, bytes]]) -> None:
        """Remove ``entries`` (as :meth:`due` gives them)."""
        entries = set(entries)
        self._puts.difference_update(entries)
        self._deletes.update(entries)


def _entry_keys(entries: set[tuple[int, bytes]]) -> list[bytes]:
    """Encoded index keys of ``(ts, encoded key)`` entries, the timestamps encoded at once."""
    listed = list(entries)
    stamps = encode_ts_many(np.fromiter(map(operator.itemgetter(0), listed), np.int64, len(listed)))
    return list(map(operator.add, stamps, map(operator.itemgetter(1), listed)))


#: A timestamp's encoding (``_TS_CODEC``'s): a byte that says it is not null, then the int64
#: with its sign bit flipped, big-endian, so that the bytes sort as the numbers do.
_NOT_NULL, _SIGN = 1, np.uint64(1 << 63)


def encode_ts_many(ts: np.ndarray) -> list[bytes]:
    """:func:`encode_ts` of each of ``ts`` (int64), in numpy."""
    n = len(ts)
    rows = np.empty((n, _TS_WIDTH), np.uint8)
    rows[:, 0] = _NOT_NULL
    rows[:, 1:] = (ts.view(np.uint64) ^ _SIGN).astype(">u8").view(np.uint8).reshape(n, 8)
    blob = rows.tobytes()
    return [blob[i : i + _TS_WIDTH] for i in range(0, n * _TS_WIDTH, _TS_WIDTH)]


def decode_ts_many(keys: list[bytes]) -> np.ndarray:
    """The timestamps that index keys ``keys`` begin with (none null), in numpy."""
    raw = np.frombuffer(b"".join([k[1:_TS_WIDTH] for k in keys]), ">u8").astype(np.uint64)
    ts: np.ndarray = (raw ^ _SIGN).view(np.int64)
    return ts
