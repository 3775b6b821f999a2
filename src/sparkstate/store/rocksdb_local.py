"""The executor-local half of the RocksDB provider: a locked directory per store, and the DB in it.

PySpark runs a partition's task in whichever Python worker process of the executor is free, so a
store's local RocksDB lives in an executor-level directory ``<local_dir>/<local_key>/``, not in a
process. An exclusive ``flock`` on ``LOCK.sparkstate`` says which process may use it; the holder
opens ``db/`` as a :class:`LocalDB`, applies each committed version as one WriteBatch (WAL off: the
durable files are the truth), and closes the DB before releasing the lock so the next process can
open it. A process that dies loses its flock in the kernel, and RocksDB's own ``LOCK`` with it.

Every DB a process opens shares one block cache and one write-buffer manager
(:func:`shared_resources`), so memory is bounded per process, not per store.

Only this module imports ``rocksdict``. It raises plain ``Exception`` carrying a RocksDB status
text; :func:`_raise_translated` maps those to sparkstate's own errors, in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
import weakref
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, NoReturn, cast

import numpy as np
import rocksdict

from sparkstate.exceptions import (
    ConfigurationError,
    CorruptStateFileError,
    MissingVersionError,
    StateFileError,
    StateStoreError,
    StoreClosedError,
    StoreLockedError,
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
    "local_key",
    "shared_resources",
]

LOCK_FILE_NAME = "LOCK.sparkstate"
DB_DIR_NAME = "db"
#: Keys starting with this prefix belong to sparkstate, not to a column family (whose physical
#: prefix starts with a length byte <= 200). ``LocalDB.iterate`` never yields them.
RESERVED_PREFIX = b"\xff\xff"
MARKER_KEY = RESERVED_PREFIX + b"sparkstate.version"

_MB = 1024 * 1024
#: multi_get asks RocksDB for this many keys per call: measured faster than one huge call.
_MULTI_GET_CHUNK = 1024
_KEY_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def local_key(checkpoint_root: str, operator_id: int, partition_id: int, store_name: str) -> str:
    """A filesystem-safe directory name for a store id: a SHA-1 prefix plus a readable suffix."""
    ident = f"{checkpoint_root}\x00{operator_id}\x00{partition_id}\x00{store_name}"
    digest = hashlib.sha1(ident.encode("utf-8"), usedforsecurity=False).hexdigest()[:20]
    name = _KEY_SAFE.sub("_", store_name)[:40]
    return f"{digest}-op{operator_id}-p{partition_id}-{name}"


# --------------------------------------------------------------------------- directory + lock


@dataclasses.dataclass(frozen=True)
class LockHolder:
    """Who holds a store directory, as recorded in its lock file by the holder."""

    pid: int
    host: str
    acquired_at: float
    owner: str

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired_at))
        who = f" ({self.owner})" if self.owner else ""
        return f"pid {self.pid} on {self.host}{who} since {since}"


class LocalStoreDir:
    """``<root>/<key>/``: one store's executor-local directory and its exclusive file lock.

    ``acquire`` waits for the lock (another worker process may be using the store) and records
    this process in the lock file; ``release`` clears it. The lock is an ``flock`` on an open file
    description, so it is also released when the holder dies, and two ``LocalStoreDir`` objects in
    one process exclude each other too.
    """

    def __init__(self, root: str, key: str) -> None:
        if not key or key in (".", "..") or os.sep in key or "\x00" in key:
            msg = f"local store key {key!r} is not a single safe directory name"
            raise ConfigurationError(msg)
        self.root = root
        self.key = key
        self.path = os.path.join(root, key)
        self.db_path = os.path.join(self.path, DB_DIR_NAME)
        self.lock_path = os.path.join(self.path, LOCK_FILE_NAME)
        self._fd: int | None = None
        self._fd_pid = 0

    def __repr__(self) -> str:
        return f"LocalStoreDir({self.path!r}, held={self.held})"

    @property
    def held(self) -> bool:
        """Whether this object holds the lock in this process (a forked child does not)."""
        return self._fd is not None and self._fd_pid == os.getpid()

    def acquire(self, timeout_s: float, owner: str = "") -> float:
        """Take the lock, waiting up to ``timeout_s``; return the seconds waited.

        ``owner`` (e.g. a task attempt) is written to the lock file for error messages.
        Raises :class:`StoreLockedError` naming the holder's pid when the wait times out.
        """
        if self.held:
            msg = f"local store directory {self.path} is already locked by this object"
            raise StoreLockedError(msg)
        self._forget_inherited_fd()
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        start = time.monotonic()
        deadline = start + max(timeout_s, 0.0)
        delay = 0.001
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                now = time.monotonic()
                if now >= deadline:
                    holder = self.holder()
                    who = holder.describe() if holder else "a process that recorded no pid"
                    msg = (
                        f"local store directory {self.path} is locked by {who}; "
                        f"gave up after {timeout_s:.1f} s"
                    )
                    raise StoreLockedError(msg)
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.05)
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "acquired_at": time.time(),
                "owner": owner,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
        except BaseException:
            os.close(fd)  # closing the only descriptor also drops a lock taken above
            raise
        self._fd = fd
        self._fd_pid = os.getpid()
        return time.monotonic() - start

    def release(self) -> None:
        """Clear the holder record and drop the lock. Close the DB first. Idempotent."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if self._fd_pid == os.getpid():
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _forget_inherited_fd(self) -> None:
        # A forked child shares the parent's open file description: unlocking it would release
        # the parent's lock, so only close our copy of the descriptor.
        if self._fd is not None and self._fd_pid != os.getpid():
            fd, self._fd = self._fd, None
            os.close(fd)

    def holder(self) -> LockHolder | None:
        """The holder recorded in the lock file, or None if none is recorded (or it is garbled)."""
        try:
            with open(self.lock_path, "rb") as f:
                raw = json.loads(f.read(4096) or b"null")
            return LockHolder(
                int(raw["pid"]), str(raw["host"]), float(raw["acquired_at"]), str(raw["owner"])
            )
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def scratch_path(self, name: str) -> str:
        """A path on the DB's filesystem (so hard links work) for checkpoints and downloads."""
        return os.path.join(self.path, "scratch", name)

    def wipe_db(self) -> None:
        """Delete the local DB directory (closed DB only); the caller holds the lock."""
        if not self.held:
            msg = f"wipe of {self.db_path} requires holding the lock of {self.path}"
            raise StoreLockedError(msg)
        shutil.rmtree(self.db_path, ignore_errors=True)

    def __enter__(self) -> LocalStoreDir:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


# --------------------------------------------------------------------------- shared resources


@dataclasses.dataclass
class SharedResources:
    """The block cache and write-buffer manager that every DB of this process uses."""

    block_cache: rocksdict.Cache
    write_buffer_manager: rocksdict.WriteBufferManager
    block_cache_bytes: int
    write_buffer_bytes: int
    pid: int


_shared: SharedResources | None = None
_shared_lock = threading.Lock()


def shared_resources(block_cache_mb: int, write_buffer_mb: int) -> SharedResources:
    """This process's LRU block cache and write-buffer manager, created on first use.

    A later call asking for more memory grows them (never shrinks: a DB may rely on them).
    Memtables are bounded by the manager (flush, not stall, when over), data blocks plus index
    and filter blocks by the cache. A forked child gets its own.
    """
    global _shared
    if block_cache_mb < 1 or write_buffer_mb < 1:
        msg = f"block cache and write buffers need >= 1 MB, got {block_cache_mb}, {write_buffer_mb}"
        raise ConfigurationError(msg)
    cache_bytes, buffer_bytes = block_cache_mb * _MB, write_buffer_mb * _MB
    with _shared_lock:
        res = _shared
        if res is None or res.pid != os.getpid():
            res = SharedResources(
                block_cache=rocksdict.Cache(cache_bytes),
                write_buffer_manager=rocksdict.WriteBufferManager(buffer_bytes, False),
                block_cache_bytes=cache_bytes,
                write_buffer_bytes=buffer_bytes,
                pid=os.getpid(),
            )
            _shared = res
        if cache_bytes > res.block_cache_bytes:
            res.block_cache.set_capacity(cache_bytes)
            res.block_cache_bytes = cache_bytes
        if buffer_bytes > res.write_buffer_bytes:
            res.write_buffer_manager.set_buffer_size(buffer_bytes)
            res.write_buffer_bytes = buffer_bytes
        return res


# --------------------------------------------------------------------------- the database


@dataclasses.dataclass(frozen=True)
class LocalDBConf:
    """RocksDB settings of a local DB (the provider builds it from its ``StoreConf``)."""

    compression: str = "zstd"
    block_cache_mb: int = 64
    write_buffer_mb: int = 64
    bloom_bits_per_key: int = 10
    max_background_jobs: int = 2
    #: RocksDB tickers (bytes read/written, ...): costs a few percent of throughput.
    statistics: bool = False

    def __post_init__(self) -> None:
        if self.compression not in _COMPRESSION:
            msg = f"compression must be one of {sorted(_COMPRESSION)}, got {self.compression!r}"
            raise ConfigurationError(msg)
        if self.bloom_bits_per_key < 0 or self.max_background_jobs < 1:
            msg = f"invalid RocksDB settings {self}"
            raise ConfigurationError(msg)

    @classmethod
    def from_store_conf(cls, conf: Any) -> LocalDBConf:
        """Take ``compression``, ``block_cache_mb`` and ``write_buffer_mb`` from a StoreConf."""
        return cls(
            compression=conf.compression,
            block_cache_mb=conf.block_cache_mb,
            write_buffer_mb=conf.write_buffer_mb,
        )


_COMPRESSION = {
    "zstd": (rocksdict.DBCompressionType.lz4, rocksdict.DBCompressionType.zstd),
    "lz4": (rocksdict.DBCompressionType.lz4, rocksdict.DBCompressionType.lz4),
    "none": (rocksdict.DBCompressionType.none, rocksdict.DBCompressionType.none),
}


def _options(conf: LocalDBConf, res: SharedResources, *, create: bool) -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(create)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(res.block_cache)
    if conf.bloom_bits_per_key:
        table.set_bloom_filter(conf.bloom_bits_per_key, False)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_format_version(5)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_manager(res.write_buffer_manager)
    opts.set_write_buffer_size(max(_MB, min(64 * _MB, res.write_buffer_bytes // 2)))
    opts.set_max_write_buffer_number(3)
    upper, bottom = _COMPRESSION[conf.compression]
    opts.set_compression_type(upper())
    opts.set_bottommost_compression_type(bottom())
    opts.set_compaction_style(rocksdict.DBCompactionStyle.level())
    opts.set_level_compaction_dynamic_level_bytes(True)
    opts.set_max_background_jobs(conf.max_background_jobs)
    opts.set_keep_log_file_num(2)
    opts.set_max_log_file_size(4 * _MB)
    if conf.statistics:
        opts.enable_statistics()
    return opts


def _write_options() -> rocksdict.WriteOptions:
    wo = rocksdict.WriteOptions()
    # The stub declares disable_wal a method; in 0.3.29 it is a bool property.
    wo.disable_wal = True  # type: ignore[assignment, method-assign]
    return wo


def _raise_translated(exc: Exception, action: str, path: str) -> NoReturn:
    """Raise ours for an error of rocksdict; the message names the DB directory and the action.

    RocksDB errors arrive as plain ``Exception`` whose text starts with the status code
    (``IO error:``, ``Corruption:``, ...), so this is the one place that reads message text.
    Anything else (a ``KeyError`` for a non-bytes key, one of ours, ...) is re-raised unchanged.
    """
    text = str(exc)
    msg = f"local RocksDB {path}: cannot {action}: {text}"
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
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        name, sep, count = line.partition(" COUNT : ")
        if sep and count.isdigit():
            out[name] = int(count)
    return out


def _drain(items: Iterator[Any]) -> Generator[tuple[bytes, bytes], None, None]:
    # Closing the generator (or dropping it) frees ``items``, the RocksDB iterator.
    yield from items


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
        self._opts = _options(self.conf, self.resources, create=create_if_missing)
        self._write_opts = _write_options()
        self._iterators: weakref.WeakSet[Generator[tuple[bytes, bytes], None, None]]
        self._iterators = weakref.WeakSet()
        #: Bytes of every batch applied by this object (RocksDB's WriteBatch size).
        self.bytes_written = 0
        if not create_if_missing and not os.path.exists(os.path.join(path, "CURRENT")):
            msg = f"local RocksDB {path}: cannot open: no CURRENT file (no database there)"
            raise MissingVersionError(msg)
        try:
            self._db: rocksdict.Rdict | None = rocksdict.Rdict(path, self._opts)
        except Exception as exc:
            _raise_translated(exc, "open", path)

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

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of ``keys`` in order, ``None`` where absent (RocksDB MultiGet, in chunks)."""
        db = self._live()
        n = len(keys)
        try:
            if n <= _MULTI_GET_CHUNK:
                return cast("list[bytes | None]", db[list(keys)])
            # Looking keys up in key order is 2-3x faster than in arrival order (block and
            # memtable locality); the order only matters for speed, so numpy's padded byte
            # strings are good enough to sort by.
            order = np.argsort(np.array(keys, dtype=np.bytes_), kind="stable").tolist()
            ordered = [keys[i] for i in order]
            found: list[bytes | None] = []
            for i in range(0, n, _MULTI_GET_CHUNK):
                found += cast("list[bytes | None]", db[ordered[i : i + _MULTI_GET_CHUNK]])
            out: list[bytes | None] = [None] * n
            for i, value in zip(order, found, strict=True):
                out[i] = value
            return out
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
        # Only the upper bound goes in ReadOptions: in rocksdict 0.3.29
        # set_iterate_lower_bound acts as an upper bound. The start is a seek (from_key).
        ro = rocksdict.ReadOptions()
        ro.set_iterate_upper_bound(end)
        try:
            items = db.items(from_key=start or None, read_opt=ro)
        except Exception as exc:
            _raise_translated(exc, "iterate", self.path)
        gen = _drain(items)
        self._iterators.add(gen)
        return gen

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
        except Exception as exc:
            _raise_translated(exc, "apply a write batch", self.path)
        self.bytes_written += size
        return size

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
        """Memory and disk use in bytes. Block cache and write buffers are process-wide."""
        cache, wbm = self.resources.block_cache, self.resources.write_buffer_manager
        return {
            "memtable_bytes": self._int_property("rocksdb.cur-size-all-mem-tables"),
            "table_readers_bytes": self._int_property("rocksdb.estimate-table-readers-mem"),
            "total_sst_bytes": self._int_property("rocksdb.total-sst-files-size"),
            "live_sst_bytes": self._int_property("rocksdb.live-sst-files-size"),
            "process_block_cache_bytes": cache.get_usage(),
            "process_block_cache_pinned_bytes": cache.get_pinned_usage(),
            "process_write_buffer_bytes": wbm.get_usage(),
        }

    def statistics(self) -> dict[str, int]:
        """RocksDB ticker counts (e.g. ``rocksdb.bytes.read``); empty unless ``conf.statistics``."""
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
        db, self._db = self._db, None
        if db is None:
            return
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
