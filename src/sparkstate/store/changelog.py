"""Changelog files: the puts and deletes of one version, plus the lineage they extend.

A changelog (``.changelog`` for rocksdb, ``.delta`` for memory) and a memory snapshot share this
format: a JSON header and an Arrow IPC stream of ``(key: binary, value: binary or null = delete)``,
inside a checksummed, compressed frame.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import CorruptStateFileError
from sparkstate.store.frames import decode_frame, encode_frame

__all__ = ["Changelog", "decode_changelog", "encode_changelog"]

_SCHEMA = pa.schema([("key", pa.binary(), False), ("value", pa.binary(), True)])
_LEN = struct.Struct("<I")


@dataclasses.dataclass
class Changelog:
    """Contents of one changelog or memory snapshot file."""

    header: dict[str, Any]
    keys: list[bytes]
    values: list[bytes | None]

    @property
    def parent(self) -> tuple[int, str] | None:
        p = self.header.get("parent")
        return None if p is None else (int(p[0]), str(p[1]))


def encode_changelog(
    kind: bytes,
    header: dict[str, Any],
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    compression: str,
) -> bytes:
    table = pa.table([pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _SCHEMA) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    head = json.dumps(header, sort_keys=True).encode()
    payload = _LEN.pack(len(head)) + head + sink.getvalue().to_pybytes()
    return encode_frame(kind, payload, compression)


def decode_changelog(kind: bytes, data: bytes, where: str) -> Changelog:
    payload = decode_frame(kind, data, where)
    try:
        (head_len,) = _LEN.unpack_from(payload)
        header = json.loads(payload[_LEN.size : _LEN.size + head_len])
        reader = pa.ipc.open_stream(pa.py_buffer(payload)[_LEN.size + head_len :])
        table = reader.read_all()
    except (ValueError, OSError, struct.error, pa.ArrowInvalid) as exc:
        msg = f"corrupt state file {where}: {exc}"
        raise CorruptStateFileError(msg) from exc
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    return Changelog(header, keys, values)
