"""The ``memory`` provider: Spark's HDFS-backed design, a map per version in the worker.

Each commit writes ``<v>_<id>.delta``; maintenance writes ``<v>_<id>.snapshot`` once
``min_deltas_for_snapshot`` deltas piled up; the last ``max_versions_in_memory`` versions stay
cached, so a batch that follows the previous one in the same worker starts without any I/O.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import ClassVar

from sparkstate.store.base import StateStore
from sparkstate.store.changelog import decode_changelog, encode_changelog
from sparkstate.store.layout import VersionIndex, VersionRef, file_name, new_checkpoint_id
from sparkstate.store.versioned import VersionedProvider

__all__ = ["MemoryStateStore", "MemoryStateStoreProvider"]

_SNAPSHOT_KIND = b"SNAP"
#: Rough per-entry overhead of a Python dict holding two bytes objects.
_ENTRY_OVERHEAD = 150


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
    ) -> None:
        super().__init__(provider.id, version, provider.families, read_only=read_only)
        self._provider = provider
        self._base = base
        self._data = data
        self._changes: dict[bytes, bytes | None] = {}
        self._sorted: list[bytes] | None = None
        self.load_time_ms = load_time_ms
        self._delta_bytes = 0

    def raw_get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def raw_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return list(map(self._data.get, keys))

    def raw_put(self, key: bytes, value: bytes) -> None:
        self._data[key] = value
        self._changes[key] = value
        self._sorted = None

    def raw_put_many(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        pairs = dict(zip(keys, values, strict=True))
        self._data.update(pairs)
        self._changes.update(pairs)
        self._sorted = None

    def raw_delete(self, key: bytes) -> None:
        if self._data.pop(key, None) is not None:
            self._changes[key] = None
            self._sorted = None

    def raw_scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        keys, data = self._sorted_keys(), self._data
        for i in range(bisect.bisect_left(keys, start), bisect.bisect_left(keys, end)):
            k = keys[i]
            v = data.get(k)
            if v is not None:
                yield k, v

    def raw_scan_suffixes(
        self, start: bytes, end: bytes, skip: int
    ) -> Iterator[tuple[bytes, bytes]]:
        keys, data = self._sorted_keys(), self._data
        for i in range(bisect.bisect_left(keys, start), bisect.bisect_left(keys, end)):
            k = keys[i]
            v = data.get(k)
            if v is not None:
                yield k[skip:], v

    def _sorted_keys(self) -> list[bytes]:
        """All keys in order, sorted once per change of the key set."""
        if self._sorted is None:
            self._sorted = sorted(self._data)
        return self._sorted

    def raw_num_keys(self) -> int:
        return len(self._data)

    def _memory_used_bytes(self) -> int:
        return sum(len(k) + len(v) for k, v in self._data.items()) + _ENTRY_OVERHEAD * len(
            self._data
        )

    def _custom_metrics(self) -> dict[str, float]:
        return {
            "deltaBytesWritten": self._delta_bytes,
            "corruptSnapshotsSkipped": self._provider.corrupt_snapshots_skipped,
        }

    def _commit(self) -> None:
        ref = VersionRef(self.version + 1, new_checkpoint_id())
        keys = list(self._changes)
        values = list(self._changes.values())
        self._delta_bytes = self._provider.write_changelog(ref, self._base, keys, values)
        self._provider.remember(ref, self._data)
        self.checkpoint_id = ref.checkpoint_id

    def _abort(self) -> None:
        self._changes.clear()


class MemoryStateStoreProvider(VersionedProvider):
    """Holds recent versions as dicts; durable as delta and snapshot files."""

    name: ClassVar[str] = "memory"
    delta_ext: ClassVar[str] = "delta"
    delta_kind: ClassVar[bytes] = b"DLTA"

    def __init__(self) -> None:
        self._cache: OrderedDict[VersionRef | None, dict[bytes, bytes]] = OrderedDict()

    def remember(self, ref: VersionRef, data: dict[bytes, bytes]) -> None:
        self._cache[ref] = data
        self._cache.move_to_end(ref)
        while len(self._cache) > self.conf.max_versions_in_memory:
            self._cache.popitem(last=False)

    def _open(self, version: int, checkpoint_id: str | None, read_only: bool) -> MemoryStateStore:
        start = time.perf_counter()
        index = self.index()
        target = self.resolve(version, checkpoint_id, index)
        cached = self._cache.get(target)
        if target is None:
            data: dict[bytes, bytes] = {}
        elif cached is not None:
            data = cached if read_only else dict(cached)
        else:
            older = [r for r in self._cache if r is not None and r.version < target.version]
            local = max(older) if older else None
            plan, snap = self.load(target, index, self._read_snapshot, local=local)
            from_local = plan.from_local and local is not None
            data = dict(self._cache[local]) if from_local and local else (snap or {})
            for _, log in plan.changelogs:
                for k, v in zip(log.keys, log.values, strict=True):
                    if v is None:
                        data.pop(k, None)
                    else:
                        data[k] = v
            self.remember(target, data)
            data = data if read_only else dict(data)
        load_ms = int((time.perf_counter() - start) * 1000)
        return MemoryStateStore(
            self, target, version, data, read_only=read_only, load_time_ms=load_ms
        )

    def get_store(self, version: int, checkpoint_id: str | None = None) -> MemoryStateStore:
        return self._open(version, checkpoint_id, read_only=False)

    def get_read_store(self, version: int, checkpoint_id: str | None = None) -> MemoryStateStore:
        return self._open(version, checkpoint_id, read_only=True)

    def _read_snapshot(self, ref: VersionRef) -> dict[bytes, bytes]:
        name = file_name(ref, "snapshot")
        snap = decode_changelog(_SNAPSHOT_KIND, self.dir.read(name), self.dir.where(name))
        return dict(zip(snap.keys, snap.values, strict=True))  # type: ignore[arg-type]

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

    @classmethod
    def supported_custom_metrics(cls) -> list[str]:
        return ["deltaBytesWritten", "corruptSnapshotsSkipped"]

    def close(self) -> None:
        self._cache.clear()
