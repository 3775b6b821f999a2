"""Decimal arithmetic of Spark's sum and average buffers: sums that turn null past their
precision (or fail, in ANSI mode), and the average's division, rounded as Spark rounds it."""

from __future__ import annotations

import decimal
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["add_within", "average"]

#: Raises the overflow error naming what overflowed; None: overflows give null.
OnOverflow = Callable[[str], Exception] | None
_CONTEXT = decimal.Context(prec=100, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def add_within(a: pa.Array, b: pa.Array, on_overflow: OnOverflow) -> pa.Array:
    """``a + b`` in ``a``'s decimal type; a sum past its precision is null, as Spark's buffer
    written to an UnsafeRow, or raises ``on_overflow(type)``."""
    typ = a.type
    wide = pa.decimal256(min(76, typ.precision + 1), typ.scale)
    total = pc.add(a.cast(wide), b.cast(wide))
    limit = pa.scalar(decimal.Decimal(10 ** (typ.precision - typ.scale)), total.type)
    over = pc.fill_null(pc.greater_equal(pc.abs(total), limit), False)
    if pc.any(over).as_py():
        if on_overflow is not None:
            raise on_overflow(str(typ))
        total = pc.if_else(over, pa.scalar(None, total.type), total)
    return total.cast(typ)


def average(
    total: pa.Array, count: pa.Array, out_type: pa.DataType, on_overflow: OnOverflow
) -> pa.Array:
    """Spark's decimal ``sum / count``: the quotient half up at scale 39, then half up to the
    result's scale; null where the count is 0, and null (or ``on_overflow``) past the result's
    precision or where the sum overflowed (a null sum with a count)."""
    scale, limit = total.type.scale, 10**out_type.precision
    values: list[decimal.Decimal | None] = []
    for s, n in zip(total.to_pylist(), count.to_pylist(), strict=True):
        if not n:
            values.append(None)
            continue
        unscaled = None if s is None else int(s.scaleb(scale, _CONTEXT))
        if unscaled is not None:
            q39 = _div_half_up(unscaled * 10 ** (39 - scale), n)
            unscaled = _div_half_up(q39, 10 ** (39 - out_type.scale))
        if unscaled is None or abs(unscaled) >= limit:
            if on_overflow is not None:
                raise on_overflow(str(total.type if unscaled is None else out_type))
            values.append(None)
            continue
        values.append(decimal.Decimal(unscaled).scaleb(-out_type.scale, _CONTEXT))
    return pa.array(values, out_type)


def _div_half_up(a: int, b: int) -> int:
    """``a / b`` rounded half away from zero (``b > 0``)."""
    q, r = divmod(abs(a), b)
    if 2 * r >= b:
        q += 1
    return q if a >= 0 else -q
