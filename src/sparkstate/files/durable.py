"""The one I/O boundary to durable storage: a directory behind ``pyarrow.fs``.

Local paths and ``file://`` URIs (:func:`local_path` is the one test of what is local), ``s3://``
URIs (with ``?endpoint_override=...&scheme=http`` for an S3 endpoint of your own) work; so does
anything else ``pyarrow.fs.FileSystem.from_uri`` knows.

A file becomes visible only once it is complete: on a file system with rename, it is written to a
temporary name and renamed; on an object store, a single-object put is atomic by itself.

A file a later read depends on also outlives a power cut or an operating system crash once its
write has returned. On a local (or mounted) file system the data are flushed to the device with
``fsync`` before the rename, and the directory after it, so that the new name is on the device
too; a new directory is synced into its parent the same way. Without that, the kernel may keep the
rename and lose the data (a complete name over an empty file) or lose the name while the logs of
the next step, written after it, survive. Object stores make a completed put durable themselves.
Other file systems behind ``pyarrow.fs`` (HDFS and the like) offer no sync through it: their
durability is their own.

An object store's call that fails on the way (throttled with ``503 SlowDown``, a ``500``, a
connection reset or timed out), once the S3 client's own retries are spent, is tried again whole
(:data:`REMOTE_ATTEMPTS` attempts, waiting longer each time); a put is atomic, so a retried write
never leaves half a file. When they run out, the error says so, with the last cause.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pyarrow
import pyarrow.fs as pafs

from sparkstate.exceptions import ConfigurationError, MissingVersionError, StateFileError

__all__ = [
    "REMOTE_ATTEMPTS",
    "TMP_PREFIX",
    "DurableDir",
    "FileEntry",
    "RangedFile",
    "canonical_location",
    "disk_full",
    "join_uri",
    "local_path",
    "make_dirs",
    "sync_dir",
    "sync_file",
    "why",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Attempts of a call to an object store, in all (module doc); the first wait, doubled after
#: each attempt up to the longest.
REMOTE_ATTEMPTS = 6
REMOTE_BACKOFF_S = 0.2
REMOTE_BACKOFF_MAX_S = 5.0
#: Errors no retry mends: a missing file or bucket, credentials refused.
_PERMANENT = (
    "not exist",
    "NoSuchKey",
    "NoSuchBucket",
    "ACCESS_DENIED",
    "AccessDenied",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
)

#: Files whose name starts with this are being written; readers ignore them, maintenance deletes
#: old ones.
TMP_PREFIX = ".tmp-"
_COPY_CHUNK = 8 << 20


#: What a full disk (or an exhausted quota) says, in the errors of Python, Arrow and RocksDB.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota on it) is full."""
    return getattr(exc, "errno", None) in _FULL or any(t in str(exc) for t in _FULL_TEXT)


def why(exc: BaseException) -> str:
    """The cause of a failed write as a user reads it: a full disk said so in words."""
    if disk_full(exc):
        return (
            f"the disk is full ({exc}): free space there, then restart the query "
            "(the batch did not commit; it runs again)"
        )
    return str(exc)


def _fsync(path: str, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file(path: str) -> None:
    """Flush a written file's data to the device (``fsync``; on Linux whichever descriptor
    wrote it)."""
    _fsync(path)


def sync_dir(path: str) -> None:
    """Flush a directory's entries (the names created, renamed or removed in it) to the device."""
    _fsync(path, os.O_DIRECTORY)


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, each directory it creates synced into its parent."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue  # made a moment ago by another process, which syncs it
        sync_dir(os.path.dirname(directory))


@dataclasses.dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    mtime_s: float


def local_path(uri: str) -> str | None:
    """The absolute local path of a plain path or a ``file:`` URI (``file:///x``, Hadoop's
    ``file:/x``, ``file://localhost/x``); None for any other URI."""
    if uri.startswith("file:"):
        rest = uri[len("file:") :]
        if rest.startswith("//"):
            host, _, path = rest[2:].partition("/")
            if host not in ("", "localhost"):
                msg = (
                    f"{uri!r} names a file on host {host!r}, which is not a local path: "
                    "write file:///path (three slashes) or the path alone"
                )
                raise ConfigurationError(msg)
            rest = "/" + path
        return os.path.abspath(rest)
    if "://" not in uri:
        return os.path.abspath(uri)
    return None


def canonical_location(uri: str) -> str:
    """One spelling for one directory: a local path made absolute with ``.``, ``..`` and
    symbolic links resolved (however it was written, and whatever the working directory is
    later); any other URI as given, without a trailing ``/``."""
    path = local_path(uri)
    if path is not None:
        return os.path.realpath(path)
    return uri.rstrip("/")


def join_uri(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` appended to its path; a query (an S3 URI's
    ``?endpoint_override=...``) stays at the end."""
    base, sep, query = uri.partition("?") if "://" in uri else (uri, "", "")
    sub = "/".join(p.strip("/") for p in parts if p)
    joined = f"{base.rstrip('/')}/{sub}" if sub else base
    return f"{joined}{sep}{query}"


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    path = local_path(uri)
    if path is not None:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:
        msg = f"cannot use {uri!r} as a state location: {exc}"
        raise ConfigurationError(msg) from exc
    return fs, path.rstrip("/")


#: Object stores: no rename, but a single-object put is atomic by itself.
_OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})


def _has_atomic_rename(fs: pafs.FileSystem) -> bool:
    base = fs
    while isinstance(base, pafs.SubTreeFileSystem):
        base = base.base_fs
    return str(base.type_name) not in _OBJECT_STORES


class DurableDir:
    """A directory on durable storage. Names passed to methods are relative to it."""

    def __init__(
        self, uri: str, *, _fs: pafs.FileSystem | None = None, _path: str | None = None
    ) -> None:
        self.uri = uri.rstrip("/")
        if _fs is not None and _path is not None:
            self.fs, self.path = _fs, _path
        else:
            self.fs, self.path = _resolve(uri)
        self._renames = _has_atomic_rename(self.fs)
        #: A directory of the operating system's: written through it, and synced (module doc).
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self._made = False

    def child(self, *parts: str) -> DurableDir:
        sub = "/".join(p.strip("/") for p in parts if p)
        return DurableDir(join_uri(self.uri, sub), _fs=self.fs, _path=f"{self.path}/{sub}")

    def where(self, name: str) -> str:
        """The full URI of a file, for messages (an S3 URI's ``?endpoint_override=...`` at the
        end, as :func:`join_uri` puts it)."""
        return join_uri(self.uri, name)

    def _full(self, name: str) -> str:
        return f"{self.path}/{name}"

    def _ensure_dir(self) -> None:
        if not self._made:
            if self._local:
                make_dirs(self.path)
            else:
                self._remote(lambda: self.fs.create_dir(self.path, recursive=True), self.uri)
            self._made = True

    def _tmp_name(self, name: str) -> str:
        return self._full(f"{TMP_PREFIX}{uuid.uuid4().hex}-{name}")

    def _publish(self, tmp: str, name: str) -> None:
        """Rename the complete ``tmp`` to ``name``; on a local file system its data are synced
        before and the directory after (module doc)."""
        if self._local:
            sync_file(tmp)
        self.fs.move(tmp, self._full(name))
        if self._local:
            sync_dir(self.path)

    @contextlib.contextmanager
    def _cleared_on_failure(self, tmp: str | None) -> Iterator[None]:
        """A write that fails (a full disk, a lost connection) leaves no temporary file."""
        try:
            yield
        except BaseException:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    self.fs.delete_file(tmp)
            raise

    def _remote(self, call: Callable[[], _T], what: str) -> _T:
        """``call()``, tried again on an object store while it fails on the way (module doc);
        on a local file system, once."""
        if self._local:
            return call()
        delay = REMOTE_BACKOFF_S
        started = time.monotonic()
        for attempt in range(1, REMOTE_ATTEMPTS + 1):
            try:
                return call()
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) or any(t in str(exc) for t in _PERMANENT):
                    raise
                if attempt == REMOTE_ATTEMPTS:
                    took = time.monotonic() - started
                    msg = f"gave up after {attempt} attempts over {took:.1f} s: {exc}"
                    raise OSError(msg) from exc
                log.info("%s failed (attempt %d), trying again: %s", what, attempt, exc)
                time.sleep(delay)
                delay = min(delay * 2, REMOTE_BACKOFF_MAX_S)
        raise AssertionError  # unreachable: the last attempt returns or raises

    def write_atomic(self, name: str, data: bytes) -> None:
        """Write ``name`` so that readers see either nothing or the whole file."""

        def write() -> None:
            if self._renames:
                tmp = self._tmp_name(name)
                with self._cleared_on_failure(tmp):
                    with self.fs.open_output_stream(tmp) as out:
                        out.write(data)
                    self._publish(tmp, name)
            else:
                with self.fs.open_output_stream(self._full(name)) as out:
                    out.write(data)

        try:
            self._ensure_dir()
            self._remote(write, f"writing {self.where(name)}")
        except OSError as exc:
            msg = f"cannot write {self.where(name)}: {why(exc)}"
            raise StateFileError(msg) from exc

    def write_if_absent(self, name: str, data: bytes) -> bool:
        """Write ``name`` unless it exists; True if this call wrote it (best effort on S3)."""
        if self.exists(name):
            return False
        self.write_atomic(name, data)
        return True

    def read(self, name: str) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(self._full(name)) as src:
                data: bytes = src.read()
                return data

        try:
            return self._remote(read, f"reading {self.where(name)}")
        except FileNotFoundError as exc:
            msg = f"missing state file {self.where(name)}"
            raise MissingVersionError(msg) from exc
        except OSError as exc:
            if "not exist" in str(exc) or "NoSuchKey" in str(exc):
                msg = f"missing state file {self.where(name)}"
                raise MissingVersionError(msg) from exc
            msg = f"cannot read {self.where(name)}: {why(exc)}"
            raise StateFileError(msg) from exc

    def open_ranged(self, name: str) -> RangedFile:
        """``name`` opened for reads of byte ranges, each one request on an object store (an
        SST file looked up in place, without downloading it)."""
        try:
            src = self._remote(
                lambda: self.fs.open_input_file(self._full(name)), f"opening {self.where(name)}"
            )
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or "not exist" in str(exc):
                msg = f"missing state file {self.where(name)}"
                raise MissingVersionError(msg) from exc
            msg = f"cannot open {self.where(name)}: {why(exc)}"
            raise StateFileError(msg) from exc
        return RangedFile(self, name, src)

    def exists(self, name: str) -> bool:
        try:
            info = self._remote(lambda: self.fs.get_file_info(self._full(name)), "a lookup")
        except OSError as exc:
            msg = f"cannot look up {self.where(name)}: {why(exc)}"
            raise StateFileError(msg) from exc
        return bool(info.type != pafs.FileType.NotFound)

    def present(self) -> bool:
        """Whether this directory exists (on an object store: whether anything is under it)."""
        try:
            info = self._remote(lambda: self.fs.get_file_info(self.path), "a lookup")
        except OSError as exc:
            msg = f"cannot look up {self.uri}: {why(exc)}"
            raise StateFileError(msg) from exc
        return bool(info.type != pafs.FileType.NotFound)

    def list(self, *, include_tmp: bool = False) -> list[FileEntry]:
        """Files directly in this directory (none if it does not exist)."""
        try:
            selector = pafs.FileSelector(self.path, allow_not_found=True)
            infos = self._remote(lambda: self.fs.get_file_info(selector), f"listing {self.uri}")
        except OSError as exc:
            msg = f"cannot list {self.uri}: {exc}"
            raise StateFileError(msg) from exc
        out = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            if not include_tmp and info.base_name.startswith(TMP_PREFIX):
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            out.append(FileEntry(info.base_name, info.size or 0, mtime))
        return out

    def walk(self) -> builtins.list[FileEntry]:  # ``list`` here is the method above
        """Files at any depth below this directory (none if it does not exist), each named by
        its path relative to it (``k=a/part-0``); files being written are left out."""
        try:
            selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
            infos = self._remote(lambda: self.fs.get_file_info(selector), f"listing {self.uri}")
        except OSError as exc:
            msg = f"cannot list {self.uri}: {exc}"
            raise StateFileError(msg) from exc
        out = []
        for info in infos:
            if info.type != pafs.FileType.File or info.base_name.startswith(TMP_PREFIX):
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            name = info.path[len(self.path) :].lstrip("/")
            out.append(FileEntry(name, info.size or 0, mtime))
        return out

    def names(self) -> builtins.list[str]:  # ``list`` here is the method above
        """The names of the files directly in this directory (none if it does not exist)."""
        return [e.name for e in self.list()]

    def delete(self, name: str) -> None:
        """Delete ``name``; a file that is already gone is fine."""
        try:
            self._remote(lambda: self.fs.delete_file(self._full(name)), f"deleting {name}")
            if self._local:  # a removal that a power cut undid could bring back a rolled-back log
                sync_dir(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not self.exists(name):
                return
            msg = f"cannot delete {self.where(name)}: {exc}"
            raise StateFileError(msg) from exc

    def upload(self, local_path: str, name: str) -> int:
        """Copy a local file to ``name`` atomically; returns the bytes copied."""

        def upload() -> None:
            target = self._tmp_name(name) if self._renames else self._full(name)
            with self._cleared_on_failure(target if self._renames else None):
                with open(local_path, "rb") as src, self.fs.open_output_stream(target) as out:
                    shutil.copyfileobj(src, out, _COPY_CHUNK)
                if self._renames:
                    self._publish(target, name)

        try:
            self._ensure_dir()
            self._remote(upload, f"uploading {self.where(name)}")
            return os.path.getsize(local_path)
        except OSError as exc:
            msg = f"cannot upload {local_path} to {self.where(name)}: {why(exc)}"
            raise StateFileError(msg) from exc

    def download(self, name: str, local_path: str) -> int:
        """Copy ``name`` to a local file; returns the bytes copied."""

        def download() -> None:
            with self.fs.open_input_stream(self._full(name)) as src, open(local_path, "wb") as out:
                shutil.copyfileobj(src, out, _COPY_CHUNK)

        try:
            self._remote(download, f"downloading {self.where(name)}")
            return os.path.getsize(local_path)
        except FileNotFoundError as exc:
            msg = f"missing state file {self.where(name)}"
            raise MissingVersionError(msg) from exc
        except OSError as exc:
            msg = f"cannot download {self.where(name)} to {local_path}: {why(exc)}"
            raise StateFileError(msg) from exc

    def move_to(self, name: str, other: DurableDir) -> None:
        """Move file ``name`` into ``other`` (same file system) under the same name."""
        try:
            other._ensure_dir()
            if self._local:  # written by another writer (Spark's, for a sink): on the device first
                sync_file(self._full(name))
            self.fs.move(self._full(name), other._full(name))
            if other._local:
                sync_dir(other.path)
        except OSError as exc:
            msg = f"cannot move {self.where(name)} to {other.where(name)}: {why(exc)}"
            raise StateFileError(msg) from exc

    def move_tree_to(self, other: DurableDir, keep: tuple[str, ...] = ()) -> int:
        """Move every file below this directory into ``other``, at the same relative paths,
        but those named in ``keep`` (directly in this one), and remove the directories left
        empty below it; returns how many moved."""
        moved = 0
        for entry in self.walk():
            if entry.name in keep:
                continue
            directory, _, name = entry.name.rpartition("/")
            source = self.child(directory) if directory else self
            source.move_to(name, other.child(directory) if directory else other)
            moved += 1
        local = local_path(self.uri)
        if local is not None:  # the directories left empty go too (an object store has none)
            for path, _, _ in os.walk(local, topdown=False):
                if path != local and not os.listdir(path):
                    os.rmdir(path)
        return moved

    def append(self, name: str, data: bytes) -> None:
        """Add ``data`` at the end of ``name``, on a local file system only: object stores cannot
        append (give each record a file of its own there)."""
        local = local_path(self.uri)
        if local is None:
            msg = f"cannot append to {self.where(name)}: an object store has no append"
            raise StateFileError(msg)
        try:
            make_dirs(local)
            path = os.path.join(local, name)
            new = not os.path.exists(path)
            with open(path, "ab") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            if new:
                sync_dir(local)
        except OSError as exc:
            msg = f"cannot append to {self.where(name)}: {why(exc)}"
            raise StateFileError(msg) from exc

    def delete_all(self) -> None:
        """Delete this directory and everything in it; a directory that is gone is fine."""
        try:
            self._remote(lambda: self.fs.delete_dir(self.path), f"deleting {self.uri}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            if self.fs.get_file_info(self.path).type == pafs.FileType.NotFound:
                return
            msg = f"cannot delete {self.uri}: {exc}"
            raise StateFileError(msg) from exc


class RangedFile:
    """A durable file open for reads of byte ranges (:meth:`DurableDir.open_ranged`)."""

    def __init__(self, directory: DurableDir, name: str, src: pyarrow.NativeFile) -> None:
        self.name = name
        self.size: int = src.size()
        self._dir = directory
        self._src = src

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer at the end of the file)."""
        try:
            data: bytes = self._dir._remote(  # noqa: SLF001 - the directory's retries
                lambda: self._src.read_at(length, offset), f"reading {self._dir.where(self.name)}"
            )
        except OSError as exc:
            msg = f"cannot read {self._dir.where(self.name)}: {why(exc)}"
            raise StateFileError(msg) from exc
        return data

    def close(self) -> None:
        self._src.close()
