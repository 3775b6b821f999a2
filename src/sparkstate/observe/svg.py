"""Charts over a query's batches as inline SVG: lines per series and stacked bars.

The x axis is the batch id. A chart is drawn at most :data:`COLUMNS` columns wide: with more
batches than that, a line keeps the lowest and the highest value of each column (spikes stay
visible) and a stacked bar shows the batch of the column whose bar is tallest. Every drawn shape
carries the batch ids and the values it draws (``data-x``, ``data-y``), so the page can be
checked against the log, and small charts carry a tooltip per point.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Iterable, Sequence
from html import escape

from sparkstate.observe.units import Format

__all__ = ["COLUMNS", "Chart", "Line", "Mark", "figure", "line_chart", "stacked_chart"]

#: The widest a chart is drawn, in columns (about one per pixel of its plot area).
COLUMNS = 600
#: Series with at most this many points get a marker and a tooltip per point.
MARKED_POINTS = 120
WIDTH, HEIGHT = 960, 260
LEFT, RIGHT, TOP, BOTTOM = 80, 16, 10, 30
PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
DAY_MS = 86_400_000
#: Steps of a time axis, in milliseconds (longer spans step by whole days).
TIME_STEPS = [
    s * 1000 for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800)
] + [h * 3_600_000 for h in (6, 12, 24, 48)]


@dataclasses.dataclass(frozen=True)
class Line:
    """A series: one value per batch id, None where the batch did not report it."""

    label: str
    xs: Sequence[int]
    ys: Sequence[float | None]


@dataclasses.dataclass(frozen=True)
class Mark:
    """A vertical mark before batch ``x`` (a restart), with its tooltip."""

    x: int
    label: str


@dataclasses.dataclass(frozen=True)
class Chart:
    """What every chart of a page shares: the batch range, the marks and how values read."""

    x_range: tuple[int, int]
    marks: Sequence[Mark]
    y_format: Format
    #: Whether the values are whole numbers (counts, bytes): no ticks between them.
    integers: bool = False


class _Scale:
    """Batch ids and values to pixels of the plot area."""

    def __init__(self, x_range: tuple[int, int], y_lo: float, y_hi: float) -> None:
        self.x0, self.x1 = x_range[0] - 0.5, x_range[1] + 0.5  # a batch is a unit wide
        self.y_lo, self.y_hi = y_lo, y_hi if y_hi > y_lo else y_lo + 1

    def x(self, batch: float) -> float:
        return LEFT + (batch - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        frac = (value - self.y_lo) / (self.y_hi - self.y_lo)
        return HEIGHT - BOTTOM - frac * (HEIGHT - TOP - BOTTOM)

    def column(self, batch: int) -> int:
        return min(COLUMNS - 1, int((batch - self.x0) / (self.x1 - self.x0) * COLUMNS))


def figure(title: str, body: str, legend: Sequence[str] = (), note: str = "") -> str:
    """A chart's ``<figure>``: its title, legend, drawing (or a note saying why there is none)."""
    items = "".join(
        f'<li><span class="swatch" style="background:{PALETTE[i % len(PALETTE)]}"></span>'
        f"{escape(label)}</li>"
        for i, label in enumerate(legend)
    )
    parts = [f"<figure><figcaption>{escape(title)}</figcaption>"]
    if items:
        parts.append(f'<ul class="legend">{items}</ul>')
    parts.append(body if body else f'<p class="note">{escape(note)}</p>')
    parts.append("</figure>")
    return "".join(parts)


def line_chart(
    title: str, lines: Sequence[Line], chart: Chart, *, time_axis: bool = False, note: str = ""
) -> str:
    """A line per series (gaps where a batch lacks the value); ``time_axis``: the values are
    milliseconds since the epoch, and the axis spans them rather than starting at 0."""
    values = [y for line in lines for y in line.ys if y is not None]
    if not values:
        return figure(title, "", note=note or "No batch in this log reports it.")
    lo = min(values) if time_axis else min(0.0, min(values))
    if time_axis:
        ticks = _time_ticks(lo, max(values))
    else:
        ticks = _nice_ticks(lo, max(values), integers=chart.integers)
    scale = _Scale(chart.x_range, ticks[0], ticks[-1])
    shapes = [_line(line, scale, PALETTE[i % len(PALETTE)], chart) for i, line in enumerate(lines)]
    fmt = _time_format(ticks) if time_axis else chart.y_format
    body = _svg(title, scale, ticks, fmt, chart, "".join(shapes))
    return figure(title, body, [line.label for line in lines])


def stacked_chart(
    title: str, xs: Sequence[int], layers: Sequence[tuple[str, Sequence[float]]], chart: Chart
) -> str:
    """Bars of ``layers`` stacked per batch (one value per batch id in ``xs`` each)."""
    totals = [sum(layer[i] for _, layer in layers) for i in range(len(xs))]
    if not xs or not layers:
        return figure(title, "", note="No batch in this log reports it.")
    ticks = _nice_ticks(0.0, max(totals), integers=chart.integers)
    scale = _Scale(chart.x_range, ticks[0], ticks[-1])
    slots = _slots(xs, totals, scale)
    shapes = []
    base = [0.0] * len(slots)
    for n, (label, layer) in enumerate(layers):
        path = []
        for k, (left, right, i) in enumerate(slots):
            if layer[i] > 0:
                bottom, top = scale.y(base[k]), scale.y(base[k] + layer[i])
                path.append(f"M{left:.1f} {bottom:.1f}V{top:.1f}H{right:.1f}V{bottom:.1f}Z")
            base[k] += layer[i]
        shapes.append(
            f'<path class="series" fill="{PALETTE[n % len(PALETTE)]}" shape-rendering="crispEdges"'
            f' data-label="{escape(label)}" data-x="{_joined(xs[i] for _, _, i in slots)}"'
            f' data-y="{_joined(layer[i] for _, _, i in slots)}" d="{"".join(path)}"/>'
        )
    body = _svg(title, scale, ticks, chart.y_format, chart, "".join(shapes))
    return figure(title, body, [label for label, _ in layers])


def _slots(
    xs: Sequence[int], totals: Sequence[float], scale: _Scale
) -> list[tuple[float, float, int]]:
    """The bars to draw: (left px, right px, index into ``xs``); one per batch, or, when there
    are more batches than columns, the tallest of each column's batches."""
    if len(xs) <= COLUMNS:
        gap = 1.0 if scale.x(1) - scale.x(0) > 6 else 0.0  # wide bars apart, narrow ones not
        return [(scale.x(x - 0.5) + gap, scale.x(x + 0.5) - gap, i) for i, x in enumerate(xs)]
    best: dict[int, int] = {}
    for i, x in enumerate(xs):
        col = scale.column(x)
        if col not in best or totals[i] > totals[best[col]]:
            best[col] = i
    width = (WIDTH - LEFT - RIGHT) / COLUMNS
    return [(LEFT + c * width, LEFT + (c + 1) * width, best[c]) for c in sorted(best)]


def _segments(line: Line) -> list[list[tuple[int, float]]]:
    """The runs of batches that have a value."""
    out: list[list[tuple[int, float]]] = []
    run: list[tuple[int, float]] = []
    for x, y in zip(line.xs, line.ys, strict=True):
        if y is None:
            if run:
                out.append(run)
            run = []
        else:
            run.append((x, y))
    return [*out, run] if run else out


def _downsample(points: list[tuple[int, float]], scale: _Scale) -> list[tuple[int, float]]:
    """The lowest and the highest point of each column, in batch order."""
    kept: list[tuple[int, float]] = []
    start = 0
    while start < len(points):
        col = scale.column(points[start][0])
        end = start
        while end < len(points) and scale.column(points[end][0]) == col:
            end += 1
        bucket = points[start:end]
        low = min(range(len(bucket)), key=lambda i: bucket[i][1])
        high = max(range(len(bucket)), key=lambda i: bucket[i][1])
        kept.extend(bucket[i] for i in sorted({low, high}))
        start = end
    return kept


def _line(line: Line, scale: _Scale, color: str, chart: Chart) -> str:
    segments = _segments(line)
    total = sum(map(len, segments))
    if total > 2 * COLUMNS:
        segments = [_downsample(s, scale) for s in segments]
    parts = [f'<g class="series" data-label="{escape(line.label)}"><title>{escape(line.label)}'
             "</title>"]  # fmt: skip
    for seg in segments:
        coords = " ".join(f"{scale.x(x):.1f},{scale.y(y):.1f}" for x, y in seg)
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"'
            f' data-x="{_joined(x for x, _ in seg)}" data-y="{_joined(y for _, y in seg)}"/>'
        )
        if total <= MARKED_POINTS or len(seg) == 1:
            for x, y in seg:
                tip = f"{line.label}, batch {x}: {chart.y_format(y)}"
                parts.append(
                    f'<circle cx="{scale.x(x):.1f}" cy="{scale.y(y):.1f}" r="2.5" fill="{color}">'
                    f"<title>{escape(tip)}</title></circle>"
                )
    parts.append("</g>")
    return "".join(parts)


def _svg(
    title: str, scale: _Scale, ticks: Sequence[float], fmt: Format, chart: Chart, shapes: str
) -> str:
    """The drawing: grid and axes, the shapes, then the restart marks over them."""
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img"'
        f' aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for t in ticks:
        y = scale.y(t)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(fmt(t))}</text>"
        )
    for b in _nice_ticks(*chart.x_range, count=8, integers=True):
        if chart.x_range[0] <= b <= chart.x_range[1]:
            x = scale.x(b)
            out.append(
                f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                f"{int(b)}</text>"
            )
    out.append(
        f'<text class="tick" x="{right}" y="{HEIGHT - 2}" text-anchor="end">batch</text>'
        f'<line class="axis" x1="{LEFT}" x2="{right}" y1="{bottom}" y2="{bottom}"/>'
    )
    out.append(shapes)
    for mark in chart.marks:
        x = scale.x(mark.x - 0.5)
        out.append(
            f'<g class="restart"><title>{escape(mark.label)}</title>'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}"/>'
            f'<path d="M{x:.1f} {bottom}l-5 8h10z"/></g>'
        )
    out.append("</svg>")
    return "".join(out)


def _nice_ticks(lo: float, hi: float, *, count: int = 4, integers: bool = False) -> list[float]:
    """Round ticks from at or below ``lo`` to at or above ``hi``, about ``count`` steps."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if integers:
        step = max(1.0, round(step))
    first = math.floor(lo / step) * step
    n = math.ceil((hi - first) / step - 1e-9)
    return [first + i * step for i in range(max(n, 1) + 1)]


def _time_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a time axis (milliseconds since the epoch) at round seconds, minutes, hours."""
    span = max(hi - lo, 1000.0)
    step = next((s for s in TIME_STEPS if span / s <= 5), math.ceil(span / 5 / DAY_MS) * DAY_MS)
    first = math.floor(lo / step) * step
    n = math.ceil((hi - first) / step - 1e-9)
    return [first + i * step for i in range(max(n, 1) + 1)]


def _time_format(ticks: Sequence[float]) -> Format:
    """Tick labels of a time axis: the time of day, with the date if the ticks span days."""

    def at(ms: float) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)

    days = {at(t).date() for t in ticks}
    pattern = "%m-%d %H:%M" if len(days) > 1 else "%H:%M:%S"
    return lambda ms: at(ms).strftime(pattern)


def _joined(values: Iterable[float]) -> str:
    """Numbers for a ``data-`` attribute: space-separated, whole ones in full, others to six
    significant digits."""
    return " ".join(str(int(v)) if float(v).is_integer() else f"{v:.6g}" for v in values)
