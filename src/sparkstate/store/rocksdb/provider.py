"""The ``rocksdb`` provider: a local RocksDB per partition, changelogs and shared-SST snapshots.

The local database lives in an executor-level directory guarded by a file lock, so the Python
worker processes of one executor take turns on a partition. The process that ran a partition's
last task keeps the lock and the database open, so that the partition's next task in the same
process starts warm; a task in another process asks it to let go (:mod:`.handoff`), and a process
that holds a store at an older version than the one requested catches it up first, so no process
ever reads a stale version. Writes are buffered in an overlay that reads see; commit
writes the version's changelog to durable storage first, then applies the overlay and the version
marker to RocksDB in one WriteBatch (WAL off). A local copy at an older version on the requested
lineage catches up by replaying changelogs; anything else restores from the nearest snapshot.

This module is the provider: the local database's lifetime, loading a version, taking and
uploading snapshots, its counters. One version over the database is
:class:`~sparkstate.store.rocksdb.store.RocksDBStateStore`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import pyarrow as pa

from sparkstate.exceptions import CorruptStateFileError, StateStoreError
from sparkstate.files.durable import FileEntry
from sparkstate.store.base import FOUND_METRICS, StoreConf, StoreId, default_local_dir
from sparkstate.store.handoff import listener
from sparkstate.store.rocksdb.lazy import LAZY_MARK, LazyDB, RemoteState
from sparkstate.store.rocksdb.local import LocalDB, LocalDBConf, LocalStoreDir, local_key
from sparkstate.store.rocksdb.snapshot import (
    SST_DIR,
    RemoteSnapshot,
    SstMap,
    download_snapshot,
    read_manifest,
    upload_snapshot,
)
from sparkstate.store.rocksdb.sst_read import SstFormatError
from sparkstate.store.rocksdb.store import STAT_NAMES, RocksDBStateStore
from sparkstate.store.rocksdb.value_copy import ValueCopy
from sparkstate.store.spark_metrics import ROCKSDB_METRICS, VersionPhases
from sparkstate.store.versions.layout import VersionIndex, VersionRef, file_name
from sparkstate.store.versions.versioned import VersionedProvider

__all__ = ["RocksDBStateStore", "RocksDBStateStoreProvider"]

log = logging.getLogger("sparkstate.store")
#: The scratch directories lazy restores download their snapshots into start so.
_LAZY_DOWNLOAD = "lazy-"
#: Providers that may hold a database open after their task, closed at exit (see below).
_KEPT_OPEN: weakref.WeakSet[RocksDBStateStoreProvider] = weakref.WeakSet()


@atexit.register
def _close_kept_open() -> None:
    """Close the databases kept open while the interpreter is whole: at its teardown, objects
    a database uses (the shared cache and write-buffer manager) can go before the database, and
    closing it then crashes the process."""
    for provider in list(_KEPT_OPEN):
        with contextlib.suppress(Exception):
            provider.release()


class RocksDBStateStoreProvider(VersionedProvider):
    """State in a local RocksDB, durable as changelogs plus snapshots with shared SST files."""

    name: ClassVar[str] = "rocksdb"
    delta_ext: ClassVar[str] = "changelog"
    delta_kind: ClassVar[bytes] = b"CLOG"
    records_rows: ClassVar[bool] = True
    shares_files: ClassVar[bool] = True
    #: Unreferenced SST objects younger than this may belong to an upload in progress.
    orphan_grace_s: ClassVar[float] = 600.0

    def __init__(self) -> None:
        self._db: LocalDB | None = None
        self._active: RocksDBStateStore | None = None
        #: Guards the database's lifetime between a task and the handoff thread.
        self._mutex = threading.RLock()
        #: A store of this provider is open (from get_store until commit/abort).
        self._in_use = False
        #: Another process asked for the partition while a store was open.
        self._release_asked = False
        #: The database's pairs in memory while they fit (:mod:`.value_copy`), and the key
        #: count at which a copy last did not fit (none is tried again above half of it).
        self._copy: ValueCopy | None = None
        self._copy_refused_at: int | None = None
        #: Snapshots whose lazy restore failed to download: restored whole from then on.
        self._not_lazily: set[VersionRef] = set()

    def init(
        self,
        store_id: StoreId,
        key_schema: pa.Schema,
        value_schema: pa.Schema,
        conf: StoreConf | None = None,
        column_families: dict[str, tuple[pa.Schema, pa.Schema]] | None = None,
    ) -> None:
        super().init(store_id, key_schema, value_schema, conf, column_families)
        root = store_id.checkpoint_root
        if "://" not in root:
            root = os.path.abspath(root)
        key = local_key(root, store_id.operator_id, store_id.partition_id, store_id.store_name)
        self.local = LocalStoreDir(self.conf.local_dir or default_local_dir(), key)
        self.db_conf = LocalDBConf.from_store_conf(self.conf)
        self._db = None
        self._reported: dict[str, int] = {}
        self._stats = {
            "filesUploaded": 0,
            "filesReused": 0,
            "bytesUploaded": 0,
            "bytesDownloaded": 0,
            "filesDownloaded": 0,
            "changelogsReplayed": 0,
            "restores": 0,
            "localOpens": 0,
            "lazyRestores": 0,
            "lazyBytesRead": 0,
        }
        #: The bytes the lazy database read in place that the counters hold.
        self._lazy_counted = 0
        #: Where the load of the version being opened went (handed to its store).
        self._phases = VersionPhases()

    # --- local database lifetime -----------------------------------------------------------------

    def _acquire(self) -> None:
        """Hold the partition's local directory (waiting for, and asking, another holder)."""
        if self.local.held:  # kept from this provider's last task
            return
        if not self.conf.keep_local_open:
            self.local.acquire(self.conf.lock_timeout_s, owner=str(self.id))
            return
        handoff = listener()
        self.local.acquire(self.conf.lock_timeout_s, owner=str(self.id), handoff=handoff.address)
        handoff.register(self.local.path, self._release_requested)

    def _release_requested(self) -> None:
        """Another process needs the partition (called on the handoff thread)."""
        with self._mutex:
            if self._in_use:
                self._release_asked = True
            else:
                self.release()

    def end_use(self, *, close: bool = False) -> None:
        """A store is done: keep the database open for this process's next task on the
        partition, unless ``close``, not configured to, or another process asked for it."""
        with self._mutex:
            self._in_use = False
            if close or self._release_asked or not self.conf.keep_local_open:
                self._release_asked = False
                self.release()

    def release(self) -> None:
        """Close the local database and let other worker processes take the partition."""
        with self._mutex:
            local: LocalStoreDir | None = getattr(self, "local", None)
            if local is not None and local.held:
                listener().unregister(local.path)
            self.drop_copy()
            if self._db is not None:
                with contextlib.suppress(StateStoreError):
                    self._db.close()
                self._db = None
            if local is not None:
                local.release()

    def _open_local(self) -> tuple[LocalDB | None, VersionRef | None, int]:
        """The local database if usable (the one kept open, else opened from the directory),
        the attempt it holds and its key count."""
        db, self._db = self._db, None
        try:
            if db is None:
                if not os.path.exists(os.path.join(self.local.db_path, "CURRENT")):
                    return None, None, 0
                self._stats["localOpens"] += 1
                db = LocalDB(self.local.db_path, self.db_conf, create_if_missing=False)
            marker = db.read_marker()
        except StateStoreError as exc:
            log.warning("%s: local database unusable, restoring: %s", self.id, exc)
            if db is not None:
                with contextlib.suppress(StateStoreError):
                    db.close()
            return None, None, 0
        if not marker or "version" not in marker or (marker.get(LAZY_MARK) and not db.lazy):
            db.close()  # (a database left part way through a lazy restore: restored again)
            return None, None, 0
        if isinstance(db, LazyDB) and db.downloaded and not self._completed(db):
            return None, None, 0
        ref = (
            VersionRef(int(marker["version"]), str(marker["checkpoint_id"]))
            if marker.get("checkpoint_id")
            else None
        )
        return db, ref, int(marker.get("num_keys", 0))

    def _fresh_db(self, files: list[str] | None = None, source: str | None = None) -> LocalDB:
        self.local.wipe_db()
        if source is None:
            SstMap(self._sst_map_path()).reset()
            return LocalDB(self.local.db_path, self.db_conf)
        os.replace(source, self.local.db_path)
        return LocalDB.open_from_files(self.local.db_path, files or [], self.db_conf)

    def _open(self, version: int, checkpoint_id: str | None, read_only: bool) -> RocksDBStateStore:
        start = time.perf_counter()
        with self._mutex:
            self._in_use = True
        _KEPT_OPEN.add(self)
        try:
            self._acquire()
            self._phases = VersionPhases()
            skipped = self.corrupt_snapshots_skipped
            store = self._load(version, checkpoint_id, read_only)
        except BaseException:
            self.end_use(close=True)
            raise
        self._active = store
        self._keep_view(store.base_ref)
        store.load_time_ms = int((time.perf_counter() - start) * 1000)
        store.phases = self._phases
        store.phases.snapshots_skipped = self.corrupt_snapshots_skipped - skipped
        return store

    def _load(self, version: int, checkpoint_id: str | None, read_only: bool) -> RocksDBStateStore:
        index = self.index()
        self.note_snapshots(index)
        target = self.resolve(version, checkpoint_id, index)
        if self._active is not None:
            # One local database per partition: as in Spark, opening a version discards a
            # version still open in this provider (its writes were never committed).
            self._active.discard()
        kept_open = self._db is not None
        db, local_ref, num_keys = self._open_local()
        self._db = db  # closed by release() if anything below fails
        if db is not None and local_ref == target:
            copy = self._copy_at(db, target, num_keys, read_only=read_only)
            store = RocksDBStateStore(
                self, target, version, db, num_keys, read_only=read_only, copy=copy
            )
            store.found = None if target is None else "open" if kept_open else "local"
            store.gaps = self.gaps_at(target)
            return store
        self.drop_copy()  # the database moves to another version
        usable = local_ref if db is not None and local_ref and target else None
        if usable is not None and target is not None and usable.version >= target.version:
            usable = None
        started = time.perf_counter()
        plan, restored = (
            self.load(target, index, self._restore, local=usable) if target else (None, None)
        )
        if not (plan is not None and plan.from_local and db is not None):
            if db is not None:
                self._db = None
                db.close()
            if isinstance(restored, _LazyStart):
                self._db = self._lazy_db(restored)
                num_keys = int(restored.manifest.get("num_keys", 0))
                self._stats["restores"] += 1
                self._stats["lazyRestores"] += 1
                self._phases.load_from_snapshot_ms = (time.perf_counter() - started) * 1000
            elif restored is not None:
                manifest, files, scratch = restored
                self._db = self._fresh_db(files, scratch)
                SstMap(self._sst_map_path()).reset(manifest["sst"])
                num_keys = int(manifest.get("num_keys", 0))
                self._stats["restores"] += 1
                self._phases.load_from_snapshot_ms = (time.perf_counter() - started) * 1000
            else:
                self._db = self._fresh_db()
                num_keys = 0
                self._db.apply_batch({}, {"version": 0, "checkpoint_id": None, "num_keys": 0})
        db = self._db
        assert db is not None
        # One changelog at a time, its rows decoded as the WriteBatch takes them; each batch
        # carries its version's marker, so a failure part way leaves the last one applied.
        started = time.perf_counter()
        for ref in plan.changelogs if plan is not None else []:
            num_keys = self._replay(db, ref, num_keys)
            self._phases.changelogs_replayed += 1
        self._phases.replay_changelog_ms = (time.perf_counter() - started) * 1000
        copy = self._copy_at(db, target, num_keys, read_only=read_only)
        store = RocksDBStateStore(
            self, target, version, db, num_keys, read_only=read_only, copy=copy
        )
        from_local = plan is not None and plan.from_local and usable is not None
        if target is not None:
            store.found = "caught_up" if from_local else "restored"
        store.gaps = self.gaps_at(target)
        return store

    def _replay(self, db: LocalDB, ref: VersionRef, num_keys: int) -> int:
        """Apply version ``ref``'s changelog to ``db`` with its marker; returns its key count."""
        changelog = self.read_changelog(ref)
        num_keys = int(changelog.header.get("num_keys", num_keys))
        marker = {"version": ref.version, "checkpoint_id": ref.checkpoint_id, "num_keys": num_keys}
        db.apply_batch(changelog.rows(), marker, delete_ranges=changelog.delete_ranges)
        self._stats["changelogsReplayed"] += 1
        return num_keys

    # --- restoring, whole or lazily ---------------------------------------------------------------

    def _restore(self, ref: VersionRef) -> tuple[dict[str, Any], list[str], str] | _LazyStart:
        """Restore the snapshot ``ref``: lazily (:mod:`.lazy`) where it is large enough, else
        downloaded whole. Either raises CorruptStateFileError for a damaged snapshot."""
        conf, manifest = self.conf, None
        if conf.lazy_restore and ref not in self._not_lazily:
            manifest = read_manifest(self.dir, ref)
            size = sum(int(e["size"]) for e in manifest["sst"].values())
            if size >= conf.lazy_restore_min_mb << 20:
                try:
                    return _LazyStart(ref, manifest, RemoteSnapshot(self.dir, manifest))
                except SstFormatError as exc:
                    log.warning("%s: restoring %s whole, not lazily: %s", self.id, ref, exc)
        return self._download(ref, manifest=manifest)

    def _lazy_db(self, start: _LazyStart) -> LazyDB:
        """A database over the snapshot ``start`` names, its files downloading meanwhile.
        Downloads of lazy restores before it (a process killed part way, a database closed
        before its download was down) are deleted: the partition's lock is held, so none is
        still to be taken."""
        self.local.wipe_db()
        scratch = os.path.dirname(self.local.scratch_path("x"))
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(scratch):
                if name.startswith(_LAZY_DOWNLOAD):
                    shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)
        SstMap(self._sst_map_path()).reset()
        ref, manifest = start.ref, start.manifest
        snapshot_keys = int(manifest.get("num_keys", 0))
        marker = {
            "version": ref.version,
            "checkpoint_id": ref.checkpoint_id,
            "num_keys": snapshot_keys,
        }

        def download() -> tuple[str, list[str]]:
            name = f"{_LAZY_DOWNLOAD}{ref}-{uuid.uuid4().hex}"
            _, files, scratch = self._download(ref, name, manifest)
            return scratch, files

        def replay(db: LocalDB, lineage: Sequence[VersionRef]) -> None:
            SstMap(self._sst_map_path()).reset(manifest["sst"])
            num_keys = snapshot_keys
            for version in lineage:
                num_keys = self._replay(db, version, num_keys)

        self._lazy_counted = 0
        return LazyDB(self.local.db_path, self.db_conf, start.remote, marker, download, replay)

    def _completed(self, db: LocalDB) -> bool:
        """Complete a lazy ``db`` whose download is down; False if that failed (the snapshot is
        then restored whole, and the database is closed)."""
        if not isinstance(db, LazyDB) or not db.lazy:
            return True
        try:
            db.complete()
        except StateStoreError as exc:
            log.warning("%s: lazy restore failed, restoring whole: %s", self.id, exc)
            self._not_lazily.add(db.snapshot)
            with contextlib.suppress(StateStoreError):
                db.close()
            return False
        return True

    # --- the copy in memory ------------------------------------------------------------------

    def _copy_at(
        self, db: LocalDB, ref: VersionRef | None, num_keys: int, *, read_only: bool
    ) -> ValueCopy | None:
        """The copy of ``db`` at ``ref``: the one held if it is of that version, else one read
        from the database for a store that will write, where the state may fit, else None. The
        database's memtable is sized for it (:func:`.options.memtable_bytes`)."""
        copy = self._copy
        if copy is not None and copy.live and copy.ref == ref:
            return copy
        self.drop_copy()
        refused = self._copy_refused_at
        if not read_only and not db.lazy and (refused is None or num_keys * 2 <= refused):
            self._copy = self._read_copy(db, ref, num_keys)
        db.size_memtable(copied=self._copy is not None)
        return self._copy

    def _read_copy(self, db: LocalDB, ref: VersionRef | None, num_keys: int) -> ValueCopy | None:
        # A bounded RocksDB memory (memory_budget_mb, Spark's boundedMemoryUsage) bounds it all.
        limit = 0 if self.conf.memory_budget_mb else self.conf.value_copy_mb
        copy = ValueCopy.of_db(db, ref, num_keys, limit)
        if copy is None and limit > 0:
            self._copy_refused_at = max(0, num_keys)
        return copy

    def applied(
        self,
        ref: VersionRef,
        keys: list[bytes],
        values: list[bytes | None],
        num_keys: int,
        removed: set[bytes] | None = None,
    ) -> None:
        """The database took version ``ref``'s writes (after its range deletions, which
        removed the stored keys ``removed``): so does the copy, while it fits."""
        copy = self._copy
        if copy is not None and copy.live and not copy.apply(ref, keys, values, removed):
            self._copy = None
            self._copy_refused_at = num_keys
            if self._db is not None:
                self._db.size_memtable(copied=False)

    def drop_copy(self) -> None:
        """Give the copy in memory up (its version and the database's may part)."""
        if self._copy is not None:
            self._copy.drop()
            self._copy = None

    def _sst_map_path(self) -> str:
        return os.path.join(self.local.path, "sst_map.json")

    def _download(
        self, ref: VersionRef, name: str = "", manifest: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], list[str], str]:
        """Download a snapshot and check that RocksDB opens it (inside the snapshot-skip loop),
        into the scratch directory ``name``."""
        scratch = self.local.scratch_path(name or f"restore-{ref}")
        manifest, files, nbytes = download_snapshot(self.dir, ref, scratch, manifest)
        self._stats["bytesDownloaded"] += nbytes
        self._stats["filesDownloaded"] += len(manifest["sst"])
        try:
            LocalDB.open_from_files(scratch, files, self.db_conf).close()
        except StateStoreError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            msg = f"corrupt state file {self.dir.where(file_name(ref, 'snapshot'))}: {exc}"
            raise CorruptStateFileError(msg) from exc
        # Opening wrote a new MANIFEST and CURRENT: the directory's listing is the file set now.
        return manifest, sorted(os.listdir(scratch)), scratch

    def get_store(self, version: int, checkpoint_id: str | None = None) -> RocksDBStateStore:
        return self._open(version, checkpoint_id, read_only=False)

    def get_read_store(self, version: int, checkpoint_id: str | None = None) -> RocksDBStateStore:
        return self._open(version, checkpoint_id, read_only=True)

    # --- commit, snapshots -----------------------------------------------------------------------

    def after_commit(self, store: RocksDBStateStore, ref: VersionRef) -> None:
        """Take a local checkpoint when a snapshot is due, capture metrics, end the store's
        use."""
        if self._snapshot_due(ref) and self._whole():
            flush_ms, checkpoint_ms = self._take_local_checkpoint(ref)
            store.phases.flush_ms, store.phases.checkpoint_ms = flush_ms, checkpoint_ms
        self._keep_view(ref)
        store.capture_final_metrics()
        self.end_use()

    # --- live reads (ReadsLive) -----------------------------------------------------------------

    def live_versions(self) -> list[int]:
        db = self._db
        return [] if db is None else db.view_versions()

    def live_get(
        self, version: int, keys: Sequence[bytes]
    ) -> tuple[str | None, list[bytes | None]] | None:
        db = self._db
        found = None if db is None else db.view_get(version, keys)
        return None if found is None else (found[0].checkpoint_id, found[1])

    def live_scan(
        self, version: int, start: bytes, end: bytes, limit: int
    ) -> tuple[str | None, list[tuple[bytes, bytes]]] | None:
        db = self._db
        found = None if db is None else db.view_scan(version, start, end, limit)
        return None if found is None else (found[0].checkpoint_id, found[1])

    def _keep_view(self, ref: VersionRef | None) -> None:
        """Pin the database, at ``ref`` now, for live reads."""
        if ref is not None and self._db is not None and not self._db.closed:
            self._db.keep_view(ref.version, ref)

    def snapshot_now(self) -> bool:
        """A local checkpoint of the newest committed version, if its database is open here at
        that version and no snapshot of it exists (stored or pending), then uploaded."""
        latest = self._last_ref
        with self._mutex:
            if latest is None or self._db is None or self._in_use or not self._whole():
                return False
            marker = self._db.read_marker() or {}
            current = marker.get("version") == latest.version
            if not current or marker.get("checkpoint_id") != latest.checkpoint_id:
                return False
            pending = {self._parse_pending(n)[0] for n in self._pending_snapshots()}
            if latest not in pending and not self.index().has(latest, "snapshot"):
                self._take_local_checkpoint(latest)
        before = self._stats["filesUploaded"] + self._stats["filesReused"]
        self._maybe_snapshot(self.index())
        return self._stats["filesUploaded"] + self._stats["filesReused"] > before

    def _whole(self) -> bool:
        """Whether the database holds its whole state, to snapshot: a lazy one is completed
        first if its download is down (a snapshot is not worth waiting for it)."""
        db = self._db
        if isinstance(db, LazyDB) and db.lazy:
            return db.downloaded and self._completed(db)
        return db is not None

    def _take_local_checkpoint(self, ref: VersionRef) -> tuple[float, float]:
        """A local checkpoint of the open database at ``ref``, for maintenance to upload: made
        under a private name and renamed to ``pending-...`` once complete, so that maintenance
        in another process only ever claims whole ones. Returns the flush's and the
        checkpoint's milliseconds."""
        assert self._db is not None
        incarnation = SstMap(self._sst_map_path()).incarnation
        creating = self.local.scratch_path(f"creating-{os.getpid()}-{ref}")
        shutil.rmtree(creating, ignore_errors=True)
        started = time.perf_counter()
        self._db.flush()
        flushed = time.perf_counter()
        self._db.create_checkpoint(creating)
        done = time.perf_counter()
        os.rename(creating, self.local.scratch_path(f"pending-{ref}@{incarnation}"))
        return (flushed - started) * 1000, (done - flushed) * 1000

    def _snapshot_due(self, ref: VersionRef) -> bool:
        """Whether no snapshot (uploaded or pending) exists among ``ref``'s recent ancestors."""
        index = self.index()
        pending = {self._parse_pending(n)[0] for n in self._pending_snapshots()}
        cur: VersionRef | None = ref
        try:
            while cur is not None and ref.version - cur.version < self.conf.min_deltas_for_snapshot:
                if cur in pending or index.has(cur, "snapshot"):
                    return False
                cur = self._parent(cur)
        except StateStoreError:
            return True
        return cur is not None or ref.version >= self.conf.min_deltas_for_snapshot

    @staticmethod
    def _parse_pending(name: str) -> tuple[VersionRef, str]:
        body, _, incarnation = name.removeprefix("pending-").partition("@")
        version, ckpt = body.split("_")
        return VersionRef(int(version), ckpt), incarnation

    def _pending_snapshots(self) -> list[str]:
        scratch = os.path.dirname(self.local.scratch_path("x"))
        try:
            return sorted(n for n in os.listdir(scratch) if n.startswith("pending-"))
        except FileNotFoundError:
            return []

    def _maybe_snapshot(self, index: VersionIndex) -> None:
        """Upload local checkpoints taken at commit (claimed by rename, so one process does it)."""
        for name in self._pending_snapshots():
            src = self.local.scratch_path(name)
            claimed = self.local.scratch_path(f"uploading-{os.getpid()}-{name}")
            try:
                os.rename(src, claimed)
            except OSError:
                continue
            try:
                ref, incarnation = self._parse_pending(name)
                files = sorted(os.listdir(claimed))
                sst_map = SstMap(self._sst_map_path())
                extra = {"num_keys": self._num_keys_of(ref)}
                up, reused, nbytes = upload_snapshot(
                    self.dir,
                    ref,
                    claimed,
                    files,
                    sst_map,
                    incarnation,
                    extra,
                    self.conf.compression,
                )
                self._stats["filesUploaded"] += up
                self._stats["filesReused"] += reused
                self._stats["bytesUploaded"] += nbytes
            finally:
                shutil.rmtree(claimed, ignore_errors=True)

    def _num_keys_of(self, ref: VersionRef) -> int:
        try:
            return int(self.read_changelog(ref).header.get("num_keys", 0))
        except StateStoreError:
            return 0

    def _delete_orphans(self, index: VersionIndex, oldest_kept: int) -> None:
        referenced: set[str] = set()
        for ref in index.refs("snapshot"):
            if ref.version >= oldest_kept:
                with contextlib.suppress(StateStoreError):
                    referenced.update(
                        e["object"] for e in read_manifest(self.dir, ref)["sst"].values()
                    )
        now = time.time()
        sst_dir = self.dir.child(SST_DIR)
        for entry in sst_dir.list():
            if entry.name not in referenced and now - entry.mtime_s > self.orphan_grace_s:
                sst_dir.delete(entry.name)

    def _shared_files(self) -> list[FileEntry]:
        return self.dir.child(SST_DIR).list()

    def _snapshot_rows(self, ref: VersionRef) -> int | None:
        manifest = read_manifest(self.dir, ref)
        return int(manifest["num_keys"]) if "num_keys" in manifest else None

    # --- metrics ---------------------------------------------------------------------------------

    def memory_used_bytes(self, db: LocalDB) -> int:
        """RocksDB's memory for this store, as Spark's ``memoryUsedBytes``: its memtables and
        table readers, and its share of the blocks in the cache that the process's databases
        share (Spark divides a shared cache among the instances of an executor)."""
        stats = db.memory_stats()
        own = stats["all_memtables_bytes"] + stats["table_readers_bytes"]
        copy = self._copy.nbytes if self._copy is not None else 0
        return own + stats["share_cached_blocks_bytes"] + copy

    def custom_metrics(self) -> dict[str, float]:
        """Work counters since this provider was created (restores, uploads, ...)."""
        return {k: float(v) for k, v in self._stats.items()}

    def counters_since_report(self, *, take: bool) -> dict[str, float]:
        """Work counters (restores, uploads, ...) since a committed store last reported them.

        Each commit reports what happened since the previous one, so progress shows per-batch
        numbers; background maintenance work shows up in the next batch.
        """
        db = self._db
        if isinstance(db, LazyDB):
            fetched = db.bytes_fetched
            self._stats["lazyBytesRead"] += fetched - self._lazy_counted
            self._lazy_counted = fetched
        delta = {k: float(v - self._reported.get(k, 0)) for k, v in self._stats.items()}
        if take:
            self._reported = dict(self._stats)
        return delta

    @classmethod
    def supported_custom_metrics(cls) -> list[str]:
        return [
            *STAT_NAMES.values(),
            "filesUploaded",
            "filesReused",
            "bytesUploaded",
            "bytesDownloaded",
            "filesDownloaded",
            "changelogsReplayed",
            "restores",
            "changelogBytesWritten",
            "corruptSnapshotsSkipped",
            "localOpens",
            "lazyRestores",
            "lazyBytesRead",
            *ROCKSDB_METRICS,
            *FOUND_METRICS.values(),
        ]

    def close(self) -> None:
        self.release()


@dataclasses.dataclass(frozen=True)
class _LazyStart:
    """A snapshot to restore lazily: its manifest and its files read from durable storage."""

    ref: VersionRef
    manifest: dict[str, Any]
    remote: RemoteState
