"""Asking the process that keeps a store's local database open to let go of it.

A worker process keeps a partition's RocksDB open after its task (the next batch of the partition
often runs in the same process, and then it finds the database open and its caches warm). Another
process that needs the partition sends the holder a datagram naming the store's directory; a
thread of the holder closes the database and drops the directory's lock, or, if a task of the
holder is using it, does so when that task ends. The waiting side keeps trying the lock, so a lost
or unanswered request costs a wait, never correctness: the lock alone says who may open the
database.

Each process listens on one Unix datagram socket in the abstract namespace (no file to clean up;
it vanishes with the process), named in the lock file's holder record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable

__all__ = ["ask_to_release", "listener"]

log = logging.getLogger("sparkstate.store")

#: The largest request: a store directory path.
_MAX_REQUEST = 4096


class HandoffListener:
    """This process's socket and thread that run the release callback of a requested directory."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.address = f"\0sparkstate-handoff-{self.pid}-{os.urandom(6).hex()}"
        self._callbacks: dict[str, Callable[[], None]] = {}
        self._guard = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.address)
        thread = threading.Thread(target=self._serve, name="sparkstate-handoff", daemon=True)
        thread.start()

    def register(self, path: str, release: Callable[[], None]) -> None:
        """Run ``release`` (from the listener's thread) when another process asks for ``path``."""
        with self._guard:
            self._callbacks[_canonical(path)] = release

    def unregister(self, path: str) -> None:
        with self._guard:
            self._callbacks.pop(_canonical(path), None)

    def _serve(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_REQUEST)
            except OSError:  # the socket was closed (interpreter shutdown)
                return
            path = data.decode("utf-8", "replace")
            with self._guard:
                release = self._callbacks.get(path)
            if release is None:
                continue
            try:
                release()
            except Exception:  # the asking side times out with the holder named
                log.exception("could not hand over the local store %s", path)


_listener: HandoffListener | None = None
_listener_lock = threading.Lock()


def listener() -> HandoffListener:
    """This process's listener, started on first use (a forked child starts its own)."""
    global _listener
    with _listener_lock:
        if _listener is None or _listener.pid != os.getpid():
            _listener = HandoffListener()
        return _listener


def ask_to_release(address: str, path: str) -> None:
    """Ask the process listening at ``address`` to let go of ``path``; silent if it is gone."""
    # No such listener (the holder died, or never listened): nothing to ask.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
        sock.sendto(_canonical(path).encode("utf-8"), address)


def _canonical(path: str) -> str:
    """One name per directory on both sides (a relative local dir resolves in the worker's cwd)."""
    return os.path.realpath(path)
