"""``sparkstate inspect CHECKPOINT``: a checkpoint as an operator on call needs to see it.

What it shows, read from the durable files alone (no Spark, no running query's databases): the
query; each operator with its key, its stores (state variables, join sides) and their schemas;
per state partition the versions on storage, the changelog, snapshot and SST files and their
sizes, and the rows in state after the batch shown; the watermark; the last batches' progress.
``--key`` looks one key up instead (:mod:`.key_lookup`). The document is JSON with ``--json``
(:func:`inspect_checkpoint`, :func:`key_document`), text otherwise (:mod:`.inspect_text`).

Rows per partition come from where they are cheapest to read honestly: the count that the
partition's files of the committed version record, where its provider records one (rocksdb:
the ``num_keys`` of its changelog or snapshot), which is the count the query reported; else,
and for a join (whose count is its buffered rows, not its keys), from the partition's state,
loaded read-only. The files are described by the provider
(:class:`~sparkstate.store.capabilities.DescribesFiles`). The total is the
one ``commits/<batch>.json`` recorded, which the batch's progress reported as ``numRowsTotal``.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import sys
from typing import Any

import pyarrow as pa

from sparkstate.console import show
from sparkstate.exceptions import ConfigurationError, SparkstateError
from sparkstate.observe import inspect_text
from sparkstate.observe.checkpoint import OperatorInfo, StateCheckpoint, open_checkpoint
from sparkstate.observe.key_lookup import (
    KeyLookup,
    key_columns,
    look_up,
    spark_type,
    store_views,
)
from sparkstate.observe.metrics import columns
from sparkstate.observe.progress_log import read_progress_log
from sparkstate.runtime.migration import MIGRATED
from sparkstate.runtime.records import BatchCommit, OperatorCommit
from sparkstate.runtime.take_over import TAKEN_OVER
from sparkstate.store.base import DEFAULT_CF
from sparkstate.store.capabilities import DescribesFiles, FileGroup, StoredFiles

__all__ = [
    "LAST_BATCHES",
    "dumps",
    "history",
    "inspect_checkpoint",
    "key_document",
    "run_inspect",
]

#: Batches of the progress log shown.
LAST_BATCHES = 5


def _fields(fields: Any) -> list[dict[str, str]]:
    return [{"name": f.name, "type": spark_type(f.type)} for f in fields]


def _time(ms: float | None) -> str | None:
    if ms is None:
        return None
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- the document ---------------------------------------------------------------------------------


def inspect_checkpoint(
    location: str, *, batch_id: int | None = None, operator_id: int | None = None
) -> dict[str, Any]:
    """The document of the checkpoint at ``location`` after batch ``batch_id`` (default: the
    last committed), of every operator or of ``operator_id``."""
    chk = open_checkpoint(location)
    batches = chk.committed_batches()
    ops = chk.operators() if operator_id is None else [chk.operator(operator_id)]
    if batch_id is None and batches:
        batch_id = batches[-1]
    commit = None if batch_id is None else chk.commit(batch_id)
    progress, name = _progress(chk)
    if operator_id is not None:  # the progress's rows of this operator only
        at = [op.id for op in chk.operators()].index(operator_id)
        for b in progress["batches"]:
            b["state_rows"] = b["state_rows"][at : at + 1]
    return {
        "checkpoint": chk.location,
        "query": {
            "id": chk.metadata.get("query_id"),
            "name": name,
            "provider": chk.provider,
            "partitions": chk.num_partitions,
            "output_mode": chk.metadata.get("output_mode"),
            "state_location": chk.metadata.get("state_location"),
            "state_root": chk.state_root,
        },
        "batches": {
            "first": batches[0] if batches else None,
            "last": batches[-1] if batches else None,
            "committed": len(batches),
            "shown": batch_id,
            "state_version": None if batch_id is None else batch_id + 1,
            "committed_at": None if commit is None else commit.committed_at,
        },
        "watermark": _watermark(commit),
        "history": history(chk.metadata),
        "operators": [_operator(chk, op, commit) for op in ops],
        "progress": progress,
    }


def history(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the checkpoint's state came from, oldest first: taken over from Spark's own
    operators after batch N (:mod:`sparkstate.runtime.take_over`), migrated to a changed query
    after batch M (:mod:`sparkstate.runtime.migration`)."""
    out = []
    taken = metadata.get(TAKEN_OVER)
    if taken:
        out.append(
            {
                "event": "taken_over_from_spark",
                "batch": int(taken["batch_id"]),
                "spark_provider": taken.get("spark_provider"),
                "at": taken.get("at"),
            }
        )
    for done in metadata.get(MIGRATED, []):
        out.append(
            {
                "event": "migrated",
                "batch": int(done["batch_id"]),
                "operators": list(done.get("changed", [])),
                "at": done.get("at"),
            }
        )
    return out


def _watermark(commit: BatchCommit | None) -> dict[str, Any]:
    """The watermark after the batch (the one the next batch runs with); None where there is
    none, and the largest event time seen per input."""
    after = {} if commit is None else commit.watermark
    ms = int(after.get("watermark_ms", 0))
    events = {str(k): int(v) for k, v in (after.get("max_event_time_ms") or {}).items()}
    ran_with = None if commit is None or commit.watermark_ms <= 0 else commit.watermark_ms
    return {
        "ms": ms if ms > 0 else None,
        "time": _time(ms) if ms > 0 else None,
        "batch_ran_with_ms": ran_with,
        "max_event_time_ms": events,
    }


def _operator(chk: StateCheckpoint, op: OperatorInfo, commit: BatchCommit | None) -> dict[str, Any]:
    families = chk.operator_families(op.id) or {}
    key_schema = families.get(DEFAULT_CF, (pa.schema([]), None))[0]
    out: dict[str, Any] = {
        "id": op.id,
        "name": op.name,
        "kind": op.kind,
        "key": [
            {"name": c.name, "type": spark_type(c.type)}
            for c in key_columns(op.description, key_schema)
        ],
        "stores": _stores(op, families) if families else [],
        "column_families": sorted(families),
    }
    out.update(op.layout.summary(op.description))
    entry = None if commit is None else commit.operators.get(op.id)
    count = len(entry.checkpoint_ids) if entry is not None else chk.num_partitions
    found = [_partition(chk, op, p, commit, entry) for p in range(count)]
    parts = [doc for doc, _ in found]
    sources = {source for _, source in found if source is not None}
    rows = [p["rows"] for p in parts]
    out["partitions"] = parts
    out["files"] = {
        kind: {
            "files": sum(p[kind]["files"] for p in parts),
            "bytes": sum(p[kind]["bytes"] for p in parts),
        }
        for kind in ("changelogs", "snapshots", "sst")
    }
    out["rows"] = {
        "batch": None if commit is None else commit.batch_id,
        "total": None if entry is None else entry.num_rows_total,
        "partitions_sum": sum(rows) if None not in rows else None,
        "source": "+".join(sorted(sources)) or None,
    }
    return out


def _stores(
    op: OperatorInfo, families: dict[str, tuple[pa.Schema, pa.Schema]]
) -> list[dict[str, Any]]:
    """The stores of an operator: the columns of a row of each as the state reader shows it
    (the key left out), and the fields of its value (and of a map's keys)."""
    out = []
    for name, view in store_views(op, families, flatten=True):
        columns = [f for f in view.schema if f.name != "key"]
        store: dict[str, Any] = {"name": name, "family": view.family, "columns": _fields(columns)}
        by_name = {f.name: f for f in columns}
        if "user_map_key" in by_name:
            store["map_key"] = _fields(by_name["user_map_key"].type)
        value = columns[-1] if columns else None
        store["value"] = _fields(
            value.type if value is not None and pa.types.is_struct(value.type) else columns
        )
        store.update(op.layout.store_summary(op.description, name))
        out.append(store)
    return out


def _files(group: FileGroup) -> dict[str, int]:
    return {"files": group.files, "bytes": group.bytes}


def _partition(
    chk: StateCheckpoint,
    op: OperatorInfo,
    partition: int,
    commit: BatchCommit | None,
    entry: OperatorCommit | None,
) -> tuple[dict[str, Any], str | None]:
    """The partition's files on storage, its rows after the batch, and where they came from."""
    with chk.provider_for(op.id, partition) as provider:
        files = None if provider is None else DescribesFiles.require(provider, "inspect")
        stored = StoredFiles() if files is None else files.describe_files()
        versions = stored.versions
        rows: int | None = None
        source = None
        if files is not None and commit is not None and versions:
            ckpt = None if entry is None else entry.checkpoint_ids.get(partition)
            rows, source = _rows(chk, op, partition, commit.batch_id, ckpt, files)
        elif commit is not None:
            rows = 0  # the partition never ran: no state
    doc = {
        "partition": partition,
        "versions": {
            "oldest": versions[0] if versions else None,
            "newest": versions[-1] if versions else None,
            "count": len(versions),
        },
        "changelogs": _files(stored.changelogs),
        "snapshots": _files(stored.snapshots),
        "sst": _files(stored.shared),
        "rows": rows,
    }
    return doc, source


def _rows(
    chk: StateCheckpoint,
    op: OperatorInfo,
    partition: int,
    batch_id: int,
    checkpoint_id: str | None,
    files: DescribesFiles,
) -> tuple[int | None, str]:
    """The partition's rows after ``batch_id`` and where the count came from: the count its
    files record (the one the query reports), except a join's (its buffered rows); else the
    state is loaded and counted."""
    if op.layout.rows_are_keys:
        found = files.recorded_rows(batch_id + 1, checkpoint_id)
        if found is not None:  # -1: not counted (trackTotalRows off), 0 in progress as in Spark
            return (found if found >= 0 else None), "changelog"
    with chk.read_store(op.id, partition, batch_id) as store:
        if store is None:
            return 0, "loaded"
        return op.layout.rows_in_state(store), "loaded"


def _progress(chk: StateCheckpoint) -> tuple[dict[str, Any], str | None]:
    """The last batches of the progress log (or why there are none), and the query's name."""
    try:
        log = read_progress_log(chk.location)
    except SparkstateError as exc:
        return {"where": None, "batches": [], "error": str(exc)}, None
    cols = columns(log.batches[-LAST_BATCHES:])
    batches = [
        {
            "batch_id": batch_id,
            "time": _time(cols.times_ms[i]),
            "input_rows": _int(cols.input_rows[i]),
            "duration_ms": _int(cols.total_ms[i]),
            "state_rows": [_int(op.rows_total[i]) for op in cols.operators],
        }
        for i, batch_id in enumerate(cols.batch_ids)
    ]
    name = log.batches[-1].get("name")
    return {"where": log.where, "batches": batches}, None if name is None else str(name)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


# --- a key ---------------------------------------------------------------------------------------


def key_document(lookup: KeyLookup, location: str) -> dict[str, Any]:
    """The JSON document of a key lookup: the key, its partition and how it was found, and per
    store the rows of the key (``found``: whether any store has one)."""
    op = lookup.operator
    return {
        "checkpoint": location,
        "operator": {"id": op.id, "name": op.name, "kind": op.kind},
        "batch": lookup.batch_id,
        "key": lookup.key,
        "partition": lookup.partition,
        "partition_from": lookup.found_by,
        "searched": lookup.searched,
        "found": lookup.found,
        "stores": lookup.stores,
    }


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    msg = f"{type(value).__name__} is not JSON"
    raise TypeError(msg)


def dumps(document: dict[str, Any]) -> str:
    """A document as JSON: times as ISO 8601, decimals as text, bytes as hex."""
    return json.dumps(document, indent=2, default=_json_value, ensure_ascii=False)


# --- the command ---------------------------------------------------------------------------------


def run_inspect(
    checkpoint: str,
    *,
    key: list[str] | None = None,
    operator: int | None = None,
    store: str | None = None,
    join_side: str | None = None,
    batch: int | None = None,
    as_json: bool = False,
) -> int:
    """The command: print the document; an error, or a key not found, is a line on stderr and
    exit code 1."""
    try:
        if key is None:
            if store is not None or join_side is not None:
                msg = "--store and --join-side pick where --key looks: give a --key"
                raise ConfigurationError(msg)
            doc = inspect_checkpoint(checkpoint, batch_id=batch, operator_id=operator)
            if as_json:
                print(dumps(doc))
            else:
                show(inspect_text.summary(doc))
            return 0
        chk = open_checkpoint(checkpoint)
        ops = chk.operators()
        op = chk.operator(operator if operator is not None else (ops[0].id if ops else 0))
        batch_id = chk.last_batch() if batch is None else batch
        chk.commit(batch_id)  # fails clearly when the batch is not committed
        lookup = look_up(chk, op, batch_id, key, store_name=store, join_side=join_side)
        if as_json:
            print(dumps(key_document(lookup, chk.location)))
        elif lookup.found:
            show(inspect_text.key(lookup))
        if not lookup.found:
            print(f"sparkstate inspect: {inspect_text.not_found(lookup)}", file=sys.stderr)
            return 1
        return 0
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (SparkstateError, OSError) as exc:
        print(f"sparkstate inspect: {exc}", file=sys.stderr)
        return 1
