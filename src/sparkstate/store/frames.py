"""Framing of every durable file: a header, a checksum, and compression.

``MAGIC | kind(4) | codec(1) | raw_len(u64) | payload_len(u64) | crc32(u32) | payload``

A truncated file fails the length check, a flipped bit fails the CRC-32 of the payload, and the
errors name the file, so that a damaged checkpoint is reported rather than loaded.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

import pyarrow as pa

from sparkstate.exceptions import CorruptStateFileError

__all__ = ["HEADER_SIZE", "Frame", "check_frame", "decode_frame", "encode_frame"]

MAGIC = b"SSF\x01"
_HEADER = struct.Struct("<4s4sBQQI")
HEADER_SIZE = _HEADER.size
_CODECS = {"none": 0, "lz4": 1, "zstd": 2}
_CODEC_NAMES = {v: k for k, v in _CODECS.items()}


def encode_frame(kind: bytes, payload: bytes, compression: str = "zstd") -> bytes:
    """Frame ``payload`` as a file of ``kind`` (4 ASCII bytes), compressed and checksummed."""
    codec = _CODECS[compression]
    body = payload if codec == 0 else pa.compress(payload, codec=compression, asbytes=True)
    header = _HEADER.pack(MAGIC, kind, codec, len(payload), len(body), zlib.crc32(body))
    return header + body


@dataclasses.dataclass(frozen=True)
class Frame:
    """A checked frame: its payload, compressed as stored, readable whole or as a stream."""

    body: memoryview
    codec: str
    raw_len: int
    where: str

    def payload(self) -> bytes:
        """The whole payload, decompressed in one call."""
        if self.codec == "none":
            return bytes(self.body)
        try:
            raw: bytes = pa.decompress(
                self.body, decompressed_size=self.raw_len, codec=self.codec, asbytes=True
            )
        except (OSError, ValueError) as exc:
            msg = f"corrupt state file {self.where}: cannot decompress: {exc}"
            raise CorruptStateFileError(msg) from exc
        return raw

    def stream(self) -> pa.NativeFile:
        """The payload as a stream, decompressed as it is read (a reader of a large file holds
        the compressed body and what it has read, not the whole payload)."""
        body = pa.BufferReader(pa.py_buffer(self.body))
        return body if self.codec == "none" else pa.CompressedInputStream(body, self.codec)


def check_frame(kind: bytes, data: bytes, where: str) -> Frame:
    """The checked frame of a file of ``kind``; ``where`` names the file in errors."""
    if len(data) < HEADER_SIZE:
        msg = f"corrupt state file {where}: truncated ({len(data)} bytes, no complete header)"
        raise CorruptStateFileError(msg)
    magic, got_kind, codec, raw_len, body_len, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        msg = f"corrupt state file {where}: bad magic {magic!r}"
        raise CorruptStateFileError(msg)
    if got_kind != kind:
        msg = f"corrupt state file {where}: expected a {kind!r} file, found {got_kind!r}"
        raise CorruptStateFileError(msg)
    body = memoryview(data)[HEADER_SIZE:]
    if len(body) != body_len:
        msg = f"corrupt state file {where}: truncated ({len(body)} of {body_len} payload bytes)"
        raise CorruptStateFileError(msg)
    if zlib.crc32(body) != crc:
        msg = f"corrupt state file {where}: checksum mismatch"
        raise CorruptStateFileError(msg)
    name = _CODEC_NAMES.get(codec)
    if name is None:
        msg = f"corrupt state file {where}: unknown compression codec {codec}"
        raise CorruptStateFileError(msg)
    return Frame(body, name, raw_len, where)


def decode_frame(kind: bytes, data: bytes, where: str) -> bytes:
    """The payload of a framed file; ``where`` names the file in errors."""
    return check_frame(kind, data, where).payload()
