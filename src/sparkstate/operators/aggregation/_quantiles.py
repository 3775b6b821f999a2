"""Greenwald-Khanna quantile summaries as Spark's ``percentile_approx`` keeps them
(``QuantileSummaries``: samples ``(value, g, delta)`` and a count, a head buffer of 50000
values, compression past 10000 samples), so that a batch's values inserted in their order and
merged into the state's summary give Spark's summary and Spark's answers. Written from Spark's
description of the algorithm; Python loops per key, at the batch's size."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["Summary", "from_values", "merge", "query"]

HEAD_SIZE = 50000
COMPRESS_THRESHOLD = 10000

#: ``(values, g, delta, count)``: the samples in value order, and how many values they stand for.
Summary = tuple[list[float], list[int], list[int], int]
EMPTY: Summary = ([], [], [], 0)


def _sort_key(x: float) -> tuple[bool, float]:
    return (math.isnan(x), 0.0 if math.isnan(x) else x)


def _with_head(summary: Summary, head: Sequence[float], eps: float) -> Summary:
    """The head buffer's values inserted (sorted) among the samples."""
    values, gs, deltas, count = summary
    out_v: list[float] = []
    out_g: list[int] = []
    out_d: list[int] = []
    at = 0
    ordered = sorted(head, key=_sort_key)
    for i, x in enumerate(ordered):
        while at < len(values) and values[at] <= x:
            out_v.append(values[at])
            out_g.append(gs[at])
            out_d.append(deltas[at])
            at += 1
        count += 1
        last = at == len(values) and i == len(ordered) - 1
        delta = 0 if not out_v or last else math.floor(2 * eps * count)
        out_v.append(x)
        out_g.append(1)
        out_d.append(delta)
    out_v += values[at:]
    out_g += gs[at:]
    out_d += deltas[at:]
    return out_v, out_g, out_d, count


def _compressed(summary: Summary, threshold: float) -> Summary:
    """GK's COMPRESS: from the end, a sample folds into the next kept one while their ``g`` and
    its ``delta`` stay under ``threshold``; the first and last samples are always kept."""
    values, gs, deltas, count = summary
    if not values:
        return summary
    kept: list[tuple[float, int, int]] = []
    head = (values[-1], gs[-1], deltas[-1])
    for i in range(len(values) - 2, 0, -1):
        if gs[i] + head[1] + head[2] < threshold:
            head = (head[0], head[1] + gs[i], head[2])
        else:
            kept.append(head)
            head = (values[i], gs[i], deltas[i])
    kept.append(head)
    if values[0] <= head[0] and len(values) > 1:
        kept.append((values[0], gs[0], deltas[0]))
    kept.reverse()
    return [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept], count


def _compress(summary: Summary, head: Sequence[float], eps: float) -> Summary:
    inserted = _with_head(summary, head, eps)
    return _compressed(inserted, 2 * eps * inserted[3])


def from_values(values: Sequence[float], eps: float) -> Summary:
    """The summary of ``values`` inserted one by one, then compressed (a partial aggregate as
    Spark serializes it)."""
    summary, head = EMPTY, []
    for x in values:
        head.append(x)
        if len(head) >= HEAD_SIZE:
            summary, head = _with_head(summary, head, eps), []
            if len(summary[0]) >= COMPRESS_THRESHOLD:
                summary = _compressed(summary, 2 * eps * summary[3])
    return _compress(summary, head, eps)


def merge(left: Summary, right: Summary, eps: float) -> Summary:
    """Two compressed summaries merged as Spark's ``left.merge(right)``."""
    if right[3] == 0:
        return left
    if left[3] == 0:
        return right
    add_left = math.floor(2 * eps * right[3])
    add_right = math.floor(2 * eps * left[3])
    lv, lg, ld, lc = left
    rv, rg, rd, rc = right
    out_v: list[float] = []
    out_g: list[int] = []
    out_d: list[int] = []
    i = j = 0
    while i < len(lv) and j < len(rv):
        if lv[i] < rv[j]:
            out_v.append(lv[i])
            out_g.append(lg[i])
            out_d.append(ld[i] + (add_left if j > 0 else 0))
            i += 1
        else:
            out_v.append(rv[j])
            out_g.append(rg[j])
            out_d.append(rd[j] + (add_right if i > 0 else 0))
            j += 1
    out_v += lv[i:] + rv[j:]
    out_g += lg[i:] + rg[j:]
    out_d += ld[i:] + rd[j:]
    count = lc + rc
    return _compressed((out_v, out_g, out_d, count), 2 * eps * count)


def query(summary: Summary, quantile: float, eps: float) -> float | None:
    """Spark's answer for ``quantile`` from a compressed summary (None when it is empty)."""
    values, gs, deltas, count = summary
    if not values:
        return None
    if quantile <= eps:
        return values[0]
    if quantile >= 1 - eps:
        return values[-1]
    rank = math.ceil(quantile * count)
    target = max(g + d for g, d in zip(gs, deltas, strict=True)) // 2
    min_rank = 0
    for i in range(len(values) - 1):
        min_rank += gs[i]
        max_rank = min_rank + deltas[i]
        if max_rank - target <= rank <= min_rank + target:
            return values[i]
    return values[-1]
