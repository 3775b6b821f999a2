"""The ``memory`` provider: Spark's HDFS-backed design, a map per version in the worker.

Each commit writes ``<v>_<id>.delta``; maintenance writes ``<v>_<id>.snapshot`` once
``min_deltas_for_snapshot`` deltas piled up; the last ``max_versions_in_memory`` versions stay
cached, so a batch that follows the previous one in the same worker starts without any I/O.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import operator
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import ClassVar, cast

from sparkstate.store.base import FOUND_METRICS, StateStore
from sparkstate.store.families import family_of, key_successor
from sparkstate.store.sizes import entry_bytes, map_size_bytes
from sparkstate.store.spark_metrics import HDFS_METRICS
from sparkstate.store.versions.changelog import ChangelogReader, encode_changelog
from sparkstate.store.versions.layout import VersionIndex, VersionRef, file_name, new_checkpoint_id
from sparkstate.store.versions.versioned import VersionedProvider

__all__ = ["MemoryStateStore", "MemoryStateStoreProvider"]

_SNAPSHOT_KIND = b"SNAP"


class KeyOrder:
    """A column family's keys in byte order for range scans, kept across versions.

    Built by one sort of the family's keys at the first scan of the family. After that, keys
    added are sorted alone and merged in (a linear merge of two sorted runs), and removed keys
    stay in the list, skipped by the scans, until they are a sixteenth of it. So a scan after a
    batch's writes costs about what the batch changed, not a sort of the whole family. A family
    never scanned tracks nothing.
    Every key is in the list once: a removed key that comes back is already there.
    """

    __slots__ = ("_new", "_prefix", "_removed", "_sorted")

    def __init__(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._sorted: list[bytes] | None = None
        self._new: list[bytes] = []
        self._removed: set[bytes] = set()

    @property
    def tracking(self) -> bool:
        return self._sorted is not None

    def lists(self) -> list[list[bytes]]:
        """The lists it holds (the sorted one is shared with the copies made of it)."""
        return [x for x in (self._sorted, self._new) if x]

    def copy(self) -> KeyOrder:
        out = KeyOrder(self._prefix)
        out._sorted = self._sorted  # replaced, never changed in place
        out._new = list(self._new)
        out._removed = set(self._removed)
        return out

    def added(self, keys: list[bytes]) -> None:
        """Keys just put that were not in the map."""
        removed = self._removed
        if removed:
            back = {k for k in keys if k in removed}
            if back:
                removed.difference_update(back)
                keys = [k for k in keys if k not in back]
        self._new.extend(keys)

    def removed(self, keys: list[bytes]) -> None:
        """Keys just removed from the map (each once). A large run of the order, as an
        eviction's range scan removes, is cut out of the list at once; other keys wait in
        ``_removed``."""
        current = self._sorted
        if current is None or not keys:
            return
        if len(keys) > len(current) // 16:  # cutting copies the list: only for a large run
            lo = bisect.bisect_left(current, keys[0])
            hi = lo + len(keys)
            if current[lo:hi] == keys:
                self._sorted = current[:lo] + current[hi:]
                return
        self._removed.update(keys)

    def keys(self, data: dict[bytes, bytes]) -> list[bytes]:
        current, removed = self._sorted, self._removed
        if current is None:
            prefix = self._prefix
            mine = (k for k in data if k.startswith(prefix)) if prefix else iter(data)
            current, self._new, self._removed = sorted(mine), [], set()
        elif self._new:
            current = current + sorted(self._new)
            current.sort()  # two sorted runs: one merge
        if len(removed) > len(current) // 16:  # dropped in one pass, before scans trip on them
            current = [k for k in current if k not in removed]
            self._removed = set()
        self._sorted, self._new = current, []
        return current


class KeyOrders:
    """The key orders of a map's column families, each kept from the first scan of its family:
    an eviction's scan of one family (a time index) keeps no order of the others, whose writes
    then cost nothing here. A scan across families (none of the store's own) sorts the map."""

    __slots__ = ("_by_family",)

    def __init__(self) -> None:
        self._by_family: dict[bytes, KeyOrder] = {}

    @property
    def tracking(self) -> bool:
        return bool(self._by_family)

    def tracks(self, family: bytes) -> bool:
        return family in self._by_family

    def lists(self) -> list[list[bytes]]:
        return [x for order in self._by_family.values() for x in order.lists()]

    def copy(self) -> KeyOrders:
        out = KeyOrders()
        out._by_family = {f: order.copy() for f, order in self._by_family.items()}
        return out

    def added(self, keys: list[bytes], family: bytes | None) -> None:
        """Keys just put that were not in the map (of ``family``, None: of any)."""
        for fam, group in self._tracked(keys, family):
            fam.added(group)

    def removed(self, keys: list[bytes], family: bytes | None) -> None:
        """Keys just removed from the map (of ``family``, None: of any)."""
        for fam, group in self._tracked(keys, family):
            fam.removed(group)

    def _tracked(
        self, keys: list[bytes], family: bytes | None
    ) -> list[tuple[KeyOrder, list[bytes]]]:
        if not keys or not self._by_family:
            return []
        if family is not None:
            order = self._by_family.get(family)
            return [] if order is None else [(order, keys)]
        groups: dict[bytes, list[bytes]] = {}
        for k in keys:
            groups.setdefault(family_of(k), []).append(k)
        return [(self._by_family[f], g) for f, g in groups.items() if f in self._by_family]

    def keys(self, data: dict[bytes, bytes], start: bytes, end: bytes) -> list[bytes]:
        """The keys of the family of ``start`` in order (and some removed ones, which scans
        skip), where ``end`` is within that family; else every key of the map, sorted."""
        family = family_of(start)
        if not family or end > key_successor(family):
            return sorted(data)
        order = self._by_family.get(family)
        if order is None:
            order = self._by_family[family] = KeyOrder(family)
        return order.keys(data)


class MemoryStateStore(StateStore):
    """One version as a Python dict; writes are recorded for the delta file."""

    def __init__(
        self,
        provider: MemoryStateStoreProvider,
        base: VersionRef | None,
        version: int,
        data: dict[bytes, bytes],
        *,
        read_only: bool,
        load_time_ms: int,
        key_order: KeyOrders | None = None,
    ) -> None:
        super().__init__(provider.id, version, provider.families, read_only=read_only)
        self._provider = provider
        self._base = base
        self._data = data
        self._changes: dict[bytes, bytes | None] = {}
        #: The keys in order, kept from the base version when its store was scanned.
        self._order = key_order.copy() if key_order is not None else KeyOrders()
        self.load_time_ms = load_time_ms
        self._delta_bytes = 0
        #: Corrupt snapshots the load of this version skipped.
        self.snapshots_skipped = 0
        #: Entries the load wrote into a copy of a cached version (None: loaded from a snapshot).
        self.replayed: int | None = 0
        #: The key ranges this version removed (``remove_range``), for its delta, in order.
        self._ranges: list[tuple[bytes, bytes]] = []

    def raw_get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def raw_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return list(map(self._data.get, keys))

    def raw_put(self, key: bytes, value: bytes) -> None:
        family = family_of(key)
        if self._order.tracks(family) and key not in self._data:
            self._order.added([key], family)
        self._data[key] = value
        self._changes[key] = value

    def raw_put_many(
        self, keys: Sequence[bytes], values: Sequence[bytes], *, family: bytes | None = None
    ) -> None:
        pairs = dict(zip(keys, values, strict=True))
        order = self._order
        if order.tracking and (family is None or order.tracks(family)):
            data = self._data
            order.added([k for k in pairs if k not in data], family)
        self._data.update(pairs)
        self._changes.update(pairs)

    def raw_delete(self, key: bytes) -> None:
        self.raw_delete_many([key], family=family_of(key))

    def raw_delete_many(self, keys: Sequence[bytes], *, family: bytes | None = None) -> None:
        popped = list(map(self._data.pop, keys, itertools.repeat(None)))
        gone = list(keys) if None not in popped else list(itertools.compress(keys, popped))
        self._changes.update(dict.fromkeys(gone))
        self._order.removed(gone, family)  # scans skip them until the order drops them

    def raw_delete_range(self, start: bytes, end: bytes, first: bytes) -> int:
        """Remove the range's keys from the map (found in the family's key order) and its
        earlier writes from the delta, which records the range instead."""
        keys, data = self._sorted_keys(first, end), self._data
        found = keys[bisect.bisect_left(keys, first) : bisect.bisect_left(keys, end)]
        gone = [k for k in found if k in data]
        collections.deque(map(data.pop, gone), maxlen=0)
        changes = self._changes
        for k in [k for k in changes if start <= k < end]:
            del changes[k]
        self._order.removed(gone, family_of(start))
        self._ranges.append((start, end))
        return len(gone)

    def raw_scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        keys, data = self._sorted_keys(start, end), self._data
        for i in range(bisect.bisect_left(keys, start), bisect.bisect_left(keys, end)):
            k = keys[i]
            v = data.get(k)
            if v is not None:
                yield k, v

    def raw_scan_suffixes(
        self, start: bytes, end: bytes, skip: int
    ) -> Iterator[tuple[bytes, bytes]]:
        keys, data = self._sorted_keys(start, end), self._data
        for i in range(bisect.bisect_left(keys, start), bisect.bisect_left(keys, end)):
            k = keys[i]
            v = data.get(k)
            if v is not None:
                yield k[skip:], v

    def raw_scan_chunks(
        self, start: bytes, end: bytes, skip: int, chunk: int
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        keys, get = self._sorted_keys(start, end), self._data.get
        hi = bisect.bisect_left(keys, end)
        for i in range(bisect.bisect_left(keys, start), hi, chunk):
            ks = keys[i : min(i + chunk, hi)]
            found = list(map(get, ks))
            if None in found:  # removed keys the order still holds
                live = [j for j, v in enumerate(found) if v is not None]
                ks, found = [ks[j] for j in live], [found[j] for j in live]
            if ks:
                yield ([k[skip:] for k in ks] if skip else ks), cast("list[bytes]", found)

    def _sorted_keys(self, start: bytes, end: bytes) -> list[bytes]:
        """The keys of the family scanned in order (and some removed ones, which scans skip)."""
        return self._order.keys(self._data, start, end)

    def total_keys(self) -> int:
        return len(self._data)

    def _memory_used_bytes(self) -> int:
        return self._provider.memory_used_bytes(self._data, self._order, self._written())

    def _written(self) -> int | None:
        """Entries of this version's map not shared with the cached version it copies."""
        return None if self.replayed is None else self.replayed + len(self._changes)

    def _custom_metrics(self) -> dict[str, float]:
        provider = self._provider
        return {
            "deltaBytesWritten": self._delta_bytes,
            "corruptSnapshotsSkipped": provider.corrupt_snapshots_skipped,
            # Spark's HDFS-backed provider's names: its cache of versions (hits and misses
            # since the provider was made), this version's map, a load that skipped a
            # corrupt snapshot, and the newest snapshot of the partition.
            "loadedMapCacheHitCount": provider.cache_hits,
            "loadedMapCacheMissCount": provider.cache_misses,
            "stateOnCurrentVersionSizeBytes": map_size_bytes(self._data),
            "numSnapshotsAutoRepaired": float(self.snapshots_skipped > 0),
            **provider.snapshot_metrics(),
        }

    def _commit(self) -> None:
        ref = VersionRef(self.version + 1, new_checkpoint_id())
        keys = list(self._changes)
        values = list(self._changes.values())
        self._delta_bytes = self._provider.write_changelog(
            ref, self._base, keys, values, delete_ranges=self._ranges
        )
        self._provider.remember(ref, self._data, self._order, written=self._written())
        self._provider.keep_gaps(ref, self.gaps)
        self.checkpoint_id = ref.checkpoint_id

    def _abort(self) -> None:
        self._changes.clear()
        self._ranges.clear()


class MemoryStateStoreProvider(VersionedProvider):
    """Holds recent versions as dicts; durable as delta and snapshot files."""

    name: ClassVar[str] = "memory"
    delta_ext: ClassVar[str] = "delta"
    delta_kind: ClassVar[bytes] = b"DLTA"

    def __init__(self) -> None:
        self._cache: OrderedDict[VersionRef | None, dict[bytes, bytes]] = OrderedDict()
        self._orders: dict[VersionRef, KeyOrders] = {}
        #: Entries a cached version wrote on top of the version it was opened at (absent: a
        #: version loaded from files, whose objects are all its own).
        self._written: dict[VersionRef, int] = {}
        #: Loads of a version found in the cache, and not (Spark's counts, never reset).
        self.cache_hits = self.cache_misses = 0

    def remember(
        self,
        ref: VersionRef,
        data: dict[bytes, bytes],
        order: KeyOrders | None = None,
        *,
        written: int | None = None,
    ) -> None:
        self._cache[ref] = data
        self._cache.move_to_end(ref)
        if order is not None and order.tracking:
            self._orders[ref] = order
        if written is not None:
            self._written[ref] = written
        while len(self._cache) > self.conf.max_versions_in_memory:
            old, _ = self._cache.popitem(last=False)
            if old is not None:
                self._orders.pop(old, None)
                self._written.pop(old, None)

    def memory_used_bytes(
        self, current: dict[bytes, bytes], order: KeyOrders, written: int | None
    ) -> int:
        """The versions held in memory, as Spark's ``memoryUsedBytes`` (an estimate of the maps
        of its cache), with ``current``, a store's version, among them: every version's hash
        table and key order, and every key and value object once. A version written on top of
        an older one shares all objects but those it wrote with it, and the oldest holds all
        of its own."""
        maps = sorted(
            (
                (ref.version, data, self._written.get(ref)) if ref is not None else (0, data, None)
                for ref, data in self._cache.items()
            ),
            key=operator.itemgetter(0),
        )
        if not any(data is current for _, data, _ in maps):
            maps.append((sys.maxsize, current, written))
        objects = sum(
            len(data) if i == 0 or own is None else own for i, (_, data, own) in enumerate(maps)
        )
        lists = {id(x): x for o in (*self._orders.values(), order) for x in o.lists()}
        tables = sum(sys.getsizeof(data) for _, data, _ in maps)
        return (
            tables + sum(map(sys.getsizeof, lists.values())) + int(objects * entry_bytes(current))
        )

    def _open(self, version: int, checkpoint_id: str | None, read_only: bool) -> MemoryStateStore:
        start = time.perf_counter()
        index = self.index()
        self.note_snapshots(index)
        target = self.resolve(version, checkpoint_id, index)
        cached = self._cache.get(target)
        skipped = self.corrupt_snapshots_skipped
        # Entries written into ``data`` since it was copied from a cached version (None: not a
        # copy, its objects are its own).
        shared: int | None = 0
        found: str | None = "open"
        if target is None:
            found = None
            data: dict[bytes, bytes] = {}
        elif cached is not None:
            self.cache_hits += 1
            data = cached if read_only else dict(cached)
        else:
            self.cache_misses += 1
            older = [r for r in self._cache if r is not None and r.version < target.version]
            local = max(older) if older else None
            plan, snap = self.load(target, index, self._read_snapshot, local=local)
            from_local = plan.from_local and local is not None
            data = dict(self._cache[local]) if from_local and local else (snap or {})
            shared = 0 if from_local else None
            found = "caught_up" if from_local else "restored"
            # The key order starts again (one sort at the first scan): replaying each delta's
            # changes into it costs more than that sort when the removals are scattered. One
            # delta is read at a time, applied a record batch at a time (what the map keeps is
            # decoded anyway; smaller chunks only slow the bulk calls down); a failure part way
            # leaves ``data``, a map of its own that nothing caches, behind.
            for ref in plan.changelogs:
                delta = self.read_changelog(ref)
                shared = _remove_ranges(data, delta.delete_ranges, shared)
                for keys, values in delta.chunks(max_rows=None):
                    _apply(data, keys, values)
                    shared = None if shared is None else shared + len(keys)
            if read_only:  # a writable store's version is cached when it commits
                self.remember(target, data, written=shared)
        load_ms = int((time.perf_counter() - start) * 1000)
        order = self._orders.get(target) if target is not None else None
        store = MemoryStateStore(
            self,
            target,
            version,
            data,
            read_only=read_only,
            load_time_ms=load_ms,
            key_order=order,
        )
        store.snapshots_skipped = self.corrupt_snapshots_skipped - skipped
        store.replayed = shared
        store.gaps = self.gaps_at(target)
        store.found = found
        return store

    def get_store(self, version: int, checkpoint_id: str | None = None) -> MemoryStateStore:
        return self._open(version, checkpoint_id, read_only=False)

    def get_read_store(self, version: int, checkpoint_id: str | None = None) -> MemoryStateStore:
        return self._open(version, checkpoint_id, read_only=True)

    def _read_snapshot(self, ref: VersionRef) -> dict[bytes, bytes]:
        name = file_name(ref, "snapshot")
        snap = ChangelogReader(_SNAPSHOT_KIND, self.dir.read(name), self.dir.where(name))
        data: dict[bytes, bytes] = {}
        for keys, values in snap.chunks(max_rows=None):  # a record batch at a time
            data.update(zip(keys, values, strict=True))  # type: ignore[arg-type]
        return data

    def write_snapshot(self, ref: VersionRef, data: dict[bytes, bytes]) -> None:
        header = {"version": ref.version, "checkpoint_id": ref.checkpoint_id, "count": len(data)}
        keys = list(data)
        encoded = encode_changelog(
            _SNAPSHOT_KIND, header, keys, list(data.values()), self.conf.compression
        )
        self.dir.write_atomic(file_name(ref, "snapshot"), encoded)

    def _maybe_snapshot(self, index: VersionIndex) -> None:
        latest = self._last_ref
        if latest is None or latest not in self._cache or index.has(latest, "snapshot"):
            return
        snaps = [r.version for r in index.refs("snapshot")]
        newest_snap = max(snaps, default=0)
        if latest.version - newest_snap >= self.conf.min_deltas_for_snapshot:
            self.write_snapshot(latest, self._cache[latest])

    def snapshot_now(self) -> bool:
        latest = self._last_ref
        if latest is None or latest not in self._cache or self.index().has(latest, "snapshot"):
            return False
        self.write_snapshot(latest, self._cache[latest])
        return True

    # --- live reads (ReadsLive): the versions in the cache, which no store writes into ----------

    def _live_map(self, version: int) -> tuple[VersionRef, dict[bytes, bytes]] | None:
        for ref, data in list(self._cache.items()):
            if ref is not None and ref.version == version:
                return ref, data
        return None

    def live_versions(self) -> list[int]:
        return sorted(r.version for r in list(self._cache) if r is not None)

    def live_get(
        self, version: int, keys: Sequence[bytes]
    ) -> tuple[str | None, list[bytes | None]] | None:
        found = self._live_map(version)
        if found is None:
            return None
        ref, data = found
        return ref.checkpoint_id, list(map(data.get, keys))

    def live_scan(
        self, version: int, start: bytes, end: bytes, limit: int
    ) -> tuple[str | None, list[tuple[bytes, bytes]]] | None:
        found = self._live_map(version)
        if found is None:
            return None
        ref, data = found
        keys = sorted(k for k in list(data) if start <= k < end)[:limit]
        return ref.checkpoint_id, [(k, data[k]) for k in keys]

    @classmethod
    def supported_custom_metrics(cls) -> list[str]:
        return [
            "deltaBytesWritten",
            "corruptSnapshotsSkipped",
            *HDFS_METRICS,
            *FOUND_METRICS.values(),
        ]

    def close(self) -> None:
        self._cache.clear()
        self._orders.clear()
        self._written.clear()


def _remove_ranges(
    data: dict[bytes, bytes], ranges: list[tuple[bytes, bytes]], shared: int | None
) -> int | None:
    """Remove the keys of a delta's ``ranges`` from ``data`` (a pass over the map: the key
    order starts again after a load); ``shared`` counts them as entries written."""
    for lo, hi in ranges:
        gone = [k for k in data if lo <= k < hi]
        collections.deque(map(data.pop, gone), maxlen=0)
        shared = None if shared is None else shared + len(gone)
    return shared


def _apply(data: dict[bytes, bytes], keys: list[bytes], values: list[bytes | None]) -> None:
    """Apply one delta (each key once: its value, or None for removed) to ``data`` in bulk
    calls: a catching-up worker replays a batch's changes in a fraction of the batch's time."""
    is_delete = list(map(operator.is_, values, itertools.repeat(None)))
    if True not in is_delete:
        puts, put_values, deleted = keys, cast("list[bytes]", values), []
    else:
        kept = [not d for d in is_delete]
        puts = list(itertools.compress(keys, kept))
        put_values = cast("list[bytes]", list(itertools.compress(values, kept)))
        deleted = [k for k in itertools.compress(keys, is_delete) if k in data]
    data.update(zip(puts, put_values, strict=True))
    collections.deque(map(data.pop, deleted), maxlen=0)
