"""The state store contract: a versioned, partitioned key-value store of typed rows.

A provider owns the durable files of one store (one operator partition); a store is one version
of it, opened for reading and writing by one task. Batch ``b`` opens version ``b`` and commits
``b + 1``.

Providers implement a small byte-level core (``raw_*`` methods over *physical keys*, which are an
encoded column-family prefix followed by the order-preserving key encoding) plus ``_commit`` and
``_abort`` (and, where a version holds something of its provider, ``_release``). Everything typed
(schemas, codecs, column families, batch calls over Arrow) and a store's life (one
:class:`StoreStatus`) live here, once, for every provider. Operators that encode keys and values
in bulk themselves use the ``*_encoded*`` methods: a family's encoded keys in and out, the family
prefix added here, so the physical key layout is known to this package alone.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import ClassVar

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError, StoreClosedError
from sparkstate.store.conf import DEFAULT_CF, StoreConf, StoreId, default_local_dir
from sparkstate.store.families import ColumnFamily, KeyRows, Row, key_successor

__all__ = [
    "DEFAULT_CF",
    "FOUND_METRICS",
    "StateStore",
    "StateStoreProvider",
    "StoreConf",
    "StoreId",
    "StoreMetrics",
    "StoreStatus",
    "default_local_dir",
]


@dataclasses.dataclass
class StoreMetrics:
    """What one store did in one version, in the names of Spark's ``stateOperators`` progress."""

    num_keys: int = 0
    num_updated: int = 0
    num_removed: int = 0
    memory_used_bytes: int = 0
    commit_time_ms: int = 0
    load_time_ms: int = 0
    custom: dict[str, float] = dataclasses.field(default_factory=dict)


class StoreStatus(enum.Enum):
    """Where a store is in its life: ``UPDATING`` from its opening until ``COMMITTED`` or
    ``ABORTED``, both final (Spark's ``UPDATING`` / ``COMMITTED`` / ``ABORTED``)."""

    UPDATING = "updating"
    COMMITTED = "committed"
    ABORTED = "aborted"


class StateStore(ABC):
    """One version of a store, opened by one task. Commit or abort ends it.

    Reads see the writes made earlier in the same version. Range scans are ordered by key value
    (the key codec preserves order). The store's life is one :class:`StoreStatus`, checked on
    every call of the typed API: ``UPDATING`` until ``commit()`` makes it ``COMMITTED`` or
    ``abort()`` (or a provider's ``discard()``) makes it ``ABORTED``; after that it cannot be used.
    """

    def __init__(
        self, store_id: StoreId, version: int, families: dict[str, ColumnFamily], *, read_only: bool
    ) -> None:
        self.id = store_id
        self.version = version
        self._families = families
        self._read_only = read_only
        self._status = StoreStatus.UPDATING
        self._num_updated = 0
        self._num_removed = 0
        #: The last multi-get of a writable store: (family, copy of its encoded keys, physical
        #: keys). A write of the same keys next (a read-modify-write) reuses the physical keys.
        self._last_read: tuple[str, list[bytes], list[bytes]] | None = None
        #: Set by ``commit()``: the checkpoint id of the committed version ``version + 1``.
        self.checkpoint_id: str | None = None
        #: Providers set the load time; ``commit()`` measures the commit time.
        self.load_time_ms = 0
        self.commit_time_ms = 0
        #: Where the provider found this version (:data:`FOUND_METRICS`); None: not said.
        self.found: str | None = None
        #: Ranges of physical keys known to hold no key, per family: ``{start: end}``
        #: (:meth:`mark_removed`); the provider hands them from one version to the next.
        self.gaps: dict[str, dict[bytes, bytes]] = {}

    # --- provider core -------------------------------------------------------------------------

    @abstractmethod
    def raw_get(self, key: bytes) -> bytes | None: ...

    def raw_get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self.raw_get(k) for k in keys]

    @abstractmethod
    def raw_put(self, key: bytes, value: bytes) -> None: ...

    def raw_put_many(
        self, keys: Sequence[bytes], values: Sequence[bytes], *, family: bytes | None = None
    ) -> None:
        """``raw_put`` of each pair; ``family``: the column family prefix every key has, where
        the caller knows it (None: the keys may be of several families)."""
        for k, v in zip(keys, values, strict=True):
            self.raw_put(k, v)

    @abstractmethod
    def raw_delete(self, key: bytes) -> None: ...

    def raw_delete_many(self, keys: Sequence[bytes], *, family: bytes | None = None) -> None:
        """``raw_delete`` of each key; ``family`` as for :meth:`raw_put_many`."""
        for k in keys:
            self.raw_delete(k)

    def raw_note_stored(self, keys: Sequence[bytes], stored: bool) -> None:  # noqa: B027 - optional hook
        """Note that ``keys``, about to be written, are (``stored``) or are not in the store as it
        stands: a provider that counts its rows need not read them for the count. Default:
        ignored."""

    def raw_delete_range(self, start: bytes, end: bytes, first: bytes) -> int:
        """Delete every key with ``start <= key < end``, pending writes included; no key is
        there below ``first`` (a range known to be empty). Returns the keys removed. This
        default deletes each key it finds; a provider that records a range deletion overrides
        it."""
        keys = [k for k, _ in self.raw_scan(first, end)]
        self.raw_delete_many(keys)
        return len(keys)

    @abstractmethod
    def raw_scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < end`` in ascending byte order, pending writes included."""

    def raw_scan_suffixes(
        self, start: bytes, end: bytes, skip: int
    ) -> Iterator[tuple[bytes, bytes]]:
        """``raw_scan`` with the first ``skip`` bytes of every key cut off (a family prefix).
        A provider whose scan is a Python loop cuts them there, saving a generator per key."""
        return ((k[skip:], v) for k, v in self.raw_scan(start, end))

    def raw_scan_chunks(
        self, start: bytes, end: bytes, skip: int, chunk: int
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """``raw_scan_suffixes`` as lists of at most ``chunk`` keys and their values. A provider
        that can read a range without a Python step per key overrides this."""
        pairs = self.raw_scan_suffixes(start, end, skip)
        while batch := list(itertools.islice(pairs, chunk)):
            yield [k for k, _ in batch], [v for _, v in batch]

    @abstractmethod
    def total_keys(self) -> int:
        """Number of live keys over all families, pending writes included (may be an estimate)."""

    @abstractmethod
    def _commit(self) -> None:
        """Make version ``self.version + 1`` durable and visible; set ``self.checkpoint_id``."""

    @abstractmethod
    def _abort(self) -> None:
        """Discard pending writes (the version ends without a commit)."""

    def _release(self) -> None:  # noqa: B027 - optional hook
        """Hand back what this version holds of its provider once aborted (the rocksdb
        provider's database); a version the provider discards itself keeps it."""

    def _custom_metrics(self) -> dict[str, float]:
        return {}

    def _memory_used_bytes(self) -> int:
        return 0

    # --- typed API -------------------------------------------------------------------------------

    @property
    def status(self) -> StoreStatus:
        return self._status

    @property
    def has_committed(self) -> bool:
        return self._status is StoreStatus.COMMITTED

    def has_column_family(self, name: str) -> bool:
        """Whether the store knows family ``name`` (one of an older state may lack it)."""
        return name in self._families

    def column_family_names(self) -> list[str]:
        """The families the store knows, sorted by name."""
        return sorted(self._families)

    def column_family(self, name: str = DEFAULT_CF) -> ColumnFamily:
        try:
            return self._families[name]
        except KeyError:
            msg = f"{self.id}: no column family {name!r}; known: {sorted(self._families)}"
            raise ConfigurationError(msg) from None

    def _writable(self) -> None:
        self._readable()
        if self._read_only:
            msg = f"{self.id} version {self.version} was opened read-only"
            raise StoreClosedError(msg)

    def _readable(self) -> None:
        if self._status is not StoreStatus.UPDATING:
            msg = (
                f"{self.id} version {self.version} was already committed or aborted "
                f"({self._status.value})"
            )
            raise StoreClosedError(msg)

    def get(self, key: Row, cf: str = DEFAULT_CF) -> Row | None:
        self._readable()
        fam = self.column_family(cf)
        raw = self.raw_get(fam.physical_key(key))
        return None if raw is None else fam.value_codec.decode(raw)

    def put(self, key: Row, value: Row, cf: str = DEFAULT_CF) -> None:
        self._writable()
        fam = self.column_family(cf)
        pkey = fam.physical_key(key)
        if cf in self.gaps:
            self._written_into_gaps(cf, [pkey])
        self.raw_put(pkey, fam.value_codec.encode(value))
        self._num_updated += 1

    def remove(self, key: Row, cf: str = DEFAULT_CF) -> None:
        self._writable()
        fam = self.column_family(cf)
        self.raw_delete(fam.physical_key(key))
        self._num_removed += 1

    def get_many(self, keys: KeyRows, cf: str = DEFAULT_CF) -> list[Row | None]:
        self._readable()
        fam = self.column_family(cf)
        return fam.value_codec.decode_many(self.raw_get_many(fam.physical_keys(keys)))

    def put_many(self, keys: KeyRows, values: KeyRows, cf: str = DEFAULT_CF) -> None:
        self._writable()
        fam = self.column_family(cf)
        pkeys = fam.physical_keys(keys)
        encoded = fam.value_codec.encode_many(values)
        if len(pkeys) != len(encoded):
            msg = f"{self.id}: put_many got {len(pkeys)} keys but {len(encoded)} values"
            raise ValueError(msg)
        if cf in self.gaps:
            self._written_into_gaps(cf, pkeys)
        self.raw_put_many(pkeys, encoded, family=fam.prefix)
        self._num_updated += len(pkeys)

    def remove_many(self, keys: KeyRows, cf: str = DEFAULT_CF) -> None:
        self._writable()
        fam = self.column_family(cf)
        pkeys = fam.physical_keys(keys)
        self.raw_delete_many(pkeys, family=fam.prefix)
        self._num_removed += len(pkeys)

    def iterator(self, cf: str = DEFAULT_CF) -> Iterator[tuple[Row, Row]]:
        """Every (key, value) of a family, in key order."""
        self._readable()
        fam = self.column_family(cf)
        return self._decode_scan(fam, fam.prefix, fam.end_of_family())

    def prefix_scan(self, prefix: Row, cf: str = DEFAULT_CF) -> Iterator[tuple[Row, Row]]:
        """Pairs whose key starts with ``prefix`` (values of the first ``len(prefix)`` columns)."""
        self._readable()
        fam = self.column_family(cf)
        start = fam.prefix + fam.key_codec.encode_prefix(prefix)
        return self._decode_scan(fam, start, key_successor(start))

    def range_scan(
        self, start: Row | None = None, end: Row | None = None, cf: str = DEFAULT_CF
    ) -> Iterator[tuple[Row, Row]]:
        """Pairs with ``start <= key < end`` in key order; a bound may be a key prefix or None."""
        self._readable()
        fam = self.column_family(cf)
        lo = fam.prefix if start is None else fam.prefix + fam.key_codec.encode_prefix(start)
        hi = fam.end_of_family() if end is None else fam.prefix + fam.key_codec.encode_prefix(end)
        return self._decode_scan(fam, lo, hi)

    def _decode_scan(
        self, fam: ColumnFamily, start: bytes, end: bytes
    ) -> Iterator[tuple[Row, Row]]:
        skip = len(fam.prefix)
        kdec, vdec = fam.key_codec.decode, fam.value_codec.decode
        for k, v in self.raw_scan(start, end):
            yield kdec(k[skip:]), vdec(v)

    # --- encoded keys ----------------------------------------------------------------------------
    # Keys are the output of the family's ``key_codec`` and values that of its ``value_codec``;
    # the family prefix is added (and stripped) here, once per call, never per key by the caller.

    def get_encoded(self, key: bytes, cf: str = DEFAULT_CF) -> bytes | None:
        """The encoded value of one encoded key, or None."""
        self._readable()
        return self.raw_get(self.column_family(cf).prefix + key)

    def get_encoded_many(self, keys: Sequence[bytes], cf: str = DEFAULT_CF) -> list[bytes | None]:
        """Encoded values of many encoded keys in one multi-get (None where absent)."""
        self._readable()
        prefix = self.column_family(cf).prefix
        pkeys = [prefix + k for k in keys]
        if not self._read_only:
            self._last_read = (cf, list(keys), pkeys)
        return self.raw_get_many(pkeys)

    def put_encoded_many(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes],
        cf: str = DEFAULT_CF,
        *,
        stored: bool | None = None,
    ) -> None:
        """Write encoded values under encoded keys, counted as updated rows like ``put_many``.
        ``stored``: whether the caller knows the keys to be (True) or not to be (False) in the
        store as it stands, which spares reading them to count rows (None: not known)."""
        self._writable()
        if len(keys) != len(values):
            msg = f"{self.id}: put_encoded_many got {len(keys)} keys but {len(values)} values"
            raise ValueError(msg)
        pkeys = self._keys_to_write(keys, cf)
        if cf in self.gaps:
            self._written_into_gaps(cf, pkeys)
        if stored is not None:
            self.raw_note_stored(pkeys, stored)
        self.raw_put_many(pkeys, values, family=self.column_family(cf).prefix)
        self._num_updated += len(keys)

    def remove_encoded_many(
        self, keys: Sequence[bytes], cf: str = DEFAULT_CF, *, stored: bool | None = None
    ) -> None:
        """Delete encoded keys (absent ones included), counted as removed rows like
        ``remove_many``; ``stored`` as for :meth:`put_encoded_many`."""
        self._writable()
        pkeys = self._keys_to_write(keys, cf)
        if stored is not None:
            self.raw_note_stored(pkeys, stored)
        self.raw_delete_many(pkeys, family=self.column_family(cf).prefix)
        self._num_removed += len(keys)

    def _keys_to_write(self, keys: Sequence[bytes], cf: str) -> list[bytes]:
        """Physical keys of a write: those of the last multi-get when it read the same keys (a
        read-modify-write, as aggregation does, prefixes a batch of keys once), else new ones.
        Comparing two lists of the same key objects costs far less than prefixing them."""
        last, self._last_read = self._last_read, None
        if last is not None and last[0] == cf and isinstance(keys, list) and last[1] == keys:
            return last[2]
        prefix = self.column_family(cf).prefix
        return [prefix + k for k in keys]

    def range_scan_encoded(
        self, start: bytes | None = None, end: bytes | None = None, cf: str = DEFAULT_CF
    ) -> Iterator[tuple[bytes, bytes]]:
        """(encoded key, encoded value) pairs with ``start <= key < end`` in key order; a bound
        of None is the family's start or end."""
        self._readable()
        fam = self.column_family(cf)
        prefix = fam.prefix
        lo = prefix if start is None else prefix + start
        hi = fam.end_of_family() if end is None else prefix + end
        return self.raw_scan_suffixes(lo, hi, len(prefix))

    def range_scan_encoded_chunks(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        cf: str = DEFAULT_CF,
        chunk: int = 65536,
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """``range_scan_encoded`` in lists of at most ``chunk`` encoded keys and their encoded
        values: the way to read many rows (an eviction, a complete-mode output)."""
        self._readable()
        fam = self.column_family(cf)
        prefix = fam.prefix
        lo = prefix if start is None else prefix + start
        hi = fam.end_of_family() if end is None else prefix + end
        return self.raw_scan_chunks(lo, hi, len(prefix), chunk)

    # --- ranges known to be empty -----------------------------------------------------------------
    # An eviction scans a family from its start up to the watermark and removes every key it
    # finds. In RocksDB a removed key stays as a tombstone until a compaction drops it, and the
    # next eviction's scan from the start walks every tombstone of the evictions before it again
    # (at 50k keys evicted a batch, most of an eviction's time). So an eviction says what it
    # emptied, and the next version's scan starts past it.

    def scan_start(self, start: bytes | None = None, cf: str = DEFAULT_CF) -> bytes | None:
        """Where a scan of family ``cf`` from encoded ``start`` (None: the family's start) can
        begin: past the keys an earlier version removed from there (:meth:`mark_removed`), as
        far as no key was written there again since."""
        gaps = self.gaps.get(cf)
        if not gaps:
            return start
        prefix = self.column_family(cf).prefix
        end = gaps.get(prefix + (start or b""))
        return start if end is None else end[len(prefix) :]

    def mark_removed(self, start: bytes | None, end: bytes, cf: str = DEFAULT_CF) -> None:
        """Say that family ``cf`` holds no key from encoded ``start`` (None: the family's start)
        up to ``end`` (exclusive) now: the caller removed every key there. A key written there
        later narrows the range; the versions after this one start their scans from ``start``
        at the range's end."""
        prefix = self.column_family(cf).prefix
        lo, hi = prefix + (start or b""), prefix + end
        if hi > lo:
            self.gaps.setdefault(cf, {})[lo] = hi

    def remove_range(self, start: bytes | None, end: bytes, cf: str = DEFAULT_CF) -> int:
        """Remove every key of family ``cf`` from encoded ``start`` (None: the family's start)
        up to encoded ``end`` (exclusive), this version's writes there included, and return how
        many there were (counted as removed rows). An eviction up to the watermark over keys
        ordered by time: the built-in providers record it as one range deletion (one changelog
        record, one RocksDB range tombstone), not a delete per key. The range is then known to
        be empty (:meth:`mark_removed`); a key written into it later is kept."""
        self._writable()
        prefix = self.column_family(cf).prefix
        lo, hi = prefix + (start or b""), prefix + end
        if hi <= lo:
            return 0
        first = min(max(prefix + (self.scan_start(start, cf) or b""), lo), hi)
        removed = self.raw_delete_range(lo, hi, first)
        self._num_removed += removed
        self.mark_removed(start, end, cf)
        return removed

    def _written_into_gaps(self, cf: str, pkeys: Sequence[bytes]) -> None:
        """Narrow the family's empty ranges to end before the keys just written into them."""
        if not pkeys:
            return
        gaps = self.gaps[cf]
        lowest = min(pkeys)
        for lo, hi in list(gaps.items()):
            if lowest >= hi:
                continue
            inside = [k for k in pkeys if lo <= k < hi]
            if not inside:
                continue
            first = min(inside)
            if first > lo:
                gaps[lo] = first
            else:
                del gaps[lo]
        if not gaps:
            del self.gaps[cf]

    def commit(self) -> int:
        """Make this version's writes durable as version ``version + 1`` and return that number."""
        self._writable()
        self._last_read = None
        start = time.perf_counter()
        self._commit()
        self.commit_time_ms = int((time.perf_counter() - start) * 1000)
        self._status = StoreStatus.COMMITTED
        return self.version + 1

    def abort(self) -> None:
        """Discard this version's writes and hand back what it holds of its provider. Safe to
        call more than once, after a commit (it does nothing) and after a failed commit."""
        if self._status is StoreStatus.UPDATING:
            self.discard()
            self._release()

    def discard(self) -> None:
        """End this version as ``ABORTED``, its writes dropped, keeping what it holds of its
        provider: the one way a version ends without a commit, used by ``abort()`` and by a
        provider that takes a version back (as opening another version of the partition does).
        Does nothing once the version has ended."""
        if self._status is not StoreStatus.UPDATING:
            return
        self._last_read = None
        self._abort()
        self._status = StoreStatus.ABORTED

    def metrics(self) -> StoreMetrics:
        return StoreMetrics(
            num_keys=self.total_keys(),
            num_updated=self._num_updated,
            num_removed=self._num_removed,
            memory_used_bytes=self._memory_used_bytes(),
            commit_time_ms=self.commit_time_ms,
            load_time_ms=self.load_time_ms,
            custom={**self._custom_metrics(), **_found_metrics(self.found)},
        )

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


#: Where a provider found the version a store opened at, each a count in the store's custom
#: metrics (progress sums them over partitions, so a user sees state move): ``open`` in this
#: process at that version; ``local`` reopened from the executor's local copy at that version;
#: ``caught_up`` from an older copy in this process or executor, the changes since replayed;
#: ``restored`` from durable storage (a snapshot, or every change from the start).
FOUND_METRICS = {
    "open": "stateFoundOpen",
    "local": "stateFoundLocal",
    "caught_up": "stateCaughtUp",
    "restored": "stateRestored",
}


def _found_metrics(found: str | None) -> dict[str, float]:
    if found is None:
        return {}
    return {name: float(kind == found) for kind, name in FOUND_METRICS.items()}


class StateStoreProvider(ABC):
    """Owns the durable files of one store and hands out versions of it."""

    #: Name recorded in ``_schema.json``; a checkpoint written by another provider is refused.
    name: ClassVar[str]

    @abstractmethod
    def init(
        self,
        store_id: StoreId,
        key_schema: pa.Schema,
        value_schema: pa.Schema,
        conf: StoreConf | None = None,
        column_families: dict[str, tuple[pa.Schema, pa.Schema]] | None = None,
    ) -> None:
        """Bind to a store; check (or write, on first use) its ``_schema.json``."""

    @abstractmethod
    def get_store(self, version: int, checkpoint_id: str | None = None) -> StateStore:
        """Open ``version`` for writing. ``checkpoint_id`` picks the lineage (None: the newest)."""

    @abstractmethod
    def get_read_store(self, version: int, checkpoint_id: str | None = None) -> StateStore:
        """Open ``version`` read-only."""

    @abstractmethod
    def latest_version(self) -> int:
        """Newest committed version on durable storage (0 if none)."""

    @abstractmethod
    def last_checkpoint_id(self) -> str | None:
        """Checkpoint id of the version this provider committed last (for the commit log)."""

    @abstractmethod
    def do_maintenance(self) -> None:
        """Take due snapshots and delete versions and files no longer needed."""

    @abstractmethod
    def close(self) -> None:
        """Release local resources (open databases, locks). Durable files stay."""

    @classmethod
    def supported_custom_metrics(cls) -> list[str]:
        return []

    @classmethod
    def supported_instance_metrics(cls) -> list[str]:
        """Prefixes of per-partition metrics (``<prefix>.partition_<p>_<store>``), as Spark's."""
        return []

    def __enter__(self) -> StateStoreProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
