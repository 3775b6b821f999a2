"""RocksDB settings of a local DB, and the memory every DB of a process shares.

:class:`LocalDBConf` is what the provider chooses (compression, memory, bloom filters);
:func:`db_options` turns it into RocksDB options. Every DB a process opens shares one block cache
and one write-buffer manager (:func:`shared_resources`), so memory is bounded per process, not per
store: the cache holds data blocks, index and filter blocks, and the memtables are charged to it
(RocksDB's write-buffer manager with a cache), so one number bounds all of it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from typing import Any

import rocksdict

from sparkstate.exceptions import ConfigurationError

__all__ = [
    "LocalDBConf",
    "SharedResources",
    "db_options",
    "memtable_bytes",
    "shared_resources",
    "write_options",
]

_MB = 1024 * 1024
#: The smallest RocksDB memory a worker's share of a budget is cut to.
_MIN_SHARE_MB = 8
#: RocksDB charges the memtables to the block cache in dummy entries of this size.
_CACHE_CHARGE_UNIT = 256 * 1024
#: Memtables allocate (and RocksDB reports them) in blocks of this size. RocksDB's default,
#: min(1 MB, write buffer / 8), made every partition's memtable 1 MB however little it held.
_ARENA_BLOCK_BYTES = 64 * 1024


@dataclasses.dataclass
class SharedResources:
    """The block cache and write-buffer manager that every DB of this process uses; the
    memtables are charged to the cache, so ``block_cache_bytes`` bounds both."""

    block_cache: rocksdict.Cache
    write_buffer_manager: rocksdict.WriteBufferManager
    block_cache_bytes: int
    write_buffer_bytes: int
    pid: int
    #: The databases open in this process (they share the cache's blocks).
    open_dbs: weakref.WeakSet[Any] = dataclasses.field(default_factory=weakref.WeakSet)

    def _memtable_charge(self) -> int:
        """What the memtables occupy of the cache: their size in whole dummy entries."""
        used = int(self.write_buffer_manager.get_usage())
        return -(-used // _CACHE_CHARGE_UNIT) * _CACHE_CHARGE_UNIT

    def cached_blocks_bytes(self) -> int:
        """Bytes of data, index and filter blocks in the cache (the memtables' charge left out:
        each database reports its own memtables)."""
        return max(0, int(self.block_cache.get_usage()) - self._memtable_charge())

    def pinned_blocks_bytes(self) -> int:
        """Bytes of the cache's pinned blocks (the memtables' charge, pinned too, left out)."""
        return max(0, int(self.block_cache.get_pinned_usage()) - self._memtable_charge())

    def share(self, nbytes: int) -> int:
        """One open database's share of ``nbytes`` of the cache, as Spark divides a bounded
        cache among the RocksDB instances of an executor."""
        return nbytes // max(1, len(self.open_dbs))


_shared: SharedResources | None = None
_shared_lock = threading.Lock()


def shared_resources(block_cache_mb: int, write_buffer_mb: int) -> SharedResources:
    """This process's block cache and write-buffer manager, created on first use.

    The cache's capacity is the process's RocksDB memory; the manager charges the memtables to it
    and flushes (it does not stall writers) once they pass ``write_buffer_mb``. A later call
    asking for more memory grows them (never shrinks: a DB may rely on them). A forked child gets
    its own.

    The cache is an LRU cache, as in the 100M-row benchmark runs. A HyperClockCache keeps large
    bloom filters better (an LRU cache of 64 MB has 1 MB shards, and a filter larger than its
    shard was read again for every 32 keys of a multi-get) but is not yet measured at scale with
    the memtables charged to it. With the default 128 MB, a shard holds the filter of 1.6M keys.
    """
    global _shared
    if block_cache_mb < 1 or write_buffer_mb < 1:
        msg = f"block cache and write buffers need >= 1 MB, got {block_cache_mb}, {write_buffer_mb}"
        raise ConfigurationError(msg)
    cache_bytes, buffer_bytes = block_cache_mb * _MB, write_buffer_mb * _MB
    with _shared_lock:
        res = _shared
        if res is None or res.pid != os.getpid():
            cache = rocksdict.Cache(cache_bytes)
            manager = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
                buffer_bytes, False, cache
            )
            res = SharedResources(
                block_cache=cache,
                write_buffer_manager=manager,
                block_cache_bytes=cache_bytes,
                write_buffer_bytes=buffer_bytes,
                pid=os.getpid(),
            )
            _shared = res
        if cache_bytes > res.block_cache_bytes:
            res.block_cache.set_capacity(cache_bytes)
            res.block_cache_bytes = cache_bytes
        if buffer_bytes > res.write_buffer_bytes:
            res.write_buffer_manager.set_buffer_size(buffer_bytes)
            res.write_buffer_bytes = buffer_bytes
        return res


@dataclasses.dataclass(frozen=True)
class LocalDBConf:
    """RocksDB settings of a local DB (the provider builds it from its ``StoreConf``)."""

    compression: str = "zstd"
    #: The process's RocksDB memory: data, index and filter blocks, and the memtables.
    block_cache_mb: int = 128
    #: Of which the memtables take at most this much before they are flushed.
    write_buffer_mb: int = 64
    bloom_bits_per_key: int = 10
    max_background_jobs: int = 2
    #: RocksDB tickers and histograms (block cache hits, bytes read, ...), for the progress's
    #: metrics in Spark's names; measured at no cost to the throughput of gets and commits.
    statistics: bool = True

    def __post_init__(self) -> None:
        if self.compression not in _COMPRESSION:
            msg = f"compression must be one of {sorted(_COMPRESSION)}, got {self.compression!r}"
            raise ConfigurationError(msg)
        if self.bloom_bits_per_key < 0 or self.max_background_jobs < 1:
            msg = f"invalid RocksDB settings {self}"
            raise ConfigurationError(msg)

    @classmethod
    def from_store_conf(cls, conf: Any) -> LocalDBConf:
        """Take compression and memory from a StoreConf: with ``memory_budget_mb`` (an executor's
        budget) each of its ``python_workers`` gets an equal share, half of it for memtables;
        else ``block_cache_mb`` and ``write_buffer_mb`` per worker."""
        cache_mb, buffer_mb = conf.block_cache_mb, conf.write_buffer_mb
        if conf.memory_budget_mb:
            cache_mb = max(_MIN_SHARE_MB, conf.memory_budget_mb // max(1, conf.python_workers))
            buffer_mb = cache_mb // 2
        return cls(
            compression=conf.compression,
            block_cache_mb=cache_mb,
            write_buffer_mb=min(buffer_mb, cache_mb),
        )


_COMPRESSION = {
    "zstd": (rocksdict.DBCompressionType.lz4, rocksdict.DBCompressionType.zstd),
    "lz4": (rocksdict.DBCompressionType.lz4, rocksdict.DBCompressionType.lz4),
    "none": (rocksdict.DBCompressionType.none, rocksdict.DBCompressionType.none),
}


def db_options(conf: LocalDBConf, res: SharedResources, *, create: bool) -> rocksdict.Options:
    """RocksDB options of a DB with ``conf``: raw (bytes) mode, the shared cache and buffers."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(create)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(res.block_cache)
    if conf.bloom_bits_per_key:
        table.set_bloom_filter(conf.bloom_bits_per_key, False)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    # Index and filter in partitions of a few KB under a small top level that stays pinned:
    # a whole filter is about 1.2 bytes per key, larger than a cache shard for a few million
    # keys, and was read again, and checksummed, on every miss once the cache was full.
    table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_pin_top_level_index_and_filter(True)
    table.set_format_version(5)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_manager(res.write_buffer_manager)
    opts.set_write_buffer_size(memtable_bytes(res, copied=False))
    opts.set_arena_block_size(_ARENA_BLOCK_BYTES)
    opts.set_max_write_buffer_number(3)
    upper, bottom = _COMPRESSION[conf.compression]
    opts.set_compression_type(upper())
    opts.set_bottommost_compression_type(bottom())
    opts.set_compaction_style(rocksdict.DBCompactionStyle.level())
    opts.set_level_compaction_dynamic_level_bytes(True)
    opts.set_max_background_jobs(conf.max_background_jobs)
    opts.set_keep_log_file_num(2)
    opts.set_max_log_file_size(4 * _MB)
    if conf.statistics:
        opts.enable_statistics()
    return opts


def memtable_bytes(res: SharedResources, *, copied: bool) -> int:
    """The size at which one database's memtable is flushed: half the process's memtable budget,
    at most 64 MB, or at most 8 MB where the provider reads a copy of the state in memory
    (:mod:`.value_copy`). A memtable is a skip list, so a write costs more the more it holds: a
    batch that rewrote 50k keys took 22-30 ms at 32-64 MB, 12 ms at 4 MB. A small memtable
    costs more flushes and compactions, which a large state pays for (a 10M-key state's commit
    took 797 against 569 ms at 8 MB), and a small one, which a copy marks, does not."""
    ceiling = (8 if copied else 64) * _MB
    return max(_MB, min(ceiling, res.write_buffer_bytes // 2))


def write_options() -> rocksdict.WriteOptions:
    """Options of every write batch: the WAL off (the durable changelog is the log)."""
    wo = rocksdict.WriteOptions()
    # The stub declares disable_wal a method; in 0.3.29 it is a bool property.
    wo.disable_wal = True  # type: ignore[assignment, method-assign]
    return wo
