"""The JSON form of an Arrow schema that the store layer records: field names, Arrow type
strings and nullability, ``{"fields": [{"name": ..., "type": ..., "nullable": ...}, ...]}``."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError

__all__ = ["schema_from_json", "schema_to_json"]

_TIMESTAMP_RE = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]")
_DECIMAL_RE = re.compile(r"decimal128\((\d+), (-?\d+)\)")


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A human-readable description of a schema: field names, Arrow type strings, nullability."""
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]
    }


def _parse_type(text: str) -> pa.DataType:
    if m := _TIMESTAMP_RE.fullmatch(text):
        return pa.timestamp(m.group(1), tz=m.group(2))
    if m := _DECIMAL_RE.fullmatch(text):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    try:
        return pa.type_for_alias(text)
    except ValueError:
        msg = f"unknown Arrow type {text!r} in a state schema description"
        raise ConfigurationError(msg) from None


def schema_from_json(description: dict[str, Any]) -> pa.Schema:
    """The schema that :func:`schema_to_json` described."""
    try:
        fields = [
            pa.field(f["name"], _parse_type(f["type"]), nullable=bool(f["nullable"]))
            for f in description["fields"]
        ]
    except (KeyError, TypeError) as exc:
        msg = f"malformed state schema description {description!r}"
        raise ConfigurationError(msg) from exc
    return pa.schema(fields)
