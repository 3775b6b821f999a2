"""Spark's ``hash()`` (Murmur3, seed 42) of key values, and so the state partition of a key.

The engine shuffles an operator's input with ``repartition(n, *key_columns)``: Spark's
``HashPartitioning``, whose partition is ``pmod(hash(key_columns), n)``. Spark hashes each
column in turn, the hash so far the seed of the next: an int (and a byte, a short, a date, a
boolean as 0/1) as one 4-byte block, a long (a timestamp's microseconds) as two, a float or
double by its bits (``-0.0`` as ``0.0``), a small decimal by its unscaled long, a string or
binary by its bytes with Spark's own treatment of the last 1-3 bytes (one block each); a null
leaves the hash as it was. Types outside these have no hash here (:func:`spark_partition`
returns None and the caller looks in every partition).
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["SEED", "hashable", "spark_hash", "spark_partition", "spark_partitions"]

SEED = 42
_MASK = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
#: Spark's small decimals: hashed as their unscaled long up to this precision.
_MAX_LONG_DIGITS = 18


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * _C1) & _MASK, 15) * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    return h1 ^ (h1 >> 16)


def _hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed, _mix_k1(value & _MASK)), 4)


def _hash_long(value: int, seed: int) -> int:
    h1 = _mix_h1(seed, _mix_k1(value & _MASK))
    h1 = _mix_h1(h1, _mix_k1((value >> 32) & _MASK))
    return _fmix(h1, 8)


def _hash_bytes(data: bytes, seed: int) -> int:
    """Spark's ``hashUnsafeBytes``: 4-byte little-endian blocks, then each byte left over as a
    block of its own (sign-extended, as Java reads a byte)."""
    aligned = len(data) - len(data) % 4
    h1 = seed
    for (block,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix_h1(h1, _mix_k1(block))
    for byte in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((byte - 256 if byte > 127 else byte) & _MASK))
    return _fmix(h1, len(data))


def _unscaled_bytes(value: decimal.Decimal, scale: int) -> bytes:
    """Java's ``BigInteger.toByteArray`` of the unscaled value: big-endian two's complement in
    the fewest bytes."""
    unscaled = int(value.scaleb(scale))
    size = unscaled.bit_length() // 8 + 1
    return unscaled.to_bytes(size, "big", signed=True)


def hashable(typ: pa.DataType) -> bool:
    """Whether :func:`spark_hash` knows how Spark hashes a column of ``typ``."""
    return (
        pa.types.is_boolean(typ)
        or pa.types.is_signed_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_date32(typ)
        or (pa.types.is_timestamp(typ) and typ.unit == "us")
        or pa.types.is_decimal128(typ)
    ) and not pa.types.is_float16(typ)


def _hash_value(scalar: pa.Scalar, seed: int) -> int:
    typ = scalar.type
    if not scalar.is_valid:
        return seed
    if pa.types.is_boolean(typ):
        return _hash_int(1 if scalar.as_py() else 0, seed)
    if pa.types.is_int64(typ):
        return _hash_long(scalar.as_py(), seed)
    if pa.types.is_signed_integer(typ):
        return _hash_int(scalar.as_py(), seed)
    if pa.types.is_date32(typ):
        return _hash_int(scalar.cast(pa.int32()).as_py(), seed)
    if pa.types.is_timestamp(typ):
        return _hash_long(scalar.cast(pa.int64()).as_py(), seed)
    if pa.types.is_float32(typ):
        value = scalar.as_py()
        bits = 0 if value == 0.0 else struct.unpack("<i", struct.pack("<f", value))[0]
        return _hash_int(bits, seed)
    if pa.types.is_float64(typ):
        value = scalar.as_py()
        bits = 0 if value == 0.0 else struct.unpack("<q", struct.pack("<d", value))[0]
        return _hash_long(bits, seed)
    if pa.types.is_decimal128(typ):
        value = scalar.as_py()
        if typ.precision <= _MAX_LONG_DIGITS:
            return _hash_long(int(value.scaleb(typ.scale)), seed)
        return _hash_bytes(_unscaled_bytes(value, typ.scale), seed)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return _hash_bytes(scalar.as_py().encode("utf-8"), seed)
    return _hash_bytes(scalar.as_py(), seed)


def spark_hash(values: Sequence[pa.Scalar], seed: int = SEED) -> int:
    """``hash(values...)`` as Spark computes it (a signed 32-bit int)."""
    h = seed & _MASK
    for value in values:
        if not hashable(value.type):
            msg = f"no Spark hash of a {value.type} value here"
            raise TypeError(msg)
        h = _hash_value(value, h)
    return h - (1 << 32) if h & 0x80000000 else h


def spark_partition(values: Sequence[pa.Scalar], num_partitions: int) -> int | None:
    """``pmod(hash(values...), num_partitions)``: the partition Spark's ``repartition`` sends
    the key to; None when a value's type has no hash here."""
    if not all(hashable(v.type) for v in values):
        return None
    return spark_hash(values) % num_partitions


# --- many keys at once: the same hash over whole columns, in numpy's wrapping uint32 ------------


def _np_rotl(x: npt.NDArray[np.uint32], r: int) -> npt.NDArray[np.uint32]:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _np_mix_k1(k1: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    return _np_rotl(k1 * np.uint32(_C1), 15) * np.uint32(_C2)


def _np_mix_h1(h1: npt.NDArray[np.uint32], k1: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    return _np_rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _np_fmix(h1: npt.NDArray[np.uint32], length: int) -> npt.NDArray[np.uint32]:
    h1 = h1 ^ np.uint32(length)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * np.uint32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def _column_hash(column: pa.Array, seeds: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    """The hash of each value of ``column`` over its row's hash so far (a null: unchanged)."""
    typ = column.type
    as_int = pa.types.is_boolean(typ) or pa.types.is_date32(typ)
    as_int = as_int or (pa.types.is_signed_integer(typ) and not pa.types.is_int64(typ))
    if as_int:
        ints = column.cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False)
        hashed = _np_fmix(_np_mix_h1(seeds, _np_mix_k1(ints.astype(np.uint32))), 4)
    elif pa.types.is_int64(typ) or pa.types.is_timestamp(typ):
        longs = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        words = longs.view(np.uint64)
        low = (words & np.uint64(_MASK)).astype(np.uint32)
        high = (words >> np.uint64(32)).astype(np.uint32)
        hashed = _np_fmix(_np_mix_h1(_np_mix_h1(seeds, _np_mix_k1(low)), _np_mix_k1(high)), 8)
    else:  # strings, binaries, floats, decimals: value by value
        hashed = np.fromiter(
            (_hash_value(v, int(h)) for v, h in zip(column, seeds, strict=True)),
            np.uint32,
            len(column),
        )
    if column.null_count:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        hashed = np.where(valid, hashed, seeds)
    return hashed


def spark_partitions(
    columns: Sequence[pa.Array | pa.ChunkedArray], num_partitions: int
) -> npt.NDArray[np.int64] | None:
    """:func:`spark_partition` of each row of ``columns`` (the key's columns, in key order);
    None when a column's type has no hash here."""
    if not all(hashable(c.type) for c in columns):
        return None
    rows = len(columns[0]) if columns else 0
    hashes = np.full(rows, SEED, np.uint32)
    with np.errstate(over="ignore"):
        for column in columns:
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks()
            hashes = _column_hash(column, hashes)
    return np.mod(hashes.view(np.int32).astype(np.int64), num_partitions)
