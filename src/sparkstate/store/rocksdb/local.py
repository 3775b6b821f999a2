"""The executor-local database of the RocksDB provider: :class:`LocalDB`, a RocksDB in a store's
local directory (:mod:`.local_dir`), written one committed version per WriteBatch with the WAL off
(the durable files are the truth). The directory and its lock, and the RocksDB settings, live in
:mod:`.local_dir` and :mod:`.rocksdb_options`; their names are re-exported here.

Only this module and :mod:`.rocksdb_options` import ``rocksdict``. It raises plain ``Exception``
carrying a RocksDB status text; :func:`_raise_translated` maps those to sparkstate's own errors, in
one place.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import threading
import weakref
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, NoReturn, cast

import numpy as np
import numpy.typing as npt
import rocksdict

from sparkstate.exceptions import (
    CorruptStateFileError,
    MissingVersionError,
    StateFileError,
    StateStoreError,
    StoreClosedError,
    StoreLockedError,
)
from sparkstate.files.durable import why
from sparkstate.store.local_dir import (
    DB_DIR_NAME,
    LOCK_FILE_NAME,
    LocalStoreDir,
    LockHolder,
    local_key,
)
from sparkstate.store.rocksdb import mark_opened
from sparkstate.store.rocksdb.options import (
    LocalDBConf,
    SharedResources,
    db_options,
    memtable_bytes,
    shared_resources,
    write_options,
)

__all__ = [
    "DB_DIR_NAME",
    "LOCK_FILE_NAME",
    "MARKER_KEY",
    "RESERVED_PREFIX",
    "LocalDB",
    "LocalDBConf",
    "LocalStoreDir",
    "LockHolder",
    "SharedResources",
    "key_order",
    "local_key",
    "shared_resources",
]

#: Keys starting with this prefix belong to sparkstate, not to a column family (whose physical
#: prefix starts with a length byte <= 200). ``LocalDB.iterate`` never yields them.
RESERVED_PREFIX = b"\xff\xff"
MARKER_KEY = RESERVED_PREFIX + b"sparkstate.version"
#: multi_get asks RocksDB for this many keys per call: measured faster than one huge call.
_MULTI_GET_CHUNK = 1024


def _raise_translated(exc: Exception, action: str, path: str) -> NoReturn:
    """Raise ours for an error of rocksdict; the message names the DB directory and the action.

    RocksDB errors arrive as plain ``Exception`` whose text starts with the status code
    (``IO error:``, ``Corruption:``, ...), so this is the one place that reads message text.
    Anything else (a ``KeyError`` for a non-bytes key, one of ours, ...) is re-raised unchanged.
    """
    text = str(exc)
    msg = f"local RocksDB {path}: cannot {action}: {why(exc)}"
    err: StateStoreError
    if isinstance(exc, rocksdict.DbClosedError):
        err = StoreClosedError(msg)
    elif type(exc) is not Exception:
        raise exc
    elif "lock hold by current process" in text or "While lock file" in text:
        err = StoreLockedError(msg)
    elif text.startswith("Corruption"):
        err = CorruptStateFileError(msg)
    elif "does not exist (create_if_missing is false)" in text:
        err = MissingVersionError(msg)
    elif text.startswith("IO error"):
        err = StateFileError(msg)
    else:
        err = StateStoreError(msg)
    raise err from exc


def _parse_statistics(text: str | None) -> dict[str, int]:
    """RocksDB's statistics dump as numbers: a ticker's count under its name (``rocksdb.bytes.read
    COUNT : 12``), a histogram's count and sum under its name plus ``.count`` and ``.sum``
    (``rocksdb.db.get.micros P50 : 1.0 ... COUNT : 3 SUM : 7``)."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        name, *rest = line.split() or [""]
        fields = dict(zip(rest[0::3], rest[2::3], strict=False))
        count, total = fields.get("COUNT", ""), fields.get("SUM", "")
        if not count.isdigit():
            continue
        if "P50" not in fields:
            out[name] = int(count)
        elif total.isdigit():
            out[f"{name}.count"], out[f"{name}.sum"] = int(count), int(total)
    return out


def _drain(items: Iterator[Any]) -> Generator[tuple[bytes, bytes], None, None]:
    # Closing the generator (or dropping it) frees ``items``, the RocksDB iterator.
    yield from items


def _upper_bound(end: bytes) -> rocksdict.ReadOptions:
    # Only the upper bound goes in ReadOptions: in rocksdict 0.3.29
    # set_iterate_lower_bound acts as an upper bound. The start is a seek (from_key).
    ro = rocksdict.ReadOptions()
    ro.set_iterate_upper_bound(end)
    return ro


def _chunks(
    keys: Iterator[bytes], values: Iterator[bytes], chunk: int
) -> Generator[tuple[list[bytes], list[bytes]], None, None]:
    while ks := list(itertools.islice(keys, chunk)):
        yield ks, list(itertools.islice(values, len(ks)))


def key_order(keys: Sequence[bytes]) -> npt.NDArray[np.intp]:
    """Indices that sort ``keys`` bytewise (RocksDB looks keys up and inserts them 2-3x faster
    in key order), by integer sorts of 8-byte windows after the keys' common prefix: the first
    window alone when it tells every key apart, as it does for most keys of one column family.
    A sort of the byte strings themselves costs 5x more."""
    n = len(keys)
    if n < 2:
        return np.arange(n)
    skip = len(os.path.commonprefix([min(keys), max(keys)]))
    first = _windows(keys, skip, 1)[:, 0]
    order = np.argsort(first)
    ranked = first[order]
    if (ranked[1:] != ranked[:-1]).all():
        return order
    # Ties: every window of the longest key, then the length (a key padded with zeros to the
    # length of another sorts before it).
    windows = _windows(keys, skip, max(1, -(-(max(map(len, keys)) - skip) // 8)))
    lengths = np.fromiter(map(len, keys), np.intp, n)
    return np.lexsort([lengths, *windows.T[::-1]])


def _windows(keys: Sequence[bytes], skip: int, count: int) -> npt.NDArray[np.uint64]:
    """(n, count) big-endian integers of the ``count`` 8-byte windows after ``skip`` bytes of
    each key (numpy's fixed-width byte strings cut a key to, or pad it with zeros up to, that)."""
    width = skip + 8 * count
    m = np.array(keys, f"S{width}").view(np.uint8).reshape(len(keys), width)
    return np.ascontiguousarray(m[:, skip:]).view(">u8").astype(np.uint64)


class LocalDB:
    """A RocksDB at ``path`` in raw (bytes) mode, written in atomic batches with the WAL off.

    Each batch also writes a *marker* (a small JSON dict under :data:`MARKER_KEY`, e.g. the
    version and checkpoint id) atomically with the data, so after a crash the provider can read
    which version the local copy holds (with the WAL off, an unflushed tail is lost, but the DB
    comes back at an earlier batch boundary) and decide to catch up, or wipe and restore.
    """

    def __init__(
        self, path: str, conf: LocalDBConf | None = None, *, create_if_missing: bool = True
    ) -> None:
        self.path = path
        self.conf = conf or LocalDBConf()
        self.resources = shared_resources(self.conf.block_cache_mb, self.conf.write_buffer_mb)
        self._opts = db_options(self.conf, self.resources, create=create_if_missing)
        self._write_opts = write_options()
        self._memtable_bytes = memtable_bytes(self.resources, copied=False)
        self._iterators: weakref.WeakSet[Generator[Any, None, None]]
        self._iterators = weakref.WeakSet()
        #: Bytes of every batch applied by this object (RocksDB's WriteBatch size).
        self.bytes_written = 0
        if not create_if_missing and not os.path.exists(os.path.join(path, "CURRENT")):
            msg = f"local RocksDB {path}: cannot open: no CURRENT file (no database there)"
            raise MissingVersionError(msg)
        self._db: rocksdict.Rdict | None = None
        #: Committed versions pinned for live reads (:meth:`keep_view`), oldest first, and the
        #: lock that keeps a read and :meth:`close` apart.
        self._views: dict[int, tuple[Any, rocksdict.Snapshot]] = {}
        self._views_lock = threading.Lock()
        self._open_handle()

    def _open_handle(self) -> None:
        try:
            # The options of the default column family are passed as well: otherwise rocksdict
            # reopens an existing DB with those of its OPTIONS file, which lose the bloom filter
            # (and the shared block cache), so every SST written after a reopen has no filter.
            mark_opened()
            self._db = rocksdict.Rdict(
                self.path, self._opts, column_families={"default": self._opts}
            )
        except Exception as exc:
            _raise_translated(exc, "open", self.path)
        self.resources.open_dbs.add(self)

    @classmethod
    def open_from_files(
        cls, path: str, files: Iterable[str], conf: LocalDBConf | None = None
    ) -> LocalDB:
        """Open a DB whose directory was filled with the files of :meth:`create_checkpoint`."""
        names = set(files)
        missing = sorted(n for n in names if not os.path.isfile(os.path.join(path, n)))
        if missing:
            msg = f"local RocksDB {path}: cannot open from files: missing {missing}"
            raise MissingVersionError(msg)
        if "CURRENT" not in names or not any(n.startswith("MANIFEST-") for n in names):
            msg = f"local RocksDB {path}: file list {sorted(names)} has no CURRENT or MANIFEST"
            raise CorruptStateFileError(msg)
        return cls(path, conf, create_if_missing=False)

    def __repr__(self) -> str:
        return f"LocalDB({self.path!r}, open={self._db is not None})"

    @property
    def lazy(self) -> bool:
        """Whether the database holds only part of its version's state (:mod:`.lazy`): not a
        whole state to copy or to snapshot yet."""
        return False

    @property
    def closed(self) -> bool:
        return self._db is None

    def _live(self) -> rocksdict.Rdict:
        if self._db is None:
            msg = f"local RocksDB {self.path} is closed"
            raise StoreClosedError(msg)
        return self._db

    # -- reads

    def get(self, key: bytes) -> bytes | None:
        db = self._live()
        try:
            value: bytes | None = db.get(key)
        except Exception as exc:
            _raise_translated(exc, "get", self.path)
        return value

    def multi_get(self, keys: Sequence[bytes], *, in_key_order: bool = False) -> list[bytes | None]:
        """Values of ``keys`` in order, ``None`` where absent (RocksDB MultiGet, in chunks).

        Keys are looked up in key order, 2-3x faster than in arrival order (block and memtable
        locality); ``in_key_order`` says that they ascend already.
        """
        db = self._live()
        n = len(keys)
        try:
            if n <= _MULTI_GET_CHUNK:
                return cast("list[bytes | None]", db[list(keys)])
            order = None if in_key_order else key_order(keys)
            ordered = list(keys) if order is None else np.array(keys, object)[order].tolist()
            found: list[bytes | None] = []
            for i in range(0, n, _MULTI_GET_CHUNK):
                found += cast("list[bytes | None]", db[ordered[i : i + _MULTI_GET_CHUNK]])
            if order is None:
                return found
            out = np.empty(n, object)
            out[order] = found
            return cast("list[bytes | None]", out.tolist())
        except Exception as exc:
            _raise_translated(exc, "multi_get", self.path)

    def iterate(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` with ``start <= key < end`` ascending, as of this call.

        Reserved keys (:data:`RESERVED_PREFIX`) are never yielded. An unfinished iterator is
        closed by :meth:`close`: a live RocksDB iterator keeps the DB (and its LOCK) open.
        """
        db = self._live()
        end = min(end, RESERVED_PREFIX)
        if start >= end:
            return iter(())
        try:
            items = db.items(from_key=start or None, read_opt=_upper_bound(end))
        except Exception as exc:
            _raise_translated(exc, "iterate", self.path)
        gen = _drain(items)
        self._iterators.add(gen)
        return gen

    def scan_chunks(
        self, start: bytes, end: bytes, chunk: int
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """``iterate`` in lists of at most ``chunk`` keys and their values, read without a Python
        step per key (keys and values come from two iterators over the same, unwritten, range)."""
        db = self._live()
        end = min(end, RESERVED_PREFIX)
        if start >= end:
            return iter(())
        try:
            keys = db.keys(from_key=start or None, read_opt=_upper_bound(end))
            values = db.values(from_key=start or None, read_opt=_upper_bound(end))
        except Exception as exc:
            _raise_translated(exc, "iterate", self.path)
        gen = _chunks(cast("Iterator[bytes]", keys), cast("Iterator[bytes]", values), chunk)
        self._iterators.add(gen)
        return gen

    def keys_in(self, start: bytes, end: bytes) -> list[bytes]:
        """The keys with ``start <= key < end`` ascending (reserved keys aside), without their
        values."""
        db = self._live()
        end = min(end, RESERVED_PREFIX)
        if start >= end:
            return []
        try:
            keys = db.keys(from_key=start or None, read_opt=_upper_bound(end))
            return list(cast("Iterator[bytes]", keys))
        except Exception as exc:
            _raise_translated(exc, "iterate", self.path)

    def last_key(self, start: bytes, end: bytes) -> bytes | None:
        """The largest key with ``start <= key < end`` (reserved keys aside), by one seek; None
        when there is none."""
        db = self._live()
        end = min(end, RESERVED_PREFIX)
        try:
            it = db.iter()
            try:
                it.seek_for_prev(end)
                if it.valid() and it.key() >= end:
                    it.prev()
                return cast("bytes", it.key()) if it.valid() and it.key() >= start else None
            finally:
                del it  # a live iterator pins the DB
        except Exception as exc:
            _raise_translated(exc, "seek", self.path)

    def count_keys(self) -> int:
        """The number of keys (reserved keys aside), by a scan of the keys."""
        db = self._live()
        try:
            keys = db.keys(read_opt=_upper_bound(RESERVED_PREFIX))
            return sum(1 for _ in keys)
        except Exception as exc:
            _raise_translated(exc, "count keys", self.path)

    def read_marker(self) -> dict[str, Any] | None:
        """The marker of the last batch applied, or None if absent or not a JSON object."""
        raw = self.get(MARKER_KEY)
        if raw is None:
            return None
        try:
            marker = json.loads(raw)
        except ValueError:
            return None
        return marker if isinstance(marker, dict) else None

    # -- views of committed versions, for live reads

    def keep_view(self, version: int, ref: Any, keep: int = 2) -> None:
        """Pin the database as it is now (a RocksDB snapshot) as version ``version`` (``ref``
        names it to readers), keeping the ``keep`` newest: a reader asks for the version of
        the last batch the query committed, which is the newest or the one before it while
        the next batch's tasks commit theirs."""
        with self._views_lock:
            db = self._live()
            self._views.pop(version, None)
            self._views[version] = (ref, db.snapshot())
            for old in sorted(self._views)[:-keep]:
                del self._views[old]

    def view_versions(self) -> list[int]:
        with self._views_lock:
            return sorted(self._views)

    def view_get(
        self, version: int, keys: Sequence[bytes]
    ) -> tuple[Any, list[bytes | None]] | None:
        """``(ref, values)`` of ``keys`` in pinned version ``version``; None if not pinned."""
        with self._views_lock:
            found = self._views.get(version)
            if found is None:
                return None
            ref, snap = found
            out: list[bytes | None] = []
            for key in keys:
                try:
                    out.append(snap[key])
                except Exception:  # noqa: BLE001 - rocksdict's snapshot raises for a missing key
                    out.append(None)
            return ref, out

    def view_scan(
        self, version: int, start: bytes, end: bytes, limit: int
    ) -> tuple[Any, list[tuple[bytes, bytes]]] | None:
        """``(ref, pairs)``: at most ``limit`` pairs with ``start <= key < end`` ascending, in
        pinned version ``version``; None if not pinned."""
        end = min(end, RESERVED_PREFIX)
        with self._views_lock:
            found = self._views.get(version)
            if found is None:
                return None
            ref, snap = found
            if start >= end:
                return ref, []
            items = snap.items(from_key=start or None, read_opt=_upper_bound(end))
            pairs: list[tuple[bytes, bytes]] = list(itertools.islice(items, limit))  # type: ignore[arg-type]
            return ref, pairs

    # -- writes

    def apply_batch(
        self,
        writes: Mapping[bytes, bytes | None] | Iterable[tuple[bytes, bytes | None]],
        marker: Mapping[str, Any],
        *,
        delete_ranges: Sequence[tuple[bytes, bytes]] = (),
    ) -> int:
        """Apply one version atomically: range deletes, then puts (``None`` deletes), then marker.

        Written with the WAL off. Returns the batch size in bytes.
        """
        db = self._live()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for begin, end in delete_ranges:
            batch.delete_range(begin, end)
        put, delete = batch.put, batch.delete
        pairs = writes.items() if isinstance(writes, Mapping) else writes
        for key, value in pairs:
            if value is None:
                delete(key)
            else:
                put(key, value)
        batch.put(MARKER_KEY, json.dumps(dict(marker), sort_keys=True).encode("utf-8"))
        size: int = batch.size_in_bytes()
        try:
            db.write(batch, self._write_opts)
            if self._memtables_over_budget():
                db.flush(False)
        except Exception as exc:
            _raise_translated(exc, "apply a write batch", self.path)
        self.bytes_written += size
        return size

    @property
    def memtable_bytes(self) -> int:
        """The size at which the memtable is flushed (RocksDB's ``write_buffer_size``)."""
        return self._memtable_bytes

    def size_memtable(self, *, copied: bool) -> None:
        """Flush the memtable at the size for a state that is (or is not) copied in memory
        (:func:`.options.memtable_bytes`) from the next write on."""
        nbytes = memtable_bytes(self.resources, copied=copied)
        if nbytes == self._memtable_bytes:
            return
        try:
            self._live().set_options({"write_buffer_size": str(nbytes)})
        except Exception as exc:
            _raise_translated(exc, "set the memtable size", self.path)
        self._memtable_bytes = nbytes

    def _memtables_over_budget(self) -> bool:
        """Whether the process's memtables hold more than their share of the cache after a
        write. RocksDB flushes them only at the next write, so a large version stayed in memory,
        charged to the block cache, through the next batch's reads, and the cache, overfull,
        kept no data, index or filter block: every read went to the file."""
        res = self.resources
        return int(res.write_buffer_manager.get_usage()) > res.write_buffer_bytes

    # -- metrics

    def _int_property(self, name: str) -> int:
        db = self._live()
        try:
            value = db.property_int_value(name)
        except Exception as exc:
            _raise_translated(exc, f"read property {name}", self.path)
        return int(value or 0)

    def approximate_num_keys(self) -> int:
        """RocksDB's estimate of the number of keys (``rocksdb.estimate-num-keys``)."""
        return self._int_property("rocksdb.estimate-num-keys")

    def memory_stats(self) -> dict[str, int]:
        """Memory and disk use in bytes. Block cache and write buffers are process-wide; the
        ``share_*`` figures are this database's share of the cache's blocks (see
        :meth:`SharedResources.share`)."""
        res = self.resources
        cache, wbm = res.block_cache, res.write_buffer_manager
        return {
            "memtable_bytes": self._int_property("rocksdb.cur-size-all-mem-tables"),
            "all_memtables_bytes": self._int_property("rocksdb.size-all-mem-tables"),
            "table_readers_bytes": self._int_property("rocksdb.estimate-table-readers-mem"),
            "share_cached_blocks_bytes": res.share(res.cached_blocks_bytes()),
            "share_pinned_blocks_bytes": res.share(res.pinned_blocks_bytes()),
            "total_sst_bytes": self._int_property("rocksdb.total-sst-files-size"),
            "live_sst_bytes": self._int_property("rocksdb.live-sst-files-size"),
            "process_block_cache_bytes": cache.get_usage(),
            "process_block_cache_pinned_bytes": cache.get_pinned_usage(),
            "process_write_buffer_bytes": wbm.get_usage(),
        }

    def statistics(self) -> dict[str, int]:
        """RocksDB's tickers and histograms since the database was opened (e.g.
        ``rocksdb.bytes.read``, ``rocksdb.db.multiget.micros.sum``); empty unless
        ``conf.statistics``."""
        self._live()
        return _parse_statistics(self._opts.get_statistics()) if self.conf.statistics else {}

    # -- files

    def flush(self) -> None:
        """Write the memtables to SST files and wait."""
        try:
            self._live().flush(True)
        except Exception as exc:
            _raise_translated(exc, "flush", self.path)

    def create_checkpoint(self, dest_dir: str) -> list[str]:
        """Write a consistent copy of the DB into the new directory ``dest_dir``.

        SST and OPTIONS files are hard links (``dest_dir`` must be on the DB's filesystem);
        MANIFEST and CURRENT are copies. Returns the sorted file names needed to open it with
        :meth:`open_from_files` (empty WAL files and rocksdict's config file are removed).
        """
        db = self._live()
        if os.path.exists(dest_dir):
            msg = f"checkpoint of local RocksDB {self.path}: {dest_dir} already exists"
            raise StateFileError(msg)
        os.makedirs(os.path.dirname(os.path.abspath(dest_dir)), exist_ok=True)
        self.flush()
        try:
            checkpoint = rocksdict.Checkpoint(db)
            try:
                checkpoint.create_checkpoint(dest_dir)
            finally:
                del checkpoint  # a live Checkpoint pins the DB, like an iterator
        except Exception as exc:
            _raise_translated(exc, f"create checkpoint {dest_dir}", self.path)
        names = []
        for name in sorted(os.listdir(dest_dir)):
            file = os.path.join(dest_dir, name)
            if name == "rocksdict-config.json" or (
                name.endswith(".log") and os.path.getsize(file) == 0
            ):
                os.remove(file)
            else:
                names.append(name)
        return names

    # -- lifetime

    def close(self) -> None:
        """Close iterators still open, then the DB; this releases RocksDB's LOCK. Idempotent.

        With the WAL off, RocksDB flushes the memtables on close.
        """
        with self._views_lock:
            self._views.clear()
            db, self._db = self._db, None
        if db is None:
            return
        self.resources.open_dbs.discard(self)
        for gen in list(self._iterators):
            gen.close()
        self._iterators.clear()
        try:
            db.close()
        except Exception as exc:
            _raise_translated(exc, "close", self.path)

    def wipe(self) -> None:
        """Close the DB and delete its directory."""
        with contextlib.suppress(StateStoreError):
            self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> LocalDB:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
