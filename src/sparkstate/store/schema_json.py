"""The one JSON form of an Arrow schema in the store layer, and the reader of every form that
sparkstate has written.

The form: ``{"fields": [{"name": ..., "type": <Arrow type string>, "nullable": ...}, ...]}``
(``_schema.json`` records each column family's key and value schemas in it). Checkpoints of earlier
versions hold two other forms, which :func:`fields_from_json` and :func:`schema_from_json` still
read: a list of ``[name, type, nullable]`` lists (``_schema.json``) and a list of
``{"name", "type"[, "nullable"]}`` dicts (operators in ``metadata.json``).

Schemas are compared as lists of :data:`Field` tuples, so a recorded schema equals the schema a
query asks for whatever form it was recorded in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeAlias

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError

__all__ = [
    "Field",
    "fields_from_json",
    "fields_of",
    "fields_to_json",
    "schema_from_json",
    "schema_to_json",
]

#: A field as recorded and compared: name, Arrow type string, nullable (None: not recorded).
Field: TypeAlias = tuple[str, str, bool | None]

_TIMESTAMP_RE = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]")
_DECIMAL_RE = re.compile(r"decimal128\((\d+), (-?\d+)\)")
_LIST_RE = re.compile(r"list<([^:<>]+): (.+?)( not null)?>")


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A human-readable description of a schema: field names, Arrow type strings, nullability."""
    return fields_to_json(fields_of(schema))


def fields_of(schema: pa.Schema) -> list[Field]:
    """The fields of ``schema`` as they are compared across restarts."""
    return [(f.name, str(f.type), f.nullable) for f in schema]


def fields_to_json(fields: Sequence[Field]) -> dict[str, Any]:
    """Fields in this module's form (a nullability that was not recorded stays unrecorded)."""
    described = []
    for name, typ, nullable in fields:
        field: dict[str, Any] = {"name": name, "type": typ}
        if nullable is not None:
            field["nullable"] = nullable
        described.append(field)
    return {"fields": described}


def _field(entry: Any) -> Field:
    if isinstance(entry, dict):
        name, typ, nullable = entry["name"], entry["type"], entry.get("nullable")
    elif isinstance(entry, list | tuple) and len(entry) in (2, 3):
        name, typ, nullable = entry[0], entry[1], entry[2] if len(entry) == 3 else None
    else:
        raise TypeError(entry)
    if not (isinstance(name, str) and isinstance(typ, str) and nullable in (True, False, None)):
        raise TypeError(entry)
    return name, typ, nullable


def fields_from_json(description: Any) -> list[Field]:
    """The fields of a schema recorded in this module's form or an earlier one (see above); a
    field recorded without its nullability has None."""
    try:
        if isinstance(description, dict):
            entries = description["fields"]
        elif isinstance(description, list):
            entries = description
        else:
            raise TypeError(description)
        if not isinstance(entries, list):
            raise TypeError(entries)
        return [_field(entry) for entry in entries]
    except (KeyError, TypeError) as exc:
        msg = f"malformed state schema description {description!r}"
        raise ConfigurationError(msg) from exc


def _parse_type(text: str) -> pa.DataType:
    if m := _LIST_RE.fullmatch(text):  # list<item: int64>, list<element: string not null>
        element, not_null = m.group(2), m.group(3) is not None
        return pa.list_(pa.field(m.group(1), _parse_type(element), nullable=not not_null))
    if m := _TIMESTAMP_RE.fullmatch(text):
        return pa.timestamp(m.group(1), tz=m.group(2))
    if m := _DECIMAL_RE.fullmatch(text):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    try:
        return pa.type_for_alias(text)
    except ValueError:
        msg = f"unknown Arrow type {text!r} in a state schema description"
        raise ConfigurationError(msg) from None


def schema_from_json(description: Any) -> pa.Schema:
    """The schema that :func:`schema_to_json` (or an earlier form) described; a field recorded
    without its nullability is nullable, as Arrow's fields are by default."""
    fields = fields_from_json(description)
    return pa.schema([pa.field(n, _parse_type(t), nullable=b is not False) for n, t, b in fields])
