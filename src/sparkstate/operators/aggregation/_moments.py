"""Central moments and co-moments as Spark's CentralMomentAgg, Covariance and
PearsonCorrelation keep them: per key ``(n, avg, m2[, m3[, m4]])`` or ``(n, xAvg, yAvg, ck[,
xMk, yMk])`` in doubles, merged with the parallel formulas (Chan et al.; Pébay for the third and
fourth moments) in Spark's order of operations, and evaluated as Spark evaluates them: a
division by zero is null, as Catalyst's ``Divide`` gives it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["comoments_result", "doubles", "merge_central", "merge_comoments", "moment_result"]

F64 = pa.float64()
Vector = npt.NDArray[np.float64]


def doubles(arr: pa.Array) -> Vector:
    """A buffer as doubles, null (a key not seen yet) as 0.0, Spark's initial value."""
    return np.asarray(pc.fill_null(arr.cast(F64), 0.0), dtype=np.float64)


def merge_central(state: Sequence[pa.Array], batch: Sequence[pa.Array]) -> list[pa.Array]:
    """``(n, avg, m2[, m3[, m4]])`` of the state and of a batch merged; as many moments as
    given."""
    order = len(state) - 1
    n1, avg1, m2_1, *high1 = (doubles(a) for a in state)
    n2, avg2, m2_2, *high2 = (doubles(a) for a in batch)
    with np.errstate(all="ignore"):
        n = n1 + n2
        delta = avg2 - avg1
        delta_n = np.where(n == 0.0, 0.0, delta / np.where(n == 0.0, 1.0, n))
        out = [n, avg1 + delta_n * n2, m2_1 + m2_2 + delta * delta_n * n1 * n2]
        if order >= 3:
            m3_1, m3_2 = high1[0], high2[0]
            out.append(
                m3_1
                + m3_2
                + delta_n * delta_n * delta * n1 * n2 * (n1 - n2)
                + 3.0 * delta_n * (n1 * m2_2 - n2 * m2_1)
            )
        if order >= 4:
            m4_1, m4_2 = high1[1], high2[1]
            out.append(
                m4_1
                + m4_2
                + delta_n * delta_n * delta_n * delta * n1 * n2 * (n1 * n1 - n1 * n2 + n2 * n2)
                + 6.0 * delta_n * delta_n * (n1 * n1 * m2_2 + n2 * n2 * m2_1)
                + 4.0 * delta_n * (n1 * m3_2 - n2 * m3_1)
            )
    return [pa.array(v, F64) for v in out]


def merge_comoments(state: Sequence[pa.Array], batch: Sequence[pa.Array]) -> list[pa.Array]:
    """``(n, xAvg, yAvg, ck[, xMk, yMk])`` of the state and of a batch merged."""
    n1, x1, y1, ck1, *mk1 = (doubles(a) for a in state)
    n2, x2, y2, ck2, *mk2 = (doubles(a) for a in batch)
    with np.errstate(all="ignore"):
        n = n1 + n2
        safe = np.where(n == 0.0, 1.0, n)
        dx, dy = x2 - x1, y2 - y1
        dx_n = np.where(n == 0.0, 0.0, dx / safe)
        dy_n = np.where(n == 0.0, 0.0, dy / safe)
        out = [n, x1 + dx_n * n2, y1 + dy_n * n2, ck1 + ck2 + dx * dy_n * n1 * n2]
        if mk1:
            out.append(mk1[0] + mk2[0] + dx * dx_n * n1 * n2)
            out.append(mk1[1] + mk2[1] + dy * dy_n * n1 * n2)
    return [pa.array(v, F64) for v in out]


def _divided(top: Vector, bottom: Vector) -> tuple[Vector, npt.NDArray[np.bool_]]:
    """``top / bottom`` and where it is null (Catalyst divides by zero into null)."""
    zero = bottom == 0.0
    with np.errstate(all="ignore"):
        return top / np.where(zero, 1.0, bottom), zero


def moment_result(func: str, bufs: Sequence[pa.Array], *, legacy: bool) -> pa.Array:
    """``skewness`` or ``kurtosis`` of merged ``(n, avg, m2, m3[, m4])``: null without values;
    null (legacy: NaN) when every value is the same (``m2`` is 0)."""
    n, _avg, m2, m3, *m4 = (doubles(a) for a in bufs)
    with np.errstate(all="ignore"):
        if func == "skewness":
            value, null = _divided(np.sqrt(n) * m3, np.sqrt(m2 * m2 * m2))
        else:
            value, null = _divided(n * m4[0], m2 * m2)
            value = value - 3.0
    flat = m2 == 0.0
    if legacy:
        value, null = np.where(flat, np.nan, value), null & ~flat
    else:
        null = null | flat
    return pa.array(value, F64, mask=null | (n == 0.0))


def comoments_result(func: str, bufs: Sequence[pa.Array], *, legacy: bool) -> pa.Array:
    """``covar_pop``, ``covar_samp`` or ``corr`` of merged co-moments: null without pairs; a
    sample statistic of one pair null (legacy: NaN)."""
    n, _x, _y, ck, *mk = (doubles(a) for a in bufs)
    with np.errstate(all="ignore"):
        if func == "covar_pop":
            value, null = _divided(ck, n)
        elif func == "covar_samp":
            value, null = _divided(ck, n - 1.0)
        else:
            value, null = _divided(ck, np.sqrt(mk[0] * mk[1]))
    if func != "covar_pop":
        one = n == 1.0
        if legacy:
            value, null = np.where(one, np.nan, value), null & ~one
        else:
            null = null | one
    return pa.array(value, F64, mask=null | (n == 0.0))
