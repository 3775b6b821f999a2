"""Point lookups in RocksDB SST files that read only the blocks a lookup needs.

A key of a snapshot on durable storage is found without downloading the snapshot: an
:class:`SstFile` reads the end of its file once (footer, metaindex, properties, range
deletions, the top levels of the index and of the filter), then for a lookup one filter
partition and, unless the filter rules the key out, one index partition and one data block,
each by a ranged read, and keeps them for the next lookup. An :class:`SstSet` answers
for a whole database from the SST files of one of its checkpoints: sequence numbers are global
in a database, so the newest entry of a key among the files wins and no MANIFEST is needed.

It reads the tables the project writes (block-based, format version 2 to 5, a binary-search or
two-level index, the bytewise comparator, blocks uncompressed or compressed with LZ4, LZ4HC,
ZSTD, Snappy, zlib or bzip2). A file or an entry it cannot read raises :class:`SstFormatError`
(an unknown table, format or compression, a merge operand, a blob reference, user-defined
timestamps) or :class:`~sparkstate.exceptions.CorruptStateFileError` (a short read, a failed
checksum, a block that does not decode), never a wrong answer. The whole-key Bloom filter of
format version 5 is read, partitioned or not (:mod:`.sst_filter`), so that a key absent from a
file mostly costs no read of its data; a file with another filter, or none, reads the data
block where an absent key would be.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import enum
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence

from sparkstate.exceptions import CorruptStateFileError
from sparkstate.store.rocksdb.sst_filter import BloomFilter, find_filter
from sparkstate.store.rocksdb.sst_format import (
    FOOTER_SIZE,
    TRAILER_SIZE,
    BlockHandle,
    SstFormatError,
    block_entries,
    decode_block,
    index_entries,
    parse_footer,
    split_internal_key,
)

__all__ = ["Entry", "EntryKind", "RangeRead", "SstFile", "SstFormatError", "SstSet"]

#: Reads ``length`` bytes at ``offset`` of one file.
RangeRead = Callable[[int, int], bytes]

#: The first read of a file takes this much of its end, which holds its footer and meta blocks
#: and, for the files of a state store, the top level of its index.
TAIL_BYTES = 64 * 1024
DATA_CACHE_BYTES = 4 * 1024 * 1024
_BYTEWISE = b"leveldb.BytewiseComparator"
_BINARY_SEARCH_INDEX, _TWO_LEVEL_INDEX = 0, 2
#: Below every internal key of a user key (sequence numbers sort newest first).
_SEEK_FIRST = -(1 << 64)
#: Above every internal key of a user key: a separator that is a user key covers all of them.
_USER_KEY_SEPARATOR = 1


class EntryKind(enum.IntEnum):
    """The kinds of entry a lookup understands, by their byte in the internal key."""

    DELETION = 0x0
    VALUE = 0x1
    SINGLE_DELETION = 0x7


_RANGE_DELETION = 0xF


@dataclasses.dataclass(frozen=True)
class Entry:
    """The newest entry of a user key in one file."""

    seq: int
    kind: EntryKind
    value: bytes


#: A separator of an index: its user key and its negated sequence-and-kind, so that tuples
#: sort as RocksDB's internal keys do.
_IndexKey = tuple[bytes, int]


@dataclasses.dataclass(frozen=True)
class _Index:
    keys: list[_IndexKey]
    handles: list[BlockHandle]

    def find(self, user_key: bytes) -> BlockHandle | None:
        """The handle of the first separator at or after every entry of ``user_key``."""
        at = bisect.bisect_left(self.keys, (user_key, _SEEK_FIRST))
        return self.handles[at] if at < len(self.handles) else None


class SstFile:
    """One SST file read by ranges: a lookup reads a filter partition, and where the filter
    does not rule its key out an index partition and a data block.

    Filter and index partitions are kept once read (they are a small part of a file);
    decompressed data blocks are kept in an LRU of ``cache_bytes``. ``reads`` and
    ``bytes_read`` count the calls to ``read`` and the bytes they returned; ``properties`` are
    the table's properties as stored (numbers as varints); ``tombstones`` its range deletions
    as (begin, end, sequence number), the end excluded.
    """

    def __init__(
        self,
        read: RangeRead,
        size: int,
        name: str = "",
        *,
        cache_bytes: int = DATA_CACHE_BYTES,
        tail_bytes: int = TAIL_BYTES,
    ) -> None:
        self.name = name
        self.size = size
        self.reads = 0
        self.bytes_read = 0
        self._read = read
        self._cache_bytes = cache_bytes
        self._cached_bytes = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._partitions: dict[int, _Index] = {}
        self._blooms: dict[int, BloomFilter | None] = {}
        with self._errors():
            self._tail_offset = max(0, size - max(tail_bytes, FOOTER_SIZE))
            self._tail = self._read_range(self._tail_offset, size - self._tail_offset)
            self._footer = parse_footer(self._tail)
            meta = self._meta_handles()
            self.properties = props = self._properties(meta)
            self._user_key_index = props.get(b"rocksdb.index.key.is.user.key") == b"\x01"
            self._delta_encoded = props.get(b"rocksdb.index.value.is.delta.encoded") == b"\x01"
            self._two_level = self._index_type(props) == _TWO_LEVEL_INDEX
            self._top = self._parse_index(self._block(self._footer.index))
            self._filter = find_filter(meta, props)
            self._filter_top: _Index | None = None
            if self._filter is not None and self._filter.partitioned:
                self._filter_top = self._parse_index(self._block(self._filter.handle))
            self.tombstones = self._range_deletions(meta.get(b"rocksdb.range_del"))

    def get(self, user_key: bytes) -> Entry | None:
        """The newest entry of ``user_key`` in this file, None if it has none."""
        with self._errors():
            handle = self._top.find(user_key)
            if handle is None or not self._may_contain(user_key):
                return None
            if self._two_level:
                handle = self._partition(handle).find(user_key)
                if handle is None:
                    return None
            for key, value in block_entries(self._data_block(handle), user_key):
                found, seq, kind = split_internal_key(key)
                if found < user_key:
                    continue
                if found > user_key:
                    return None
                return Entry(seq, self._kind(kind, user_key), value)
            return None

    def may_contain(self, user_key: bytes) -> bool:
        """False if the file's filter rules ``user_key`` out (it has no entry of it), True if
        it may have one or the file has no filter this reader reads."""
        with self._errors():
            return self._may_contain(user_key)

    def last_below(self, end: bytes) -> bytes | None:
        """The largest user key below ``end`` that has an entry in this file (of any kind, a
        deletion too: a bound of the keys stored), None if none has. Reads the data block
        where ``end`` would be, and the one before it where that holds no lower key."""
        with self._errors():
            for index in self._indexes_before(end):
                for at in range(self._first_at(index, end), -1, -1):
                    below = None
                    for key, _ in block_entries(self._data_block(index.handles[at])):
                        user_key = split_internal_key(key)[0]
                        if user_key >= end:
                            break
                        below = user_key
                    if below is not None:
                        return below
            return None

    def _indexes_before(self, end: bytes) -> Iterator[_Index]:
        """The index blocks over data blocks from the one where ``end`` would be, backwards."""
        if not self._two_level:
            yield self._top
            return
        for at in range(self._first_at(self._top, end), -1, -1):
            yield self._partition(self._top.handles[at])

    @staticmethod
    def _first_at(index: _Index, end: bytes) -> int:
        """The position of the first separator at or after ``end`` (the last one if none)."""
        return min(bisect.bisect_left(index.keys, (end, _SEEK_FIRST)), len(index.keys) - 1)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Name this file in the errors raised within, and report a block that does not parse
        as damage."""
        where = f"SST file {self.name or '?'}"
        try:
            yield
        except (SstFormatError, CorruptStateFileError) as exc:
            msg = f"{where}: {exc}"
            raise type(exc)(msg) from exc
        except (IndexError, struct.error) as exc:
            msg = f"{where}: malformed block ({exc})"
            raise CorruptStateFileError(msg) from exc

    def _kind(self, kind: int, user_key: bytes) -> EntryKind:
        try:
            return EntryKind(kind)
        except ValueError:
            msg = (
                f"key {user_key!r} has an entry of kind {kind:#x} (a merge operand, a blob "
                "reference or another kind this reader does not read)"
            )
            raise SstFormatError(msg) from None

    def _meta_handles(self) -> dict[bytes, BlockHandle]:
        meta = {
            name: BlockHandle.decode(value)[0]
            for name, value in block_entries(self._block(self._footer.metaindex))
        }
        if b"rocksdb.compression_dict" in meta:
            msg = "compression dictionaries are not supported"
            raise SstFormatError(msg)
        if b"rocksdb.properties" not in meta:
            msg = "no properties block"
            raise CorruptStateFileError(msg)
        return meta

    def _properties(self, meta: dict[bytes, BlockHandle]) -> dict[bytes, bytes]:
        props = dict(block_entries(self._block(meta[b"rocksdb.properties"])))
        comparator = props.get(b"rocksdb.comparator", _BYTEWISE)
        if comparator != _BYTEWISE:
            msg = f"comparator {comparator!r} is not supported"
            raise SstFormatError(msg)
        if props.get(b"rocksdb.timestamp_size", b"\x00") != b"\x00":
            msg = "user-defined timestamps are not supported"
            raise SstFormatError(msg)
        return props

    def _index_type(self, props: dict[bytes, bytes]) -> int:
        raw = props.get(b"rocksdb.block.based.table.index.type", b"\x00\x00\x00\x00")
        kind = int.from_bytes(raw, "little")
        if kind not in (_BINARY_SEARCH_INDEX, _TWO_LEVEL_INDEX):
            msg = f"index type {kind} is not supported"
            raise SstFormatError(msg)
        return kind

    def _range_deletions(self, handle: BlockHandle | None) -> list[tuple[bytes, bytes, int]]:
        if handle is None:
            return []
        out = []
        for key, end in block_entries(self._block(handle)):
            begin, seq, kind = split_internal_key(key)
            if kind != _RANGE_DELETION:
                msg = f"range deletion block holds an entry of kind {kind:#x}"
                raise CorruptStateFileError(msg)
            out.append((begin, end, seq))
        return out

    def _parse_index(self, block: bytes) -> _Index:
        keys: list[_IndexKey] = []
        handles: list[BlockHandle] = []
        for key, handle in index_entries(block, self._delta_encoded):
            if self._user_key_index:
                keys.append((key, _USER_KEY_SEPARATOR))
            else:
                user_key, seq, kind = split_internal_key(key)
                keys.append((user_key, -((seq << 8) | kind)))
            handles.append(handle)
        return _Index(keys, handles)

    def _partition(self, handle: BlockHandle) -> _Index:
        index = self._partitions.get(handle.offset)
        if index is None:
            index = self._parse_index(self._block(handle))
            self._partitions[handle.offset] = index
        return index

    def _may_contain(self, user_key: bytes) -> bool:
        """:meth:`may_contain`: the filter partition where ``user_key`` would be, read once."""
        if self._filter is None:
            return True
        handle = self._filter.handle
        if self._filter_top is not None:
            if not self._filter_top.handles:
                return True
            found = self._filter_top.find(user_key)
            # Past the last partition's key, the last partition (as RocksDB looks it up).
            handle = self._filter_top.handles[-1] if found is None else found
        bloom = self._bloom(handle)
        return bloom is None or bloom.may_contain(user_key)

    def _bloom(self, handle: BlockHandle) -> BloomFilter | None:
        if handle.offset not in self._blooms:
            self._blooms[handle.offset] = BloomFilter.parse(self._block(handle))
        return self._blooms[handle.offset]

    def _data_block(self, handle: BlockHandle) -> bytes:
        block = self._blocks.get(handle.offset)
        if block is not None:
            self._blocks.move_to_end(handle.offset)
            return block
        block = self._block(handle)
        self._blocks[handle.offset] = block
        self._cached_bytes += len(block)
        while self._cached_bytes > self._cache_bytes and len(self._blocks) > 1:
            self._cached_bytes -= len(self._blocks.popitem(last=False)[1])
        return block

    def _block(self, handle: BlockHandle) -> bytes:
        """A block's contents, from the tail read at open where it lies there."""
        length = handle.size + TRAILER_SIZE
        if handle.offset + length > self.size - FOOTER_SIZE:
            msg = f"block at {handle.offset} of {handle.size} bytes is past the end"
            raise CorruptStateFileError(msg)
        start = handle.offset - self._tail_offset
        if start >= 0:
            raw = self._tail[start : start + length]
        else:
            raw = self._read_range(handle.offset, length)
        return decode_block(raw, self._footer.checksum_type)

    def _read_range(self, offset: int, length: int) -> bytes:
        data = self._read(offset, length)
        self.reads += 1
        self.bytes_read += len(data)
        if len(data) != length:
            msg = f"read {len(data)} of {length} bytes at {offset}"
            raise CorruptStateFileError(msg)
        return data


class SstSet:
    """The SST files of one database at one point (a checkpoint's files), looked up together:
    the entry of a key with the highest sequence number wins, unless a range deletion with a
    higher one covers the key. An entry compacted to the bottom level has sequence number 0,
    older than anything."""

    def __init__(self, files: Sequence[SstFile]) -> None:
        self.files = list(files)
        self._bounds, self._newest_deletion = _fragment(t for f in self.files for t in f.tombstones)

    def get(self, user_key: bytes) -> bytes | None:
        """The value of ``user_key`` in the database, None if it has none."""
        best: Entry | None = None
        for sst in self.files:
            entry = sst.get(user_key)
            if entry is not None and (best is None or entry.seq > best.seq):
                best = entry
        if best is None or best.kind != EntryKind.VALUE:
            return None
        if self._deleted_after(user_key, best.seq):
            return None
        return best.value

    def get_many(self, user_keys: Sequence[bytes]) -> list[bytes | None]:
        """The values of ``user_keys``, looked up in key order (neighbours share blocks)."""
        found = {key: self.get(key) for key in sorted(set(user_keys))}
        return [found[key] for key in user_keys]

    def last_below(self, end: bytes) -> bytes | None:
        """A bound of the keys below ``end`` in the database: the largest user key below it
        with an entry in any file (deleted ones counted), None if no file has one."""
        found = [k for k in (f.last_below(end) for f in self.files) if k is not None]
        return max(found, default=None)

    @property
    def reads(self) -> int:
        return sum(f.reads for f in self.files)

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    def _deleted_after(self, user_key: bytes, seq: int) -> bool:
        at = bisect.bisect_right(self._bounds, user_key) - 1
        return at >= 0 and self._newest_deletion[at] > seq


def _fragment(tombstones: Iterable[tuple[bytes, bytes, int]]) -> tuple[list[bytes], list[int]]:
    """Range deletions cut into fragments that do not overlap: the start of each fragment, and
    the highest sequence number of a deletion covering it (-1 where none does)."""
    ranges = [(begin, end, seq) for begin, end, seq in tombstones if begin < end]
    bounds = sorted({key for begin, end, _ in ranges for key in (begin, end)})
    newest = [-1] * len(bounds)
    for begin, end, seq in ranges:
        for at in range(bisect.bisect_left(bounds, begin), bisect.bisect_left(bounds, end)):
            newest[at] = max(newest[at], seq)
    return bounds, newest
