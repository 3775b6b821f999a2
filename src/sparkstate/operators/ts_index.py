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

from collections.abc import Iterable, Iterator
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


class _Writes:
    """A run of buffered writes of one kind (puts or deletes), with what the caller knows of
    whether their entries are stored (None: not known)."""

    __slots__ = ("kencs", "put", "stored", "ts")

    def __init__(self, put: bool, stored: bool | None, ts: list[int], kencs: list[bytes]) -> None:
        if len(ts) != len(kencs):
            msg = f"{len(kencs)} keys and {len(ts)} timestamps"
            raise ValueError(msg)
        self.put, self.stored, self.ts, self.kencs = put, stored, ts, kencs


class TimestampIndex:
    """Buffered writes to, and range scans of, one ``(ts, key)`` index column family; with
    ``count_cf``, its number of entries kept there.

    The writes are buffered as they come, a run of them per bulk call (the single calls of a
    kind share one), and resolved at the flush: each entry as the last write to it left it."""

    def __init__(self, cf_name: str, count_cf: str | None = None) -> None:
        self.cf_name = cf_name
        self.count_cf = count_cf
        self._writes: list[_Writes] = []
        #: The run the single calls append to (a bulk call's run is the caller's and stays so).
        self._open: _Writes | None = None

    def move(self, kenc: bytes, old_ts: int, new_ts: int) -> None:
        """Re-index ``kenc`` from ``old_ts`` to ``new_ts`` (``NO_TS``: not indexed)."""
        if old_ts == new_ts:
            return
        if old_ts != NO_TS:
            self.remove(kenc, old_ts)
        if new_ts != NO_TS:
            self.add(kenc, new_ts)

    def add(self, kenc: bytes, ts: int) -> None:
        self._one(True, kenc, ts)

    def remove(self, kenc: bytes, ts: int) -> None:
        self._one(False, kenc, ts)

    def _one(self, put: bool, kenc: bytes, ts: int) -> None:
        run = self._open
        if run is None or run.put is not put:
            run = self._open = _Writes(put, None, [], [])
            self._writes.append(run)
        run.ts.append(ts)
        run.kencs.append(kenc)

    def add_many(
        self, kencs: Iterable[bytes], ts: Iterable[int], *, stored: bool | None = None
    ) -> None:
        """``add`` of each ``(kenc, ts)`` pair. ``stored=False``: the caller knows these entries
        are not stored, apart from those removed before as stored (an entry put back); None:
        not known, read back at the flush where a count is kept."""
        self._many(True, kencs, ts, stored)

    def remove_many(
        self, kencs: Iterable[bytes], ts: Iterable[int], *, stored: bool | None = None
    ) -> None:
        """``remove`` of each ``(kenc, ts)`` pair. ``stored=True``: the caller knows these
        entries are stored (read from the state they index); None: not known."""
        self._many(False, kencs, ts, stored)

    def _many(
        self, put: bool, kencs: Iterable[bytes], ts: Iterable[int], stored: bool | None
    ) -> None:
        run = _Writes(put, stored, list(ts), list(kencs))
        if run.kencs:
            self._writes.append(run)
            self._open = None

    def flush(self, store: StateStore) -> None:
        """Write the buffered changes in a few bulk calls (entries known stored, known not
        stored, and not known), and the count of entries where it is kept (also with nothing
        buffered, if the version has no count yet)."""
        cf = self.cf_name
        deletes, puts = self._resolved()
        if self.count_cf is not None:
            self._count(store, deletes, puts)
        for stored, entries in deletes.items():
            if entries:
                store.remove_encoded_many(entries, cf, stored=stored)
        for stored, entries in puts.items():
            if entries:
                store.put_encoded_many(entries, [MARKER] * len(entries), cf, stored=stored)
        self._writes.clear()
        self._open = None

    def _resolved(self) -> tuple[dict[bool | None, list[bytes]], dict[bool | None, list[bytes]]]:
        """The index keys to delete and to put, each once, as the last write to its entry left
        it; by whether the entry is known to be stored (None: not known). What the callers
        said of an entry holds whatever the order: "stored" over "not stored" (an entry
        removed as stored and put back, a session written again at its old end, is stored)."""
        runs = self._writes
        if not runs:
            return {}, {}
        sizes = [len(run.kencs) for run in runs]
        if sum(sizes) < _IN_ARRAYS_FROM:
            return _resolved_one_by_one(runs)
        ts = np.asarray(list(chain.from_iterable(run.ts for run in runs)), np.int64)
        keys = _entry_keys(
            ts, pa.array(list(chain.from_iterable(run.kencs for run in runs)), pa.binary())
        )
        put = np.repeat([run.put for run in runs], sizes)
        said = np.repeat([_SAID[run.stored] for run in runs], sizes).astype(np.int8)
        if len(runs) > 1 and _repeats(ts, keys):
            # an entry written more than once: its last write, and the most said of it
            last = (
                pa.table({"k": keys, "i": np.arange(len(keys)), "s": said})
                .group_by("k", use_threads=False)
                .aggregate([("i", "max"), ("s", "max")])
            )
            keys, said = last.column("k"), np.asarray(last.column("s_max"), np.int8)
            put = put[np.asarray(last.column("i_max"))]
        out: tuple[dict[bool | None, list[bytes]], ...] = ({}, {})
        for p in (False, True):
            for stored, code in _SAID.items():
                mask = (put == p) & (said == code)
                if mask.any():
                    out[p][stored] = keys.filter(pa.array(mask)).to_pylist()
        return out[0], out[1]

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
        listed = list(entries)
        self.remove_many([k for _, k in listed], [ts for ts, _ in listed])


def _resolved_one_by_one(
    runs: list[_Writes],
) -> tuple[dict[bool | None, list[bytes]], dict[bool | None, list[bytes]]]:
    """``TimestampIndex._resolved`` of a few writes, entry by entry."""
    last: dict[bytes, bool] = {}
    said: dict[bytes, int] = {}
    for run in runs:
        code = _SAID[run.stored]
        for ts, kenc in zip(run.ts, run.kencs, strict=True):
            key = _TS_PREFIX + (ts + _SIGN_BIT).to_bytes(8, "big") + kenc
            last[key] = run.put
            if code > said.get(key, 0):
                said[key] = code
    out: tuple[dict[bool | None, list[bytes]], ...] = ({}, {})
    for key, put in last.items():
        out[put].setdefault(_STORED[said.get(key, 0)], []).append(key)
    return out[0], out[1]


def _repeats(ts: np.ndarray, keys: pa.Array) -> bool:
    """Whether an entry (of timestamps ``ts`` and index keys ``keys``) is written more than
    once. Only entries of one timestamp can be the same: their keys alone are compared."""
    order = np.argsort(ts)
    sorted_ts = ts[order]
    tied = np.flatnonzero(sorted_ts[1:] == sorted_ts[:-1])
    if not len(tied):
        return False
    in_tie = np.zeros(len(ts), bool)
    in_tie[tied] = in_tie[tied + 1] = True
    some = keys.take(pa.array(order[in_tie])).to_pylist()
    return len(set(some)) < len(some)


def _entry_keys(ts: np.ndarray, kencs: pa.Array) -> pa.Array:
    """Encoded index keys of the entries ``zip(ts, kencs)`` (int64, binary), as one array."""
    n = len(ts)
    stamps = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(_TS_WIDTH), n, [None, pa.py_buffer(_ts_rows(ts))]
    )
    return pc.binary_join_element_wise(stamps.cast(pa.binary()), kencs, b"")


#: A timestamp's encoding (``_TS_CODEC``'s): a byte that says it is not null, then the int64
#: with its sign bit flipped, big-endian, so that the bytes sort as the numbers do.
_NOT_NULL, _SIGN = 1, np.uint64(1 << 63)
#: The same, one timestamp at a time: the first byte, and what flips the sign bit (an int64
#: plus 2^63 is its bits, the sign flipped, as an unsigned number).
_TS_PREFIX, _SIGN_BIT = bytes([_NOT_NULL]), 1 << 63
#: What a caller said of entries (``stored``), as codes ordered as they prevail, and back.
_SAID: dict[bool | None, int] = {None: 0, False: 1, True: 2}
_STORED: dict[int, bool | None] = {code: said for said, code in _SAID.items()}
#: Writes resolved in arrays from this many on (one by one below: a few writes, a few calls).
_IN_ARRAYS_FROM = 2048


def encode_ts_many(ts: np.ndarray) -> list[bytes]:
    """:func:`encode_ts` of each of ``ts`` (int64), in numpy."""
    blob = _ts_rows(ts).tobytes()
    return [blob[i : i + _TS_WIDTH] for i in range(0, len(ts) * _TS_WIDTH, _TS_WIDTH)]


def _ts_rows(ts: np.ndarray) -> np.ndarray:
    """The encodings of ``ts`` (int64) as the rows of a byte matrix."""
    n = len(ts)
    rows = np.empty((n, _TS_WIDTH), np.uint8)
    rows[:, 0] = _NOT_NULL
    rows[:, 1:] = (ts.view(np.uint64) ^ _SIGN).astype(">u8").view(np.uint8).reshape(n, 8)
    return rows


def decode_ts_many(keys: list[bytes]) -> np.ndarray:
    """The timestamps that index keys ``keys`` begin with (none null), in numpy."""
    raw = np.frombuffer(b"".join([k[1:_TS_WIDTH] for k in keys]), ">u8").astype(np.uint64)
    ts: np.ndarray = (raw ^ _SIGN).view(np.int64)
    return ts
