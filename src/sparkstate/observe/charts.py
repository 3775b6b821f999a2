"""Charts over a query's batches for the report's page: drawn by matplotlib as SVG, inline.

The x axis is the batch id. A chart is drawn at most :data:`COLUMNS` columns wide: with more
batches than that, a line keeps the lowest and the highest value of each column (spikes stay
visible) and a stacked bar shows the batch of the column whose bar is tallest. Each series'
group in the drawing carries the batch ids and the values it draws (``data-x``, ``data-y``),
so the page can be checked against the log, and a tooltip with its name; each restart mark's
group a tooltip saying which run started there. Text is left to the browser's fonts
(``svg.fonttype`` none), which keeps the page small.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from html import escape

import matplotlib as mpl
from matplotlib import dates, ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sparkstate.observe.units import Format

__all__ = ["COLUMNS", "PALETTE", "Chart", "Line", "Mark", "figure", "line_chart", "stacked_chart"]

#: The widest a chart is drawn, in columns (about one per pixel of its plot area).
COLUMNS = 600
#: Series with at most this many points get a marker per point.
MARKED_POINTS = 120
#: Bars this many or fewer are drawn apart.
APART_BARS = 150
SIZE_INCHES = (9.6, 2.6)
PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
RESTART = "#c0392b"


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

    def column(self, batch: float) -> int:
        """The column batch ``batch`` is drawn in."""
        x0, x1 = self.x_range[0] - 0.5, self.x_range[1] + 0.5  # a batch is a unit wide
        return min(COLUMNS - 1, int((batch - x0) / (x1 - x0) * COLUMNS))


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
    with _style(title):
        body = _lines(title, lines, chart, values, time_axis)
    return figure(title, body, [line.label for line in lines])


def _lines(
    title: str, lines: Sequence[Line], chart: Chart, values: list[float], time_axis: bool
) -> str:
    fig, ax = _axes(chart)
    scale = 1 / 86_400_000 if time_axis else 1.0  # matplotlib's dates are days since the epoch
    groups: dict[str, tuple[str, list[int], list[float]]] = {}
    for i, line in enumerate(lines):
        xs, ys, isolated = _points(line, chart)
        drawn = [math.nan if y is None else y * scale for y in ys]
        marked = None if sum(y is not None for y in ys) <= MARKED_POINTS else isolated
        gid = f"series-{i}"
        ax.plot(xs, drawn, color=PALETTE[i % len(PALETTE)], linewidth=1.5, gid=gid,
                marker="o", markersize=3, markevery=marked)  # fmt: skip
        kept = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        groups[gid] = (line.label, [x for x, _ in kept], [y for _, y in kept])
    if time_axis:
        lo, hi = min(values) * scale, max(values) * scale
        pad = max(hi - lo, 1 / 86_400) * 0.05
        ax.set_ylim(lo - pad, hi + pad)
        locator = dates.AutoDateLocator(tz=datetime.UTC, minticks=3, maxticks=8)  # type: ignore[no-untyped-call]
        ax.yaxis.set_major_locator(locator)
        pattern = "%H:%M:%S" if math.floor(lo) == math.floor(hi) else "%m-%d %H:%M"  # one day
        formatter = dates.DateFormatter(pattern, tz=datetime.UTC)  # type: ignore[no-untyped-call]
        ax.yaxis.set_major_formatter(formatter)
    else:
        _value_axis(ax, chart, min(0.0, min(values)), max(values))
    return _svg(fig, title, chart, groups)


def stacked_chart(
    title: str, xs: Sequence[int], layers: Sequence[tuple[str, Sequence[float]]], chart: Chart
) -> str:
    """Bars of ``layers`` stacked per batch (one value per batch id in ``xs`` each)."""
    if not xs or not layers:
        return figure(title, "", note="No batch in this log reports it.")
    with _style(title):
        body = _stacked(title, xs, layers, chart)
    return figure(title, body, [label for label, _ in layers])


def _stacked(
    title: str, xs: Sequence[int], layers: Sequence[tuple[str, Sequence[float]]], chart: Chart
) -> str:
    totals = [sum(layer[i] for _, layer in layers) for i in range(len(xs))]
    fig, ax = _axes(chart)
    slots = _slots(xs, totals, chart)
    edges = [edge for left, right, _ in slots for edge in (left, right)]
    base = [0.0] * len(slots)
    groups: dict[str, tuple[str, list[int], list[float]]] = {}
    for n, (label, layer) in enumerate(layers):
        top = [b + layer[i] for b, (_, _, i) in zip(base, slots, strict=True)]
        gid = f"series-{n}"
        # one filled shape: a step per bar, and one of no height between bars
        ax.stairs(_apart(top), edges, baseline=_apart(base), fill=True, linewidth=0,
                  color=PALETTE[n % len(PALETTE)], gid=gid)  # fmt: skip
        groups[gid] = (label, [xs[i] for _, _, i in slots], [layer[i] for _, _, i in slots])
        base = top
    _value_axis(ax, chart, 0.0, max(totals))
    return _svg(fig, title, chart, groups)


def _apart(values: Sequence[float]) -> list[float]:
    """``values`` with a 0 between each and the next (the gaps between bars)."""
    out: list[float] = []
    for v in values:
        out += [v, 0.0]
    return out[:-1]


def _slots(
    xs: Sequence[int], totals: Sequence[float], chart: Chart
) -> list[tuple[float, float, int]]:
    """The bars to draw: (left, right, index into ``xs``); one per batch, or, when there are
    more batches than columns, the tallest of each column's batches."""
    if len(xs) <= COLUMNS:
        half = 0.4 if len(xs) <= APART_BARS else 0.5  # wide bars apart, narrow ones not
        return [(x - half, x + half, i) for i, x in enumerate(xs)]
    best: dict[int, int] = {}
    for i, x in enumerate(xs):
        col = chart.column(x)
        if col not in best or totals[i] > totals[best[col]]:
            best[col] = i
    x0, x1 = chart.x_range[0] - 0.5, chart.x_range[1] + 0.5
    width = (x1 - x0) / COLUMNS
    return [(x0 + c * width, x0 + (c + 1) * width, best[c]) for c in sorted(best)]


def _points(line: Line, chart: Chart) -> tuple[list[int], list[float | None], list[int]]:
    """The points of ``line`` to draw (a None between runs of batches that have a value, each
    run downsampled where the line has more than two points a column) and the indexes of the
    points that stand alone (drawn as a marker: a line of one point is not seen)."""
    runs = _runs(line)
    if sum(map(len, runs)) > 2 * COLUMNS:
        runs = [_downsample(run, chart) for run in runs]
    xs: list[int] = []
    ys: list[float | None] = []
    isolated: list[int] = []
    for run in runs:
        if xs:
            xs.append(run[0][0])
            ys.append(None)
        if len(run) == 1:
            isolated.append(len(xs))
        xs += [x for x, _ in run]
        ys += [y for _, y in run]
    return xs, ys, isolated


def _runs(line: Line) -> list[list[tuple[int, float]]]:
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


def _downsample(points: list[tuple[int, float]], chart: Chart) -> list[tuple[int, float]]:
    """The lowest and the highest point of each column, in batch order."""
    kept: list[tuple[int, float]] = []
    start = 0
    while start < len(points):
        col = chart.column(points[start][0])
        end = start
        while end < len(points) and chart.column(points[end][0]) == col:
            end += 1
        bucket = points[start:end]
        low = min(range(len(bucket)), key=lambda i: bucket[i][1])
        high = max(range(len(bucket)), key=lambda i: bucket[i][1])
        kept.extend(bucket[i] for i in sorted({low, high}))
        start = end
    return kept


@contextlib.contextmanager
def _style(title: str) -> Iterator[None]:
    """matplotlib's settings while a chart is drawn; the ids in its drawing made apart from
    those of the page's other charts."""
    with mpl.rc_context(
        {
            "svg.fonttype": "none",  # text as text, in the browser's fonts
            "svg.hashsalt": _prefix(title),
            "font.size": 8,
            "axes.edgecolor": "#888888",
            "axes.linewidth": 0.8,
            "axes.labelcolor": "#555555",
            "xtick.color": "#555555",
            "ytick.color": "#555555",
        }
    ):
        yield


def _prefix(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _axes(chart: Chart) -> tuple[Figure, Axes]:
    """A chart's figure (no pyplot: nothing global) and its plot area, batches along x."""
    fig = Figure(figsize=SIZE_INCHES)
    fig.subplots_adjust(left=0.085, right=0.99, top=0.96, bottom=0.13)
    ax = fig.add_subplot()
    ax.set_xlim(chart.x_range[0] - 0.5, chart.x_range[1] + 0.5)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=8, integer=True))
    ax.set_xlabel("batch", loc="right", labelpad=0)
    ax.grid(axis="y", color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    for k, mark in enumerate(chart.marks):
        ax.axvline(mark.x - 0.5, color=RESTART, linewidth=1, linestyle=(0, (4, 3)),
                   gid=f"restart-{k}")  # fmt: skip
    return fig, ax


def _value_axis(ax: Axes, chart: Chart, lo: float, hi: float) -> None:
    """A y axis from ``lo`` to ``hi`` (from 1 above where they are equal), its ticks read as
    the chart's values."""
    hi = hi if hi > lo else lo + 1
    ax.set_ylim(lo, hi + (hi - lo) * 0.05)
    ax.yaxis.set_major_locator(ticker.MaxNLocator(nbins=4, integer=chart.integers))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: chart.y_format(v)))


def _svg(
    fig: Figure, title: str, chart: Chart, groups: dict[str, tuple[str, list[int], list[float]]]
) -> str:
    """The drawing as an ``<svg>`` element for the page: its series' and restart marks' groups
    named apart from other charts' and annotated; no XML prolog or metadata."""
    prefix = _prefix(title)
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    svg = out.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{escape(title)}" ', 1)
    for gid, (label, xs, ys) in groups.items():
        svg = svg.replace(
            f'<g id="{gid}">',
            f'<g id="{prefix}-{gid}" class="series" data-label="{escape(label)}" '
            f'data-x="{_joined(xs)}" data-y="{_joined(ys)}"><title>{escape(label)}</title>',
        )
    for k, mark in enumerate(chart.marks):
        svg = svg.replace(
            f'<g id="restart-{k}">',
            f'<g id="{prefix}-restart-{k}" class="restart"><title>{escape(mark.label)}</title>',
        )
    return svg.strip()


def _joined(values: Iterable[float]) -> str:
    """Numbers for a ``data-`` attribute: space-separated, whole ones in full, others to six
    significant digits."""
    return " ".join(str(int(v)) if float(v).is_integer() else f"{v:.6g}" for v in values)
