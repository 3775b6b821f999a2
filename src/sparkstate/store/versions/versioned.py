"""What both built-in providers share: durable layout, schema check, changelogs, lineage, retention.

A subclass says how it holds state in the worker and how it writes and reads a snapshot; this base
owns which files exist, which of them a version needs, and which can go. Because it knows them, it
gives readers the capabilities of :mod:`.capabilities`: a version's changes, what the files are,
a version written from rows.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from sparkstate.exceptions import (
    ConfigurationError,
    CorruptStateFileError,
    MissingVersionError,
    StateFileError,
)
from sparkstate.files.durable import TMP_PREFIX, DurableDir, FileEntry
from sparkstate.store.base import DEFAULT_CF, StateStoreProvider, StoreConf, StoreId
from sparkstate.store.capabilities import (
    Changes,
    DescribesFiles,
    FileGroup,
    ReadsChanges,
    ReadsLive,
    SnapshotsNow,
    StoredFiles,
    WritesVersions,
)
from sparkstate.store.evolution import value_codec_for
from sparkstate.store.families import ColumnFamily
from sparkstate.store.schema_file import schema_description, write_rescaled_schema
from sparkstate.store.spark_metrics import SNAPSHOT_LAST_UPLOADED, instance_metric
from sparkstate.store.versions.changelog import ChangelogReader, encode_changelog, ranges_field
from sparkstate.store.versions.layout import (
    VersionIndex,
    VersionRef,
    check_schema_file,
    file_name,
    new_checkpoint_id,
)
from sparkstate.store.versions.lineage import LoadPlan, plan_load

__all__ = ["VersionedProvider"]

log = logging.getLogger("sparkstate.store")
T = TypeVar("T")

#: Temporary files older than this are leftovers of a crashed writer and are deleted.
STALE_TMP_S = 3600.0


class VersionedProvider(
    StateStoreProvider, ReadsChanges, DescribesFiles, WritesVersions, SnapshotsNow, ReadsLive
):
    """Base of providers that write one changelog per version and snapshots every N versions."""

    delta_ext: ClassVar[str]
    delta_kind: ClassVar[bytes]
    #: Whether a changelog's header records the version's row count (``num_keys``).
    records_rows: ClassVar[bool] = False

    def init(
        self,
        store_id: StoreId,
        key_schema: pa.Schema,
        value_schema: pa.Schema,
        conf: StoreConf | None = None,
        column_families: dict[str, tuple[pa.Schema, pa.Schema]] | None = None,
    ) -> None:
        if not key_schema:
            msg = f"{store_id}: the key schema needs at least one column"
            raise ConfigurationError(msg)
        self.id = store_id
        self.conf = conf or StoreConf()
        specs = {DEFAULT_CF: (key_schema, value_schema), **(column_families or {})}
        self.families = {n: ColumnFamily(n, k, v) for n, (k, v) in specs.items()}
        self.dir = DurableDir(store_id.checkpoint_root).child(store_id.relative_dir)
        self._check_schema()
        self.where = str(store_id)
        self._last_ref: VersionRef | None = None
        self.corrupt_snapshots_skipped = 0
        self._parents: dict[VersionRef, VersionRef | None] = {}
        #: The newest snapshot version seen on durable storage (-1: none yet).
        self.last_snapshot_version = -1
        #: The empty key ranges of the last version a store of this provider committed
        #: (:meth:`StateStore.mark_removed`), for the store that opens it next.
        self._gaps: tuple[VersionRef, dict[str, dict[bytes, bytes]]] | None = None

    def keep_gaps(self, ref: VersionRef, gaps: dict[str, dict[bytes, bytes]]) -> None:
        """What a store committing ``ref`` knew to be empty."""
        self._gaps = (ref, gaps) if gaps else None

    def gaps_at(self, ref: VersionRef | None) -> dict[str, dict[bytes, bytes]]:
        """The empty ranges known of version ``ref`` (a copy: a store narrows its own)."""
        if self._gaps is None or ref is None or self._gaps[0] != ref:
            return {}
        return {cf: dict(ranges) for cf, ranges in self._gaps[1].items()}

    def _check_schema(self) -> None:
        specs = {n: (f.key_schema, f.value_schema) for n, f in self.families.items()}
        expected = schema_description(self.name, specs, self.conf.num_partitions)
        widening = self.conf.value_widening
        evolved = check_schema_file(self.dir, expected, str(self.id), widening=widening)
        for name, (history, schema_id) in evolved.items():
            self.families[name].value_codec = value_codec_for(history, schema_id)

    def register_column_family(
        self, name: str, key_schema: pa.Schema, value_schema: pa.Schema
    ) -> None:
        """Add a column family (recorded in ``_schema.json``; an incompatible change fails)."""
        fam = self.families.get(name)
        if fam is not None and fam.key_schema == key_schema and fam.value_schema == value_schema:
            return
        self.families[name] = ColumnFamily(name, key_schema, value_schema)
        self._check_schema()

    # --- versions --------------------------------------------------------------------------------

    def index(self) -> VersionIndex:
        return VersionIndex.scan(self.dir)

    def note_snapshots(self, index: VersionIndex) -> None:
        """Remember the newest snapshot of ``index`` (loads and maintenance list the files)."""
        newest = max((r.version for r in index.refs("snapshot")), default=-1)
        self.last_snapshot_version = max(self.last_snapshot_version, newest)

    def snapshot_metrics(self) -> dict[str, float]:
        """Spark's instance metric of the newest snapshot version, for this partition."""
        name = instance_metric(SNAPSHOT_LAST_UPLOADED, self.id.partition_id, self.id.store_name)
        return {name: float(self.last_snapshot_version)}

    @classmethod
    def supported_instance_metrics(cls) -> list[str]:
        return [SNAPSHOT_LAST_UPLOADED]

    def latest_version(self) -> int:
        idx = self.index()
        refs = idx.refs(self.delta_ext) + idx.refs("snapshot")
        return max((r.version for r in refs), default=0)

    def last_checkpoint_id(self) -> str | None:
        return None if self._last_ref is None else self._last_ref.checkpoint_id

    def resolve(
        self, version: int, checkpoint_id: str | None, index: VersionIndex
    ) -> VersionRef | None:
        """The attempt to load for ``version`` (None for the empty version 0)."""
        if version < 0:
            msg = f"{self.id}: version must be >= 0, got {version}"
            raise ValueError(msg)
        if version == 0:
            return None
        return index.resolve(version, checkpoint_id, self.delta_ext, self.where)

    def write_changelog(
        self,
        ref: VersionRef,
        parent: VersionRef | None,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        extra: dict[str, Any] | None = None,
        *,
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> int:
        """Write the changelog of ``ref`` (``extra`` goes into its header): the key ranges it
        removed, then its rows. Returns its size."""
        header: dict[str, Any] = {
            **(extra or {}),
            **ranges_field(delete_ranges),
            "version": ref.version,
            "checkpoint_id": ref.checkpoint_id,
            "parent": None if parent is None else [parent.version, parent.checkpoint_id],
            "count": len(keys),
        }
        data = encode_changelog(self.delta_kind, header, keys, values, self.conf.compression)
        self.dir.write_atomic(file_name(ref, self.delta_ext), data)
        self._last_ref = ref
        self._parents[ref] = parent
        return len(data)

    def read_changelog(self, ref: VersionRef) -> ChangelogReader:
        """The changelog of ``ref``, its frame and header checked; its rows are decoded as they
        are read, so a replay holds one changelog, a chunk of it decoded, at a time."""
        name = file_name(ref, self.delta_ext)
        return ChangelogReader(self.delta_kind, self.dir.read(name), self.dir.where(name))

    # --- capabilities ----------------------------------------------------------------------------

    def read_changes(
        self,
        version: int,
        checkpoint_id: str | None,
        cf: str = DEFAULT_CF,
        chunk_rows: int = 65536,
    ) -> Iterator[Changes]:
        ref = self.resolve(version, checkpoint_id, self.index())
        if ref is None:  # version 0 is made by no changes
            return iter(())
        log = self.read_changelog(ref)
        fam = self.families[cf]
        lo, hi = fam.prefix, fam.end_of_family()
        ranges = [(max(a, lo), min(b, hi)) for a, b in log.delete_ranges if a < hi and lo < b]
        if not ranges:
            return _family_changes(log, fam.prefix, chunk_rows)
        parent = log.parent
        return self._changes_with_ranges(
            log, None if parent is None else VersionRef(*parent), fam, ranges, chunk_rows
        )

    def _changes_with_ranges(
        self,
        log: ChangelogReader,
        parent: VersionRef | None,
        fam: ColumnFamily,
        ranges: list[tuple[bytes, bytes]],
        chunk_rows: int,
    ) -> Iterator[Changes]:
        """A family's changes where the version removed key ranges: its rows, then a delete of
        each key the ranges removed, read from the version before (``parent``) and each once
        (a key written again after the range's removal is one of the rows)."""
        written: set[bytes] = set()
        for keys, values in _family_changes(log, fam.prefix, chunk_rows):
            written.update(keys)
            yield keys, values
        if parent is None:  # the empty version: the ranges removed nothing
            return
        cut = len(fam.prefix)
        store = self.get_read_store(parent.version, parent.checkpoint_id)
        try:
            for lo, hi in ranges:
                for found, _ in store.raw_scan_chunks(lo, hi, cut, chunk_rows):
                    gone = [k for k in found if k not in written]
                    written.update(gone)
                    if gone:
                        yield gone, [None] * len(gone)
        finally:
            store.abort()

    def describe_files(self) -> StoredFiles:
        index = self.index()
        by_ext: dict[str, list[FileEntry]] = {}
        for exts in index.files.values():
            for ext, entry in exts.items():
                by_ext.setdefault(ext, []).append(entry)
        return StoredFiles(
            versions=sorted({ref.version for ref in index.files}),
            changelogs=FileGroup.of(by_ext.get(self.delta_ext, [])),
            snapshots=FileGroup.of(by_ext.get("snapshot", [])),
            shared=FileGroup.of(self._shared_files()),
        )

    def _shared_files(self) -> list[FileEntry]:
        """Hook: files shared between versions (rocksdb: SST files)."""
        return []

    def recorded_rows(self, version: int, checkpoint_id: str | None) -> int | None:
        if not self.records_rows:
            return None
        index = self.index()
        ref = self.resolve(version, checkpoint_id, index)
        if ref is None:
            return 0
        if index.has(ref, self.delta_ext):
            header = self.read_changelog(ref).header
            if "num_keys" in header:
                return int(header["num_keys"])
        if index.has(ref, "snapshot"):
            return self._snapshot_rows(ref)
        return None

    def _snapshot_rows(self, ref: VersionRef) -> int | None:
        """Hook: the row count the snapshot of ``ref`` records (None: none)."""
        return None

    @classmethod
    def admit_partition_count(
        cls, store_id: StoreId, record: dict[str, Any], counts: list[int], num_partitions: int
    ) -> None:
        directory = DurableDir(store_id.checkpoint_root).child(store_id.relative_dir)
        write_rescaled_schema(directory, record, counts, num_partitions)

    def write_version(self, version: int, keys: Any, values: Any) -> str:
        ref = VersionRef(version, new_checkpoint_id())
        self.write_changelog(ref, None, keys, values, {"num_keys": len(keys)})
        return ref.checkpoint_id

    def load(
        self,
        target: VersionRef | None,
        index: VersionIndex,
        load_snapshot: Callable[[VersionRef], T],
        local: VersionRef | None = None,
    ) -> tuple[LoadPlan, T | None]:
        """Plan a load and read its snapshot; a corrupt snapshot is skipped for an older base.

        Every changelog the plan names is read and checked here (lineage, frame, checksum), so
        a missing or damaged one fails the load before anything is applied; the provider then
        reads them again, one at a time, as it replays them.
        """
        skip: set[VersionRef] = set()
        causes: list[str] = []
        checked: dict[VersionRef, VersionRef | None] = {}

        def parent_of(ref: VersionRef) -> VersionRef | None:
            if ref not in checked:  # read once per load, whatever snapshots are skipped
                parent = self.read_changelog(ref).parent
                checked[ref] = self._parents[ref] = None if parent is None else VersionRef(*parent)
            return checked[ref]

        while True:
            try:
                plan = plan_load(
                    target,
                    index,
                    self.delta_ext,
                    parent_of,
                    local=local,
                    skip_snapshots=frozenset(skip),
                    where=self.where,
                )
            except MissingVersionError as exc:
                if not causes:
                    raise
                msg = (
                    f"{self.where}: cannot load version {target}: no usable snapshot is left. "
                    f"Damaged: {'; '.join(causes)}. Then: {exc}"
                )
                raise CorruptStateFileError(msg) from exc
            if plan.snapshot is None:
                return plan, None
            try:
                return plan, load_snapshot(plan.snapshot)
            except CorruptStateFileError as exc:
                skip.add(plan.snapshot)
                causes.append(str(exc))
                self.corrupt_snapshots_skipped += 1
                log.warning("%s: skipping corrupt snapshot %s: %s", self.where, plan.snapshot, exc)

    # --- maintenance -----------------------------------------------------------------------------

    @abstractmethod
    def _maybe_snapshot(self, index: VersionIndex) -> None:
        """Write a snapshot of the newest version if enough changelogs piled up since the last."""

    def _delete_orphans(self, index: VersionIndex, oldest_kept: int) -> None:
        """Hook: delete provider-specific orphans (rocksdb: unreferenced SST files)."""

    def do_maintenance(self) -> None:
        index = self.index()
        self._maybe_snapshot(index)
        after = self.index()
        self.note_snapshots(after)
        self.cleanup(after)

    def _parent(self, ref: VersionRef) -> VersionRef | None:
        """The attempt ``ref`` was committed on top of (cached: changelogs are immutable)."""
        if ref not in self._parents:
            parent = self.read_changelog(ref).parent
            self._parents[ref] = None if parent is None else VersionRef(*parent)
        return self._parents[ref]

    def _retention_base(self, index: VersionIndex) -> VersionRef | None:
        """The newest snapshot on the live lineage at or below the oldest version to retain."""
        # Only the instance that committed knows the live lineage: the newest attempt on storage
        # may be an abandoned one (a restart from an older version), so without a commit of its
        # own, an instance deletes nothing.
        latest = self._last_ref
        if latest is None:
            return None
        min_keep = latest.version - self.conf.min_versions_to_retain + 1
        cur: VersionRef | None = latest
        try:
            while cur is not None and (cur.version > min_keep or not index.has(cur, "snapshot")):
                if not index.has(cur, self.delta_ext):
                    return None
                cur = self._parent(cur)
        except StateFileError as exc:
            log.warning("%s: retention skipped, lineage unreadable: %s", self.where, exc)
            return None
        return cur

    def cleanup(self, index: VersionIndex) -> list[str]:
        """Delete versions older than ``min_versions_to_retain`` and stale temporary files.

        Files older than the newest snapshot that the live lineage (the newest attempt's chain of
        parents) can load from are deleted, whatever attempt wrote them.
        """
        deleted: list[str] = []
        base = self._retention_base(index)
        if base is not None:
            for ref, exts in index.files.items():
                if ref.version < base.version:
                    for ext in exts:
                        name = file_name(ref, ext)
                        self.dir.delete(name)
                        deleted.append(name)
                    self._parents.pop(ref, None)
            self._delete_orphans(index, base.version)
        now = time.time()
        for entry in self.dir.list(include_tmp=True):
            if entry.name.startswith(TMP_PREFIX) and now - entry.mtime_s > STALE_TMP_S:
                self.dir.delete(entry.name)
                deleted.append(entry.name)
        return deleted


def _family_changes(log: ChangelogReader, prefix: bytes, chunk_rows: int) -> Iterator[Changes]:
    """The changes of one family in a changelog, its prefix cut off, a chunk at a time."""
    cut = len(prefix)
    for keys, values in log.chunks(chunk_rows):
        mine = [i for i, key in enumerate(keys) if key.startswith(prefix)]
        if mine:
            yield [keys[i][cut:] for i in mine], [values[i] for i in mine]
