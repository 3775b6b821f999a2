"""A store's executor-local directory and the exclusive file lock that says who may use it.

PySpark runs a partition's task in whichever Python worker process of the executor is free, so a
store's local RocksDB lives in an executor-level directory ``<local_dir>/<local_key>/``, not in a
process. An exclusive ``flock`` on ``LOCK.sparkstate`` (:mod:`.file_lock`) says which process may
use it; the holder records itself in the lock file (for the error message of a process that waits
in vain, and the address where it takes requests to let go: :mod:`.handoff`), opens ``db/`` and
closes it before releasing the lock so the next process can open it. A process that dies loses its
flock in the kernel, and RocksDB's own ``LOCK`` with it.

A store's directory is its user's alone (mode 0700: RocksDB writes its files with the umask's
mode, and a directory others cannot enter keeps them from those files whatever their mode), and
so is the default root (``sparkstate-<uid>`` in the temp dir, refused if another user owns it:
:func:`sparkstate.files.private.private_dir`). A root the user chose is made 0700 if it is
missing and otherwise left as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import time
from types import TracebackType

from sparkstate.exceptions import (
    ConfigurationError,
    StateFileError,
    StateStoreError,
    StoreLockedError,
)
from sparkstate.files.durable import why
from sparkstate.files.file_lock import FileLock
from sparkstate.files.private import DIR_MODE, private_dir
from sparkstate.store.conf import default_local_dir
from sparkstate.store.handoff import ask_to_release

__all__ = ["DB_DIR_NAME", "LOCK_FILE_NAME", "LocalStoreDir", "LockHolder", "local_key"]

LOCK_FILE_NAME = "LOCK.sparkstate"
DB_DIR_NAME = "db"
_KEY_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: While refused, how often the holder is asked to let go (a request can be lost or early).
_ASK_EVERY_S = 0.05


def local_key(checkpoint_root: str, operator_id: int, partition_id: int, store_name: str) -> str:
    """A filesystem-safe directory name for a store id: a SHA-1 prefix plus a readable suffix."""
    ident = f"{checkpoint_root}\x00{operator_id}\x00{partition_id}\x00{store_name}"
    digest = hashlib.sha1(ident.encode("utf-8"), usedforsecurity=False).hexdigest()[:20]
    name = _KEY_SAFE.sub("_", store_name)[:40]
    return f"{digest}-op{operator_id}-p{partition_id}-{name}"


@dataclasses.dataclass(frozen=True)
class LockHolder:
    """Who holds a store directory, as recorded in its lock file by the holder."""

    pid: int
    host: str
    acquired_at: float
    owner: str
    #: Where the holder takes requests to let go (:mod:`.handoff`), if it does.
    handoff: str | None = None

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired_at))
        who = f" ({self.owner})" if self.owner else ""
        return f"pid {self.pid} on {self.host}{who} since {since}"


class LocalStoreDir:
    """``<root>/<key>/``: one store's executor-local directory and its exclusive file lock.

    ``acquire`` waits for the lock (another worker process may be using the store) and records
    this process in the lock file; ``release`` clears it. The lock is a :class:`.FileLock` (an
    ``flock`` on an open file description), so it is also released when the holder dies, and two
    ``LocalStoreDir`` objects in one process exclude each other too.
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
        self._lock = FileLock(self.lock_path)

    def __repr__(self) -> str:
        return f"LocalStoreDir({self.path!r}, held={self.held})"

    @property
    def held(self) -> bool:
        """Whether this object holds the lock in this process (a forked child does not)."""
        return self._lock.held

    def acquire(self, timeout_s: float, owner: str = "", handoff: str | None = None) -> float:
        """Take the lock, waiting up to ``timeout_s``; return the seconds waited.

        ``owner`` (e.g. a task attempt) is written to the lock file for error messages, and
        ``handoff``, the address this process listens on for requests to let go of the directory
        (:mod:`.handoff`). While refused, the holder is asked at its recorded address, if any.
        Raises :class:`StoreLockedError` naming the holder's pid when the wait times out.
        """
        if self.held:
            msg = f"local store directory {self.path} is already locked by this object"
            raise StoreLockedError(msg)
        start = time.monotonic()
        deadline = start + max(timeout_s, 0.0)
        delay = 0.001
        asked = -1.0
        while not self._try_acquire(owner, handoff):
            now = time.monotonic()
            if now - asked >= _ASK_EVERY_S:
                self._ask_holder()
                asked = now
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
        return time.monotonic() - start

    def _try_acquire(self, owner: str, handoff: str | None) -> bool:
        try:
            self._make_private()
            return self._lock.try_acquire(self._record(owner, handoff))
        except StateStoreError:
            raise
        except OSError as exc:  # a full disk, a directory without permission
            msg = f"cannot take the local store directory {self.path}: {why(exc)}"
            raise StateFileError(msg) from exc

    def _make_private(self) -> None:
        """The store's directory, made (or narrowed) to mode 0700, under its root (see the
        module)."""
        if os.path.abspath(self.root) == os.path.abspath(default_local_dir()):
            private_dir(self.root)
        elif not os.path.isdir(self.root):
            os.makedirs(os.path.dirname(os.path.abspath(self.root)), exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.root, DIR_MODE)
        try:
            os.mkdir(self.path, DIR_MODE)
        except FileExistsError:
            st = os.stat(self.path)
            if stat.S_IMODE(st.st_mode) != DIR_MODE and st.st_uid == os.getuid():
                os.chmod(self.path, DIR_MODE)  # a copy kept by an earlier version

    @staticmethod
    def _record(owner: str, handoff: str | None = None) -> str:
        """The owner line of this process: a JSON object that :meth:`holder` reads back."""
        record: dict[str, object] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "acquired_at": time.time(),
            "owner": owner,
        }
        if handoff:
            record["handoff"] = handoff
        return json.dumps(record)

    def _ask_holder(self) -> None:
        """Ask the holder to let go, if it recorded where it listens (a holder on this host)."""
        holder = self.holder()
        if holder is not None and holder.handoff and holder.host == socket.gethostname():
            ask_to_release(holder.handoff, self.path)

    def release(self) -> None:
        """Clear the holder record and drop the lock. Close the DB first. Idempotent."""
        self._lock.release()

    def holder(self) -> LockHolder | None:
        """The holder recorded in the lock file, or None if none is recorded (or it is garbled)."""
        try:
            raw = json.loads(self._lock.owner() or "null")
            handoff = raw.get("handoff")
            return LockHolder(
                int(raw["pid"]),
                str(raw["host"]),
                float(raw["acquired_at"]),
                str(raw["owner"]),
                handoff if isinstance(handoff, str) else None,
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
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
