"""Names of a store's durable files, the index of what exists, and a provider's check of its
``_schema.json`` (:mod:`sparkstate.store.schema_file`) when it opens, with each column family's
value schema history (:mod:`sparkstate.store.evolution`).

Every file a commit writes is named ``<version>_<checkpoint id>.<ext>``. Checkpoint ids are fresh
per attempt and sort by creation time, so zombie or retried attempts never overwrite each other and,
without an engine saying which attempt won, the newest complete attempt of a version is the one
loaded (Spark's last-writer-wins for a re-run batch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import (
    MissingVersionError,
    ProviderMismatchError,
    SchemaMismatchError,
)
from sparkstate.files.durable import DurableDir, FileEntry
from sparkstate.files.json_files import RESTORE, read_json
from sparkstate.store.evolution import KEY_NOT_COMPATIBLE, evolve
from sparkstate.store.schema_file import SCHEMA_FILE, partition_counts, schema_record
from sparkstate.store.schema_json import (
    Field,
    fields_from_json,
    fields_to_json,
    schema_from_json,
    schema_to_json,
)

__all__ = [
    "VersionIndex",
    "VersionRef",
    "check_schema_file",
    "file_name",
    "new_checkpoint_id",
    "parse_file_name",
]

_NAME = re.compile(r"^(\d+)_([0-9a-f]{16}[0-9a-f]{8})\.([a-z]+)$")


@dataclasses.dataclass(frozen=True, order=True)
class VersionRef:
    """One committed attempt of a version: its number and checkpoint id."""

    version: int
    checkpoint_id: str

    def __str__(self) -> str:
        return f"{self.version}_{self.checkpoint_id}"


def new_checkpoint_id() -> str:
    """A fresh id that sorts after every id made earlier in this or another process."""
    return f"{time.time_ns():016x}{os.urandom(4).hex()}"


def file_name(ref: VersionRef, ext: str) -> str:
    return f"{ref.version}_{ref.checkpoint_id}.{ext}"


def parse_file_name(name: str) -> tuple[VersionRef, str] | None:
    m = _NAME.match(name)
    if m is None:
        return None
    return VersionRef(int(m.group(1)), m.group(2)), m.group(3)


class VersionIndex:
    """What versioned files exist in a store directory, from one listing."""

    def __init__(self, entries: list[FileEntry]) -> None:
        self.files: dict[VersionRef, dict[str, FileEntry]] = {}
        self.others: list[FileEntry] = []
        for entry in entries:
            parsed = parse_file_name(entry.name)
            if parsed is None:
                self.others.append(entry)
                continue
            ref, ext = parsed
            self.files.setdefault(ref, {})[ext] = entry

    @classmethod
    def scan(cls, directory: DurableDir) -> VersionIndex:
        return cls(directory.list())

    def has(self, ref: VersionRef, ext: str) -> bool:
        return ext in self.files.get(ref, {})

    def refs(self, ext: str) -> list[VersionRef]:
        return sorted(r for r, exts in self.files.items() if ext in exts)

    def latest(self, ext: str) -> VersionRef | None:
        """The newest attempt of the highest version that has a file of ``ext``."""
        refs = self.refs(ext)
        return refs[-1] if refs else None

    def resolve(self, version: int, checkpoint_id: str | None, ext: str, where: str) -> VersionRef:
        """The attempt of ``version`` to load: the one named, else the newest with ``ext``."""
        if checkpoint_id is not None:
            ref = VersionRef(version, checkpoint_id)
            if not self.files.get(ref):
                msg = f"{where}: version {version} has no attempt {checkpoint_id} on storage"
                raise MissingVersionError(msg)
            return ref
        candidates = [r for r in self.refs(ext) if r.version == version]
        candidates += [r for r in self.refs("snapshot") if r.version == version]
        if not candidates:
            latest = self.latest(ext)
            newest = latest.version if latest else 0
            msg = (
                f"{where}: version {version} does not exist on durable storage "
                f"(newest committed version: {newest})"
            )
            raise MissingVersionError(msg)
        return max(candidates)


def _shown(fields: list[Field]) -> list[list[Any]]:
    """Fields as a changed key schema has always been shown: ``[[name, type, nullable], ...]``."""
    return [list(f) for f in fields]


def _in_one_form(family: dict[str, Any]) -> dict[str, Any]:
    """A column family's record with its schemas in :mod:`.schema_json`'s form."""
    out = {**family, "key": _one_form(family["key"]), "value": _one_form(family["value"])}
    if "value_history" in family:
        out["value_history"] = [_one_form(v) for v in family["value_history"]]
    return out


def _one_form(described: Any) -> dict[str, Any]:
    return fields_to_json(fields_from_json(described))


def _types(fields: list[Field]) -> list[tuple[str, bool | None]]:
    return [(t, nullable) for _, t, nullable in fields]


def check_schema_file(
    directory: DurableDir, expected: dict[str, Any], where: str, *, widening: bool = False
) -> dict[str, tuple[list[pa.Schema], int]]:
    """Write ``_schema.json`` on first use; on later opens fail clearly on an incompatible change.

    Column families not yet recorded are added (a new state variable is not a mismatch). A value
    schema may evolve (see :mod:`.evolution`; with ``widening``, a field's type may also widen):
    returns, for each family whose value schema ever changed, its schema history and the id of
    the schema in use.
    """
    file = directory.where(SCHEMA_FILE)
    if not directory.exists(SCHEMA_FILE):
        if VersionIndex.scan(directory).files:
            msg = (
                f"{where}: {file} is missing, but the store holds committed versions: without "
                f"it their values cannot be checked or read. {RESTORE}"
            )
            raise MissingVersionError(msg)
        directory.write_atomic(SCHEMA_FILE, json.dumps(expected, indent=2).encode())
        return {}
    found = read_json(directory, SCHEMA_FILE, RESTORE, schema_record)
    if found.get("provider") != expected["provider"]:
        msg = (
            f"{where}: the checkpoint was written by state store provider "
            f"{found.get('provider')!r} but this query uses {expected['provider']!r} ({file}). "
            "Use the original provider, or start from a new checkpoint location."
        )
        raise ProviderMismatchError(msg)
    counts = partition_counts(found)
    if expected["num_partitions"] is not None and expected["num_partitions"] not in counts:
        msg = (
            f"{where}: the checkpoint has {found.get('num_partitions')} state partitions but "
            f"this query uses {expected['num_partitions']} ({file}). The partition count "
            "changes only by rescaling the state: sparkstate repartition CHECKPOINT "
            "--partitions N, or a restart with the new count."
        )
        raise SchemaMismatchError(msg)
    if found.get("codec_version") != expected["codec_version"]:
        msg = f"{where}: unsupported state encoding version {found.get('codec_version')} ({file})"
        raise SchemaMismatchError(msg)
    known = found.get("column_families", {})
    changed = False
    evolved: dict[str, tuple[list[pa.Schema], int]] = {}
    for name, want in expected["column_families"].items():
        have = known.get(name)
        if have is None:
            known[name] = want
            changed = True
            continue
        have_key, want_key = fields_from_json(have["key"]), fields_from_json(want["key"])
        if have_key != want_key and _types(have_key) == _types(want_key):
            have["key"] = want["key"]  # its columns renamed: Spark compares keys without names
            changed = True
        elif have_key != want_key:
            msg = (
                f"{where}: the key schema of column family {name!r} changed: "
                f"checkpoint has {_shown(have_key)}, query has {_shown(want_key)} ({file}); "
                "restore the original query, or start from a new checkpoint location"
            )
            raise SchemaMismatchError(msg, KEY_NOT_COMPATIBLE)
        described = have.get("value_history", [have["value"]])
        recorded = [fields_from_json(v) for v in described]
        have_value, want_value = fields_from_json(have["value"]), fields_from_json(want["value"])
        if have_value == want_value and len(recorded) == 1:
            continue
        history = [schema_from_json(v) for v in described]
        current = recorded.index(have_value) if have_value in recorded else len(recorded) - 1
        what = f"{where}: column family {name!r} ({file})"
        wanted = schema_from_json(want["value"])
        history, schema_id = evolve(history, current, wanted, what, widening=widening)
        evolved[name] = (history, schema_id)
        if have_value != want_value or len(history) != len(recorded):
            have["value"] = want["value"]
            have["value_history"] = [schema_to_json(s) for s in history]
            changed = True
    if changed:
        found["column_families"] = {n: _in_one_form(f) for n, f in known.items()}
        directory.write_atomic(SCHEMA_FILE, json.dumps(found, indent=2).encode())
    return evolved
