"""A store's ``_schema.json``: the provider that wrote the store, the partition counts it was
written for, and each column family's key and value schemas (in the JSON form of
:mod:`sparkstate.store.schema_json`, files of earlier versions in theirs). It belongs to the
store contract: every provider over durable files keeps one, and what reads or moves a store's
state without opening it (the state reader, inspect, rescale, the take-over) reads it here.
A provider's check of it when it opens is
:func:`sparkstate.store.versions.layout.check_schema_file`.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from sparkstate.files.durable import DurableDir
from sparkstate.files.json_files import RESTORE, json_object, read_json
from sparkstate.store.schema_json import fields_from_json, schema_from_json, schema_to_json

__all__ = [
    "CODEC_VERSION",
    "SCHEMA_FILE",
    "merged_schema_record",
    "partition_counts",
    "read_schema_file",
    "read_schema_record",
    "schema_description",
    "schema_record",
    "write_rescaled_schema",
]

SCHEMA_FILE = "_schema.json"
#: The version of the key and value encodings a store's ``_schema.json`` records.
CODEC_VERSION = 1


def schema_description(
    provider: str,
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    num_partitions: int | None,
) -> dict[str, Any]:
    return {
        "provider": provider,
        "codec_version": CODEC_VERSION,
        "num_partitions": num_partitions,
        "column_families": {
            name: {"key": schema_to_json(k), "value": schema_to_json(v)}
            for name, (k, v) in sorted(families.items())
        },
    }


def schema_record(data: bytes) -> dict[str, Any]:
    """``_schema.json``, its column families' schemas checked (``KeyError``, ``TypeError``,
    ``ValueError`` for a wrong shape)."""
    found = json_object(data)
    families = found.get("column_families", {})
    if not isinstance(families, dict):
        msg = "'column_families' is not a JSON object"
        raise TypeError(msg)
    for family in families.values():
        for described in (family["key"], family["value"], *family.get("value_history", [])):
            fields_from_json(described)
    return found


def partition_counts(record: dict[str, Any]) -> list[int]:
    """The partition counts a store's ``_schema.json`` was written for: its own, and those a
    rescale added (the state of each count is on its own lineage of versions)."""
    first = record.get("num_partitions")
    return sorted({*record.get("partition_counts", []), *([first] if first is not None else [])})


def read_schema_record(directory: DurableDir) -> dict[str, Any] | None:
    """A store's ``_schema.json`` as written (None: the store never ran)."""
    if not directory.exists(SCHEMA_FILE):
        return None
    return read_json(directory, SCHEMA_FILE, RESTORE, schema_record)


def merged_schema_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``_schema.json`` for state gathered from the stores of ``records`` (one operator's
    partitions): every column family any of them has, each with the longest value history
    (a value schema evolves by appending to it, so the longest one reads every value)."""
    out = {k: v for k, v in records[0].items() if k != "column_families"}
    families: dict[str, dict[str, Any]] = {}
    for record in records:
        for name, family in record.get("column_families", {}).items():
            have = families.get(name)
            history = len(family.get("value_history", [family["value"]]))
            if have is None or history > len(have.get("value_history", [have["value"]])):
                families[name] = family
    out["column_families"] = dict(sorted(families.items()))
    return out


def write_rescaled_schema(
    directory: DurableDir, record: dict[str, Any], counts: list[int], num_partitions: int
) -> None:
    """Let the store at ``directory`` open with ``num_partitions`` partitions as well as with
    ``counts`` (a rescale writes a new lineage there): ``record`` with both counts recorded."""
    existing = read_schema_record(directory)
    before = partition_counts(existing) if existing is not None else []
    body = {
        **record,
        "num_partitions": num_partitions,
        "partition_counts": sorted({*before, *counts, num_partitions}),
    }
    directory.write_atomic(SCHEMA_FILE, json.dumps(body, indent=2).encode())


def read_schema_file(directory: DurableDir) -> dict[str, tuple[pa.Schema, pa.Schema]]:
    """The column families a store's ``_schema.json`` records, with their current schemas."""
    found = read_json(directory, SCHEMA_FILE, RESTORE, schema_record)
    return {
        name: (schema_from_json(f["key"]), schema_from_json(f["value"]))
        for name, f in found["column_families"].items()
    }
