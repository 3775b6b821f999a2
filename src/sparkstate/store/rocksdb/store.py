"""One version of the ``rocksdb`` provider: the local database plus an overlay of its writes.

Reads see the overlay first, then the copy of a small state in memory (:mod:`.value_copy`) or
the database (a multi-get of only the keys that can be stored, see
:meth:`RocksDBStateStore._fetch`). The row count is kept without extra reads where
the keys written were read before. A key range removed (``remove_range``) is kept as the range
and the stored keys it covers, which reads and scans pass over. Commit writes the version's
changelog through the provider, then applies the ranges (as RocksDB range deletions), the
overlay and the version marker to RocksDB in one WriteBatch; abort drops the overlay, so it
costs nothing and needs no reload.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from sparkstate.store.base import StateStore, StoreStatus
from sparkstate.store.conf import StoreConf, StoreId
from sparkstate.store.families import ColumnFamily, family_of
from sparkstate.store.rocksdb.local import LocalDB, key_order
from sparkstate.store.rocksdb.value_copy import ValueCopy
from sparkstate.store.spark_metrics import (
    VersionPhases,
    rocksdb_file_metrics,
    rocksdb_statistics_metrics,
)
from sparkstate.store.versions.layout import VersionRef, new_checkpoint_id


class StoreHost(Protocol):
    """What a store asks of the provider that opened it
    (:class:`~sparkstate.store.rocksdb.provider.RocksDBStateStoreProvider`): its settings, and
    the work around a commit that outlives the store (the copy in memory, the snapshots, the
    changelog, the counters)."""

    id: StoreId
    conf: StoreConf
    families: dict[str, ColumnFamily]
    corrupt_snapshots_skipped: int

    def applied(
        self,
        ref: VersionRef,
        keys: list[bytes],
        values: list[bytes | None],
        num_keys: int,
        removed: set[bytes] | None = None,
    ) -> None: ...
    def drop_copy(self) -> None: ...
    def keep_gaps(self, ref: VersionRef, gaps: dict[str, dict[bytes, bytes]]) -> None: ...
    def after_commit(self, store: RocksDBStateStore, ref: VersionRef) -> None: ...
    def end_use(self, *, close: bool = False) -> None: ...
    def write_changelog(
        self,
        ref: VersionRef,
        parent: VersionRef | None,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        extra: dict[str, Any] | None = None,
        *,
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> int: ...
    def memory_used_bytes(self, db: LocalDB) -> int: ...
    def counters_since_report(self, *, take: bool) -> dict[str, float]: ...
    def snapshot_metrics(self) -> dict[str, float]: ...


__all__ = ["STAT_NAMES", "RocksDBStateStore"]

_MISSING = object()
_NONES = itertools.repeat(None)
#: LocalDB.memory_stats() keys -> custom metric names.
STAT_NAMES = {
    "memtable_bytes": "memtableBytes",
    "table_readers_bytes": "tableReadersBytes",
    "total_sst_bytes": "sstBytes",
    "live_sst_bytes": "liveSstBytes",
    "process_block_cache_bytes": "blockCacheBytes",
    "process_block_cache_pinned_bytes": "blockCachePinnedBytes",
    "process_write_buffer_bytes": "writeBufferBytes",
}


def _in_key_order(writes: dict[bytes, bytes | None]) -> tuple[list[bytes], list[bytes | None]]:
    """The keys and values of ``writes`` in ascending key order."""
    keys, values = list(writes), list(writes.values())
    if len(keys) < 2:
        return keys, values
    order = key_order(keys)
    return np.array(keys, object)[order].tolist(), np.array(values, object)[order].tolist()


class RocksDBStateStore(StateStore):
    """One version over the local database plus an overlay of this version's writes."""

    def __init__(
        self,
        provider: StoreHost,
        base: VersionRef | None,
        version: int,
        db: LocalDB,
        num_keys: int,
        *,
        read_only: bool,
        copy: ValueCopy | None = None,
    ) -> None:
        super().__init__(provider.id, version, provider.families, read_only=read_only)
        self._provider = provider
        self._base = base
        self._db = db
        #: Every pair of the database in memory, where the provider holds them (read instead).
        self._copy = copy
        self._pending: dict[bytes, bytes | None] = {}
        #: The lowest and highest key of each family written in this version (a bound: keys
        #: a range deletion dropped from the overlay stay in it), so that a scan of a range no
        #: write reaches skips a pass over every write; None: a write of keys of no one family.
        self._written: dict[bytes, tuple[bytes, bytes]] | None = {}
        #: Whether keys read from the database existed there, to count rows without extra reads
        #: (also keys a writer said it knew, and, as gone, those of a range this version removed).
        self._existed: dict[bytes, bool] = {}
        #: Count rows (Spark's ``trackTotalNumberOfRows``): off, a write needs no read of its key
        #: and the row count is reported as -1.
        self._track = provider.conf.track_total_rows
        if self._track and num_keys < 0:  # written untracked: counted once, here
            num_keys = db.count_keys()
        self._base_keys = num_keys if self._track else -1
        self._num_keys = self._base_keys
        #: The key count of the overlay as it stands (None: a write since it was counted).
        self._counted: int | None = None
        #: The overlay's keys and values in key order, as of its last count.
        self._in_order: tuple[list[bytes], list[bytes | None]] = ([], [])
        self._final: dict[str, float] = {}
        self._memory_used: int | None = None
        #: What this version's load and commit did, and the database's statistics as loaded.
        self.phases = VersionPhases()
        self._statistics = db.statistics()
        #: Per column family prefix, its largest key in the database (see ``_family_tops``).
        self._tops: dict[bytes, bytes] | None = None
        #: The key ranges this version removed (``remove_range``), in order, applied before the
        #: overlay at the commit, and the stored keys they cover, which reads pass over. A key
        #: of the overlay in a range was written after the range's removal.
        self._ranges: list[tuple[bytes, bytes]] = []
        self._ranged: set[bytes] = set()

    @property
    def base_ref(self) -> VersionRef | None:
        """The committed version this one was opened at (None: the empty state)."""
        return self._base

    def raw_get(self, key: bytes) -> bytes | None:
        value = self._pending.get(key, _MISSING)
        if value is not _MISSING:
            return value  # type: ignore[return-value]
        if key in self._ranged:
            return None
        got = self._fetch([key])[0]
        if self._track:
            self._existed[key] = got is not None
        return got

    def _fetch(self, keys: list[bytes], *, in_key_order: bool = False) -> list[bytes | None]:
        """A multi-get from the database, of the keys that can be there: a key above the largest
        stored key of its column family cannot, and keys that grow with event time (a window's
        end first, an index by time) are mostly such keys, where lookups of absent keys would be
        most of a batch's read time. ``in_key_order``: the keys ascend (see ``_fetch_ascending``).
        """
        copy = self._copy
        if copy is not None and copy.live:  # complete: a key not in it is not stored
            return list(map(copy.values.get, keys))
        if in_key_order:
            return self._fetch_ascending(keys)
        tops = self._family_tops()
        if len(tops) == 1:
            (top,) = tops.values()
            end = next(iter(self._families.values())).end_of_family()
            probe = [k for k in keys if k <= top or k >= end]  # (or of no family)
        elif keys and family_of(min(keys)) == family_of(max(keys)):
            # One family's keys (a family's keys are one range of bytes): one top for all.
            family_top = tops.get(family_of(keys[0]))
            probe = keys if family_top is None else [k for k in keys if k <= family_top]
        else:
            probe = [k for k in keys if k <= tops.get(family_of(k), k)]
        if len(probe) == len(keys):
            return self._db.multi_get(keys)
        found = dict(zip(probe, self._db.multi_get(probe), strict=True))
        return list(map(found.get, keys))

    def _fetch_ascending(self, keys: list[bytes]) -> list[bytes | None]:
        """``_fetch`` of ascending keys: a family's keys above its largest stored key are one
        slice of them, found by bisection rather than by a comparison per key."""
        tops = self._family_tops()
        reads, pos = [], 0  # index ranges of the keys that can be stored
        for fam in sorted(self._families.values(), key=operator.attrgetter("prefix")):
            top = tops.get(fam.prefix)
            if top is not None:  # (None: a family registered since the tops were read)
                above = bisect.bisect_right(keys, top, pos)
                reads.append((pos, above))
                pos = bisect.bisect_left(keys, fam.end_of_family(), above)
        reads.append((pos, len(keys)))
        probe = list(itertools.chain.from_iterable(keys[a:b] for a, b in reads))
        found = self._db.multi_get(probe, in_key_order=True)
        if len(found) == len(keys):
            return found
        out: list[bytes | None] = [None] * len(keys)
        done = 0
        for a, b in reads:
            out[a:b] = found[done : done + b - a]
            done += b - a
        return out

    def _family_tops(self) -> dict[bytes, bytes]:
        """Each family's largest stored key (its prefix, which is no key, for an empty family),
        read at the first lookup: the database does not change until the commit."""
        if self._tops is None:
            self._tops = {
                f.prefix: self._db.last_key(f.prefix, f.end_of_family()) or f.prefix
                for f in self._families.values()
            }
        return self._tops

    def raw_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        pending, ranged = self._pending, self._ranged
        if ranged:
            misses = [k for k in keys if k not in pending and k not in ranged]
        else:
            misses = [k for k in keys if k not in pending] if pending else list(keys)
        fetched = self._fetch(misses)
        if self._track and not self._read_only:
            self._existed.update(zip(misses, map(operator.is_not, fetched, _NONES), strict=True))
        if len(misses) == len(keys):  # no key written or removed in this version
            return fetched
        found = dict(zip(misses, fetched, strict=True))
        return [pending[k] if k in pending else found.get(k) for k in keys]

    def raw_put(self, key: bytes, value: bytes) -> None:
        self._counted = None
        self._pending[key] = value
        self._widen(family_of(key), key, key)

    def raw_put_many(
        self, keys: Sequence[bytes], values: Sequence[bytes], *, family: bytes | None = None
    ) -> None:
        self._counted = None
        self._pending.update(zip(keys, values, strict=True))
        self._wrote(keys, family)

    def raw_delete(self, key: bytes) -> None:
        self._counted = None
        self._pending[key] = None
        self._widen(family_of(key), key, key)

    def raw_delete_many(self, keys: Sequence[bytes], *, family: bytes | None = None) -> None:
        self._counted = None
        self._pending.update(dict.fromkeys(keys))
        self._wrote(keys, family)

    def _wrote(self, keys: Sequence[bytes], family: bytes | None) -> None:
        if not keys:
            return
        if family is None:
            self._written = None  # (keys of any family: every scan passes over the writes)
        else:
            self._widen(family, min(keys), max(keys))

    def _widen(self, family: bytes, low: bytes, high: bytes) -> None:
        written = self._written
        if written is None:
            return
        was = written.get(family)
        written[family] = (low, high) if was is None else (min(was[0], low), max(was[1], high))

    def _written_in(self, start: bytes, end: bytes) -> bool:
        """Whether a write of this version is in ``[start, end)``: first by the written
        families' bounds, then, where one meets the range, by the writes themselves."""
        written = self._written
        if written is not None and not any(
            low < end and start <= high for low, high in written.values()
        ):
            return False
        return any(start <= k < end for k in self._pending)

    def raw_note_stored(self, keys: Sequence[bytes], stored: bool) -> None:
        """Whether keys not written yet in this version are stored is whether the database
        has them: noted as if read, so the row count does not read them."""
        if not self._track or self._read_only:
            return
        pending = self._pending
        if pending and not pending.keys().isdisjoint(keys):
            keys = [k for k in keys if k not in pending]
        self._existed.update(dict.fromkeys(keys, stored))

    def raw_delete_range(self, start: bytes, end: bytes, first: bytes) -> int:
        """Keep the range, drop the overlay's writes in it, and note the stored keys it covers
        (one scan of keys, from ``first``): for reads, the row count and the copy in memory."""
        self._counted = None
        pending = self._pending
        inside = [k for k in pending if start <= k < end] if self._written_in(start, end) else []
        if any(k < first for k in inside):  # deletes of stored keys the empty range counts
            first = start
        stored = [k for k in self._db.keys_in(first, end) if k not in self._ranged]
        removed = len(stored)
        if inside:
            was_stored = set(stored)
            for k in inside:
                written = pending.pop(k) is not None
                if written != (k in was_stored):  # a put of a new key, a delete of a stored one
                    removed += 1 if written else -1
        self._ranges.append((start, end))
        self._ranged.update(stored)
        if self._track and not self._read_only:  # counted as removed here, not as written
            self._existed.update(dict.fromkeys(stored, False))
        return removed

    def raw_scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        for k, v in self._merged(start, end):
            if v is not None:
                yield k, v

    def raw_scan_suffixes(
        self, start: bytes, end: bytes, skip: int
    ) -> Iterator[tuple[bytes, bytes]]:
        for k, v in self._merged(start, end):
            if v is not None:
                yield k[skip:], v

    def raw_scan_chunks(
        self, start: bytes, end: bytes, skip: int, chunk: int
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        if self._written_in(start, end) or self._removed_in(start, end):
            yield from super().raw_scan_chunks(start, end, skip, chunk)
            return
        # No write of this version in the range: the database's rows, a chunk per step.
        existed = self._existed if self._track and not self._read_only else None
        for ks, vs in self._db.scan_chunks(start, end, chunk):
            if existed is not None:  # known to exist: no read to count them at the commit
                existed.update(dict.fromkeys(ks, True))
            yield ([k[skip:] for k in ks] if skip else ks), vs

    def _merged(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes | None]]:
        """Stored pairs and pending writes (None: a delete) with ``start <= key < end``, in
        key order, a pending write in place of the stored pair of its key."""
        pending, ranged = self._pending, self._ranged
        overlay = (
            sorted((k, v) for k, v in pending.items() if start <= k < end)
            if self._written_in(start, end)
            else []
        )
        stored: Iterator[tuple[bytes, bytes | None]] = (
            (k, v) for k, v in self._db.iterate(start, end) if k not in pending
        )
        if self._removed_in(start, end):
            stored = ((k, v) for k, v in stored if k not in ranged)
        return heapq.merge(stored, overlay)

    def _removed_in(self, start: bytes, end: bytes) -> bool:
        """Whether a range this version removed meets ``[start, end)``."""
        return any(lo < end and start < hi for lo, hi in self._ranges)

    def _count_after_writes(self) -> int:
        """Exact number of keys once the overlay is applied (reads unknown existence in bulk);
        counted once per state of the overlay (the task's metrics and the commit both ask).
        The overlay is put in key order on the way (``_in_order``), for these reads and the
        commit's write: RocksDB looks keys up and inserts them 2-3x faster in key order."""
        if self._counted is not None:
            return self._counted
        keys, values = self._in_order = _in_key_order(self._pending)
        if not self._track:
            self._counted = -1
            return self._counted
        existed, ranged = self._existed, self._ranged
        # Every written key that was stored goes, every one that is not a delete comes back;
        # the stored keys of the ranges removed go (a key written there since is not stored:
        # the range's removal noted its keys as not existing).
        if existed:
            known = list(map(existed.get, keys))  # None: not read yet
            gone = known.count(True)
            unknown = list(itertools.compress(keys, map(operator.is_, known, _NONES)))
        else:
            gone, unknown = 0, keys
        if unknown:
            found = self._fetch(unknown, in_key_order=True)
            gone += len(found) - found.count(None)
        gone += len(ranged)
        self._counted = self._base_keys - gone + len(values) - values.count(None)
        return self._counted

    def total_keys(self) -> int:
        if self.status is not StoreStatus.UPDATING:
            return self._num_keys
        return self._count_after_writes()

    def _memory_used_bytes(self) -> int:
        if self._memory_used is not None:
            return self._memory_used
        return self._provider.memory_used_bytes(self._db)

    def _custom_metrics(self) -> dict[str, float]:
        return {
            **self._provider.counters_since_report(take=False),
            **self._final,
            "corruptSnapshotsSkipped": self._provider.corrupt_snapshots_skipped,
        }

    def _commit(self) -> None:
        ref = VersionRef(self.version + 1, new_checkpoint_id())
        self._num_keys = self._count_after_writes()
        keys, values = self._in_order
        start = time.perf_counter()
        changelog_bytes = self._provider.write_changelog(
            ref,
            self._base,
            keys,
            values,
            {"num_keys": self._num_keys},
            delete_ranges=self._ranges,
        )
        self.phases.changelog_ms = (time.perf_counter() - start) * 1000
        self.phases.puts = len(keys)
        marker = {
            "version": ref.version,
            "checkpoint_id": ref.checkpoint_id,
            "num_keys": self._num_keys,
        }
        try:
            self._db.apply_batch(zip(keys, values, strict=True), marker, delete_ranges=self._ranges)
        except BaseException:
            self._provider.drop_copy()  # the database may not have taken them
            raise
        self._provider.applied(ref, keys, values, self._num_keys, self._ranged)
        self._provider.keep_gaps(ref, self.gaps)
        self.checkpoint_id = ref.checkpoint_id
        self._final = {"changelogBytesWritten": changelog_bytes}
        self._provider.after_commit(self, ref)

    def _abort(self) -> None:
        self._pending.clear()
        self._written = {}
        self._ranges.clear()
        self._ranged = set()
        self._counted = None
        self._in_order = ([], [])

    def _release(self) -> None:
        # A writable version aborted is a failed or replayed task: let the database go.
        self._provider.end_use(close=not self._read_only)

    def capture_final_metrics(self) -> None:
        """Read the database's memory and disk figures and statistics while it is still open;
        also under Spark's names (:mod:`.spark_metrics`)."""
        counters = self._provider.counters_since_report(take=True)
        stats = self._db.memory_stats()
        self._final.update(counters)
        self._final.update({name: float(stats[key]) for key, name in STAT_NAMES.items()})
        self._final.update(self.phases.spark_metrics(self.load_time_ms))
        self._final.update(rocksdb_file_metrics(counters))
        self._final.update(rocksdb_statistics_metrics(self._statistics, self._db.statistics()))
        self._final["rocksdbSstFileSize"] = float(stats["total_sst_bytes"])
        self._final["rocksdbPinnedBlocksMemoryUsage"] = float(stats["share_pinned_blocks_bytes"])
        self._final.update(self._provider.snapshot_metrics())
        self._memory_used = self._provider.memory_used_bytes(self._db)
