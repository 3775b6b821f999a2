"""DataSketches HLL sketches for ``hll_sketch_agg`` and ``hll_union_agg``, kept in state as
Spark's bytes.

Spark keeps an Apache DataSketches ``HllSketch`` (target type HLL_8) per key, merges two with a
``Union`` whose result it takes as HLL_8, and outputs the sketch's updatable serialization.
Spark computes each batch's sketch (or union) per key in the JVM; here it is unioned into the
state's, the state's first, as Spark's streaming aggregation merges the restored buffer with the
batch's. The union is the DataSketches C++ library's (the ``datasketches`` binding), whose bytes
differ from those of the Java library Spark runs in two places, both in the header of a sketch
in HLL mode; we give them Java's values:

* C++ drops the HIP accumulator of an out-of-order sketch when it reads one, Java keeps it (and
  coupons merged later add to it): sketches go into the union with that flag cleared, and the
  result carries it where Java's does (a source copied into the union keeps its flag; a merge of
  two sketches in HLL mode sets it);
* after a merge of two sketches in HLL mode, or a downsampling, Java rebuilds ``curMin`` and
  ``numAtCurMin`` from the registers (the smallest register, and how many hold it), where C++
  keeps ``curMin`` at 0 for HLL_8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sparkstate.exceptions import ConfigurationError, SparkstateError

__all__ = [
    "DEFAULT_LG_K",
    "SketchMergeError",
    "check_lg_k",
    "empty",
    "merge_sketches",
    "merge_unions",
    "union",
]

#: Spark's default ``lgConfigK`` and its range (DataSketches' own).
DEFAULT_LG_K = 12
MIN_LG_K, MAX_LG_K = 4, 21

# The header of a serialized HLL sketch (DataSketches' layout, the same in every language).
_LG_K_BYTE, _FLAGS_BYTE, _CUR_MIN_BYTE, _MODE_BYTE = 3, 5, 6, 7
_NUM_AT_CUR_MIN = slice(32, 36)
_REGISTERS_START = 40
_OUT_OF_ORDER = 0x10
_HLL_MODE = 2


class SketchMergeError(SparkstateError, ValueError):
    """Two sketches that Spark would not merge (``HLL_UNION_DIFFERENT_LG_K``)."""


def check_lg_k(lg_k: Any, function: str = "hll_sketch_agg") -> int:
    """``lg_k`` as Spark takes it (an integer from 4 to 21), or Spark's error."""
    if isinstance(lg_k, bool) or not isinstance(lg_k, int):
        msg = (
            f"[HLL_K_MUST_BE_CONSTANT] Invalid call to `{function}`; the `K` value must be a "
            f"constant value, but got {lg_k!r}; sparkstate takes a literal integer"
        )
        raise ConfigurationError(msg)
    if not MIN_LG_K <= lg_k <= MAX_LG_K:
        msg = (
            f"[HLL_INVALID_LG_K] Invalid call to `{function}`; the `lgConfigK` value must be "
            f"between {MIN_LG_K} and {MAX_LG_K}, inclusive: {lg_k}."
        )
        raise ConfigurationError(msg)
    return lg_k


def empty(lg_k: int) -> bytes:
    """An empty sketch's bytes (what Spark gives for a group without values)."""
    import datasketches as ds

    out: bytes = ds.hll_sketch(lg_k, ds.tgt_hll_type.HLL_8).serialize_updatable()
    return out


def union(sketches: Sequence[bytes | None], lg_max_k: int) -> bytes:
    """The union of ``sketches`` (in order; None skipped) taken as HLL_8, as Java's
    ``new Union(lg_max_k)``, ``update`` of each, ``getResult(HLL_8)`` serializes it."""
    import datasketches as ds

    gadget = ds.hll_union(lg_max_k)
    inherited, hll_lg_ks = False, []
    for sketch in sketches:
        if sketch is None:
            continue
        raw = bytearray(sketch)
        if len(raw) > _MODE_BYTE and raw[_MODE_BYTE] & 3 == _HLL_MODE:
            hll_lg_ks.append(raw[_LG_K_BYTE])
            if raw[_FLAGS_BYTE] & _OUT_OF_ORDER:
                inherited = True
                raw[_FLAGS_BYTE] &= ~_OUT_OF_ORDER & 0xFF
        gadget.update(ds.hll_sketch.deserialize(bytes(raw)))
    out = bytearray(gadget.get_result(ds.tgt_hll_type.HLL_8).serialize_updatable())
    if out[_MODE_BYTE] & 3 == _HLL_MODE:
        lg_k = out[_LG_K_BYTE]
        if out[_FLAGS_BYTE] & _OUT_OF_ORDER or any(k > lg_k for k in hll_lg_ks):
            registers = np.frombuffer(out, np.uint8, 1 << lg_k, _REGISTERS_START)
            low = int(registers.min())
            out[_CUR_MIN_BYTE] = low
            out[_NUM_AT_CUR_MIN] = int((registers == low).sum()).to_bytes(4, "little")
        if inherited:
            out[_FLAGS_BYTE] |= _OUT_OF_ORDER
    return bytes(out)


def lg_config_k(sketch: bytes) -> int:
    """The ``lgConfigK`` a serialized sketch records."""
    return sketch[_LG_K_BYTE]


def merge_sketches(state: pa.Array, batch: pa.Array, lg_k: int) -> pa.Array:
    """``hll_sketch_agg``: each row's state sketch (None before the first) and the batch's,
    unioned with the query's ``lg_k``."""
    rows = zip(state.to_pylist(), batch.to_pylist(), strict=True)
    return pa.array([union([s, b], lg_k) for s, b in rows], pa.binary())


def merge_unions(state: pa.Array, batch: pa.Array, *, allow_different_lg_k: bool) -> pa.Array:
    """``hll_union_agg``: each row's state union and the batch's (None where no sketch came
    yet), with the state's ``lgConfigK``; sketches of another ``lgConfigK`` fail unless
    allowed, as in Spark."""
    out: list[bytes | None] = []
    for s, b in zip(state.to_pylist(), batch.to_pylist(), strict=True):
        if b is None or s is None:
            out.append(s if b is None else union([b], lg_config_k(b)))
            continue
        left, right = lg_config_k(s), lg_config_k(b)
        if left != right and not allow_different_lg_k:
            msg = (
                f"[HLL_UNION_DIFFERENT_LG_K] Sketches have different `lgConfigK` values: {left} "
                f"and {right}. Set the `allowDifferentLgConfigK` parameter to true to call "
                "hll_union_agg with different `lgConfigK` values."
            )
            raise SketchMergeError(msg)
        out.append(union([s, b], left))
    return pa.array(out, pa.binary())
