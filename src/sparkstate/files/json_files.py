"""JSON files on durable storage, read so that a damaged one is reported by name.

A checkpoint's JSON files (the engine's logs, a store's ``_schema.json``) are read with
:func:`read_json` (:func:`parse_json` for bytes in hand) and a function that parses them,
:func:`json_object` or a record's ``from_json``. Bytes that are not UTF-8, text that is not JSON
and JSON of the wrong shape all raise :class:`~sparkstate.exceptions.CorruptStateFileError`, whose
message names the file, says what is wrong with it and what the user can do. The file is parsed
once; only a failure looks at it again, to say what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from sparkstate.exceptions import CorruptStateFileError
from sparkstate.files.durable import DurableDir

__all__ = ["RESTORE", "json_object", "parse_json", "parse_json_lines", "read_json"]

T = TypeVar("T")

#: What to do about a damaged or lost file that the checkpoint cannot do without.
RESTORE = (
    "Restore it from a backup of the checkpoint, or start the query from a new checkpoint location."
)

#: How a JSON value is named when an object was expected instead.
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number"}


def json_object(data: bytes) -> dict[str, Any]:
    """``data`` parsed as a JSON object (a ``TypeError`` for any other JSON value)."""
    value = json.loads(data)
    if not isinstance(value, dict):
        raise TypeError(value)
    return value


def read_json(directory: DurableDir, name: str, remedy: str, parse: Callable[[bytes], T]) -> T:
    """``parse`` applied to file ``name`` of ``directory`` (see :func:`parse_json`); a missing
    file raises :class:`~sparkstate.exceptions.MissingVersionError`."""
    return parse_json(directory.read(name), directory.where(name), remedy, parse)


def parse_json(data: bytes, where: str, remedy: str, parse: Callable[[bytes], T]) -> T:
    """``parse(data)``, where ``parse`` reads JSON (a record's ``from_json``) and fails with
    ``ValueError``, ``KeyError``, ``TypeError`` or ``AttributeError`` on damaged content: that
    failure becomes a :class:`~sparkstate.exceptions.CorruptStateFileError` naming ``where``,
    what is wrong and ``remedy`` (what the user can do)."""
    try:
        return parse(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = f"corrupt state file {where}: {_problem(data, exc)}. {remedy}"
        raise CorruptStateFileError(msg) from exc


def parse_json_lines(data: bytes, where: str, remedy: str) -> list[dict[str, Any]]:
    """One JSON object per non-blank line of ``data`` (a ``.jsonl`` file); the error for a damaged
    line names its number."""
    out = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if line.strip():
            out.append(parse_json(line, f"{where} (line {number})", remedy, json_object))
    return out


def _problem(data: bytes, exc: BaseException) -> str:
    """What is wrong with ``data``, which failed to parse with ``exc``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"is not UTF-8 (byte {data[err.start]:#04x} at offset {err.start})"
    if not text.strip():
        return "is empty"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        ends_early = not text[err.pos :].strip() or err.msg.startswith("Unterminated")
        truncated = " (it ends too early: truncated?)" if ends_early else ""
        return f"is not valid JSON{truncated}: {err.msg} at line {err.lineno} column {err.colno}"
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), json.dumps(value))
        return f"holds {kind} where a JSON object belongs"
    if isinstance(exc, KeyError):
        return f"lacks field {exc.args[0]!r}"
    return f"has a field of the wrong type or value ({exc})"
