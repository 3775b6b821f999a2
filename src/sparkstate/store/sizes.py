"""What a dict of bytes keys and values holds in memory, estimated as Spark's ``SizeEstimator``
estimates a map: the memory provider's versions and the rocksdb provider's copies of a small
state (:mod:`sparkstate.store.rocksdb.value_copy`) are measured alike."""

from __future__ import annotations

import itertools
import sys

__all__ = ["entry_bytes", "map_size_bytes"]

#: Entries whose mean size estimates the memory a map holds.
_SIZE_SAMPLE = 1000


def entry_bytes(data: dict[bytes, bytes]) -> float:
    """The mean size of a key and value object of ``data``, from a sample of its entries."""
    sample = list(itertools.islice(data.items(), _SIZE_SAMPLE))
    if not sample:
        return 0.0
    return sum(map(sys.getsizeof, itertools.chain.from_iterable(sample))) / len(sample)


def map_size_bytes(data: dict[bytes, bytes]) -> int:
    """An estimate of a map: its hash table and its key and value objects."""
    return sys.getsizeof(data) + int(len(data) * entry_bytes(data))
