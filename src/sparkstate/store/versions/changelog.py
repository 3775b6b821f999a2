"""Changelog files: the puts and deletes of one version, plus the lineage they extend.

A changelog (``.changelog`` for rocksdb, ``.delta`` for memory) and a memory snapshot share this
format: a JSON header and an Arrow IPC stream of ``(key: binary, value: binary or null = delete)``,
inside a checksummed, compressed frame. A reader checks the frame and reads the header at once,
and decodes the rows a chunk at a time as they are asked for.

A version that removed whole key ranges (``StateStore.remove_range``: an eviction up to the
watermark) records each as one ``[start, end)`` pair in the header's ``delete_ranges`` (hex),
applied before the rows: a key the version wrote into a range after removing it is a row. A file
without the field (every file written before it existed) removed no range.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import CorruptStateFileError
from sparkstate.store.frames import Frame, check_frame, encode_frame

__all__ = [
    "BATCH_ROWS",
    "CHUNK_ROWS",
    "DELETE_RANGES",
    "Changelog",
    "ChangelogReader",
    "decode_changelog",
    "encode_changelog",
    "ranges_field",
    "ranges_of",
]

_SCHEMA = pa.schema([("key", pa.binary(), False), ("value", pa.binary(), True)])
_LEN = struct.Struct("<I")
#: Rows per record batch of the Arrow stream a writer makes.
BATCH_ROWS = 1 << 20
#: Rows a reader turns into Python objects at a time.
CHUNK_ROWS = 1 << 16
_DECODE_ERRORS = (ValueError, OSError, struct.error, pa.ArrowInvalid)
#: The header field of the key ranges a version removed, applied before its rows.
DELETE_RANGES = "delete_ranges"


@dataclasses.dataclass
class Changelog:
    """Contents of one changelog or memory snapshot file."""

    header: dict[str, Any]
    keys: list[bytes]
    values: list[bytes | None]

    @property
    def parent(self) -> tuple[int, str] | None:
        return _parent(self.header)

    @property
    def delete_ranges(self) -> list[tuple[bytes, bytes]]:
        return ranges_of(self.header)


def _parent(header: dict[str, Any]) -> tuple[int, str] | None:
    p = header.get("parent")
    return None if p is None else (int(p[0]), str(p[1]))


def ranges_field(ranges: Sequence[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The header field recording ``ranges`` (none: no field, as files before it had)."""
    if not ranges:
        return {}
    return {DELETE_RANGES: [[lo.hex(), hi.hex()] for lo, hi in ranges]}


def ranges_of(header: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """The ``[start, end)`` key ranges a header says its version removed, in order."""
    return [(bytes.fromhex(lo), bytes.fromhex(hi)) for lo, hi in header.get(DELETE_RANGES, ())]


def encode_changelog(
    kind: bytes,
    header: dict[str, Any],
    keys: Sequence[bytes] | pa.Array | pa.ChunkedArray,
    values: Sequence[bytes | None] | pa.Array | pa.ChunkedArray,
    compression: str,
    *,
    batch_rows: int = BATCH_ROWS,
) -> bytes:
    """A changelog file: the rows in record batches of ``batch_rows``, after the header. Keys
    and values may come as Python bytes or as Arrow binary columns (taken as they are)."""
    table = pa.table([_binary(keys), _binary(values)], schema=_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _SCHEMA) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    head = json.dumps(header, sort_keys=True).encode()
    payload = _LEN.pack(len(head)) + head + sink.getvalue().to_pybytes()
    return encode_frame(kind, payload, compression)


def _binary(column: Any) -> pa.Array | pa.ChunkedArray:
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return column.cast(pa.binary())
    return pa.array(column, pa.binary())


class ChangelogReader:
    """One changelog file, its frame (checksum included) and header checked when it is opened.

    Its rows are read once, a chunk at a time: the reader holds the compressed file and the
    chunk being decoded, never the whole decoded changelog, and lets go of the file once the
    rows are read.
    """

    def __init__(self, kind: bytes, data: bytes, where: str) -> None:
        self.where = where
        self._frame: Frame | None = check_frame(kind, data, where)
        try:
            payload = self._frame.stream()
            (head_len,) = _LEN.unpack(payload.read(_LEN.size))
            self.header: dict[str, Any] = json.loads(payload.read(head_len))
        except _DECODE_ERRORS as exc:
            raise self._corrupt(exc) from exc
        if not isinstance(self.header, dict):
            msg = f"corrupt state file {where}: the header is not a JSON object"
            raise CorruptStateFileError(msg)
        self._rows_at = _LEN.size + head_len

    @property
    def parent(self) -> tuple[int, str] | None:
        return _parent(self.header)

    @property
    def delete_ranges(self) -> list[tuple[bytes, bytes]]:
        """The key ranges the version removed, applied before its rows (see the module)."""
        try:
            return ranges_of(self.header)
        except (TypeError, ValueError) as exc:
            raise self._corrupt(exc) from exc

    def _corrupt(self, exc: Exception) -> CorruptStateFileError:
        return CorruptStateFileError(f"corrupt state file {self.where}: {exc}")

    def chunks(
        self, max_rows: int | None = CHUNK_ROWS
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """The rows as ``(keys, values)`` lists of at most ``max_rows`` (None: a record batch)
        each; a value of None is a delete. A damaged stream fails when it is reached."""
        frame, self._frame = self._frame, None
        if frame is None:
            msg = f"{self.where}: the rows of a changelog reader are read once"
            raise RuntimeError(msg)
        batches = self._batches(frame)
        del frame  # the stream holds the compressed body until the last batch is read
        for batch in batches:
            step = max_rows or batch.num_rows or 1
            for lo in range(0, batch.num_rows, step):
                part = batch.slice(lo, step)
                yield part.column(0).to_pylist(), part.column(1).to_pylist()

    def _batches(self, frame: Frame) -> Iterator[pa.RecordBatch]:
        try:
            payload = frame.stream()
            payload.read(self._rows_at)
            reader = pa.ipc.open_stream(payload)
            if reader.schema.names != _SCHEMA.names:
                msg = f"columns {reader.schema.names}, expected {_SCHEMA.names}"
                raise ValueError(msg)
        except _DECODE_ERRORS as exc:
            raise self._corrupt(exc) from exc
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except _DECODE_ERRORS as exc:
                raise self._corrupt(exc) from exc
            yield batch

    def rows(self) -> Iterator[tuple[bytes, bytes | None]]:
        """The rows one ``(key, value)`` pair at a time, decoded a chunk at a time."""
        return itertools.chain.from_iterable(
            zip(keys, values, strict=True) for keys, values in self.chunks()
        )


def decode_changelog(kind: bytes, data: bytes, where: str) -> Changelog:
    """A whole changelog file, decoded."""
    reader = ChangelogReader(kind, data, where)
    keys: list[bytes] = []
    values: list[bytes | None] = []
    for k, v in reader.chunks(max_rows=None):
        keys += k
        values += v
    return Changelog(reader.header, keys, values)
