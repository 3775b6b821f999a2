"""The merges and results of the aggregate functions (first, last, collect_list/set, the stddev
and variance family, approx_count_distinct, decimal sum and avg) against plain-Python models of
Spark's semantics, batch after batch through the operator and a real store."""

from __future__ import annotations

import decimal
import math
import random
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators import hll
from sparkstate.operators.aggregate import (
    ROWS_COLUMN,
    AggregateFunction,
    AggregateOverflowError,
    StreamingAggregate,
    buffer_column,
)

from .conftest import OperatorRunner

Runner = Callable[[StreamingAggregate], OperatorRunner]
Rows = list[tuple[str, Any]]
D = decimal.Decimal
NAN = float("nan")


def op_of(*aggs: AggregateFunction, ansi: bool = True) -> StreamingAggregate:
    return StreamingAggregate(pa.schema([("k", pa.string())]), list(aggs), ansi=ansi)


def run(runner: OperatorRunner, partials: list[dict[str, Any]], mode: str = "update") -> dict:  # type: ignore[type-arg]
    out, _ = runner.run(partials, mode)
    return {r.pop("k"): r for r in out.to_pylist()}


def grouped(rows: Rows) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for k, v in rows:
        groups.setdefault(k, []).append(v)
    return groups


def same(a: Any, b: Any, rel: float = 0.0) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=rel, abs_tol=rel * 1e-3) if rel else a == b
    return bool(a == b) and type(a) is type(b)


# --- first and last -------------------------------------------------------------------------------


def test_first_and_last_with_and_without_ignorenulls(make_runner: Runner) -> None:
    aggs = [
        AggregateFunction("first", "f", pa.int64(), pa.int64()),
        AggregateFunction("first", "fi", pa.int64(), pa.int64(), ignore_nulls=True),
        AggregateFunction("last", "l", pa.int64(), pa.int64()),
        AggregateFunction("last", "li", pa.int64(), pa.int64(), ignore_nulls=True),
    ]
    runner = make_runner(op_of(*aggs))
    rnd = random.Random(3)
    seen: Rows = []
    for _ in range(8):
        rows: Rows = [
            (rnd.choice("abc"), rnd.choice([None, None, 1, 2, 3])) for _ in range(rnd.randint(0, 6))
        ]
        seen += rows
        partials = []
        for k, vs in grouped(rows).items():  # Spark's first/last of the batch, per key
            nn = [v for v in vs if v is not None]
            partials.append(
                {
                    "k": k,
                    buffer_column(0, "first", 0): vs[0],
                    buffer_column(1, "first", 0): nn[0] if nn else None,
                    buffer_column(2, "last", 0): vs[-1],
                    buffer_column(3, "last", 0): nn[-1] if nn else None,
                    ROWS_COLUMN: len(vs),
                }
            )
        got = run(runner, partials)
        for k in grouped(rows):
            vs = grouped(seen)[k]
            nn = [v for v in vs if v is not None]
            want = {
                "f": vs[0],
                "fi": nn[0] if nn else None,
                "l": vs[-1],
                "li": nn[-1] if nn else None,
            }
            assert got[k] == want, (k, vs)


# --- collect_list and collect_set -----------------------------------------------------------------


def _set_key(v: Any) -> Any:
    return (
        "NaN"
        if isinstance(v, float) and math.isnan(v)
        else (v + 0.0 if isinstance(v, float) else v)
    )


def _distinct(values: list[Any]) -> list[Any]:
    out, keys = [], set()
    for v in values:
        if _set_key(v) not in keys:
            keys.add(_set_key(v))
            out.append(v)
    return out


@pytest.mark.parametrize(
    ("element", "choices"),
    [
        (pa.float64(), [None, 1.5, -0.0, 0.0, NAN, float("inf")]),
        (pa.string(), [None, "a", "", "é", "a"]),
        (pa.decimal128(10, 2), [None, D("1.25"), D("-3.00"), D("1.25")]),
    ],
)
def test_collect_list_and_set(
    make_runner: Runner, element: pa.DataType, choices: list[Any]
) -> None:
    out = pa.list_(pa.field("element", element, nullable=False))  # Spark's array<T> (no nulls)
    runner = make_runner(
        op_of(
            AggregateFunction("collect_list", "l", out, element),
            AggregateFunction("collect_set", "s", out, element),
        )
    )
    rnd = random.Random(5)
    seen: Rows = []
    for batch in range(6):
        rows: Rows = [(rnd.choice("ab"), rnd.choice(choices)) for _ in range(rnd.randint(0, 7))]
        seen += rows
        partials = []
        for k, vs in grouped(rows).items():
            nn = [v for v in vs if v is not None]
            partials.append(
                {
                    "k": k,
                    buffer_column(0, "collect_list", 0): nn,
                    buffer_column(1, "collect_set", 0): _distinct(nn),
                    ROWS_COLUMN: len(vs),
                }
            )
        got = run(runner, partials, "complete")
        for k, vs in grouped(seen).items():
            nn = [v for v in vs if v is not None]
            assert len(got[k]["l"]) == len(nn) and all(
                same(a, b) for a, b in zip(got[k]["l"], nn, strict=True)
            ), (batch, k)
            want = _distinct(nn)
            assert [_set_key(v) for v in got[k]["s"]] == [_set_key(v) for v in want], (batch, k)


def test_collect_of_a_key_with_only_nulls_is_empty(make_runner: Runner) -> None:
    out = pa.list_(pa.field("element", pa.int32(), nullable=False))
    runner = make_runner(op_of(AggregateFunction("collect_set", "s", out, pa.int32())))
    got = run(runner, [{"k": "a", buffer_column(0, "collect_set", 0): [], ROWS_COLUMN: 2}])
    assert got == {"a": {"s": []}}


def test_collect_of_nested_values_is_refused() -> None:
    nested = pa.list_(pa.list_(pa.int64()))
    with pytest.raises(
        ConfigurationError, match=r"collect_list\(\) into column 'x'.*cannot be kept"
    ):
        AggregateFunction("collect_list", "x", nested, pa.list_(pa.int64()))


# --- stddev and variance --------------------------------------------------------------------------

MOMENTS = ["stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop"]


def moments_model(func: str, values: list[float | None], legacy: bool = False) -> float | None:
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    if any(math.isnan(x) or math.isinf(x) for x in xs):
        return NAN
    sample = func not in ("stddev_pop", "var_pop")
    if sample and len(xs) == 1:
        return NAN if legacy else None
    var = statistics.variance(xs) if sample else statistics.pvariance(xs)
    return math.sqrt(var) if func.startswith("std") else var


def moments_partial(values: list[float | None]) -> tuple[float, float | None, float | None]:
    """What Spark sends per batch: count, avg and var_pop * count of the non-null values."""
    xs = [v for v in values if v is not None]
    if not xs:
        return 0.0, None, None
    if any(math.isnan(x) or math.isinf(x) for x in xs):
        return float(len(xs)), NAN, NAN
    return float(len(xs)), statistics.fmean(xs), statistics.pvariance(xs) * len(xs)


@pytest.mark.parametrize("legacy", [False, True])
def test_stddev_and_variance_merge_as_chan(make_runner: Runner, legacy: bool) -> None:
    aggs = [
        AggregateFunction(f, f, pa.float64(), pa.float64(), legacy_statistics=legacy)
        for f in MOMENTS
    ]
    runner = make_runner(op_of(*aggs))
    rnd = random.Random(11)
    seen: Rows = []
    for batch in range(8):
        pool = [None, 1e9 + rnd.random(), rnd.uniform(-5, 5), 3.0]
        if batch == 6:
            pool.append(NAN)  # key c only: a NaN stays NaN
        rows: Rows = [
            (k, rnd.choice(pool if k == "c" else pool[:4]))
            for k in rnd.choices("abcd", k=rnd.randint(0, 6))
        ]
        if batch == 0:
            rows += [("d", None), ("e", 2.5)]  # only nulls; a single value
        seen += rows
        partials = []
        for k, vs in grouped(rows).items():
            n, avg, m2 = moments_partial(vs)
            row: dict[str, Any] = {"k": k, ROWS_COLUMN: len(vs)}
            for i, f in enumerate(MOMENTS):
                row |= {
                    buffer_column(i, f, 0): n,
                    buffer_column(i, f, 1): avg,
                    buffer_column(i, f, 2): m2,
                }
            partials.append(row)
        got = run(runner, partials, "complete")
        for k, vs in grouped(seen).items():
            for f in MOMENTS:
                want = moments_model(f, vs, legacy)
                assert (got[k][f] is None) == (want is None), (batch, k, f, got[k][f], want)
                if want is not None:
                    assert same(got[k][f], want, rel=1e-9), (batch, k, f, got[k][f], want)


# --- decimal sum and avg --------------------------------------------------------------------------


def decimal_op(ansi: bool) -> StreamingAggregate:
    return op_of(
        AggregateFunction("sum", "s", pa.decimal128(20, 2), pa.decimal128(10, 2)),
        AggregateFunction("avg", "a", pa.decimal128(14, 6), pa.decimal128(10, 2)),
        ansi=ansi,
    )


def decimal_partial(k: str, values: list[D | None], overflowed: bool = False) -> dict[str, Any]:
    """Spark's batch buffers: sum (null past its precision outside ANSI), emptiness, count."""
    nn = [v for v in values if v is not None]
    total = None if overflowed or not nn else sum(nn, D(0))
    return {
        "k": k,
        buffer_column(0, "sum", 0): total,
        buffer_column(0, "sum", 1): not nn,
        buffer_column(1, "avg", 0): total,
        buffer_column(1, "avg", 1): len(nn),
        ROWS_COLUMN: len(values),
    }


def test_decimal_sum_and_avg(make_runner: Runner) -> None:
    runner = make_runner(decimal_op(ansi=True))
    got = run(runner, [decimal_partial("a", [D("1.00"), D("1.00")]), decimal_partial("b", [None])])
    assert got == {"a": {"s": D("2.00"), "a": D("1.000000")}, "b": {"s": None, "a": None}}
    got = run(runner, [decimal_partial("a", [D("-0.01"), None]), decimal_partial("b", [D("0.01")])])
    # 1.99 / 3 = 0.663333..., half up at 6 places
    assert got == {
        "a": {"s": D("1.99"), "a": D("0.663333")},
        "b": {"s": D("0.01"), "a": D("0.010000")},
    }
    got = run(runner, [decimal_partial("a", [D("0.01")])])
    assert got["a"] == {"s": D("2.00"), "a": D("0.500000")}
    got = run(runner, [decimal_partial("c", [D("-2.00"), D("-1.00"), D("-1.00")])])
    assert got["c"] == {"s": D("-4.00"), "a": D("-1.333333")}
    got = run(runner, [decimal_partial("d", [D("0.02"), D("0.01"), D("0.01"), D("0.01")] * 2)])
    assert got["d"]["a"] == D("0.012500")  # exactly half way at the last digit: kept


def test_decimal_avg_rounds_half_up_at_the_result_scale() -> None:
    agg = AggregateFunction("avg", "a", pa.decimal128(14, 4), pa.decimal128(10, 0))
    total = pa.array([D(2), D(-2), D(1), D(5)], pa.decimal128(20, 0))
    count = pa.array([3, 3, 8, 0], pa.int64())
    assert agg.result([total, count]).to_pylist() == [D("0.6667"), D("-0.6667"), D("0.1250"), None]


def test_decimal_overflow_is_null_or_fails_in_ansi_mode(make_runner: Runner) -> None:
    def wide(ansi: bool) -> StreamingAggregate:  # decimal(28, 2) in, sums of decimal(38, 2)
        return op_of(
            AggregateFunction("sum", "s", pa.decimal128(38, 2), pa.decimal128(28, 2)),
            AggregateFunction("avg", "a", pa.decimal128(32, 6), pa.decimal128(28, 2)),
            ansi=ansi,
        )

    def partial(k: str, total: D | None, count: int) -> dict[str, Any]:
        return {
            "k": k,
            buffer_column(0, "sum", 0): total,
            buffer_column(0, "sum", 1): count == 0,
            buffer_column(1, "avg", 0): total,
            buffer_column(1, "avg", 1): count,
            ROWS_COLUMN: count,
        }

    big, n = D("9" * 36 + ".00"), 10**12  # a batch's sum of a trillion rows: 36 digits fit
    lenient = make_runner(wide(ansi=False))
    got = run(lenient, [partial("a", big, n), partial("b", big, n)])
    assert got["a"] == {"s": big, "a": D("1" + "0" * 24 + ".000000")}  # half up
    got = run(lenient, [partial("a", big, n), partial("b", None, 0)])
    assert got == {"a": {"s": None, "a": None}, "b": {"s": big, "a": got["b"]["a"]}}
    got = run(lenient, [partial("a", D("-1.00"), 1)])
    assert got["a"] == {"s": None, "a": None}  # an overflowed sum stays null
    got = run(lenient, [partial("c", None, 3)])
    assert got["c"] == {"s": None, "a": None}  # the batch's own sum overflowed in Spark
    strict = make_runner(wide(ansi=True))
    run(strict, [partial("a", big, n)])
    with pytest.raises(
        AggregateOverflowError, match=r"sum\(\) into column 's'.*decimal128\(38, 2\)"
    ):
        run(strict, [partial("a", big, n)])


def test_decimal_avg_past_its_result_precision() -> None:
    agg = AggregateFunction("avg", "a", pa.decimal128(38, 38), pa.decimal128(36, 34))
    total = pa.array([D("3"), D("0.5")], pa.decimal128(38, 34))
    count = pa.array([2, 1], pa.int64())
    assert agg.result([total, count], ansi=False).to_pylist() == [
        None,
        D("0." + "5" + "0" * 37),
    ]
    with pytest.raises(AggregateOverflowError, match="decimal128"):
        agg.result([total, count], ansi=True)


# --- approx_count_distinct ------------------------------------------------------------------------


def packed_pairs(hashes: list[int], p: int) -> list[int]:
    """What Spark sends: each hash's register index and rank, packed as index * 64 + rank."""
    out = set()
    for h in hashes:
        index, rest = h >> (64 - p), h & ((1 << (64 - p)) - 1)
        rank = (64 - p) - rest.bit_length() + 1
        out.add(index << hll.RANK_BITS | rank)
    return sorted(out)


def test_approx_count_distinct_folds_batches_and_estimates(make_runner: Runner) -> None:
    agg = AggregateFunction("approx_count_distinct", "n", pa.int64(), pa.int64())
    runner = make_runner(op_of(agg))
    rnd = random.Random(17)
    sizes = {"a": 5, "b": 300, "c": 3000, "d": 30000}
    hashes = {k: [rnd.getrandbits(64) for _ in range(n)] for k, n in sizes.items()}
    halves = [
        {k: h[: len(h) // 2] for k, h in hashes.items()},
        {k: h[len(h) // 3 :] for k, h in hashes.items()},
    ]
    got: dict[str, Any] = {}
    for half in halves:
        partials = [
            {
                "k": k,
                buffer_column(0, "approx_count_distinct", 0): packed_pairs(h, 9),
                ROWS_COLUMN: 1,
            }
            for k, h in half.items()
        ]
        got = run(runner, partials)
    assert got["a"]["n"] == 5
    for k, n in sizes.items():
        assert abs(got[k]["n"] - n) <= 3 * 0.05 * n, (k, got[k]["n"], n)
    one = make_runner(op_of(agg))
    whole = [
        {"k": k, buffer_column(0, "approx_count_distinct", 0): packed_pairs(h, 9), ROWS_COLUMN: 1}
        for k, h in hashes.items()
    ]
    assert run(one, whole) == got  # folding is a max: the batches' split does not matter
    assert run(make_runner(op_of(agg)), [{"k": "e", ROWS_COLUMN: 3}]) == {"e": {"n": 0}}


def test_hll_estimate_across_its_ranges() -> None:
    """Linear counting, the bias-corrected range (Ertl's estimator here) and the raw estimate,
    each within three standard errors, for several precisions."""
    rnd = random.Random(23)
    for rsd in (0.05, 0.02, 0.2):
        p = hll.precision(rsd)
        m = 1 << p
        for n in (1, 10, m // 2, 2 * m, 4 * m, 10 * m):
            pairs = packed_pairs([rnd.getrandbits(64) for _ in range(n)], p)
            regs = hll.fold(
                pa.array([None], pa.binary()), pa.array([pairs], pa.list_(pa.int64())), p
            )
            est = hll.estimate(regs, p)[0].as_py()
            assert abs(est - n) <= max(1, 3 * 1.04 / math.sqrt(m) * n), (rsd, n, est)


def test_hll_precision_is_sparks() -> None:
    assert [hll.precision(r) for r in (None, 0.05, 0.01, 0.39, 0.2)] == [9, 9, 14, 4, 5]
    for bad in (0.0, 0.4, -1.0):
        with pytest.raises(ConfigurationError, match="at most 0.39"):
            hll.precision(bad)
    regs = hll.fold(
        pa.array([None], pa.binary()), pa.array([[1 << 6 | 3]], pa.list_(pa.int64())), 4
    )
    assert np.frombuffer(regs[0].as_py(), np.uint8).tolist() == [0, 3] + [0] * 14
