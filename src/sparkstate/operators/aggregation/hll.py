"""HyperLogLog registers for ``approx_count_distinct``, kept in state as one byte per register.

Spark's ``HyperLogLogPlusPlus`` hashes each value with XxHash64 (seed 42, floats normalised), takes
the top ``p`` bits as the register index and the leading zeros of the rest, plus one, as the
rank; a register keeps the largest rank it saw. Spark computes each batch's (index, rank) pairs in
the JVM, packed as ``index * 64 + rank`` (:mod:`sparkstate.engine.plan.aggregate.plan`); here
they fold into the registers, and the registers give Spark's estimate: linear counting for small
cardinalities, the raw HyperLogLog estimate above ``5 m``. Between the two Spark subtracts a bias
interpolated from the empirical tables of the HLL++ paper, which we do not carry; there we use
Ertl's improved raw estimator ("New cardinality estimation algorithms for HyperLogLog sketches",
2017), which needs no tables and is as accurate (the relative standard error ``1.04 / sqrt(m)``).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError

__all__ = ["RANK_BITS", "estimate", "fold", "precision"]

#: A packed pair is ``index << RANK_BITS | rank``.
RANK_BITS = 6
#: Spark's threshold of the linear-counting estimate per precision 4..18 (from the HLL++ paper).
_THRESHOLDS = (10, 20, 40, 80, 220, 400, 900, 1800, 3100, 6500, 15500, 20000, 50000, 120000, 350000)

Registers = npt.NDArray[np.uint8]


def precision(rsd: float | None) -> int:
    """Spark's number of index bits ``p`` for a relative standard deviation (default 0.05)."""
    rsd = 0.05 if rsd is None else float(rsd)
    p = math.ceil(2.0 * math.log(1.106 / rsd) / math.log(2.0)) if rsd > 0 else 0
    if rsd <= 0 or p < 4:
        msg = (
            f"approx_count_distinct(rsd={rsd}): the relative standard deviation must be above 0 "
            "and at most 0.39 (as in Spark)"
        )
        raise ConfigurationError(msg)
    return p


def registers(state: pa.Array, p: int) -> Registers:
    """The registers of each state row, ``(rows, 2**p)``; zeros where the state has none."""
    m, n = 1 << p, len(state)
    if n == 0:
        return np.zeros((0, m), np.uint8)
    filled = state.cast(pa.large_binary())
    if filled.null_count:
        filled = filled.fill_null(pa.scalar(bytes(m), pa.large_binary()))
    if pc.any(pc.not_equal(pc.binary_length(filled), m)).as_py():
        msg = f"approx_count_distinct: a state row does not hold {m} registers"
        raise ValueError(msg)
    offsets = np.frombuffer(filled.buffers()[1], np.int64)[filled.offset :][: n + 1]
    data = np.frombuffer(filled.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    return data.reshape(n, m).copy()


def fold(state: pa.Array, pairs: pa.Array, p: int) -> pa.Array:
    """The state's registers (binary, or null) with each row's packed (index, rank) pairs of
    ``pairs`` (a list column) folded in, as binary of ``2**p`` bytes per row."""
    regs = registers(state, p)
    lists = pairs if len(pairs) else pa.array([], pa.list_(pa.int64()))
    packed = np.asarray(lists.flatten().fill_null(0), dtype=np.int64)
    if len(packed):
        rows = np.asarray(pc.list_parent_indices(lists), dtype=np.int64)
        index, rank = packed >> RANK_BITS, packed & ((1 << RANK_BITS) - 1)
        if index.min() < 0 or index.max() >= regs.shape[1]:
            msg = f"approx_count_distinct: a register index out of range for p={p}"
            raise ValueError(msg)
        np.maximum.at(regs, (rows, index), rank.astype(np.uint8))
    return _as_binary(regs, p)


def union(a: pa.Array, b: pa.Array, p: int) -> pa.Array:
    """Each row's registers of ``a`` and ``b`` merged (register by register, the larger)."""
    return _as_binary(np.maximum(registers(a, p), registers(b, p)), p)


def _as_binary(regs: Registers, p: int) -> pa.Array:
    flat = pa.py_buffer(np.ascontiguousarray(regs))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(1 << p), len(regs), [None, flat]).cast(
        pa.binary()
    )


def estimate(state: pa.Array, p: int) -> pa.Array:
    """Spark's cardinality estimate of each row's registers (0 for a row without any)."""
    regs = registers(state, p)
    m = 1 << p
    if len(regs) == 0:
        return pa.array([], pa.int64())
    alpha = {4: 0.673, 5: 0.697, 6: 0.709}.get(p, 0.7213 / (1.0 + 1.079 / m))
    # Spark sums the indicator register by register; a running sum gives the same double.
    z_inverse = np.cumsum(np.ldexp(1.0, -regs.astype(np.int64)), axis=1)[:, -1]
    raw = alpha * m * m / z_inverse
    zeros = (regs == 0).sum(axis=1)
    with np.errstate(divide="ignore"):
        linear = m * np.log(m / zeros.astype(np.float64))
    use_linear = (zeros > 0) & ((raw <= 2.5 * m) | ((p < 19) & (linear <= _threshold(p))))
    est = np.where(use_linear, linear, raw)
    for i in np.flatnonzero(~use_linear & (p < 19) & (raw < 5.0 * m)).tolist():
        est[i] = _ertl(regs[i], p)
    return pa.array(np.floor(est + 0.5).astype(np.int64), pa.int64())


def _threshold(p: int) -> float:
    return float(_THRESHOLDS[p - 4]) if p < 19 else math.inf


def _ertl(regs: Registers, p: int) -> float:
    """Ertl's improved raw estimate of one row's registers (ranks 0..65-p)."""
    q, m = 64 - p, 1 << p
    counts = np.bincount(regs, minlength=q + 2).tolist()
    z = m * _tau(1.0 - counts[q + 1] / m)
    for k in range(q, 0, -1):
        z = 0.5 * (z + counts[k])
    z += m * _sigma(counts[0] / m)
    return m * m / (2.0 * math.log(2.0)) / z


def _sigma(x: float) -> float:
    if x == 1.0:
        return math.inf
    y, z = 1.0, x
    while True:
        x *= x
        before = z
        z += x * y
        y += y
        if z == before:
            return z


def _tau(x: float) -> float:
    if x in (0.0, 1.0):
        return 0.0
    y, z = 1.0, 1.0 - x
    while True:
        x = math.sqrt(x)
        before = z
        y *= 0.5
        z -= (1.0 - x) ** 2 * y
        if z == before:
            return z / 3.0
