"""A partition restored lazily: its first batches run before its snapshot is downloaded.

A :class:`LazyDB` is a :class:`~.local.LocalDB` that starts empty over a *remote* view of the
snapshot it restores (:class:`RemoteState`: the snapshot's SST files on durable storage, read a
block at a time by :mod:`.sst_read`). On local disk it holds every key whose state it knows: the
keys that the changelogs replayed since the snapshot and the batches since wrote or deleted, and
the keys already read from the snapshot, so local disk is a cache of the snapshot's keys as well.
A key it does not know has the snapshot's value, unless a range deletion since covers it.

Meanwhile the whole snapshot downloads in a background thread. Once it is down, the next load,
or the first read that needs every key (a scan, a count, a range deletion), *completes* the
database: the partial one is replaced by the snapshot with the changelogs since replayed onto it,
as a restore always ran, and from then on the LazyDB is a plain LocalDB.

What is durable does not change: a version still writes its changelog before the database takes
it; no snapshot is taken of a lazy database (one is, once it is complete); and a lazy database's
marker says so, so a database found on disk after a crash part way is never taken for the version
it names: it is wiped and restored again.
"""

from __future__ import annotations

import bisect
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import rocksdict

from sparkstate.store.rocksdb.local import RESERVED_PREFIX, LocalDB
from sparkstate.store.rocksdb.options import LocalDBConf
from sparkstate.store.versions.layout import VersionRef

__all__ = ["LAZY_MARK", "LazyDB", "RemoteState"]

#: The marker field of a database that is not complete (never opened as its version again).
LAZY_MARK = "lazy"
#: A read of more keys not known yet than this waits for the download instead: a block read
#: from the snapshot per key and file costs more than the download once a batch asks for most
#: of the snapshot's blocks.
MAX_LAZY_KEYS = 20_000


class RemoteState(Protocol):
    """The state of a snapshot, read from durable storage a key at a time."""

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (None: not in the snapshot)."""
        ...

    def last_below(self, end: bytes) -> bytes | None:
        """A bound of the snapshot's keys below ``end``: at least the largest of them."""
        ...

    @property
    def reads(self) -> int:
        """Ranged reads made so far."""
        ...

    @property
    def bytes_read(self) -> int:
        """Bytes those reads returned."""
        ...


#: Downloads the snapshot whole (run in the background): the local directory it is in, ready
#: to open, and the names of its files.
Download = Callable[[], tuple[str, list[str]]]
#: Applies the changelogs of these versions, in order, onto the completed database.
Replay = Callable[[LocalDB, Sequence[VersionRef]], None]


class LazyDB(LocalDB):
    """A database restoring lazily from ``remote`` (see the module doc) while ``download``
    runs in the background; ``replay`` brings the downloaded snapshot up to its version."""

    def __init__(
        self,
        path: str,
        conf: LocalDBConf,
        remote: RemoteState,
        marker: Mapping[str, Any],
        download: Download,
        replay: Replay,
    ) -> None:
        """``marker``: the snapshot's (its version, checkpoint id and key count)."""
        shutil.rmtree(path, ignore_errors=True)
        super().__init__(path, conf)
        super().apply_batch({}, {**marker, LAZY_MARK: True})
        #: The snapshot restored.
        self.snapshot = VersionRef(int(marker["version"]), str(marker["checkpoint_id"]))
        self._remote: RemoteState | None = remote
        self._replay = replay
        #: Keys whose state this database holds (present, or absent from it: deleted).
        self._known: set[bytes] = set()
        #: Ranges removed since the snapshot, as sorted, disjoint ``(start, end)``.
        self._cleared: list[tuple[bytes, bytes]] = []
        #: The versions applied since the snapshot, to replay onto it once it is down.
        self._lineage: list[VersionRef] = []
        self._downloaded: tuple[str, list[str]] | BaseException | None = None
        self._done = threading.Event()
        self._cancelled = False
        self._fetched = 0
        self._thread = threading.Thread(
            target=self._download, args=(download,), name=f"lazy-restore {path}", daemon=True
        )
        self._thread.start()

    @property
    def lazy(self) -> bool:
        """Whether the database is not complete yet."""
        return self._remote is not None

    @property
    def downloaded(self) -> bool:
        """Whether the snapshot is down (or its download failed): completing will not wait."""
        return self._done.is_set()

    @property
    def bytes_fetched(self) -> int:
        """The bytes read from the snapshot's files in place so far."""
        remote = self._remote
        if remote is not None:
            self._fetched = remote.bytes_read
        return self._fetched

    def _download(self, download: Download) -> None:
        try:
            self._downloaded = download()
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that completes
            self._downloaded = exc
        finally:
            self._done.set()
        if self._cancelled:
            self._drop_download()

    # -- completion

    def complete(self) -> None:
        """Wait for the download, then become the snapshot with every version since applied."""
        if self._remote is None:
            return
        self._done.wait()
        got = self._downloaded
        if isinstance(got, BaseException):
            raise got
        assert got is not None
        source, _ = got
        self._fetched = self.bytes_fetched
        super().close()  # (the download is kept: it becomes the database)
        shutil.rmtree(self.path, ignore_errors=True)
        os.replace(source, self.path)
        self._remote = None
        self._known.clear()
        self._cleared.clear()
        self._open_handle()
        lineage, self._lineage = self._lineage, []
        self._replay(self, lineage)

    def close(self) -> None:
        super().close()
        if self._remote is not None:  # a download not taken: its directory goes, once down
            self._cancelled = True
            if self._done.is_set():
                self._drop_download()

    def _drop_download(self) -> None:
        got, self._downloaded = self._downloaded, None
        if isinstance(got, tuple):
            shutil.rmtree(got[0], ignore_errors=True)

    # -- reads

    def _cleared_at(self, key: bytes) -> bool:
        i = bisect.bisect_right(self._cleared, key, key=lambda r: r[0]) - 1
        return i >= 0 and key < self._cleared[i][1]

    def _learn(self, keys: Iterable[bytes]) -> None:
        """Read the keys not known yet from the snapshot, and keep them locally."""
        known = self._known
        unknown = sorted({k for k in keys if k not in known and k < RESERVED_PREFIX})
        if self._cleared:
            cleared = [k for k in unknown if self._cleared_at(k)]
            known.update(cleared)
            unknown = [k for k in unknown if k not in known]
        if not unknown:
            return
        if len(unknown) > MAX_LAZY_KEYS:
            self.complete()
            return
        assert self._remote is not None
        values = self._remote.get_many(unknown)
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in zip(unknown, values, strict=True):
            if value is not None:
                batch.put(key, value)
        if len(batch):
            self._live().write(batch, self._write_opts)
        known.update(unknown)

    def get(self, key: bytes) -> bytes | None:
        if self._remote is not None:
            self._learn([key])
        return super().get(key)

    def multi_get(self, keys: Sequence[bytes], *, in_key_order: bool = False) -> list[bytes | None]:
        if self._remote is not None:
            self._learn(keys)
        return super().multi_get(keys, in_key_order=in_key_order)

    def last_key(self, start: bytes, end: bytes) -> bytes | None:
        """While lazy, a bound of the range's keys rather than the largest: the largest of the
        local ones and of the keys the snapshot's files hold below ``end`` (deleted ones too).
        A store looks up no key above it (keys that grow, a window's end, a new key)."""
        local = super().last_key(start, end)
        if self._remote is None:
            return local
        remote = self._remote.last_below(min(end, RESERVED_PREFIX))
        if remote is not None and remote < start:
            remote = None
        return max((k for k in (local, remote) if k is not None), default=None)

    def iterate(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.complete()
        return super().iterate(start, end)

    def scan_chunks(
        self, start: bytes, end: bytes, chunk: int
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        self.complete()
        return super().scan_chunks(start, end, chunk)

    def keys_in(self, start: bytes, end: bytes) -> list[bytes]:
        self.complete()
        return super().keys_in(start, end)

    def count_keys(self) -> int:
        self.complete()
        return super().count_keys()

    def create_checkpoint(self, dest_dir: str) -> list[str]:
        self.complete()
        return super().create_checkpoint(dest_dir)

    # -- views: a lazy database has none (a live read then reads the checkpoint)

    def keep_view(self, version: int, ref: Any, keep: int = 2) -> None:
        if self._remote is None:
            super().keep_view(version, ref, keep)

    # -- writes

    def apply_batch(
        self,
        writes: Mapping[bytes, bytes | None] | Iterable[tuple[bytes, bytes | None]],
        marker: Mapping[str, Any],
        *,
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> int:
        if self._remote is None:
            return super().apply_batch(writes, marker, delete_ranges=delete_ranges)
        known = self._known
        pairs = writes.items() if isinstance(writes, Mapping) else writes

        def noted() -> Iterator[tuple[bytes, bytes | None]]:
            for key, value in pairs:
                known.add(key)
                yield key, value

        size = super().apply_batch(
            noted(), {**marker, LAZY_MARK: True}, delete_ranges=delete_ranges
        )
        for start, end in delete_ranges:
            self._clear(start, end)
        if "version" in marker and marker.get("checkpoint_id"):
            self._lineage.append(VersionRef(int(marker["version"]), str(marker["checkpoint_id"])))
        return size

    def _clear(self, start: bytes, end: bytes) -> None:
        """Note ``[start, end)`` removed: merged into the sorted, disjoint ranges."""
        merged: list[tuple[bytes, bytes]] = []
        for lo, hi in self._cleared:
            if hi < start or end < lo:
                merged.append((lo, hi))
            else:
                start, end = min(lo, start), max(hi, end)
        merged.append((start, end))
        merged.sort()
        self._cleared = merged
