"""RocksDB's block-based table format, as far as a point lookup needs it.

The pieces :mod:`.sst_read` is built from: varints, block handles, the footer of
``format_version`` 2 to 5, a block's trailer (its compression type and checksum), the entries of
a block (keys sharing a prefix with the one before, a restart array at the end) and internal keys
(a user key and eight bytes of sequence number and kind).

Block checksums are verified where the standard library or ``xxhash`` computes them (xxHash,
xxHash64 and XXH3, RocksDB's default); a file checksummed with CRC32c is read unverified.
"""

from __future__ import annotations

import bz2
import dataclasses
import struct
import zlib
from collections.abc import Iterator

import pyarrow
import xxhash

from sparkstate.exceptions import CorruptStateFileError, StateStoreError

__all__ = [
    "FOOTER_SIZE",
    "TRAILER_SIZE",
    "BlockHandle",
    "Footer",
    "SstFormatError",
    "block_entries",
    "decode_block",
    "decode_varint",
    "index_entries",
    "parse_footer",
    "split_internal_key",
]

#: The footer of format versions 1 to 5: checksum type, two handles padded to 40 bytes,
#: the format version and the magic number.
FOOTER_SIZE = 53
#: Each block is followed by its compression type (one byte) and its checksum (four).
TRAILER_SIZE = 5
_MAGIC = 0x88E241B785F4CFF7
_LEGACY_MAGIC = 0xDB4775248B80FB57
_XXH3_LAST_BYTE_PRIME = 0x6B9083D9

_NO_COMPRESSION, _SNAPPY, _ZLIB, _BZIP2, _LZ4, _LZ4HC, _ZSTD = 0, 1, 2, 3, 4, 5, 7
_CODECS = {_SNAPPY: "snappy", _LZ4: "lz4_raw", _LZ4HC: "lz4_raw", _ZSTD: "zstd"}
_CHECKSUMS = {0: "none", 1: "crc32c", 2: "xxhash", 3: "xxhash64", 4: "xxh3"}


class SstFormatError(StateStoreError, ValueError):
    """An SST file this reader does not read: not a block-based table, or a feature it does not
    decode (a compression type, a format version, a merge operand, a blob reference, ...)."""


def decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            msg = "varint longer than 64 bits"
            raise IndexError(msg)


@dataclasses.dataclass(frozen=True)
class BlockHandle:
    """Where a block lies in its file: its offset and its size without the trailer."""

    offset: int
    size: int

    @classmethod
    def decode(cls, buf: bytes, pos: int = 0) -> tuple[BlockHandle, int]:
        offset, pos = decode_varint(buf, pos)
        size, pos = decode_varint(buf, pos)
        return cls(offset, size), pos


@dataclasses.dataclass(frozen=True)
class Footer:
    """The end of an SST file: how its blocks are checksummed, where the metaindex and the
    index are, and its format version."""

    checksum_type: int
    metaindex: BlockHandle
    index: BlockHandle
    format_version: int


def parse_footer(tail: bytes) -> Footer:
    """The footer in the last :data:`FOOTER_SIZE` bytes of a file."""
    if len(tail) < FOOTER_SIZE:
        msg = f"{len(tail)} bytes, shorter than a footer"
        raise CorruptStateFileError(msg)
    tail = tail[-FOOTER_SIZE:]
    version, magic = struct.unpack_from("<IQ", tail, FOOTER_SIZE - 12)
    if magic == _LEGACY_MAGIC:
        msg = "format_version 0 is not supported"
        raise SstFormatError(msg)
    if magic != _MAGIC:
        msg = (
            f"not a RocksDB block-based table (magic {magic:#x}): "
            "another table format, or a truncated file"
        )
        raise SstFormatError(msg)
    if not 2 <= version <= 5:
        msg = f"format_version {version} is not supported (2 to 5 are)"
        raise SstFormatError(msg)
    checksum_type = tail[0]
    if checksum_type not in _CHECKSUMS:
        msg = f"unknown checksum type {checksum_type}"
        raise CorruptStateFileError(msg)
    metaindex, pos = BlockHandle.decode(tail, 1)
    index, _ = BlockHandle.decode(tail, pos)
    return Footer(checksum_type, metaindex, index, version)


def _checksum(kind: int, data: bytes, block_type: int) -> int | None:
    """The checksum RocksDB stores after ``data`` and its compression type, None where this
    module cannot compute it."""
    if kind == 4:
        low = xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF
        return low ^ ((block_type * _XXH3_LAST_BYTE_PRIME) & 0xFFFFFFFF)
    if kind == 2:
        return xxhash.xxh32_intdigest(data + bytes([block_type]))
    if kind == 3:
        return xxhash.xxh64_intdigest(data + bytes([block_type])) & 0xFFFFFFFF
    return None


def decode_block(raw: bytes, checksum_type: int) -> bytes:
    """The contents of a block read with its trailer: checked, and decompressed."""
    if len(raw) < TRAILER_SIZE:
        msg = "block shorter than its trailer"
        raise CorruptStateFileError(msg)
    data, block_type = raw[:-TRAILER_SIZE], raw[-TRAILER_SIZE]
    (stored,) = struct.unpack_from("<I", raw, len(raw) - 4)
    expected = _checksum(checksum_type, data, block_type)
    if expected is not None and expected != stored:
        msg = "block checksum mismatch"
        raise CorruptStateFileError(msg)
    if block_type == _NO_COMPRESSION:
        return data
    if block_type not in (*_CODECS, _ZLIB, _BZIP2):
        msg = f"compression type {block_type} is not supported"
        raise SstFormatError(msg)
    try:
        # Snappy carries its own length; the others are preceded by theirs (format_version 2+).
        size, pos = decode_varint(data, 0)
        if block_type == _SNAPPY:
            pos = 0
        body = data[pos:]
        if block_type == _ZLIB:
            out = zlib.decompress(body, -15)
        elif block_type == _BZIP2:
            out = bz2.decompress(body)
        else:
            codec = pyarrow.Codec(_CODECS[block_type])
            out = codec.decompress(body, decompressed_size=size).to_pybytes()
    except (IndexError, OSError, ValueError, zlib.error) as exc:
        msg = f"block does not decompress ({exc})"
        raise CorruptStateFileError(msg) from exc
    if len(out) != size:
        msg = f"block decompressed to {len(out)} bytes, not {size}"
        raise CorruptStateFileError(msg)
    return out


def _restarts(block: bytes) -> tuple[int, list[int]]:
    """Where a block's entries end and its restart points."""
    if len(block) < 4:
        msg = "block shorter than its restart count"
        raise IndexError(msg)
    (packed,) = struct.unpack_from("<I", block, len(block) - 4)
    if packed >> 28:
        msg = f"block footer {packed:#x}: a data-block hash index or another feature"
        raise SstFormatError(msg)
    end = len(block) - 4 - 4 * packed
    if packed == 0 or end < 0:
        msg = f"bad restart count {packed}"
        raise IndexError(msg)
    return end, list(struct.unpack_from(f"<{packed}I", block, end))


def _entry_header(block: bytes, pos: int, with_value_length: bool) -> tuple[int, int, int, int]:
    """The shared and unshared key lengths and value length of the entry at ``pos``, and where
    its key bytes start (one byte each in the common case)."""
    shared, non_shared = block[pos], block[pos + 1]
    value_length = block[pos + 2] if with_value_length else 0
    if shared | non_shared | value_length < 0x80:
        return shared, non_shared, value_length, pos + (3 if with_value_length else 2)
    shared, pos = decode_varint(block, pos)
    non_shared, pos = decode_varint(block, pos)
    if with_value_length:
        value_length, pos = decode_varint(block, pos)
    return shared, non_shared, value_length, pos


def block_entries(block: bytes, start_after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) entries of a block of keys and values, in order. With ``start_after``
    (a user key), the scan starts at the last restart point whose key's user key is lower, so
    that the entries it skips all have lower user keys."""
    end, restarts = _restarts(block)
    pos = restarts[0]
    if start_after is not None:
        lo, hi = 0, len(restarts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            _, non_shared, _, at = _entry_header(block, restarts[mid], True)
            if block[at : at + non_shared - 8] < start_after:
                lo = mid
            else:
                hi = mid - 1
        pos = restarts[lo]
    key = b""
    while pos < end:
        shared, non_shared, value_length, pos = _entry_header(block, pos, True)
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        yield key, block[pos : pos + value_length]
        pos += value_length
    if pos != end:
        msg = "entries overrun the restart array"
        raise IndexError(msg)


def index_entries(block: bytes, delta_encoded: bool) -> Iterator[tuple[bytes, BlockHandle]]:
    """The (separator key, block handle) entries of an index block. Delta-encoded values (format
    version 4 and later) hold a full handle at each restart point and elsewhere the change in
    size, the block starting right after the previous one and its trailer."""
    end, restarts = _restarts(block)
    restart_set = set(restarts)
    pos, key, handle = restarts[0], b"", BlockHandle(0, 0)
    while pos < end:
        at_restart = pos in restart_set
        shared, non_shared, value_length, pos = _entry_header(block, pos, not delta_encoded)
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        if not delta_encoded or at_restart:
            handle, after = BlockHandle.decode(block, pos)
        else:
            zigzag, after = decode_varint(block, pos)
            size = handle.size + ((zigzag >> 1) ^ -(zigzag & 1))
            handle = BlockHandle(handle.offset + handle.size + TRAILER_SIZE, size)
        pos = pos + value_length if not delta_encoded else after
        yield key, handle
    if pos != end:
        msg = "entries overrun the restart array"
        raise IndexError(msg)


def split_internal_key(key: bytes) -> tuple[bytes, int, int]:
    """The user key, sequence number and kind of an internal key."""
    if len(key) < 8:
        msg = f"internal key of {len(key)} bytes"
        raise IndexError(msg)
    (packed,) = struct.unpack_from("<Q", key, len(key) - 8)
    return key[:-8], packed >> 8, packed & 0xFF
