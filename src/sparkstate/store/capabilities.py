"""What only some providers can do: capabilities a caller asks a provider for.

The contract (:mod:`.base`) is what every provider does. Readers of stored state need more:
the changes each version made (the state reader's change feed), what files a store keeps and
the row count they record (``sparkstate inspect``), a version written from rows (a rescale). A
provider that can inherits the capability's class; a caller asks with
``Capability.of(provider)`` (None when the provider cannot) or
``Capability.require(provider, purpose)`` (an error that names the provider), as Spark's state
reader asks a provider for ``SupportsFineGrainedReplay``. Callers never branch on a provider's
name nor read its files: the file formats stay with the provider.

Both built-in providers have every capability (:class:`~.versioned.VersionedProvider`).
:func:`provider_over_files` binds a provider to a store's durable files alone, for readers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Self

from sparkstate.exceptions import ConfigurationError
from sparkstate.files.durable import DurableDir, FileEntry
from sparkstate.store.base import DEFAULT_CF, StateStoreProvider
from sparkstate.store.conf import StoreConf, StoreId
from sparkstate.store.families import ColumnFamily
from sparkstate.store.registry import provider_class, provider_name
from sparkstate.store.schema_file import SCHEMA_FILE, read_schema_file

__all__ = [
    "Capability",
    "Changes",
    "DescribesFiles",
    "FileGroup",
    "ReadsChanges",
    "ReadsLive",
    "StoredFiles",
    "SnapshotsNow",
    "WritesVersions",
    "provider_over_files",
    "shares_files",
]

#: One chunk of a version's changes: encoded keys, and their encoded values (None: removed).
Changes = tuple[list[bytes], list[bytes | None]]


class Capability(ABC):
    """A capability a provider may have: a provider class inherits it, a caller asks for it."""

    #: What the capability does, for the error of a provider without it.
    action: ClassVar[str]

    @classmethod
    def of(cls, provider: StateStoreProvider) -> Self | None:
        """``provider`` as this capability when it has it, else None."""
        return provider if isinstance(provider, cls) else None

    @classmethod
    def require_class(cls, provider: type[StateStoreProvider], purpose: str) -> type[Self]:
        """The provider class ``provider`` as this capability's; the error of :meth:`require`
        when it has not."""
        if not issubclass(provider, cls):
            name = provider_name(provider)
            msg = f"state store provider {name!r} cannot {cls.action}: {purpose}"
            raise ConfigurationError(msg)
        return provider

    @classmethod
    def require(cls, provider: StateStoreProvider, purpose: str) -> Self:
        """``provider`` as this capability; an error naming the provider and ``purpose`` (what
        needs the capability) when it has not."""
        found = cls.of(provider)
        if found is None:
            name = provider_name(type(provider))
            msg = f"state store provider {name!r} cannot {cls.action}: {purpose}"
            raise ConfigurationError(msg)
        return found


class SnapshotsNow(Capability):
    """Writes a snapshot of the newest version it committed, where none exists yet: a query
    that stops cleanly leaves each partition one snapshot to restore and nothing to replay."""

    action = "write a snapshot on demand"

    @abstractmethod
    def snapshot_now(self) -> bool:
        """Snapshot the newest version this provider committed (still open in it) unless one
        is stored already; whether one was written."""


class ReadsLive(Capability):
    """Answers reads of its newest committed versions while a query runs, from another thread
    than the task's and without the partition's lock: a read sees one committed version whole,
    never a version being written, and never holds a commit up for longer than a point read."""

    action = "serve reads of a running query's state"

    @abstractmethod
    def live_versions(self) -> list[int]:
        """The committed versions it can answer for now, oldest first (none: it holds none)."""

    @abstractmethod
    def live_get(
        self, version: int, keys: Sequence[bytes]
    ) -> tuple[str | None, list[bytes | None]] | None:
        """The checkpoint id of ``version`` and the values of the physical ``keys`` in it
        (None where absent); None if it does not hold that version."""

    @abstractmethod
    def live_scan(
        self, version: int, start: bytes, end: bytes, limit: int
    ) -> tuple[str | None, list[tuple[bytes, bytes]]] | None:
        """The checkpoint id of ``version`` and at most ``limit`` of its pairs with physical
        keys from ``start`` up to ``end`` (exclusive), ascending; None if it does not hold
        that version."""


class ReadsChanges(Capability):
    """Reads the changes that made a version, as the provider recorded them at its commit."""

    action = "read a version's changes"

    #: The store's column families (codecs included), as the provider was bound to them.
    families: dict[str, ColumnFamily]

    @abstractmethod
    def read_changes(
        self,
        version: int,
        checkpoint_id: str | None,
        cf: str = DEFAULT_CF,
        chunk_rows: int = 65536,
    ) -> Iterator[Changes]:
        """The writes of family ``cf`` that made ``version`` from the version before it (the
        attempt ``checkpoint_id``; None: the newest), in chunks of at most ``chunk_rows``. The
        version is found and its record checked before this returns: a version that is gone
        raises :class:`~sparkstate.exceptions.MissingVersionError` here."""


@dataclasses.dataclass(frozen=True)
class FileGroup:
    """A number of files and their bytes."""

    files: int = 0
    bytes: int = 0

    @classmethod
    def of(cls, entries: Sequence[FileEntry]) -> FileGroup:
        return cls(len(entries), sum(e.size for e in entries))


@dataclasses.dataclass(frozen=True)
class StoredFiles:
    """The durable files of one store: its versions, and its files by role."""

    #: Every version some file is kept for, ascending.
    versions: list[int] = dataclasses.field(default_factory=list)
    #: One per committed version (rocksdb: ``.changelog``, memory: ``.delta``).
    changelogs: FileGroup = FileGroup()
    snapshots: FileGroup = FileGroup()
    #: Files shared between versions (rocksdb: the SST files its snapshots name).
    shared: FileGroup = FileGroup()


class DescribesFiles(Capability):
    """Describes a store's durable files, and the row count they record for a version."""

    action = "describe its files"
    #: Whether the provider keeps files shared between versions (``StoredFiles.shared``).
    shares_files: ClassVar[bool] = False

    @abstractmethod
    def describe_files(self) -> StoredFiles:
        """The store's versions and files on durable storage."""

    @abstractmethod
    def recorded_rows(self, version: int, checkpoint_id: str | None) -> int | None:
        """The rows of ``version`` (the attempt ``checkpoint_id``; None: the newest) that its
        files record, the count the query reported: -1 when the query did not count them,
        None when its files record no count (then the state must be loaded to count)."""


class WritesVersions(Capability):
    """Writes a version from rows, with no parent: what a rescale puts in a new partition."""

    action = "write a version from rows"

    @classmethod
    @abstractmethod
    def admit_partition_count(
        cls, store_id: StoreId, record: dict[str, Any], counts: list[int], num_partitions: int
    ) -> None:
        """Let the store of ``store_id`` open with ``num_partitions`` partitions as well as with
        ``counts``, before a version is written there from rows: its ``_schema.json`` written
        from ``record`` with the counts recorded. A rescale writes a new lineage there (``record``
        is the old partitions' merged, ``counts`` their count); a take-over or a migration
        writes a store's first version (``counts`` empty)."""

    @abstractmethod
    def write_version(self, version: int, keys: Any, values: Any) -> str:
        """Write ``version`` holding exactly ``keys`` (physical keys, as the store's raw scans
        give them, ascending, each once) and their ``values``, from nothing, under a fresh
        checkpoint id, which it returns. Keys and values: sequences or Arrow binary arrays."""


def shares_files(provider: str) -> bool:
    """Whether the provider named ``provider`` keeps files shared between versions, whether or
    not a store has any yet (so a listing can show their column)."""
    cls = provider_class(provider)
    return issubclass(cls, DescribesFiles) and cls.shares_files


@contextlib.contextmanager
def provider_over_files(
    provider: str, store_id: StoreId, *, keep_open: bool = False
) -> Iterator[StateStoreProvider | None]:
    """A provider (by name or class path) bound to the durable files of ``store_id`` alone,
    with a scratch local directory of its own, for any partition count the store was written
    for; None when the store has no ``_schema.json`` (it never ran). ``keep_open``: its local
    copy stays open between loads (a reader that follows later versions catches up on it; a
    lazy restore's copy, closed, is restored again)."""
    directory = DurableDir(store_id.checkpoint_root).child(store_id.relative_dir)
    if not directory.exists(SCHEMA_FILE):
        yield None
        return
    families = read_schema_file(directory)
    bound = provider_class(provider)()
    scratch = tempfile.mkdtemp(prefix="sparkstate-reader-")
    conf = StoreConf(
        local_dir=scratch,
        keep_local_open=keep_open,
        num_partitions=None,  # any count the store was written for: batches before a rescale
        block_cache_mb=32,
        write_buffer_mb=16,
    )
    key, value = families.pop(DEFAULT_CF)
    try:
        bound.init(store_id, key, value, conf, families)
        yield bound
    finally:
        bound.close()
        shutil.rmtree(scratch, ignore_errors=True)
