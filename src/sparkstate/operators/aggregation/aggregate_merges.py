"""How each aggregate function's buffers merge and give its result, as Spark's merge and
evaluate expressions do (the functions themselves:
:mod:`sparkstate.operators.aggregation.aggregate_functions`).
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.operators.aggregation import _distribution, _moments, _quantiles, hll, hll_sketch
from sparkstate.operators.aggregation._decimals import add_within, average
from sparkstate.operators.aggregation._lists import concat_lists, distinct_lists, no_null_lists


class Aggregate(Protocol):
    """What a merge reads of its aggregate
    (:class:`~sparkstate.operators.aggregation.aggregate_functions.AggregateFunction`)."""

    @property
    def func(self) -> str: ...
    @property
    def output_type(self) -> pa.DataType: ...
    @property
    def ignore_nulls(self) -> bool: ...
    @property
    def rsd(self) -> float | None: ...
    @property
    def legacy_statistics(self) -> bool: ...
    @property
    def percentage(self) -> float | tuple[float, ...] | None: ...
    @property
    def allow_different_lg_config_k(self) -> bool: ...
    def effective_accuracy(self) -> int: ...
    def effective_lg_k(self) -> int: ...
    def overflow(self, detail: str) -> Exception: ...


__all__ = ["MERGES", "RESULTS", "SAMPLE_STATISTICS", "merge_summaries"]

_F64 = pa.float64()
#: The functions that give a sample's statistic (their population's are ``*_pop``).
SAMPLE_STATISTICS = ("stddev", "std", "stddev_samp", "variance", "var_samp")
#: The functions that give a standard deviation, not a variance.
_ROOTS = ("stddev", "std", "stddev_samp", "stddev_pop")

# --- merges ---------------------------------------------------------------------------------------

Bufs = list[pa.Array]
Merge = Callable[["Aggregate", Bufs, Bufs, bool], Bufs]
Result = Callable[["Aggregate", Bufs, bool], pa.Array]


def _add_counts(state: pa.Array, batch: pa.Array) -> pa.Array:
    return pc.add_checked(pc.fill_null(state, 0), pc.fill_null(batch, 0))


def _add_sums(state: pa.Array, batch: pa.Array, ansi: bool) -> pa.Array:
    """Spark's non-decimal sum: null + x = x; integers wrap around outside ANSI mode."""
    if not ansi and pa.types.is_integer(state.type):
        return pc.coalesce(pc.add(state, batch), state, batch)
    total = pc.add_checked(state, batch)
    return pc.coalesce(total, state, batch).cast(state.type)


def _merge_count(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [_add_counts(s[0], b[0])]


def _merge_sum(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [_add_sums(s[0], b[0], ansi)]


def _merge_avg(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [_add_sums(s[0], b[0], True), _add_counts(s[1], b[1])]


def _emptiness(total: pa.Array, empty: pa.Array) -> pa.Array:
    """Spark's ``isEmpty``; where it was not kept, a null sum means no value."""
    return pc.coalesce(empty, pc.is_null(total))


def _merge_decimal_sum(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Spark's decimal ``(sum, isEmpty)``: an overflowed side (null sum, not empty) stays null."""
    empty_s, empty_b = _emptiness(s[0], s[1]), _emptiness(b[0], b[1].cast(pa.bool_()))
    overflowed = pc.or_(
        pc.and_(pc.invert(empty_s), pc.is_null(s[0])),
        pc.and_(pc.invert(empty_b), pc.is_null(b[0])),
    )
    zero = pa.scalar(decimal.Decimal(0), s[0].type)
    total = add_within(
        pc.fill_null(s[0], zero),
        pc.fill_null(b[0].cast(s[0].type), zero),
        agg.overflow if ansi else None,
    )
    total = pc.if_else(overflowed, pa.scalar(None, total.type), total)
    both_empty = pc.and_(empty_s, empty_b)
    return [pc.if_else(both_empty, pa.scalar(None, total.type), total), both_empty]


def _merge_decimal_avg(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Spark's decimal ``(sum, count)``: the sum starts at 0 and stays null once past its
    precision."""
    count_s, count_b = pc.fill_null(s[1], 0), pc.fill_null(b[1], 0)
    overflowed = pc.or_(
        pc.and_(pc.greater(count_s, 0), pc.is_null(s[0])),
        pc.and_(pc.greater(count_b, 0), pc.is_null(b[0])),
    )
    zero = pa.scalar(decimal.Decimal(0), s[0].type)
    total = add_within(
        pc.fill_null(s[0], zero),
        pc.fill_null(b[0].cast(s[0].type), zero),
        agg.overflow if ansi else None,
    )
    total = pc.if_else(overflowed, pa.scalar(None, total.type), total)
    return [total, pc.add_checked(count_s, count_b)]


def _pick(better: Callable[[pa.Array, pa.Array], pa.Array]) -> Merge:
    def merge(agg: Aggregate, s: list[pa.Array], b: list[pa.Array], ansi: bool) -> list[pa.Array]:
        state, batch = s[0], b[0]
        take_batch = pc.or_kleene(
            pc.is_null(state), pc.and_kleene(pc.is_valid(batch), better(batch, state))
        )
        return [pc.if_else(pc.fill_null(take_batch, False), batch, state)]

    return merge


def _less(a: pa.Array, b: pa.Array) -> pa.Array:
    if pa.types.is_floating(a.type):  # NaN is the largest value in Spark
        nan_a, nan_b = pc.is_nan(a), pc.is_nan(b)
        return pc.or_kleene(pc.less(a, b), pc.and_kleene(nan_b, pc.invert(nan_a)))
    return pc.less(a, b)


def _greater(a: pa.Array, b: pa.Array) -> pa.Array:
    return _less(b, a)


def _batch_set(agg: Aggregate, value: pa.Array) -> pa.Array:
    """Whether a batch's partial row sets the value: always (a row of the group came), or with
    ``ignorenulls`` when the value is not null."""
    if agg.ignore_nulls:
        return pc.is_valid(value)
    return pa.array(np.ones(len(value), np.bool_))


def _merge_first(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    was_set = pc.fill_null(s[1], False)
    now_set = _batch_set(agg, b[0])
    return [pc.if_else(was_set, s[0], b[0]), pc.or_(was_set, now_set)]


def _merge_last(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    was_set = pc.fill_null(s[1], False)
    now_set = _batch_set(agg, b[0])
    return [pc.if_else(now_set, b[0], s[0]), pc.or_(was_set, now_set)]


def _merge_collect_list(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [concat_lists(s[0], b[0])]


def _merge_collect_set(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [distinct_lists(concat_lists(s[0], b[0]))]


def _doubles(arr: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(arr.cast(_F64), 0.0), dtype=np.float64)


def _merge_moments(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Chan et al.'s merge of ``(n, avg, m2)``, in Spark's order of operations."""
    n1, avg1, m2_1 = (_doubles(a) for a in s)
    n2, avg2, m2_2 = (_doubles(a) for a in b)
    with np.errstate(all="ignore"):
        n = n1 + n2
        delta = avg2 - avg1
        delta_n = np.where(n == 0.0, 0.0, delta / np.where(n == 0.0, 1.0, n))
        avg = avg1 + delta_n * n2
        m2 = m2_1 + m2_2 + delta * delta_n * n1 * n2
    return [pa.array(n, _F64), pa.array(avg, _F64), pa.array(m2, _F64)]


def _merge_bool(op: Callable[[pa.Array, pa.Array], pa.Array]) -> Merge:
    """Spark's ``bool_and``/``bool_or`` (and ``bit_*``): a null side (no value yet) gives the
    other side."""

    def merge(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
        state, batch = s[0], b[0].cast(s[0].type)
        return [pc.coalesce(op(state, batch), state, batch)]

    return merge


def _merge_extremum_by(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Spark's ``max_by``/``min_by`` merge: a null ordering gives the other side; else the
    state's stays only when its ordering is strictly better."""
    better = _greater if agg.func == "max_by" else _less
    order_s, order_b = s[1], b[1].cast(s[1].type)
    keep = pc.or_kleene(pc.is_null(order_b), better(order_s, order_b))
    keep = pc.and_(pc.is_valid(order_s), pc.fill_null(keep, False))
    return [pc.if_else(keep, s[0], b[0]), pc.if_else(keep, order_s, order_b)]


def _merge_central(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return _moments.merge_central(s, b)


def _merge_comoments(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return _moments.merge_comoments(s, b)


def _summaries(bufs: Bufs) -> list[_quantiles.Summary]:
    values, gs, deltas, counts = (b.to_pylist() for b in bufs)
    return [
        (v or [], g or [], d or [], c or 0)
        for v, g, d, c in zip(values, gs, deltas, counts, strict=True)
    ]


def merge_summaries(agg: Aggregate, s: Bufs, b: Bufs, *, from_values: bool) -> Bufs:
    """Each row's quantile summary merged with the batch's (built from its values in order) or,
    between sessions, with another summary."""
    eps = 1.0 / agg.effective_accuracy()
    if from_values:
        batch = [_quantiles.from_values(v or [], eps) for v in b[0].to_pylist()]
    else:
        batch = _summaries(b)
    merged = [_quantiles.merge(x, y, eps) for x, y in zip(_summaries(s), batch, strict=True)]
    return [
        pa.array([m[0] for m in merged], pa.list_(_F64)),
        pa.array([m[1] for m in merged], pa.list_(pa.int64())),
        pa.array([m[2] for m in merged], pa.list_(pa.int64())),
        pa.array([m[3] for m in merged], pa.int64()),
    ]


def _merge_quantiles(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return merge_summaries(agg, s, b, from_values=True)


def _merge_registers(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [hll.fold(s[0], b[0], hll.precision(agg.rsd))]


def _merge_hll_sketches(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [hll_sketch.merge_sketches(s[0], b[0], agg.effective_lg_k())]


def _merge_hll_unions(agg: Aggregate, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    allow = agg.allow_different_lg_config_k
    return [hll_sketch.merge_unions(s[0], b[0], allow_different_lg_k=allow)]


MERGES: dict[str, Merge] = {
    "count": _merge_count,
    "sum": _merge_sum,
    "avg": _merge_avg,
    "decimal_sum": _merge_decimal_sum,
    "decimal_avg": _merge_decimal_avg,
    "min": _pick(_less),
    "max": _pick(_greater),
    "first": _merge_first,
    "last": _merge_last,
    "collect_list": _merge_collect_list,
    "collect_set": _merge_collect_set,
    "moments": _merge_moments,
    "approx_count_distinct": _merge_registers,
    "bool_and": _merge_bool(pc.and_),
    "bool_or": _merge_bool(pc.or_),
    "bit_and": _merge_bool(pc.bit_wise_and),
    "bit_or": _merge_bool(pc.bit_wise_or),
    "bit_xor": _merge_bool(pc.bit_wise_xor),
    "max_by": _merge_extremum_by,
    "central": _merge_central,
    "comoments": _merge_comoments,
    "percentile": _merge_collect_list,
    "mode": _merge_collect_list,
    "percentile_approx": _merge_quantiles,
    "hll_sketch_agg": _merge_hll_sketches,
    "hll_union_agg": _merge_hll_unions,
}


# --- results --------------------------------------------------------------------------------------


def _first_buffer(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    return bufs[0]


def _count(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    return pc.fill_null(bufs[0], 0)


def _average(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    total, count = bufs
    nonzero = pc.greater(pc.fill_null(count, 0), 0)
    quotient = pc.divide(total, pc.if_else(nonzero, count, 1).cast(_F64))
    return pc.if_else(nonzero, quotient, pa.scalar(None, _F64))


def _decimal_average(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    """Spark's ``sum / count`` of decimals (null without values)."""
    return average(bufs[0], bufs[1], agg.output_type, agg.overflow if ansi else None)


def _decimal_sum(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    total, empty = bufs
    return pc.if_else(_emptiness(total, empty), pa.scalar(None, total.type), total)


def _collected(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    return no_null_lists(bufs[0])


def _moment(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    """Spark's evaluation: null without values; a sample statistic of one value is null (NaN
    in legacy mode)."""
    n, m2 = _doubles(bufs[0]), _doubles(bufs[2])
    sample = agg.func in SAMPLE_STATISTICS
    with np.errstate(all="ignore"):
        value = m2 / (n - 1.0) if sample else m2 / n
        if agg.func in _ROOTS:
            value = np.sqrt(value)
    null = n == 0.0
    if sample:
        one = n == 1.0
        if agg.legacy_statistics:
            value = np.where(one, np.nan, value)
        else:
            null = null | one
    return pa.array(value, _F64, mask=null)


def _approx_count(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    return hll.estimate(bufs[0], hll.precision(agg.rsd))


def _sketch(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    """The state's sketch; where no sketch came (``hll_union_agg`` of nulls only), Spark's
    empty union: an empty sketch of ``lgConfigK`` 12."""
    lg_k = agg.effective_lg_k() if agg.func == "hll_sketch_agg" else hll_sketch.DEFAULT_LG_K
    return pc.fill_null(bufs[0].cast(pa.binary()), pa.scalar(hll_sketch.empty(lg_k), pa.binary()))


def _central(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    return _moments.moment_result(agg.func, bufs, legacy=agg.legacy_statistics)


def _comoments(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    return _moments.comoments_result(agg.func, bufs, legacy=agg.legacy_statistics)


def _percentile(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    assert agg.percentage is not None
    return _distribution.percentiles(bufs[0], agg.percentage)


def _mode(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    return _distribution.mode(bufs[0])


def _approx_percentile(agg: Aggregate, bufs: Bufs, ansi: bool) -> pa.Array:
    """Spark's answers from each summary, as the column's type (a list of them for a list of
    percentages); null without values."""
    eps = 1.0 / agg.effective_accuracy()
    percentage = agg.percentage
    assert percentage is not None
    several = isinstance(percentage, tuple)
    shares = percentage if isinstance(percentage, tuple) else (percentage,)
    rows: list[Any] = []
    for summary in _summaries(bufs):
        got = [_quantiles.query(summary, p, eps) for p in shares]
        rows.append(None if not summary[0] else (got if several else got[0]))
    out = agg.output_type
    element = out.value_type if several else out
    doubles = pa.array(rows, pa.list_(_F64) if several else _F64)
    if several:
        values = _as_output(doubles.flatten(), element)
        return pa.ListArray.from_arrays(doubles.offsets, values, mask=doubles.is_null())
    return _as_output(doubles, element)


def _as_output(doubles: pa.Array, typ: pa.DataType) -> pa.Array:
    """Spark's conversion of a summary's double back to the column's type (integers, dates and
    timestamps truncate toward zero)."""
    if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        return doubles.cast(typ)
    if pa.types.is_date32(typ):
        return pc.trunc(doubles).cast(pa.int32()).cast(typ)
    if pa.types.is_timestamp(typ):
        return pc.trunc(doubles).cast(pa.int64()).cast(typ)
    return pc.trunc(doubles).cast(typ, safe=False)


RESULTS: dict[str, Result] = {
    "count": _count,
    "sum": _first_buffer,
    "avg": _average,
    "decimal_sum": _decimal_sum,
    "decimal_avg": _decimal_average,
    "min": _first_buffer,
    "max": _first_buffer,
    "first": _first_buffer,
    "last": _first_buffer,
    "collect_list": _collected,
    "collect_set": _collected,
    "moments": _moment,
    "approx_count_distinct": _approx_count,
    "bool_and": _first_buffer,
    "bool_or": _first_buffer,
    "bit_and": _first_buffer,
    "bit_or": _first_buffer,
    "bit_xor": _first_buffer,
    "max_by": _first_buffer,
    "central": _central,
    "comoments": _comoments,
    "percentile": _percentile,
    "mode": _mode,
    "percentile_approx": _approx_percentile,
    "hll_sketch_agg": _sketch,
    "hll_union_agg": _sketch,
}
