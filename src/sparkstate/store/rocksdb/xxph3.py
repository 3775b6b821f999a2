"""RocksDB's persistent 64-bit hash (``Hash64`` in ``util/hash.h``), which its filters hash
keys with.

It is a frozen copy of a preview of XXH3 (xxHash 0.7.x, ``util/xxph3.h`` in RocksDB) that
differs from the final XXH3 the ``xxhash`` package computes at every input length: the final
version mixes inputs up to 16 bytes otherwise and avalanches with another multiplier, and
RocksDB changed the hash of an empty input. So it is written out here, seed 0 only, and checked
against the values of RocksDB's own tests (every length below 430) and of its code at longer
lengths, and by the filters of SST files RocksDB wrote (tests/store/test_sst_filter.py).
"""

from __future__ import annotations

__all__ = ["hash64"]

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64_1, _P64_2, _P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P64_4, _P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5

_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_STRIPE = 64
#: Stripes per block: the secret is consumed 8 bytes a stripe, the last 64 kept back.
_STRIPES_PER_BLOCK = (len(_SECRET) - _STRIPE) // 8
_BLOCK = _STRIPE * _STRIPES_PER_BLOCK


def _le64(buf: bytes, at: int) -> int:
    return int.from_bytes(buf[at : at + 8], "little")


def _le32(buf: bytes, at: int) -> int:
    return int.from_bytes(buf[at : at + 4], "little")


def _mul128_fold64(lhs: int, rhs: int) -> int:
    product = lhs * rhs
    return (product ^ (product >> 64)) & _M64


def _avalanche(h: int) -> int:
    h ^= h >> 37
    h = (h * _P64_3) & _M64
    return h ^ (h >> 32)


def _mix16(data: bytes, at: int, secret_at: int) -> int:
    return _mul128_fold64(
        _le64(data, at) ^ _le64(_SECRET, secret_at),
        _le64(data, at + 8) ^ _le64(_SECRET, secret_at + 8),
    )


def hash64(data: bytes) -> int:
    """``XXPH3_64bits(data)``: RocksDB's ``Hash64`` with seed 0 (``GetSliceHash64``)."""
    n = len(data)
    if n == 0:  # RocksDB's change: a hash of the seed, not 0
        return _mul128_fold64(_le64(_SECRET, 0), _P64_2)
    if n <= 3:
        combined = data[0] | data[n >> 1] << 8 | data[n - 1] << 16 | n << 24
        return _avalanche(((combined ^ _le32(_SECRET, 0)) * _P64_1) & _M64)
    if n <= 8:
        keyed = (_le32(data, 0) | _le32(data, n - 4) << 32) ^ _le64(_SECRET, 0)
        mix = (n + (keyed ^ (keyed >> 51)) * _P32_1) & _M64
        return _avalanche(((mix ^ (mix >> 47)) * _P64_2) & _M64)
    if n <= 16:
        lo = _le64(data, 0) ^ _le64(_SECRET, 0)
        hi = _le64(data, n - 8) ^ _le64(_SECRET, 8)
        return _avalanche((n + lo + hi + _mul128_fold64(lo, hi)) & _M64)
    if n <= 128:
        return _hash_17_to_128(data)
    if n <= 240:
        return _hash_129_to_240(data)
    return _hash_long(data)


def _hash_17_to_128(data: bytes) -> int:
    n = len(data)
    acc = n * _P64_1
    rounds = 1 + (n > 32) + (n > 64) + (n > 96)
    for i in range(rounds):
        acc += _mix16(data, 16 * i, 32 * i) + _mix16(data, n - 16 * (i + 1), 32 * i + 16)
    return _avalanche(acc & _M64)


def _hash_129_to_240(data: bytes) -> int:
    n = len(data)
    acc = n * _P64_1
    for i in range(8):
        acc += _mix16(data, 16 * i, 16 * i)
    acc = _avalanche(acc & _M64)
    for i in range(8, n // 16):
        acc += _mix16(data, 16 * i, 16 * (i - 8) + 3)
    acc += _mix16(data, n - 16, 136 - 17)
    return _avalanche(acc & _M64)


def _accumulate_stripe(acc: list[int], data: bytes, at: int, secret_at: int) -> None:
    for lane in range(8):
        value = _le64(data, at + 8 * lane)
        key = value ^ _le64(_SECRET, secret_at + 8 * lane)
        acc[lane] = (acc[lane] + value + (key & _M32) * (key >> 32)) & _M64


def _scramble(acc: list[int]) -> None:
    for lane in range(8):
        a = acc[lane]
        a ^= a >> 47
        a ^= _le64(_SECRET, len(_SECRET) - _STRIPE + 8 * lane)
        acc[lane] = (a * _P32_1) & _M64


def _hash_long(data: bytes) -> int:
    n = len(data)
    acc = [_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1]
    blocks = n // _BLOCK
    for block in range(blocks):
        for stripe in range(_STRIPES_PER_BLOCK):
            _accumulate_stripe(acc, data, block * _BLOCK + stripe * _STRIPE, 8 * stripe)
        _scramble(acc)
    for stripe in range((n - blocks * _BLOCK) // _STRIPE):
        _accumulate_stripe(acc, data, blocks * _BLOCK + stripe * _STRIPE, 8 * stripe)
    if n % _STRIPE:
        _accumulate_stripe(acc, data, n - _STRIPE, len(_SECRET) - _STRIPE - 7)
    result = n * _P64_1
    for pair in range(4):
        result += _mul128_fold64(
            acc[2 * pair] ^ _le64(_SECRET, 11 + 16 * pair),
            acc[2 * pair + 1] ^ _le64(_SECRET, 11 + 16 * pair + 8),
        )
    return _avalanche(result & _M64)
