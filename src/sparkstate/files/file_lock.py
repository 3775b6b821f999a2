"""An exclusive lock on a local file: who may use a directory, across processes and within one.

:class:`FileLock` takes a non-blocking ``flock`` on an open file description. The kernel drops it
when the holder's process dies, however it dies, and two ``FileLock`` objects on one file exclude
each other even in one process. The holder writes an owner line into the file (``pid N`` unless
told otherwise) so that the side it refuses can name the holder in its error. Waiting, retrying
and the error to raise are the caller's: a store's local directory waits with a timeout, a query's
checkpoint refuses at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
from types import TracebackType

from sparkstate.exceptions import StoreLockedError

__all__ = ["FileLock"]

#: The errno values of an ``flock`` refused because another open file description holds it.
_HELD_ELSEWHERE = frozenset({errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES})
#: How much of the file :meth:`FileLock.owner` reads: an owner line, not a log.
_OWNER_MAX = 4096


class FileLock:
    """An exclusive ``flock`` on the file at ``path`` (created if missing; its directory must
    exist), with the holder's owner line in the file.

    Held by this object in this process only: a forked child that inherits the descriptor does
    not hold the lock, and its :meth:`release` closes its copy without unlocking the parent's.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._fd_pid = 0

    def __repr__(self) -> str:
        return f"FileLock({self.path!r}, held={self.held})"

    @property
    def held(self) -> bool:
        """Whether this object holds the lock in this process (a forked child does not)."""
        return self._fd is not None and self._fd_pid == os.getpid()

    def try_acquire(self, owner: str | None = None) -> bool:
        """Take the lock if no one holds it and write ``owner`` (default ``pid N``) as the file's
        one line; False, without waiting, if another process or object holds it."""
        if self.held:
            msg = f"lock file {self.path} is already held by this object"
            raise StoreLockedError(msg)
        self._forget_inherited_fd()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in _HELD_ELSEWHERE:
                    raise
                os.close(fd)
                return False
            line = f"pid {os.getpid()}" if owner is None else owner
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{line}\n".encode(), 0)
        except BaseException:
            os.close(fd)  # closing the only descriptor also drops a lock taken above
            raise
        self._fd = fd
        self._fd_pid = os.getpid()
        return True

    def acquire(self, owner: str | None = None) -> None:
        """:meth:`try_acquire`, raising :class:`StoreLockedError` naming the holder if refused."""
        if not self.try_acquire(owner):
            msg = f"lock file {self.path} is held by {self.owner() or 'another process'}"
            raise StoreLockedError(msg)

    def owner(self) -> str:
        """The owner line the holder wrote, stripped; empty if none (or the file is gone).

        It is only shown in messages, so damage never fails it: of a garbled file it gives the
        first line, with bytes that are not UTF-8 and unprintable characters shown as U+FFFD.
        """
        try:
            with open(self.path, "rb") as f:
                data = f.read(_OWNER_MAX)
        except OSError:
            return ""
        lines = data.decode("utf-8", "replace").strip().splitlines()
        line = lines[0].strip() if lines else ""
        return "".join(c if c.isprintable() else "\ufffd" for c in line)

    def release(self) -> None:
        """Clear the owner line and drop the lock. Idempotent; never fails for a lock not held."""
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

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
