"""RocksDB's whole-key Bloom filters in SST files, as far as a point lookup needs them.

A table written with a Bloom filter policy holds, under the metaindex entry
``fullfilter.rocksdb.BuiltinBloomFilter``, one filter over the user keys of all its entries
(deletions too), or under ``partitionedfilter.rocksdb.BuiltinBloomFilter`` an index of filter
partitions, each such a filter over a range of keys. :func:`find_filter` tells which a file
has; :class:`BloomFilter` reads one filter block.

Only the Bloom filter of format version 5 (FastLocalBloom: 64-byte cache lines, its probes in
one of them) is read; any other (the legacy Bloom of older format versions, Ribbon, a
block-based filter, a prefix filter, a filter policy of its own, metadata this module does not
know) is no filter at all to a lookup, which then reads the data block as it would without one.
Keys are hashed as RocksDB hashes them, with :func:`.xxph3.hash64` (its frozen XXH3 preview,
written out in Python: the ``xxhash`` package's XXH3 differs at every key length), so that a
key a file holds is never ruled out.
"""

from __future__ import annotations

import dataclasses

from sparkstate.store.rocksdb.sst_format import BlockHandle
from sparkstate.store.rocksdb.xxph3 import hash64

__all__ = ["BloomFilter", "FilterRef", "find_filter"]

_POLICY = b"rocksdb.BuiltinBloomFilter"
_METADATA_BYTES = 5
_CACHE_LINE = 64
#: The metadata's first byte: -1 marks the newer Bloom implementations (-2 Ribbon, 1 to 127
#: the legacy Bloom's probe count).
_NEW_BLOOM = 0xFF
_FAST_LOCAL_BLOOM = 0
_GOLDEN32 = 0x9E3779B9
_M32 = (1 << 32) - 1


@dataclasses.dataclass(frozen=True)
class FilterRef:
    """Where a file's filter is: one filter block, or the index of its partitions."""

    handle: BlockHandle
    partitioned: bool


def find_filter(meta: dict[bytes, BlockHandle], props: dict[bytes, bytes]) -> FilterRef | None:
    """The whole-key filter of a table from its metaindex and properties, None if it has none
    a lookup can use (no filter, or one over prefixes, or of another policy)."""
    whole_keys = props.get(b"rocksdb.block.based.table.whole.key.filtering") == b"1"
    prefixes = props.get(b"rocksdb.block.based.table.prefix.filtering") != b"0"
    if not whole_keys or prefixes:
        return None
    if (handle := meta.get(b"partitionedfilter." + _POLICY)) is not None:
        return FilterRef(handle, partitioned=True)
    if (handle := meta.get(b"fullfilter." + _POLICY)) is not None:
        return FilterRef(handle, partitioned=False)
    return None


class BloomFilter:
    """A FastLocalBloom filter block: cache lines of 512 bits, then five bytes of metadata
    (0xff, the implementation 0, the probe count, two zero bytes). A key's 64-bit hash picks
    a cache line by its low half and the bits within it by its high half."""

    def __init__(self, lines: bytes, probes: int) -> None:
        self._lines = lines
        self._line_count = len(lines) // _CACHE_LINE
        self._probes = probes

    @classmethod
    def parse(cls, block: bytes) -> BloomFilter | None:
        """The filter in a filter block, None where it is not a FastLocalBloom filter this
        module reads (and where it is empty: RocksDB reads that as holding no key; a lookup
        reads the data block rather than rely on it)."""
        if len(block) <= _METADATA_BYTES:
            return None
        length = len(block) - _METADATA_BYTES
        marker, impl, block_and_probes = block[length : length + 3]
        reserved = block[length + 3 :]
        probes = block_and_probes & 31
        if (
            marker != _NEW_BLOOM
            or impl != _FAST_LOCAL_BLOOM
            or block_and_probes >> 5  # cache lines of 64 bytes only
            or not 1 <= probes <= 30
            or reserved != b"\x00\x00"
            or length % _CACHE_LINE
        ):
            return None
        return cls(block[:length], probes)

    def may_contain(self, user_key: bytes) -> bool:
        """False if ``user_key`` is certainly not among the keys the filter was built over."""
        h = hash64(user_key)
        line = ((h & _M32) * self._line_count >> 32) * _CACHE_LINE
        bits = h >> 32
        lines = self._lines
        for _ in range(self._probes):
            bit = bits >> 23  # nine bits: a bit of the 512 of the line
            if not lines[line + (bit >> 3)] >> (bit & 7) & 1:
                return False
            bits = (bits * _GOLDEN32) & _M32
        return True
