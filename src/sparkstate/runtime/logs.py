"""The engine's durable logs under ``<checkpointLocation>/sparkstate/``.

``metadata.json`` fixes what must not change for the life of a checkpoint; ``batches/<b>.json`` is
the intent of batch ``b`` (its watermark and timestamp, written before it runs, reused by a
replay); ``reports/<b>/<run>/`` holds the reports of the tasks of one run of batch ``b`` until
``commits/<b>.json`` records its outcome (which attempt of every store partition counts);
``progress.jsonl`` holds one progress dict per batch; ``clock.json`` asks for no-data batches
(:mod:`sparkstate.runtime.triggers`). A lock file keeps a second query off a checkpoint that a
running query uses. Every file goes through :class:`~sparkstate.store.durable.DurableDir`.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any

from sparkstate.exceptions import CheckpointInUseError, MissingVersionError
from sparkstate.runtime.records import BatchCommit, BatchIntent, TaskReport
from sparkstate.runtime.triggers import read_clock, write_clock
from sparkstate.store.durable import DurableDir, local_path
from sparkstate.store.file_lock import FileLock

__all__ = ["CheckpointLock", "CheckpointLog", "ReportDir", "local_path"]

FORMAT_VERSION = 1
LOCK_FILE = "_query.lock"
PROGRESS_FILE = "progress.jsonl"


class ReportDir:
    """Where the tasks of one run of a batch leave their reports, and where the driver reads
    them. Pickles as its URI, so it travels to the tasks; each task attempt writes its own file."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def __call__(self, report: TaskReport) -> None:
        tag = report.checkpoint_id or uuid.uuid4().hex
        name = f"{report.op}-{report.partition}-{tag}.json"
        DurableDir(self.uri).write_atomic(name, report.to_json().encode("utf-8"))

    def read(self) -> list[TaskReport]:
        directory = DurableDir(self.uri)
        return [
            TaskReport.from_json(directory.read(e.name))
            for e in directory.list()
            if e.name.endswith(".json")
        ]


class CheckpointLog:
    """Reads and writes the engine's files under one checkpoint directory."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.dir = DurableDir(self.root)
        self.batches = self.dir.child("batches")
        self.commits = self.dir.child("commits")
        self.reports = self.dir.child("reports")

    # --- metadata --------------------------------------------------------------------------------

    def read_metadata(self) -> dict[str, Any] | None:
        if not self.dir.exists("metadata.json"):
            return None
        data: dict[str, Any] = json.loads(self.dir.read("metadata.json"))
        return data

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        body = {"format_version": FORMAT_VERSION, **metadata}
        self.dir.write_atomic("metadata.json", _dumps(body))

    # --- intents, reports and commits ------------------------------------------------------------

    def read_intent(self, batch_id: int) -> BatchIntent | None:
        text = _read_optional(self.batches, f"{batch_id}.json")
        return None if text is None else BatchIntent.from_json(text)

    def write_intent(self, intent: BatchIntent) -> None:
        self.batches.write_atomic(f"{intent.batch_id}.json", intent.to_json().encode("utf-8"))

    def new_report_dir(self, batch_id: int) -> ReportDir:
        """A fresh directory for the reports of one run of batch ``batch_id``."""
        return ReportDir(self.reports.child(str(batch_id), uuid.uuid4().hex).uri)

    def read_commit(self, batch_id: int) -> BatchCommit | None:
        text = _read_optional(self.commits, f"{batch_id}.json")
        return None if text is None else BatchCommit.from_json(text)

    def write_commit(self, commit: BatchCommit) -> None:
        """Record the batch's outcome; the reports of its runs are not needed after that."""
        self.commits.write_atomic(f"{commit.batch_id}.json", commit.to_json().encode("utf-8"))
        self.reports.child(str(commit.batch_id)).delete_all()

    def latest_commit(self) -> BatchCommit | None:
        ids = [_batch_of(e.name) for e in self.commits.list() if _is_batch_file(e.name)]
        return self.read_commit(max(ids)) if ids else None

    def roll_back(self, batch_id: int) -> list[int]:
        """Forget the outcome of batch ``batch_id`` and every later batch (Spark plans them
        again). Newest first, so that a crash part way leaves the logs a prefix of batches.
        The intent of ``batch_id`` stays until the caller replaces it, which is what tells a
        run after such a crash to go on rolling back. Returns the batches whose commits went."""
        committed = sorted(
            (
                b
                for b in (_batch_of(e.name) for e in self.commits.list() if _is_batch_file(e.name))
                if b >= batch_id
            ),
            reverse=True,
        )
        for b in committed:
            self.commits.delete(f"{b}.json")
        intents = [_batch_of(e.name) for e in self.batches.list() if _is_batch_file(e.name)]
        for b in sorted((b for b in intents if b > batch_id), reverse=True):
            self.batches.delete(f"{b}.json")
        return sorted(committed)

    # --- clock -----------------------------------------------------------------------------------

    def read_clock(self) -> dict[str, Any]:
        return read_clock(self.dir)

    def write_clock(self, request: dict[str, Any]) -> None:
        write_clock(self.dir, request)

    # --- progress --------------------------------------------------------------------------------

    def append_progress(self, progress: dict[str, Any]) -> None:
        line = (json.dumps(progress, sort_keys=True) + "\n").encode("utf-8")
        if local_path(self.root) is not None:
            self.dir.append(PROGRESS_FILE, line)
        else:  # object stores cannot append: one file per batch
            self.dir.child("progress").write_atomic(f"{progress['batchId']}.json", line)

    def read_progress(self) -> list[dict[str, Any]]:
        if local_path(self.root) is not None:
            text = _read_optional(self.dir, PROGRESS_FILE) or b""
            return [json.loads(line) for line in text.decode("utf-8").splitlines() if line.strip()]
        pdir = self.dir.child("progress")
        names = sorted((e.name for e in pdir.list() if _is_batch_file(e.name)), key=_batch_of)
        return [json.loads(pdir.read(n)) for n in names]


class CheckpointLock:
    """An exclusive lock on a checkpoint for the life of a query.

    On a local checkpoint it is a :class:`~sparkstate.store.file_lock.FileLock` (released by the
    kernel if the driver dies); elsewhere only queries of this process are kept apart.
    """

    _held: set[str] = set()
    _guard = threading.Lock()

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._lock: FileLock | None = None

    def acquire(self) -> None:
        with self._guard:
            if self.root in self._held:
                raise CheckpointInUseError(self._message("this process"))
            path = local_path(self.root)
            if path is not None:
                os.makedirs(path, exist_ok=True)
                lock = FileLock(os.path.join(path, LOCK_FILE))
                if not lock.try_acquire():
                    raise CheckpointInUseError(self._message(lock.owner() or "another process"))
                self._lock = lock
            self._held.add(self.root)

    def release(self) -> None:
        with self._guard:
            self._held.discard(self.root)
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _message(self, owner: str) -> str:
        return (
            f"checkpoint {self.root} is in use by a running query ({owner}). Stop that query "
            "first, or give this one its own checkpointLocation."
        )


def _dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, sort_keys=True).encode("utf-8")


def _read_optional(directory: DurableDir, name: str) -> bytes | None:
    try:
        return directory.read(name)
    except MissingVersionError:
        return None


def _is_batch_file(name: str) -> bool:
    return name.endswith(".json") and name[:-5].isdigit()


def _batch_of(name: str) -> int:
    return int(name[:-5])
