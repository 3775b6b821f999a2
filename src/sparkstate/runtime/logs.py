"""The engine's durable logs under ``<checkpointLocation>/sparkstate/``.

``metadata.json`` fixes what must not change for the life of a checkpoint; ``batches/<b>.json`` is
the intent of batch ``b`` (its watermark and timestamp, written before it runs, reused by a
replay); ``reports/<b>/<run>/`` holds the reports of the tasks of one run of batch ``b`` until
``commits/<b>.json`` records its outcome (which attempt of every store partition counts);
``progress.jsonl`` holds one progress dict per batch; ``clock.json`` asks for no-data batches
(:mod:`sparkstate.runtime.triggers`). A lock file keeps a second query off a checkpoint that a
running query uses. Every file goes through :class:`~sparkstate.files.durable.DurableDir`, and
every JSON file is read with :mod:`sparkstate.files.json_files`: a damaged one fails with a
:class:`~sparkstate.exceptions.CorruptStateFileError` naming it, what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from sparkstate.exceptions import CheckpointInUseError, MissingVersionError, QueryError
from sparkstate.files.durable import DurableDir, canonical_location, join_uri, local_path
from sparkstate.files.file_lock import FileLock
from sparkstate.files.json_files import RESTORE, json_object, parse_json_lines, read_json
from sparkstate.runtime.records import BatchCommit, BatchIntent, TaskFailure, TaskReport
from sparkstate.runtime.triggers import read_clock, write_clock

__all__ = [
    "ENGINE_DIR",
    "CheckpointLock",
    "CheckpointLog",
    "ReportDir",
    "engine_root_of",
    "local_path",
]

T = TypeVar("T")

log = logging.getLogger("sparkstate.engine")

#: The engine's directory inside a checkpoint.
ENGINE_DIR = "sparkstate"
FORMAT_VERSION = 1
LOCK_FILE = "_query.lock"
METADATA_FILE = "metadata.json"
PROGRESS_FILE = "progress.jsonl"
FAILURE_SUFFIX = ".failure"
#: The fields of ``metadata.json`` that a restart reads, and their JSON types.
METADATA_FIELDS: dict[str, tuple[type, ...]] = {
    "query_id": (str,),
    "num_partitions": (int,),
    "provider": (str,),
    "state_location": (str, type(None)),  # None: in the checkpoint itself
    "operators": (list,),
}

#: What to do about a damaged file that the checkpoint can do without (else ``RESTORE``).
RERUN = (
    "Its batch has not committed: restarting the query runs the batch again, with new reports "
    "(the damaged file is deleted once the batch commits)."
)
PROGRESS_ONLY = (
    "It only records progress and nothing reads it to run the query: delete it to go on."
)


def engine_root_of(location: str) -> str:
    """The engine's directory of the checkpoint at ``location`` (a canonical location)."""
    return join_uri(location, ENGINE_DIR)


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
            read_json(directory, e.name, RERUN, TaskReport.from_json)
            for e in directory.list()
            if e.name.endswith(".json")
        ]

    def failed(self, failure: TaskFailure) -> None:
        """A task attempt failed: why, for the driver to raise (best effort: the task's own
        error must reach Spark whatever happens here)."""
        name = f"{failure.op}-{failure.partition}-{uuid.uuid4().hex}{FAILURE_SUFFIX}"
        try:
            DurableDir(self.uri).write_atomic(name, failure.to_json().encode("utf-8"))
        except Exception:  # noqa: BLE001 - the failure being reported is what matters
            log.warning("could not record a task's failure in %s", self.uri, exc_info=True)

    def first_failure(self) -> TaskFailure | None:
        """The failure a task of this run recorded first, if any."""
        directory = DurableDir(self.uri)
        entries = sorted(
            (e for e in directory.list() if e.name.endswith(FAILURE_SUFFIX)),
            key=lambda e: e.mtime_s,
        )
        for entry in entries:
            try:
                return TaskFailure.from_json(directory.read(entry.name))
            except Exception:  # noqa: BLE001 - then Spark's own error is what the user sees
                log.warning("unreadable task failure %s", directory.where(entry.name))
        return None


class CheckpointLog:
    """Reads and writes the engine's files under one checkpoint directory."""

    def __init__(self, root: str, location: str | None = None) -> None:
        self.root = root.rstrip("/")
        #: The checkpoint's canonical location, where the log was opened from it.
        self.location = location
        self.dir = DurableDir(self.root)
        self.batches = self.dir.child("batches")
        self.commits = self.dir.child("commits")
        self.reports = self.dir.child("reports")
        self.failures = self.dir.child("failures")

    @classmethod
    def of_checkpoint(cls, location: str) -> CheckpointLog:
        """The log of the checkpoint at ``location``, as a user gives ``checkpointLocation``."""
        location = canonical_location(location)
        return cls(join_uri(location, ENGINE_DIR), location)

    # --- metadata --------------------------------------------------------------------------------

    def read_metadata(self) -> dict[str, Any] | None:
        """The checkpoint's ``metadata.json``; None for a new checkpoint. Missing where batches
        have run, it is not made anew (the state would not match it): a :class:`QueryError`."""
        try:
            return read_json(self.dir, METADATA_FILE, RESTORE, _metadata)
        except MissingVersionError:
            pass
        logs = [d for d in (self.commits, self.batches) if any(map(_is_batch_file, d.names()))]
        if logs:
            msg = (
                f"{self.dir.where(METADATA_FILE)} is missing, but batches of this checkpoint have "
                f"run ({logs[0].uri} holds their logs): a new one might not match the state they "
                f"left (its partition count, provider, operators). {RESTORE}"
            )
            raise QueryError(msg)
        return None

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        body = {"format_version": FORMAT_VERSION, **metadata}
        self.dir.write_atomic(METADATA_FILE, _dumps(body))

    # --- intents, reports and commits ------------------------------------------------------------

    def read_intent(self, batch_id: int) -> BatchIntent | None:
        return _read_optional(self.batches, f"{batch_id}.json", BatchIntent.from_json)

    def write_intent(self, intent: BatchIntent) -> None:
        self.batches.write_atomic(f"{intent.batch_id}.json", intent.to_json().encode("utf-8"))

    def new_report_dir(self, batch_id: int) -> ReportDir:
        """A fresh directory for the reports of one run of batch ``batch_id``."""
        return ReportDir(self.reports.child(str(batch_id), uuid.uuid4().hex).uri)

    def read_commit(self, batch_id: int) -> BatchCommit | None:
        return _read_optional(self.commits, f"{batch_id}.json", BatchCommit.from_json)

    def write_commit(self, commit: BatchCommit) -> None:
        """Record the batch's outcome; the reports of its runs are not needed after that."""
        self.commits.write_atomic(f"{commit.batch_id}.json", commit.to_json().encode("utf-8"))
        self.reports.child(str(commit.batch_id)).delete_all()

    def latest_commit(self) -> BatchCommit | None:
        ids = [_batch_of(n) for n in self.commits.names() if _is_batch_file(n)]
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

    # --- failures --------------------------------------------------------------------------------

    def write_failure(self, start_id: str, failure: TaskFailure) -> None:
        """The error that failed the run ``start_id`` of the query, for a client in another
        process (best effort: the error itself is what must reach Spark)."""
        try:
            self.failures.write_atomic(f"{start_id}.json", failure.to_json().encode("utf-8"))
        except Exception:  # noqa: BLE001
            log.warning("could not record the query's failure in %s", self.failures.uri)

    def read_failure(self, start_id: str) -> TaskFailure | None:
        return _read_optional(self.failures, f"{start_id}.json", TaskFailure.from_json)

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
            lines = self.dir.read(PROGRESS_FILE) if self.dir.exists(PROGRESS_FILE) else b""
            return parse_json_lines(lines, self.dir.where(PROGRESS_FILE), PROGRESS_ONLY)
        pdir = self.dir.child("progress")
        names = sorted(filter(_is_batch_file, pdir.names()), key=_batch_of)
        return [read_json(pdir, n, PROGRESS_ONLY, json_object) for n in names]


class CheckpointLock:
    """An exclusive lock on a checkpoint for the life of a query.

    On a local checkpoint it is a :class:`~sparkstate.files.file_lock.FileLock` (released by
    the
    kernel if the driver dies); elsewhere only queries of this process are kept apart.
    """

    _held: set[str] = set()
    _guard = threading.Lock()

    def __init__(self, root: str, location: str | None = None) -> None:
        self.root = root.rstrip("/")
        #: The checkpoint's canonical location, where the log was opened from it.
        self.location = location
        self._lock: FileLock | None = None
        #: The directory ``acquire`` made, for :meth:`release` to take back (None: it was there).
        self._made: str | None = None

    def acquire(self) -> None:
        with self._guard:
            if self.root in self._held:
                raise CheckpointInUseError(self._message("this process"))
            path = local_path(self.root)
            if path is not None:
                self._made = None if os.path.isdir(path) else path
                os.makedirs(path, exist_ok=True)
                lock = FileLock(os.path.join(path, LOCK_FILE))
                if not lock.try_acquire():
                    raise CheckpointInUseError(self._message(lock.owner() or "another process"))
                self._lock = lock
            self._held.add(self.root)

    def release(self, *, undo: bool = False, emptied: bool = False) -> None:
        """Let the checkpoint go; ``undo`` (a start that failed): also remove the directory
        ``acquire`` made, where nothing but the lock was written to it, so that a refused start
        leaves the checkpoint as it found it; ``emptied`` (an export, which moved everything
        aside): remove the directory where nothing but the lock is left in it."""
        with self._guard:
            self._held.discard(self.root)
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            made, self._made = self._made, None
            if emptied:
                made = local_path(self.root)
            if (undo or emptied) and made is not None and os.listdir(made) == [LOCK_FILE]:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(made, LOCK_FILE))
                    os.rmdir(made)

    def _message(self, owner: str) -> str:
        return (
            f"checkpoint {self.root} is in use by a running query ({owner}). Stop that query "
            "first, or give this one its own checkpointLocation."
        )


def _dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, sort_keys=True).encode("utf-8")


def _metadata(data: bytes) -> dict[str, Any]:
    """``metadata.json``, with the fields a restart reads (a ``KeyError`` or ``TypeError`` if
    one is missing or of another type)."""
    metadata = json_object(data)
    for field, kind in METADATA_FIELDS.items():
        if not isinstance(metadata[field], kind):
            wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kind)
            msg = f"{field!r} is {json.dumps(metadata[field])}, not a JSON {wanted}"
            raise TypeError(msg)
    if not all(isinstance(op, dict) for op in metadata["operators"]):
        msg = "'operators' holds something other than JSON objects"
        raise TypeError(msg)
    return metadata


def _read_optional(directory: DurableDir, name: str, parse: Callable[[bytes], T]) -> T | None:
    """``parse`` of file ``name`` (see :func:`~sparkstate.files.json_files.read_json`); None
    if
    the file does not exist."""
    try:
        return read_json(directory, name, RESTORE, parse)
    except MissingVersionError:
        return None


def _is_batch_file(name: str) -> bool:
    return name.endswith(".json") and name[:-5].isdigit()


def _batch_of(name: str) -> int:
    return int(name[:-5])
