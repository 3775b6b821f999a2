"""``hll_sketch_agg`` and ``hll_union_agg`` merged batch after batch without Spark: sketches made
with the DataSketches library itself, unioned into the state as the operator does (the bytes
against Spark's own are checked by tests/engine/test_aggregate_functions.py)."""

from __future__ import annotations

import random
import struct

import datasketches as ds
import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.aggregation import hll_sketch
from sparkstate.operators.aggregation.aggregate_functions import AggregateFunction

H8 = ds.tgt_hll_type.HLL_8


def sketch_of(values: list[int], lg_k: int = 12) -> bytes:
    sk = ds.hll_sketch(lg_k, H8)
    for v in values:
        sk.update(v)
    out: bytes = sk.serialize_updatable()
    return out


def estimate(sketch: bytes) -> float:
    return float(ds.hll_sketch.deserialize(sketch).get_estimate())


def three_errors(exact: int, lg_k: int) -> float:
    """Three relative standard errors of a union's estimate of ``exact`` distinct values."""
    return 3 * abs(ds.hll_sketch.get_rel_err(True, True, lg_k, 1)) * exact


def binary(*values: bytes | None) -> pa.Array:
    return pa.array(list(values), pa.binary())


def test_sketches_merge_batch_after_batch_into_the_distinct_count() -> None:
    """Keys whose sketches stay in list, set and HLL mode: exact while few, within three
    relative standard errors of the distinct count once many; the registers are those of one
    sketch of every value."""
    agg = AggregateFunction("hll_sketch_agg", "h", pa.binary(), pa.int64(), lg_config_k=10)
    rnd = random.Random(5)
    sizes = {"few": 3, "some": 40, "many": 5000}
    seen: dict[str, list[int]] = {k: [] for k in sizes}
    state = binary(*(None for _ in sizes))
    for _ in range(4):
        batch = []
        for k, n in sizes.items():
            values = [rnd.randint(0, 2 * n) for _ in range(n)]
            seen[k] += values
            batch.append(sketch_of(values, 10))
        (state,) = agg.merge([state], [binary(*batch)])
    (result,) = [agg.result([state]).to_pylist()]
    for (k, _), got in zip(sizes.items(), result, strict=True):
        exact = len(set(seen[k]))
        error = 1e-6 if exact < 8 else three_errors(exact, 10)
        assert abs(estimate(got) - exact) <= error, (k, exact)
        assert ds.hll_sketch.deserialize(got).lg_config_k == 10
    one_pass = sketch_of(seen["many"], 10)
    assert result[2][40:] == one_pass[40:]  # HLL_8 registers, one byte each


def test_a_union_of_hll_sketches_carries_javas_header() -> None:
    """Two sketches in HLL mode: out of order, ``curMin`` the smallest register and
    ``numAtCurMin`` how many hold it (Java rebuilds both; C++ leaves ``curMin`` at 0); list-mode
    coupons merged into it later add to its HIP accumulator, which a union then keeps (C++ drops
    it when it reads an out-of-order sketch)."""
    a, b = sketch_of(list(range(3000)), 4), sketch_of(list(range(2000, 6000)), 4)
    both = hll_sketch.union([a, b], 4)
    assert both[5] & 0x10 and both[7] & 3 == 2
    registers = both[40 : 40 + 16]
    assert both[6] == min(registers) > 0
    assert struct.unpack("<i", both[32:36])[0] == registers.count(min(registers))
    wide = hll_sketch.union([sketch_of(list(range(600))), sketch_of(list(range(500, 900)))], 12)
    assert wide[5] & 0x10 and struct.unpack("<d", wide[8:16])[0] == 0.0
    grown = hll_sketch.union([wide, sketch_of(list(range(10**6, 10**6 + 5)))], 12)
    assert grown[5] & 0x10 and struct.unpack("<d", grown[8:16])[0] > 0.0
    for sketch, lg_k in ((both, 4), (wide, 12), (grown, 12)):
        assert hll_sketch.union([sketch], lg_k) == sketch


def test_union_agg_skips_nulls_and_gives_sparks_empty_union_without_sketches() -> None:
    agg = AggregateFunction("hll_union_agg", "u", pa.binary(), pa.binary())
    one = sketch_of([1, 2])
    (state,) = agg.merge([binary(None, None, one)], [binary(None, one, None)])
    assert state.to_pylist() == [None, hll_sketch.union([one], 12), one]
    empty = agg.result([state]).to_pylist()[0]
    assert empty == hll_sketch.empty(12) and estimate(empty) == 0.0


def test_union_agg_of_another_lg_config_k_fails_unless_allowed() -> None:
    big, small = sketch_of(list(range(500)), 12), sketch_of(list(range(400, 900)), 10)
    strict = AggregateFunction("hll_union_agg", "u", pa.binary(), pa.binary())
    with pytest.raises(hll_sketch.SketchMergeError, match="values: 12 and 10"):
        strict.merge([binary(big)], [binary(small)])
    allowed = AggregateFunction(
        "hll_union_agg", "u", pa.binary(), pa.binary(), allow_different_lg_config_k=True
    )
    (state,) = allowed.merge([binary(big)], [binary(small)])
    merged = state.to_pylist()[0]
    assert ds.hll_sketch.deserialize(merged).lg_config_k == 10
    assert abs(estimate(merged) - 900) <= three_errors(900, 10)


@pytest.mark.parametrize("lg_k", [3, 22])
def test_lg_config_k_outside_sparks_range_is_refused(lg_k: int) -> None:
    with pytest.raises(ConfigurationError, match=rf"HLL_INVALID_LG_K.*inclusive: {lg_k}\."):
        AggregateFunction("hll_sketch_agg", "h", pa.binary(), pa.int64(), lg_config_k=lg_k)
