"""The merges and results of the aggregate functions (first, last, collect_list/set, the stddev
and variance family, approx_count_distinct, decimal sum and avg, count_if, the boolean and
bitwise ones, any_value, max_by/min_by, skewness, kurtosis, corr and covariances, percentile,
median, mode, percentile_approx) against plain-Python models of Spark's semantics, batch after
batch through the operator and a real store."""

from __future__ import annotations

import collections
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
from sparkstate.operators.aggregation import _quantiles, hll
from sparkstate.operators.aggregation.aggregate import (
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


# --- count_if, bool_and/or, bit_and/or/xor, any_value ---------------------------------------------


def _all(op: Callable[[Any, Any], Any], values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    out = present[0] if present else None
    for v in present[1:]:
        out = op(out, v)
    return out


LOGICAL: list[tuple[str, pa.DataType, Callable[[list[Any]], Any], int]] = [
    ("count_if", pa.int64(), lambda bs: sum(1 for b in bs if b is True), 0),
    ("bool_and", pa.bool_(), lambda bs: _all(lambda a, b: a and b, bs), 0),
    ("every", pa.bool_(), lambda bs: _all(lambda a, b: a and b, bs), 0),
    ("bool_or", pa.bool_(), lambda bs: _all(lambda a, b: a or b, bs), 0),
    ("some", pa.bool_(), lambda bs: _all(lambda a, b: a or b, bs), 0),
    ("any", pa.bool_(), lambda bs: _all(lambda a, b: a or b, bs), 0),
    ("bit_and", pa.int32(), lambda vs: _all(lambda a, b: a & b, vs), 1),
    ("bit_or", pa.int32(), lambda vs: _all(lambda a, b: a | b, vs), 1),
    ("bit_xor", pa.int32(), lambda vs: _all(lambda a, b: a ^ b, vs), 1),
    ("any_value", pa.int32(), lambda vs: next((v for v in vs if v is not None), None), 1),
]


def test_logical_bitwise_and_any_value_merge_batch_after_batch(make_runner: Runner) -> None:
    """Each batch's partial (Spark's own function over the batch) merged into the state equals
    the function over every value seen; null without values, count_if 0."""
    aggs = [
        AggregateFunction(f, f, typ, pa.bool_() if column == 0 else pa.int32(), ignore_nulls=True)
        for f, typ, _, column in LOGICAL
    ]
    runner = make_runner(op_of(*aggs))
    rnd = random.Random(5)
    seen: list[tuple[str, bool | None, int | None]] = []
    for batch in range(8):
        rows = [
            (k, rnd.choice([None, True, False]), rnd.choice([None, -1, 0, 5, 6, 1 << 20]))
            for k in rnd.choices("abc", k=rnd.randint(0, 6))
        ]
        if batch == 0:
            rows.append(("n", None, None))
        seen += rows
        partials = []
        for k in {r[0] for r in rows}:
            columns = [[r[1] for r in rows if r[0] == k], [r[2] for r in rows if r[0] == k]]
            row: dict[str, Any] = {"k": k, ROWS_COLUMN: len(columns[0])}
            for i, (f, _, model, column) in enumerate(LOGICAL):
                row[buffer_column(i, f, 0)] = model(columns[column])
            partials.append(row)
        got = run(runner, partials, "complete")
        for k in {r[0] for r in seen}:
            columns = [[r[1] for r in seen if r[0] == k], [r[2] for r in seen if r[0] == k]]
            want = {f: model(columns[column]) for f, _, model, column in LOGICAL}
            assert got[k] == want, (batch, k)
    assert got["n"] == {f: 0 if f == "count_if" else None for f, *_ in LOGICAL}


# --- max_by and min_by ----------------------------------------------------------------------------


def _extremum_by(rows: list[tuple[str | None, float | None]], largest: bool) -> str | None:
    """Spark's max_by/min_by over rows in arrival order: a null ordering is skipped, NaN is the
    largest, and of equal orderings the later row wins (its merge keeps the right side)."""

    def key(x: float) -> tuple[bool, float]:
        return (math.isnan(x), 0.0 if math.isnan(x) else x)

    best: tuple[str | None, float] | None = None
    for value, order in rows:
        if order is None:
            continue
        if best is None or (key(order) >= key(best[1]) if largest else key(order) <= key(best[1])):
            best = (value, order)
    return None if best is None else best[0]


def test_max_by_and_min_by_keep_the_value_of_the_extreme_ordering(make_runner: Runner) -> None:
    struct = pa.struct([("value", pa.string()), ("ordering", pa.float64())])
    aggs = [
        AggregateFunction("max_by", "hi", pa.string(), struct),
        AggregateFunction("min_by", "lo", pa.string(), struct),
    ]
    runner = make_runner(op_of(*aggs))
    rnd = random.Random(8)
    seen: list[tuple[str, str | None, float | None]] = []
    for batch in range(10):
        pool: list[float | None] = [None, 1.0, 2.0, -3.5, rnd.uniform(-4, 4)]
        if batch == 7:
            pool.append(NAN)
        rows = [
            (k, rnd.choice([None, f"v{batch}.{i}"]), rnd.choice(pool))
            for i, k in enumerate(rnd.choices("abc", k=rnd.randint(0, 6)))
        ]
        seen += rows
        partials = []
        for k in {r[0] for r in rows}:
            mine = [(v, o) for kk, v, o in rows if kk == k]
            orders = [o for _, o in mine if o is not None]
            row: dict[str, Any] = {"k": k, ROWS_COLUMN: len(mine)}
            for i, (f, largest) in enumerate((("max_by", True), ("min_by", False))):
                extreme = _extremum_by([(str(o), o) for o in orders], largest)
                row[buffer_column(i, f, 0)] = _extremum_by(mine, largest)
                row[buffer_column(i, f, 1)] = None if extreme is None else float(extreme)
            partials.append(row)
        got = run(runner, partials, "complete")
        for k in {r[0] for r in seen}:
            mine = [(v, o) for kk, v, o in seen if kk == k]
            want = {"hi": _extremum_by(mine, True), "lo": _extremum_by(mine, False)}
            assert got[k] == want, (batch, k, mine)


def test_merging_two_sessions_keeps_the_later_extreme_and_the_first_value() -> None:
    """``merge_states`` (sessions that join): max_by as Spark's merge, any_value the earlier
    session's once it has one."""
    struct = pa.struct([("value", pa.string()), ("ordering", pa.int64())])
    max_by = AggregateFunction("max_by", "hi", pa.string(), struct)
    merged = max_by.merge_states(
        [pa.array(["a", "b", None, "d"]), pa.array([5, 5, None, 1])],
        [pa.array(["x", "y", "z", None]), pa.array([5, 4, 2, None])],
    )
    assert merged[0].to_pylist() == ["x", "b", "z", "d"]
    assert merged[1].to_pylist() == [5, 5, 2, 1]
    any_value = AggregateFunction("any_value", "v", pa.int64(), pa.int64())
    merged = any_value.merge_states(
        [pa.array([1, None, None]), pa.array([True, True, False])],
        [pa.array([2, 3, 4]), pa.array([True, True, True])],
    )
    assert merged[0].to_pylist() == [1, None, 4]


# --- skewness, kurtosis, corr, covar_pop, covar_samp ----------------------------------------------


def central(xs: list[float]) -> list[float]:
    """``(n, avg, m2, m3, m4)`` of ``xs``, two passes (what Spark's batch partial stands for)."""
    if not xs:
        return [0.0, 0.0, 0.0, 0.0, 0.0]
    avg = statistics.fmean(xs)
    return [float(len(xs)), avg, *(math.fsum((x - avg) ** p for x in xs) for p in (2, 3, 4))]


def comoments(pairs: list[tuple[float, float]]) -> list[float]:
    """``(n, xAvg, yAvg, ck, xMk, yMk)`` of the pairs."""
    if not pairs:
        return [0.0] * 6
    xa = statistics.fmean(x for x, _ in pairs)
    ya = statistics.fmean(y for _, y in pairs)
    return [
        float(len(pairs)),
        xa,
        ya,
        math.fsum((x - xa) * (y - ya) for x, y in pairs),
        math.fsum((x - xa) ** 2 for x, _ in pairs),
        math.fsum((y - ya) ** 2 for _, y in pairs),
    ]


def statistic(func: str, xs: list[float], ys: list[float], legacy: bool) -> float | None:
    """Spark's evaluation of each function over every value seen (a two-pass model)."""
    undefined = NAN if legacy else None
    if func in ("skewness", "kurtosis"):
        n, _, m2, m3, m4 = central(xs)
        if n == 0:
            return None
        if m2 == 0:
            return undefined
        return math.sqrt(n) * m3 / m2**1.5 if func == "skewness" else n * m4 / (m2 * m2) - 3.0
    n, _, _, ck, xmk, ymk = comoments(list(zip(xs, ys, strict=True)))
    if n == 0:
        return None
    if func == "covar_pop":
        return ck / n
    if n == 1:
        return undefined
    if func == "covar_samp":
        return ck / (n - 1)
    return None if xmk * ymk == 0 else ck / math.sqrt(xmk * ymk)


STATISTICS = ("skewness", "kurtosis", "covar_pop", "covar_samp", "corr")


@pytest.mark.parametrize("legacy", [False, True])
def test_higher_moments_and_comoments_merge_as_spark(make_runner: Runner, legacy: bool) -> None:
    """Batches' exact moments merged with Spark's parallel formulas equal the statistics over
    every value seen (nulls skipped, a pair with a null skipped); a key of one value or of
    equal values gets null (NaN in legacy mode), a key of nothing but nulls null."""
    pair = pa.struct([("x", pa.float64()), ("y", pa.float64())])
    aggs = [
        AggregateFunction(
            f,
            f,
            pa.float64(),
            pair if f in STATISTICS[2:] else pa.float64(),
            legacy_statistics=legacy,
        )
        for f in STATISTICS
    ]
    runner = make_runner(op_of(*aggs))
    rnd = random.Random(13)
    seen: list[tuple[str, float | None, float | None]] = []
    for batch in range(8):
        rows = [
            (k, rnd.choice([None, rnd.uniform(-3, 9), 2.0]), rnd.choice([None, rnd.gauss(1, 4)]))
            for k in rnd.choices("abc", k=rnd.randint(0, 7))
        ]
        if batch == 0:
            rows += [("one", 1.5, 2.5), ("flat", 4.0, 1.0), ("flat", 4.0, 2.0), ("n", None, 3.0)]
        if batch == 3:
            rows += [("flat", 4.0, 7.0)]
        seen += rows
        partials = []
        for k in {r[0] for r in rows}:
            xs = [x for kk, x, _ in rows if kk == k and x is not None]
            pairs = [(x, y) for kk, x, y in rows if kk == k and x is not None and y is not None]
            row: dict[str, Any] = {"k": k, ROWS_COLUMN: 1}
            for i, f in enumerate(STATISTICS):
                parts = central(xs)[: 4 if f == "skewness" else 5]
                if f in STATISTICS[2:]:
                    parts = comoments(pairs)[: 6 if f == "corr" else 4]
                row |= {buffer_column(i, f, p): v for p, v in enumerate(parts)}
            partials.append(row)
        got = run(runner, partials, "complete")
        for k in {r[0] for r in seen}:
            xs = [x for kk, x, _ in seen if kk == k and x is not None]
            pairs = [(x, y) for kk, x, y in seen if kk == k and x is not None and y is not None]
            for f in STATISTICS:
                if f in STATISTICS[2:]:
                    want = statistic(f, [x for x, _ in pairs], [y for _, y in pairs], legacy)
                else:
                    want = statistic(f, xs, [], legacy)
                assert (got[k][f] is None) == (want is None), (batch, k, f, got[k][f], want)
                if want is not None:
                    assert same(got[k][f], want, rel=1e-9), (batch, k, f, got[k][f], want)
    assert got["one"]["covar_pop"] == 0.0 and got["n"]["skewness"] is None
    undefined = [got["flat"][f] for f in ("skewness", "kurtosis")] + [got["one"]["corr"]]
    assert all(math.isnan(v) for v in undefined) if legacy else undefined == [None] * 3


# --- percentile, median and mode ------------------------------------------------------------------


def spark_percentile(values: list[float], p: float) -> float | None:
    """Spark's Percentile: position ``(n - 1) * p`` in the sorted values, interpolated."""
    if not values:
        return None
    ordered = sorted(values, key=lambda x: (math.isnan(x), x))
    position = (len(ordered) - 1) * p
    lower, higher = math.floor(position), math.ceil(position)
    low, high = ordered[lower], ordered[higher]
    if lower == higher or low == high:
        return low
    return (higher - position) * low + (position - lower) * high


def test_percentiles_and_mode_over_every_value_seen(make_runner: Runner) -> None:
    aggs = [
        AggregateFunction("percentile", "p30", pa.float64(), pa.int64(), percentage=0.3),
        AggregateFunction(
            "percentile", "ps", pa.list_(pa.float64()), pa.int64(), percentage=(0.0, 0.5, 1.0)
        ),
        AggregateFunction("median", "med", pa.float64(), pa.int64(), percentage=0.5),
        AggregateFunction("mode", "mode", pa.int64(), pa.int64()),
    ]
    runner = make_runner(op_of(*aggs))
    rnd = random.Random(21)
    seen: Rows = []
    for batch in range(8):
        rows: Rows = [
            (k, rnd.choice([None, -2, 0, 3, 3, 17, 1 << 40]))
            for k in rnd.choices("abc", k=rnd.randint(0, 7))
        ]
        if batch == 0:
            rows += [("n", None), ("tie", 9), ("tie", 4)]
        seen += rows
        partials = []
        for k, vs in grouped(rows).items():
            present = [v for v in vs if v is not None]
            row: dict[str, Any] = {"k": k, ROWS_COLUMN: len(vs)}
            for i, f in enumerate(("percentile", "percentile", "median")):
                row[buffer_column(i, f, 0)] = [float(v) for v in present]
            row[buffer_column(3, "mode", 0)] = present
            partials.append(row)
        got = run(runner, partials, "complete")
        for k, vs in grouped(seen).items():
            xs = [float(v) for v in vs if v is not None]
            counts = collections.Counter(v for v in vs if v is not None)
            want = {
                "p30": spark_percentile(xs, 0.3),
                "ps": [spark_percentile(xs, p) for p in (0.0, 0.5, 1.0)] if xs else None,
                "med": spark_percentile(xs, 0.5),
                "mode": min(counts, key=lambda v: (-counts[v], v)) if counts else None,
            }
            assert got[k] == want, (batch, k, vs)
    assert got["tie"]["mode"] == 4 and got["n"] == dict.fromkeys(("p30", "ps", "med", "mode"))


def test_percentile_of_doubles_sorts_nan_last() -> None:
    agg = AggregateFunction("percentile", "p", pa.float64(), pa.float64(), percentage=0.5)
    lists = pa.array([[NAN, 1.0, 3.0], [2.0, NAN], [], None], pa.list_(pa.float64()))
    got = agg.result([lists]).to_pylist()
    assert got[0] == 3.0 and math.isnan(got[1]) and got[2:] == [None, None]


def test_percentile_needs_its_percentage() -> None:
    with pytest.raises(ConfigurationError, match="needs its percentage"):
        AggregateFunction("percentile", "p", pa.float64(), pa.int64())


# --- percentile_approx ----------------------------------------------------------------------------


def exact_rank_value(values: list[float], q: float, eps: float) -> float:
    """Spark's answer while its summary still holds every value: the extremes within ``eps`` of
    0 and 1, else the value of rank ``ceil(q * n)``."""
    ordered = sorted(values)
    if q <= eps:
        return ordered[0]
    if q >= 1 - eps:
        return ordered[-1]
    return ordered[math.ceil(q * len(ordered)) - 1]


def test_percentile_approx_is_exact_while_the_summary_holds_every_value(
    make_runner: Runner,
) -> None:
    aggs = [
        AggregateFunction(
            "percentile_approx", "p", pa.int32(), pa.int32(), percentage=0.37, accuracy=10000
        ),
        AggregateFunction(
            "approx_percentile",
            "ps",
            pa.list_(pa.float64()),
            pa.float64(),
            percentage=(0.0, 0.5, 1.0),
            accuracy=100,
        ),
    ]
    runner = make_runner(op_of(*aggs))
    rnd = random.Random(4)
    seen: Rows = []
    for _ in range(6):
        rows: Rows = [(k, rnd.choice([None, rnd.randint(-50, 50)])) for k in rnd.choices("ab", k=9)]
        seen += rows
        partials = []
        for k, vs in grouped(rows).items():
            present = [float(v) for v in vs if v is not None]
            partials.append(
                {
                    "k": k,
                    ROWS_COLUMN: len(vs),
                    buffer_column(0, "percentile_approx", 0): present,
                    buffer_column(1, "approx_percentile", 0): present,
                }
            )
        got = run(runner, partials, "complete")
        for k, vs in grouped(seen).items():
            xs = [float(v) for v in vs if v is not None]
            want = {
                "p": int(exact_rank_value(xs, 0.37, 1e-4)) if xs else None,
                "ps": [exact_rank_value(xs, q, 0.01) for q in (0.0, 0.5, 1.0)] if xs else None,
            }
            assert got[k] == want, (k, vs)


def test_merged_quantile_summaries_stay_within_their_relative_error() -> None:
    """Summaries past compression, merged batch after batch (and two sessions' merged), answer
    within Spark's bound: the rank of the answer within ``eps * n`` of the asked rank."""
    eps = 0.01
    rnd = random.Random(9)
    batches = [[rnd.gauss(0, 1) for _ in range(rnd.randint(500, 4000))] for _ in range(6)]
    summary = _quantiles.EMPTY
    for values in batches:
        summary = _quantiles.merge(summary, _quantiles.from_values(values, eps), eps)
    everything = sorted(x for values in batches for x in values)
    n = len(everything)
    assert summary[3] == n and len(summary[0]) < n / 10  # compressed
    for q in (0.05, 0.25, 0.5, 0.75, 0.95):
        answer = _quantiles.query(summary, q, eps)
        rank = everything.index(answer) + 1
        assert abs(rank - q * n) <= 2 * eps * n, (q, rank, q * n)
    sessions = AggregateFunction(
        "percentile_approx", "p", pa.float64(), pa.float64(), percentage=0.5, accuracy=100
    )
    halves = [_quantiles.from_values(batches[0], eps), _quantiles.from_values(batches[1], eps)]
    state, other = ([pa.array([[*h[i]]] if i < 3 else [h[3]]) for i in range(4)] for h in halves)
    merged = sessions.merge_states(state, other)
    answer = sessions.result(merged).to_pylist()[0]
    both = sorted(batches[0] + batches[1])
    assert abs(both.index(answer) + 1 - 0.5 * len(both)) <= 2 * eps * len(both)
