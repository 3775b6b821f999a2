"""The two providers, unchanged, except that one task attempt is slow at its commit: the first
attempt of one partition at one version, so that Spark starts a speculative copy of it.

Used as ``.option("stateStore", "tests.cluster.slow_attempt:SlowMemory")`` (or ``SlowRocksDB``)
with ``SLOW_ENV`` set to ``<partition>:<version>`` in the executors' environment. Every commit of
every attempt leaves a line in ``<checkpoint>/attempts/<pid>.jsonl``: the partition, the version
committed, Spark's attempt number and task attempt id, and the checkpoint id.

The slow attempt waits, before its commit, until another attempt of its partition has committed
(up to ``WAIT_S``). After their reports, the two attempts wait for each other's, and the one
that committed last stays in its task until Spark kills it. That is the order that tells whose
state counts: the other one finished first, so Spark kept its output; the one that stays
committed and reported last, before the batch's job ended, so its version is the newest the
driver reads. (The stay comes after the report, which the task writes after its commit, so this
module wraps ``ReportDir`` in every process that imports it.)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from pyspark import TaskContext

from sparkstate.runtime.logs import ReportDir
from sparkstate.runtime.records import TaskReport
from sparkstate.store.base import StateStore
from sparkstate.store.memory import MemoryStateStoreProvider
from sparkstate.store.rocksdb.provider import RocksDBStateStoreProvider

SLOW_ENV = "SPARKSTATE_TEST_SLOW_ATTEMPT"
ATTEMPTS_DIR = "attempts"
#: How long the slow attempt waits for another one to commit.
WAIT_S = 10.0
#: How long it then stays in its task (Spark kills it long before).
STAY_S = 300.0


def read_attempts(checkpoint: Path) -> list[dict[str, Any]]:
    """Every commit (and every report after it) the attempts of ``checkpoint`` recorded."""
    return _entries(checkpoint / ATTEMPTS_DIR)


def _entries(directory: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(directory.glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line]
    return out


#: The attempts of the slow partition that committed in this process: task attempt id -> the
#: attempts directory and what they committed, for the report that follows the commit.
_COMMITTED: dict[int, tuple[Path, tuple[int, int, int]]] = {}


def _record(out: Path, entry: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def _of(entries: list[dict[str, Any]], what: tuple[int, int, int]) -> list[dict[str, Any]]:
    """The entries (commits and reports) of (operator, partition, version) ``what``."""
    return [e for e in entries if (e["operator"], e["partition"], e["version"]) == what]


def _wait(until: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not until() and time.monotonic() < deadline:
        time.sleep(0.05)


class _Slow:
    """What both slow providers add: the record of each commit, and the slow attempt."""

    id: Any

    def _slowed(self, store: StateStore, version: int) -> StateStore:
        commit = store.commit
        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else -1
        task_attempt_id = context.taskAttemptId() if context is not None else -1
        partition = self.id.partition_id
        watched = os.environ.get(SLOW_ENV, "") == f"{partition}:{version}"
        what = (self.id.operator_id, partition, version + 1)
        # The provider's root is ``<checkpoint>/sparkstate``.
        out = Path(self.id.checkpoint_root.rstrip("/")).parent / ATTEMPTS_DIR

        def slow_commit() -> int:
            if watched and attempt == 0:  # slow: until another attempt committed
                _wait(lambda: any("checkpoint_id" in e for e in _of(_entries(out), what)))
            committed = commit()
            entry = {
                "operator": what[0],
                "partition": partition,
                "version": committed,
                "attempt": attempt,
                "task_attempt_id": task_attempt_id,
                "checkpoint_id": store.checkpoint_id,
                "at": time.time(),
            }
            _record(out, entry)
            if watched:
                _COMMITTED[task_attempt_id] = (out, what)
            return committed

        store.commit = slow_commit  # type: ignore[method-assign]
        return store


def _report_then_stay(self: ReportDir, report: TaskReport) -> None:
    """A task's report, written as ever. An attempt of the slow partition then waits until the
    other attempt has reported too, and the one that committed last stays in its task until
    Spark kills it: the other one finishes first, and Spark keeps its output."""
    _REPORT(self, report)
    out, what = _COMMITTED.pop(report.task_attempt_id, (None, None))
    if out is None or what is None:
        return
    operator, partition, version = what
    _record(
        out,
        {
            "operator": operator,
            "partition": partition,
            "version": version,
            "reported": report.task_attempt_id,
            "at": time.time(),
        },
    )
    _wait(lambda: sum("reported" in e for e in _of(_entries(out), what)) >= 2)
    commits = sorted(
        (e for e in _of(_entries(out), what) if "checkpoint_id" in e), key=lambda e: e["at"]
    )
    if len(commits) >= 2 and commits[-1]["task_attempt_id"] == report.task_attempt_id:
        time.sleep(STAY_S)


_REPORT = ReportDir.__call__
ReportDir.__call__ = _report_then_stay  # type: ignore[method-assign]


class SlowRocksDB(_Slow, RocksDBStateStoreProvider):
    name: ClassVar[str] = "rocksdb"

    def get_store(self, version: int, checkpoint_id: str | None = None) -> Any:
        return self._slowed(super().get_store(version, checkpoint_id), version)


class SlowMemory(_Slow, MemoryStateStoreProvider):
    name: ClassVar[str] = "memory"

    def get_store(self, version: int, checkpoint_id: str | None = None) -> Any:
        return self._slowed(super().get_store(version, checkpoint_id), version)
