"""The stream-stream join operator against a join of everything it was given.

Rows of both sides arrive over many batches, in random order, with keys shared by many rows of
each side (and null keys); a time-range condition says a click joins an impression of its key
in the 10 s after it. Whatever the batching, once a last batch's watermark has evicted
everything, the rows a join emitted over all batches must be the rows the same join over all
the (not late) input gives at once: each pair once, each unmatched row of an outer side once
with nulls, each matched left row of a semi join once. And the state must be empty by then.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkstate.operators.join import (
    COUNT_FAMILY,
    SIDE_COLUMN,
    SIDE_FAMILIES,
    JoinSide,
    StreamingJoin,
    read_counts,
    recount,
)

from .conftest import OperatorRunner, at

Runner = Callable[[Any], OperatorRunner]
TS = pa.timestamp("us", tz="UTC")
WINDOW = dt.timedelta(seconds=10)  # a click joins an impression of its key in the 10 s after it
DELAY_S = 3


def join_op(how: str, left_only: pc.Expression | None = None) -> StreamingJoin:
    left = JoinSide(
        "left",
        (pa.field("imp_id", pa.int64()), pa.field("imp_ts", TS)),
        event_time="imp_ts",
        state_time="imp_ts",
        state_offset_ms=int(WINDOW.total_seconds() * 1000),  # no click after imp_ts + 10 s
        only=left_only,
    )
    right = JoinSide(
        "right",
        (pa.field("clk_id", pa.int64()), pa.field("clk_ts", TS)),
        event_time="clk_ts",
        state_time="clk_ts",
        state_offset_ms=0,  # no impression after clk_ts can be its impression
    )
    condition = (pc.field("clk_ts") >= pc.field("imp_ts")) & (
        pc.field("clk_ts") <= pc.add(pc.field("imp_ts"), pa.scalar(WINDOW))
    )
    return StreamingJoin(how, [pa.field("__ss_k0", pa.int64())], left, right, condition)


def generate(seed: int, batches: int) -> list[list[dict[str, Any]]]:
    """Per batch, rows of both sides: event time moving on 5 s a batch, spread over 8 s (so some
    rows are late), 6 keys and a null key shared by many rows."""
    rng = random.Random(seed)
    out: list[list[dict[str, Any]]] = []
    n = 0
    for b in range(batches):
        rows = []
        for _ in range(rng.randrange(5, 40)):
            n += 1
            key = rng.choice([None, 1, 2, 3, 4, 5, 6])
            ts = at(b * 5 + rng.uniform(-3, 5))
            if rng.random() < 0.5:
                rows.append({SIDE_COLUMN: 0, "__ss_k0": key, "imp_id": n, "imp_ts": ts})
            else:
                rows.append({SIDE_COLUMN: 1, "__ss_k0": key, "clk_id": n, "clk_ts": ts})
        rng.shuffle(rows)
        out.append(rows)
    return out


def run_batches(runner: OperatorRunner, data: list[list[dict[str, Any]]]) -> tuple[list, list]:
    """Run every batch with the watermark the engine would give it (max event time of the
    batches before, minus the delay), then a last batch that evicts everything. Returns the
    output rows and the input rows that were not late."""
    out: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    max_seen = {0: None, 1: None}
    for rows in [*data, []]:
        seen = [m for m in max_seen.values() if m is not None]
        wm = min(seen) - dt.timedelta(seconds=DELAY_S) if len(seen) == 2 else None
        wm_ms = int(wm.timestamp() * 1000) if wm is not None else 0
        if not rows:  # the last batch: a watermark past everything
            wm_ms = int(at(10_000).timestamp() * 1000)
        for r in rows:
            ts = r["imp_ts"] if r[SIDE_COLUMN] == 0 else r["clk_ts"]
            if wm_ms == 0 or int(ts.timestamp() * 1000) > wm_ms:
                kept.append(r)
            side = r[SIDE_COLUMN]
            max_seen[side] = ts if max_seen[side] is None else max(max_seen[side], ts)
        table, metrics = runner.run(rows, "append", watermark_ms=wm_ms)
        out.extend(table.to_pylist())
        last_metrics = metrics
    assert last_metrics.num_rows_total == 0  # everything evicted
    return out, kept


def expected(how: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The join of all rows at once, by a nested loop, with Spark's null keys: the optimizer
    drops them on every side but an outer join's preserved one, and the full outer join's state
    matches a null key with a null key."""
    imps = [r for r in rows if r[SIDE_COLUMN] == 0]
    clks = [r for r in rows if r[SIDE_COLUMN] == 1]
    if how not in ("leftOuter", "fullOuter"):
        imps = [r for r in imps if r["__ss_k0"] is not None]
    if how not in ("rightOuter", "fullOuter"):
        clks = [r for r in clks if r["__ss_k0"] is not None]

    def joins(i: dict[str, Any], c: dict[str, Any]) -> bool:
        return (
            (i["__ss_k0"] is not None or how == "fullOuter")
            and i["__ss_k0"] == c["__ss_k0"]
            and i["imp_ts"] <= c["clk_ts"] <= i["imp_ts"] + WINDOW
        )

    def imp(i: dict[str, Any] | None) -> dict[str, Any]:
        return (
            {"imp_id": i["imp_id"], "imp_ts": i["imp_ts"]}
            if i
            else {"imp_id": None, "imp_ts": None}
        )

    def clk(c: dict[str, Any] | None) -> dict[str, Any]:
        return (
            {"clk_id": c["clk_id"], "clk_ts": c["clk_ts"]}
            if c
            else {"clk_id": None, "clk_ts": None}
        )

    if how == "leftSemi":
        return [imp(i) for i in imps if any(joins(i, c) for c in clks)]
    out = [{**imp(i), **clk(c)} for i in imps for c in clks if joins(i, c)]
    if how in ("leftOuter", "fullOuter"):
        out += [{**imp(i), **clk(None)} for i in imps if not any(joins(i, c) for c in clks)]
    if how in ("rightOuter", "fullOuter"):
        out += [{**imp(None), **clk(c)} for c in clks if not any(joins(i, c) for i in imps)]
    return out


def _bag(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(sorted(r.items())) for r in rows)


@pytest.mark.parametrize("how", ["inner", "leftOuter", "rightOuter", "fullOuter", "leftSemi"])
def test_join_over_batches_equals_the_join_of_everything(make_runner: Runner, how: str) -> None:
    for seed in range(3):
        runner = make_runner(join_op(how))
        out, kept = run_batches(runner, generate(seed, 12))
        want = expected(how, kept)
        assert len(want) > 10
        assert _bag(out) == _bag(want), seed


def test_rows_wait_in_state_until_the_watermark_passes_them(make_runner: Runner) -> None:
    runner = make_runner(join_op("leftOuter"))
    imp = {SIDE_COLUMN: 0, "__ss_k0": 1, "imp_id": 1, "imp_ts": at(0)}
    out, m = runner.run([imp], "append")
    assert out.num_rows == 0 and m.num_rows_total == 1 and m.num_rows_updated == 1
    assert m.max_event_time_by_input == {"left": int(at(0).timestamp() * 1000)}
    # A click 8 s later, two batches on: it still finds the impression.
    runner.run([], "append", watermark_ms=int(at(5).timestamp() * 1000))
    clk = {SIDE_COLUMN: 1, "__ss_k0": 1, "clk_id": 2, "clk_ts": at(8)}
    out, m = runner.run([clk], "append", watermark_ms=int(at(5).timestamp() * 1000))
    assert out.to_pylist() == [{"imp_id": 1, "imp_ts": at(0), "clk_id": 2, "clk_ts": at(8)}]
    assert m.num_rows_total == 2
    # The watermark passes both: they leave the state; the impression matched, so no null row.
    out, m = runner.run([], "append", watermark_ms=int(at(30).timestamp() * 1000))
    assert out.num_rows == 0 and m.num_rows_total == 0 and m.num_rows_removed == 2


def test_a_preserved_sides_own_condition_emits_its_failing_rows_at_once(
    make_runner: Runner,
) -> None:
    """``ON imp_id % 2 = 1 AND ...`` in a left outer join: an even impression joins nothing and
    is emitted with nulls in the batch it arrives, never stored (Spark's pre-join filter)."""
    odd = pc.equal(pc.bit_wise_and(pc.field("imp_id"), 1), 1)
    runner = make_runner(join_op("leftOuter", left_only=odd))
    rows = [
        {SIDE_COLUMN: 0, "__ss_k0": 1, "imp_id": 1, "imp_ts": at(0)},
        {SIDE_COLUMN: 0, "__ss_k0": 1, "imp_id": 2, "imp_ts": at(0)},
        {SIDE_COLUMN: 1, "__ss_k0": 1, "clk_id": 3, "clk_ts": at(1)},
    ]
    out, m = runner.run(rows, "append")
    assert _bag(out.to_pylist()) == _bag(
        [
            {"imp_id": 2, "imp_ts": at(0), "clk_id": None, "clk_ts": None},
            {"imp_id": 1, "imp_ts": at(0), "clk_id": 3, "clk_ts": at(1)},
        ]
    )
    assert m.num_rows_total == 2  # the odd impression and the click


def test_a_rescale_counts_each_sides_rows_as_the_operator_does(make_runner: Runner) -> None:
    """What a rescale writes for a join's row counts, from the rows a partition holds, is what
    the operator wrote after its batches (rows of both sides waiting in state)."""
    runner = make_runner(join_op("leftOuter"))
    data = generate(11, 6)
    for i, rows in enumerate(data):
        runner.run(rows, "append", watermark_ms=int(at(i * 5 - 10).timestamp() * 1000))
    store = runner.provider.get_read_store(runner.batch_id)
    families: list[str] = []
    keys: list[bytes] = []
    values: list[bytes] = []
    for name in (*SIDE_FAMILIES.values(), COUNT_FAMILY):
        fam = store.column_family(name)
        for suffixes, vals in store.raw_scan_chunks(fam.prefix, fam.end_of_family(), 0, 1000):
            families += [name] * len(vals)
            keys += suffixes
            values += vals
    side_rows = [f != COUNT_FAMILY for f in families]
    counted_keys, counted_values = recount(
        pa.array(families, pa.string()).filter(side_rows),
        pa.array(keys, pa.binary()).filter(side_rows),
        pa.array(values, pa.binary()).filter(side_rows),
    )
    stored = {k: v for f, k, v in zip(families, keys, values, strict=True) if f == COUNT_FAMILY}
    assert dict(zip(counted_keys.to_pylist(), counted_values.to_pylist(), strict=True)) == stored
    assert sum(read_counts(store).values()) > 0
