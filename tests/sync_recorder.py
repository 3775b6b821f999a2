"""What a process does to durable storage, in order: every ``fsync`` (with the path of the file
or directory it flushed) and every create, rename and delete of a ``DurableDir``, one JSON line
each in ``<log_dir>/<pid>.log``.

A test installs it in its own process (:func:`install`), or in every Python process of a Spark
job of its own by setting :data:`ENV` (``python_start/sitecustomize.py`` installs it then: the
driver, the Python daemon before it forks the workers, the streaming sources' runners).
:func:`unsynced` says which renames were not synced on both sides.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ENV = "SPARKSTATE_RECORD_SYNCS"


def install(log_dir: str) -> None:
    from sparkstate.files import durable

    def record(kind: str, path: str) -> None:
        with open(os.path.join(log_dir, f"{os.getpid()}.log"), "a", encoding="utf-8") as out:
            out.write(json.dumps([kind, path]) + "\n")

    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        record("fsync", os.readlink(f"/proc/self/fd/{fd}"))

    os.fsync = fsync
    original_init = durable.DurableDir.__init__

    def init(self: Any, uri: str, *, _fs: Any = None, _path: str | None = None) -> None:
        inner = _fs.inner if isinstance(_fs, _RecordingFS) else _fs
        original_init(self, uri, _fs=inner, _path=_path)
        self.fs = _RecordingFS(self.fs, record)

    durable.DurableDir.__init__ = init  # type: ignore[method-assign]


class _RecordingFS:
    """A ``pyarrow.fs`` file system whose mutating calls are recorded (a rename once done)."""

    def __init__(self, inner: Any, record: Callable[[str, str], None]) -> None:
        self.inner, self._record = inner, record

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def open_output_stream(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._record("create", path)
        return self.inner.open_output_stream(path, *args, **kwargs)

    def move(self, src: str, dest: str) -> None:
        self.inner.move(src, dest)
        self._record("rename", f"{src}\0{dest}")

    def delete_file(self, path: str) -> None:
        self.inner.delete_file(path)
        self._record("deleted", path)


def events(log_dir: Path) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    """Each process's events, in its order."""
    for log in sorted(log_dir.glob("*.log")):
        lines = log.read_text(encoding="utf-8").splitlines()
        yield int(log.stem), [tuple(json.loads(line)) for line in lines]  # type: ignore[misc]


def unsynced(log: list[tuple[str, str]]) -> list[str]:
    """The renames in one process's ``log`` whose file was not synced before (since it was
    created here: a file of another writer, a sink's part file, since the start) or whose
    directory was not synced after."""
    bad = []
    for i, (kind, paths) in enumerate(log):
        if kind != "rename":
            continue
        src, dest = paths.split("\0")
        created = max((j for j in range(i) if log[j] == ("create", src)), default=-1)
        before = ("fsync", src) in log[created + 1 : i]
        after = ("fsync", os.path.dirname(dest)) in log[i + 1 :]
        if not (before and after):
            bad.append(f"{src} -> {dest}: synced before {before}, its directory after {after}")
    return bad


def renamed_to(log: list[tuple[str, str]]) -> set[str]:
    """The paths files were renamed to in ``log``."""
    return {paths.split("\0")[1] for kind, paths in log if kind == "rename"}
