"""The engine's durable logs under ``<checkpointLocation>/sparkstate/``.

``metadata.json`` fixes what must not change for the life of a checkpoint; ``batches/<b>.json`` is
the intent of batch ``b`` (its watermark and timestamp, written before it runs, reused by a
replay); ``commits/<b>.json`` is its outcome (which attempt of every store partition counts, and
metrics); ``progress.jsonl`` holds one progress dict per batch. A lock file keeps a second query
off a checkpoint that a running query uses.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from typing import IO, Any

from sparkstate.exceptions import CheckpointInUseError, MissingVersionError
from sparkstate.store.durable import DurableDir

__all__ = ["CheckpointLock", "CheckpointLog", "local_path"]

FORMAT_VERSION = 1
LOCK_FILE = "_query.lock"


def local_path(uri: str) -> str | None:
    """The local file system path of ``uri``, or None if it is not local."""
    if "://" not in uri:
        return os.path.abspath(uri)
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None


class CheckpointLog:
    """Reads and writes the engine's files under one checkpoint directory."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.dir = DurableDir(self.root)
        self.batches = self.dir.child("batches")
        self.commits = self.dir.child("commits")

    # --- metadata --------------------------------------------------------------------------------

    def read_metadata(self) -> dict[str, Any] | None:
        if not self.dir.exists("metadata.json"):
            return None
        data: dict[str, Any] = json.loads(self.dir.read("metadata.json"))
        return data

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        body = {"format_version": FORMAT_VERSION, **metadata}
        self.dir.write_atomic("metadata.json", _dumps(body))

    # --- intents and commits ---------------------------------------------------------------------

    def read_intent(self, batch_id: int) -> dict[str, Any] | None:
        return _read_optional(self.batches, f"{batch_id}.json")

    def write_intent(self, batch_id: int, intent: dict[str, Any]) -> None:
        self.batches.write_atomic(f"{batch_id}.json", _dumps({"batch_id": batch_id, **intent}))

    def read_commit(self, batch_id: int) -> dict[str, Any] | None:
        return _read_optional(self.commits, f"{batch_id}.json")

    def write_commit(self, batch_id: int, commit: dict[str, Any]) -> None:
        self.commits.write_atomic(f"{batch_id}.json", _dumps({"batch_id": batch_id, **commit}))

    def latest_commit(self) -> dict[str, Any] | None:
        ids = [int(e.name[:-5]) for e in self.commits.list() if _is_batch_file(e.name)]
        return self.read_commit(max(ids)) if ids else None

    # --- progress --------------------------------------------------------------------------------

    def append_progress(self, progress: dict[str, Any]) -> None:
        line = json.dumps(progress, sort_keys=True) + "\n"
        path = local_path(self.root)
        if path is not None:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "progress.jsonl"), "a", encoding="utf-8") as out:
                out.write(line)
        else:  # object stores cannot append: one file per batch
            self.dir.child("progress").write_atomic(f"{progress['batchId']}.json", line.encode())

    def read_progress(self) -> list[dict[str, Any]]:
        path = local_path(self.root)
        if path is not None:
            file = os.path.join(path, "progress.jsonl")
            if not os.path.exists(file):
                return []
            with open(file, encoding="utf-8") as src:
                return [json.loads(line) for line in src if line.strip()]
        pdir = self.dir.child("progress")
        names = sorted((e.name for e in pdir.list() if _is_batch_file(e.name)), key=_batch_of)
        return [json.loads(pdir.read(n)) for n in names]


class CheckpointLock:
    """An exclusive lock on a checkpoint for the life of a query.

    On a local checkpoint it is an ``flock`` (released by the kernel if the driver dies); elsewhere
    only queries of this process are kept apart.
    """

    _held: set[str] = set()
    _guard = threading.Lock()

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        with self._guard:
            if self.root in self._held:
                raise CheckpointInUseError(self._message("this process"))
            path = local_path(self.root)
            if path is not None:
                os.makedirs(path, exist_ok=True)
                handle = open(os.path.join(path, LOCK_FILE), "a+", encoding="utf-8")  # noqa: SIM115
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    handle.seek(0)
                    owner = handle.read().strip() or "another process"
                    handle.close()
                    raise CheckpointInUseError(self._message(owner)) from None
                handle.seek(0)
                handle.truncate()
                handle.write(f"pid {os.getpid()}\n")
                handle.flush()
                self._file = handle
            self._held.add(self.root)

    def release(self) -> None:
        with self._guard:
            self._held.discard(self.root)
            if self._file is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._file, fcntl.LOCK_UN)
                self._file.close()
                self._file = None

    def _message(self, owner: str) -> str:
        return (
            f"checkpoint {self.root} is in use by a running query ({owner}). Stop that query "
            "first, or give this one its own checkpointLocation."
        )


def _dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, sort_keys=True).encode("utf-8")


def _read_optional(directory: DurableDir, name: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(directory.read(name))
    except MissingVersionError:
        return None
    return data


def _is_batch_file(name: str) -> bool:
    return name.endswith(".json") and name[:-5].isdigit()


def _batch_of(name: str) -> int:
    return int(name[:-5])
