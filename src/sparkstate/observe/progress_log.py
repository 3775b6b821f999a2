"""A query's progress log, read from its checkpoint while the query runs or after.

The engine appends one progress dict per batch to ``<checkpoint>/sparkstate/progress.jsonl`` on
a local file system, and writes ``<checkpoint>/sparkstate/progress/<batch>.json`` where nothing
can be appended (an object store); both are read, through
:class:`~sparkstate.files.durable.DurableDir`. A line that a running query is still writing
(the
last one, without its newline) is left out; a damaged line anywhere else fails with an error
naming it. A batch logged twice (run again after a failure) counts once, as its last run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sparkstate.exceptions import MissingVersionError
from sparkstate.files.durable import DurableDir, local_path
from sparkstate.files.json_files import json_object, parse_json_lines, read_json
from sparkstate.runtime.logs import ENGINE_DIR, PROGRESS_FILE, PROGRESS_ONLY

__all__ = ["ProgressLog", "read_progress_log"]

#: Where an object store keeps one progress file per batch, beside the engine's other logs.
PROGRESS_DIR = "progress"


@dataclasses.dataclass(frozen=True)
class ProgressLog:
    """The progress of a query's batches, in batch order, and where it was read from."""

    where: str
    batches: list[dict[str, Any]]


def read_progress_log(checkpoint: str | DurableDir) -> ProgressLog:
    """The progress log of the query whose ``checkpointLocation`` is ``checkpoint`` (a path, a
    URI such as ``s3://bucket/chk``, or the directory itself). Raises
    :class:`~sparkstate.exceptions.MissingVersionError` when there is no log or no batch in it."""
    root = checkpoint if isinstance(checkpoint, DurableDir) else DurableDir(checkpoint)
    engine = root.child(ENGINE_DIR)
    where = engine.where(PROGRESS_FILE)
    found = engine.exists(PROGRESS_FILE)
    entries = _read_lines(engine, where) if found else []
    per_batch = engine.child(PROGRESS_DIR)
    names = [e.name for e in per_batch.list() if _batch_file(e.name)]
    if names and not found:
        where = per_batch.uri
    entries += [read_json(per_batch, n, PROGRESS_ONLY, json_object) for n in names]
    if not found and not names:
        if local_path(root.uri) is None:  # an object store: a file per batch
            where = f"{where} nor {per_batch.where('<batch>.json')}"
        msg = (
            f"no progress log at {where}: is {root.uri} the checkpointLocation of a sparkstate "
            "query? The query writes its log from its first batch on."
        )
        raise MissingVersionError(msg)
    batches = _by_batch(entries)
    if not batches:
        msg = (
            f"the progress log {where} holds no batch yet: let the query complete a batch, "
            "then make the report again"
        )
        raise MissingVersionError(msg)
    return ProgressLog(where, batches)


def _read_lines(engine: DurableDir, where: str) -> list[dict[str, Any]]:
    data = engine.read(PROGRESS_FILE)
    if data and not data.endswith(b"\n"):  # being written: the query appends a line at a time
        data = data[: data.rfind(b"\n") + 1]
    return parse_json_lines(data, where, PROGRESS_ONLY)


def _batch_file(name: str) -> bool:
    return name.endswith(".json") and name[:-5].isdigit()


def _by_batch(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per batch id (the last logged), in batch order; entries without one go."""
    latest: dict[int, dict[str, Any]] = {}
    for entry in entries:
        batch = entry.get("batchId")
        if isinstance(batch, int) and not isinstance(batch, bool):
            latest[batch] = entry
    return [latest[b] for b in sorted(latest)]
