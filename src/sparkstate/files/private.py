"""Directories and files of this machine that only their owner may read: the state homes'
sockets, addresses, logs and the application's secret, and the local copies of state.

A private directory is this user's (mode 0700) and a private file is too (0600). A directory
that exists already is checked before it is used: one that is a symbolic link, or that another
user owns, is refused (its owner could read or replace what is put in it, and only they could
change that); one of ours that others may read (0755, as a ``mkdir`` under the usual umask
makes it) is narrowed to 0700; one of ours that others could write to is refused, since they
may have put files in it already that would be taken for ours.
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["PrivateDirError", "open_private", "private_dir", "write_private"]

#: A private directory's mode, and a private file's.
DIR_MODE = 0o700
FILE_MODE = 0o600


class PrivateDirError(PermissionError):
    """A directory meant to be this user's alone cannot be made so."""


def private_dir(path: str) -> str:
    """``path``, created (with its parents) if missing, checked or narrowed as the module says;
    :class:`PrivateDirError` if it cannot be this user's alone."""
    with contextlib.suppress(FileExistsError):
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        os.mkdir(path, DIR_MODE)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        msg = f"{path} must be a directory of this user's, not a link or a file"
        raise PrivateDirError(msg)
    if st.st_uid != os.getuid():
        msg = (
            f"{path} belongs to user {st.st_uid}, not to this user ({os.getuid()}): another "
            "user could read or replace what sparkstate keeps there; remove it or choose "
            "another directory"
        )
        raise PrivateDirError(msg)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        msg = (
            f"{path} can be written by other users (mode {mode:o}): they may have put files "
            "there that sparkstate would take for its own; remove it (no query of this user's "
            "running) and it is made again for this user alone"
        )
        raise PrivateDirError(msg)
    if mode != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file renamed over it), readable and
    writable by this user only; a link at ``path`` is replaced, not followed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = -1
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_private(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)`` with the private file mode for a file it creates."""
    return os.open(path, flags | os.O_CREAT, FILE_MODE)
