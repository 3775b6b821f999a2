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
    "type_string",
]

#: A field as recorded and compared: name, Arrow type string, nullable (None: not recorded).
Field: TypeAlias = tuple[str, str, bool | None]

_TIMESTAMP_RE = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]")
_DECIMAL_RE = re.compile(r"decimal128\((\d+), (-?\d+)\)")
_NOT_NULL = " not null"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+")


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A human-readable description of a schema: field names, Arrow type strings, nullability."""
    return fields_to_json(fields_of(schema))


def fields_of(schema: pa.Schema) -> list[Field]:
    """The fields of ``schema`` as they are compared across restarts."""
    return [(f.name, type_string(f.type), f.nullable) for f in schema]


def type_string(t: pa.DataType) -> str:
    """An Arrow type as recorded: ``str(t)`` (``list<element: int32>``, ``struct<a: int64 not
    null>``), but a map says whether its values may be null (``map<string, int64 not null>``) and
    a nested field name other than letters, digits and ``_`` is backquoted."""
    if pa.types.is_list(t):
        return f"list<{_field_string(t.value_field)}>"
    if pa.types.is_struct(t):
        return f"struct<{', '.join(_field_string(t.field(i)) for i in range(t.num_fields))}>"
    if pa.types.is_map(t):
        value = type_string(t.item_type) + ("" if t.item_field.nullable else _NOT_NULL)
        return f"map<{type_string(t.key_type)}, {value}>"
    return str(t)


def _field_string(f: pa.Field) -> str:
    name = f.name if _PLAIN_NAME.fullmatch(f.name) else "`" + f.name.replace("`", "``") + "`"
    return f"{name}: {type_string(f.type)}{'' if f.nullable else _NOT_NULL}"


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


def _split(text: str) -> list[str]:
    """``text`` split at the ``", "`` outside brackets and backquotes."""
    parts, depth, start, quoted, i = [], 0, 0, False, 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "<([":
            depth += 1
        elif not quoted and ch in ">)]":
            depth -= 1
        elif not quoted and depth == 0 and text.startswith(", ", i):
            parts.append(text[start:i])
            start = i + 2
            i += 1
        i += 1
    parts.append(text[start:])
    return parts


def _parse_field(text: str) -> pa.Field:
    if text.startswith("`"):
        end = 1
        while True:
            end = text.index("`", end)
            if text.startswith("``", end):
                end += 2
                continue
            break
        name, rest = text[1:end].replace("``", "`"), text[end + 1 :]
    else:
        name, sep, rest = text.partition(":")
        if not sep:
            raise ValueError(text)
        rest = sep + rest
    if not rest.startswith(": "):
        raise ValueError(text)
    typ, nullable = _nullable(rest[2:])
    return pa.field(name, _parse_type(typ), nullable=nullable)


def _nullable(text: str) -> tuple[str, bool]:
    if text.endswith(_NOT_NULL):
        return text[: -len(_NOT_NULL)], False
    return text, True


def _parse_type(text: str) -> pa.DataType:
    try:
        if text.startswith("list<") and text.endswith(">"):
            return pa.list_(_parse_field(text[5:-1]))
        if text.startswith("struct<") and text.endswith(">"):
            inner = text[7:-1]
            return pa.struct([_parse_field(p) for p in _split(inner)] if inner else [])
        if text.startswith("map<") and text.endswith(">"):
            key, value = _split(text[4:-1])
            value, nullable = _nullable(value)
            return pa.map_(
                pa.field("key", _parse_type(key), nullable=False),
                pa.field("value", _parse_type(value), nullable=nullable),
            )
    except (ValueError, IndexError):
        msg = f"unknown Arrow type {text!r} in a state schema description"
        raise ConfigurationError(msg) from None
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
