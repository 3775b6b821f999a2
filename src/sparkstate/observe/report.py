"""``sparkstate report CHECKPOINT -o report.html``: a query's batches on one self-contained page.

The page is read from the query's progress log (:mod:`.progress_log`) and needs nothing else to
show: no script, no style sheet or font from elsewhere, the charts inline SVG that matplotlib
draws (:mod:`.charts`). A
header says which query, runs, batches and times the log covers and what they add up to; the
charts show, batch by batch, the rates, where a batch's time went, each operator's state rows,
memory and disk, what the batches wrote to the checkpoint and the rows the watermark dropped; a
table lists the last batches. Every text taken from the log is escaped.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from sparkstate.exceptions import SparkstateError
from sparkstate.observe import inspect_text, units
from sparkstate.observe.charts import Chart, Line, Mark, line_chart, stacked_chart
from sparkstate.observe.checkpoint import open_checkpoint
from sparkstate.observe.inspect import history
from sparkstate.observe.metrics import (
    DISK_METRICS,
    WRITTEN_METRICS,
    Columns,
    OperatorColumns,
    Run,
    columns,
)
from sparkstate.observe.progress_log import ProgressLog, read_progress_log

__all__ = ["CHARTS", "render", "run_report", "write_report"]

#: The charts of a page, in order: key -> title.
CHARTS = {
    "rates": "Input and processing rate",
    "phases": "Batch duration by phase",
    "rows": "State rows",
    "memory": "State memory",
    "disk": "State on disk",
    "written": "Bytes written to the checkpoint",
    "dropped": "Rows dropped by the watermark",
    "watermark": "Watermark",
}
#: Rows of the table of the last batches; runs listed in the header.
LAST_BATCHES = 12
LISTED_RUNS = 20

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;color:#222;max-width:1000px;margin:1em auto;padding:0 1em}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.1em;margin:1.4em 0 .4em}
dl{display:grid;grid-template-columns:max-content auto;gap:.1em 1em;margin:.5em 0}
dt{color:#666}dd{margin:0;font-variant-numeric:tabular-nums}
figure{margin:1em 0}figcaption{font-weight:600}svg{width:100%;height:auto;display:block}
.legend{list-style:none;margin:.2em 0;padding:0;display:flex;flex-wrap:wrap;gap:.2em 1em}
.legend{font-size:12px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.note{color:#777;font-style:italic}
table{border-collapse:collapse;font-size:12px;font-variant-numeric:tabular-nums}
th,td{padding:2px 8px;border-bottom:1px solid #eee;text-align:right}th{color:#666}
td.text,th.text{text-align:left}code{font-size:12px}
"""


def default_out(checkpoint: str) -> str:
    """Where the command writes the page of ``checkpoint`` unless told: in the system's
    temporary directory (not the current one), named after the checkpoint's last part."""
    name = re.sub(
        r"[^A-Za-z0-9._-]+", "_", checkpoint.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    )
    return os.path.join(tempfile.gettempdir(), f"sparkstate-report-{name or 'query'}.html")


def run_report(checkpoint: str, out: str | None = None) -> int:
    """The command: write the page (to ``out``, else :func:`default_out`), say where and for
    how many batches; an error is a line on stderr and exit code 1."""
    out = out or default_out(checkpoint)
    try:
        log = write_report(checkpoint, out)
    except (SparkstateError, OSError) as exc:
        print(f"sparkstate report: {exc}", file=sys.stderr)
        return 1
    n, first, last = len(log.batches), log.batches[0]["batchId"], log.batches[-1]["batchId"]
    batches = f"1 batch ({first})" if n == 1 else f"{n} batches ({first} to {last})"
    print(f"wrote {out}: {batches} from {log.where}")
    return 0


def write_report(checkpoint: str, out: str) -> ProgressLog:
    """Read the progress log of ``checkpoint`` and write its page to the local file ``out``."""
    log = read_progress_log(checkpoint)
    page = render(log, checkpoint)
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, out)
    return log


def render(log: ProgressLog, checkpoint: str) -> str:
    """The page of ``log``."""
    cols = columns(log.batches)
    runs = cols.runs()
    first = log.batches[0]
    query = first.get("name") or first.get("id") or "query"
    x_range = (cols.batch_ids[0], cols.batch_ids[-1])
    marks = [Mark(r.first_batch, _run_label(r)) for r in runs[1:]]
    body = [
        f"<h1>sparkstate report: {escape(str(query))}</h1>",
        _header(log, checkpoint, cols, runs),
        "<h2>Batches</h2>",
        *_charts(cols, x_range, marks),
        f"<h2>Last {min(LAST_BATCHES, len(cols.batch_ids))} batches</h2>",
        _last_batches(cols),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>sparkstate report: {escape(str(query))}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _charts(cols: Columns, x_range: tuple[int, int], marks: Sequence[Mark]) -> list[str]:
    xs = cols.batch_ids
    ops = cols.operators

    def chart(fmt: units.Format, *, integers: bool = True) -> Chart:
        return Chart(x_range, marks, fmt, integers=integers)

    def per_op(pick: Callable[[OperatorColumns], Sequence[float | None]]) -> list[Line]:
        return [Line(op.label, xs, pick(op)) for op in ops]

    rates = [Line("processed rows/s", xs, cols.processed_rate)]
    if any(v is not None for v in cols.input_rate):
        rates.insert(0, Line("input rows/s", xs, cols.input_rate))
    disk = [
        Line(f"{op.label} {name}", xs, op.disk_bytes[metric])
        for op in ops
        for metric, name in DISK_METRICS.items()
        if metric in op.disk_bytes
    ]
    written = [
        Line(f"{op.label} {name}", xs, op.written_bytes[metric])
        for op in ops
        for metric, name in WRITTEN_METRICS.items()
        if metric in op.written_bytes
    ]
    event_time = [Line("watermark", xs, cols.watermark_ms)]
    if any(v is not None for v in cols.max_event_ms):
        event_time.append(Line("max event time", xs, cols.max_event_ms))
    no_ops = "The query has no stateful operator in this log."
    return [
        line_chart(CHARTS["rates"], rates, chart(units.rate, integers=False)),
        stacked_chart(CHARTS["phases"], xs, list(cols.phases.items()), chart(units.duration_ms)),
        line_chart(CHARTS["rows"], per_op(lambda op: op.rows_total), chart(units.count),
                   note=no_ops),
        line_chart(CHARTS["memory"], per_op(lambda op: op.memory_bytes), chart(units.byte_size),
                   note=no_ops),
        line_chart(CHARTS["disk"], disk, chart(units.byte_size),
                   note="No batch in this log reports sstBytes (the rocksdb provider does)."),
        line_chart(CHARTS["written"], written, chart(units.byte_size),
                   note="No batch in this log reports the bytes it wrote."),
        line_chart(CHARTS["dropped"], per_op(lambda op: op.rows_dropped), chart(units.count),
                   note=no_ops),
        line_chart(CHARTS["watermark"], event_time, chart(units.epoch_ms), time_axis=True,
                   note="The query has no watermark (or no batch of this log reports it)."),
    ]  # fmt: skip


def _header(log: ProgressLog, checkpoint: str, cols: Columns, runs: list[Run]) -> str:
    first, last = log.batches[0], log.batches[-1]
    times = [t for t in cols.times_ms if t is not None]
    rows: list[tuple[str, str]] = [
        ("query id", _code(first.get("id"))),
        ("checkpoint", _code(checkpoint)),
        ("progress log", _code(log.where)),
        ("batches", f"{cols.batch_ids[0]} to {cols.batch_ids[-1]} ({len(cols.batch_ids)} logged)"),
    ]
    if first.get("name"):
        rows.insert(1, ("name", escape(str(first["name"]))))
    if times:
        span = units.duration_ms(max(times) - min(times))
        rows.append(
            ("time", f"{units.epoch_ms(min(times))} to {units.epoch_ms(max(times))} UTC ({span})")
        )
    ops = cols.operators
    rows += [
        ("input rows", units.count(_sum(cols.input_rows))),
        ("output rows", units.count(_sum(cols.output_rows))),
        ("time in batches", units.duration_ms(_sum(cols.total_ms))),
        ("dropped by watermark", units.count(sum(_sum(op.rows_dropped) for op in ops))),
    ]
    for op in ops:
        state = [units.count(_last(op.rows_total)) + " rows"]
        state.append(units.byte_size(_last(op.memory_bytes)) + " in memory")
        if "sstBytes" in op.disk_bytes:
            state.append(units.byte_size(_last(op.disk_bytes["sstBytes"])) + " on disk")
        rows.append((f"state of {escape(op.label)}", ", ".join(state) + " (last batch)"))
    rows += [("history", escape(inspect_text.event_text(e))) for e in _history(checkpoint)]
    if isinstance(last.get("sink"), dict) and last["sink"].get("description"):
        rows.append(("sink", escape(str(last["sink"]["description"]))))
    items = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return f"<dl>{items}</dl><h2>Runs ({len(runs)})</h2>{_runs_table(runs)}"


def _history(checkpoint: str) -> list[dict[str, Any]]:
    """Where the checkpoint's state came from (none where its metadata cannot be read: the
    page is drawn from the progress log alone)."""
    try:
        return history(open_checkpoint(checkpoint).metadata)
    except SparkstateError:
        return []


def _runs_table(runs: list[Run]) -> str:
    shown = runs[-LISTED_RUNS:]
    head = "<tr><th class='text'>run id</th><th>first batch</th><th>last batch</th>"
    head += "<th>batches</th><th class='text'>started (UTC)</th></tr>"
    body = "".join(
        f"<tr><td class='text'>{_code(r.run_id)}</td><td>{r.first_batch}</td>"
        f"<td>{r.last_batch}</td><td>{r.batches}</td>"
        f"<td class='text'>{_time(r.started_ms)}</td></tr>"
        for r in shown
    )
    more = f"<p class='note'>{len(runs) - len(shown)} earlier runs not listed.</p>"
    return f"<table>{head}{body}</table>" + (more if len(runs) > len(shown) else "")


def _last_batches(cols: Columns) -> str:
    heads = [
        "batch", "time (UTC)", "run", "input rows", "processed", "duration",
        "state rows", "state memory", "dropped", "watermark",
    ]  # fmt: skip
    text = {1, 2, 9}
    head = "".join(f"<th class='text'>{h}</th>" if i in text else f"<th>{h}</th>"
                   for i, h in enumerate(heads))  # fmt: skip
    rows = []
    for i in range(max(0, len(cols.batch_ids) - LAST_BATCHES), len(cols.batch_ids)):
        cells = [
            str(cols.batch_ids[i]),
            _time(cols.times_ms[i]),
            _code((cols.run_ids[i] or "")[:8] or None),
            _maybe(cols.input_rows[i], units.count),
            _maybe(cols.processed_rate[i], units.rate),
            _maybe(cols.total_ms[i], units.duration_ms),
            _maybe(_total([op.rows_total[i] for op in cols.operators]), units.count),
            _maybe(_total([op.memory_bytes[i] for op in cols.operators]), units.byte_size),
            _maybe(_total([op.rows_dropped[i] for op in cols.operators]), units.count),
            _time(cols.watermark_ms[i]),
        ]
        rows.append("<tr>" + "".join(
            f"<td class='text'>{c}</td>" if n in text else f"<td>{c}</td>"
            for n, c in enumerate(cells)
        ) + "</tr>")  # fmt: skip
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _total(values: Sequence[float | None]) -> float | None:
    """The sum of the values there are; None if there are none."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _run_label(run: Run) -> str:
    return f"restart: run {run.run_id or '?'} from batch {run.first_batch} at {_plain_time(run)}"


def _plain_time(run: Run) -> str:
    return units.epoch_ms(run.started_ms) if run.started_ms is not None else "an unknown time"


def _sum(values: Sequence[float | None]) -> float:
    return sum(v for v in values if v is not None)


def _last(values: Sequence[float | None]) -> float:
    return next((v for v in reversed(values) if v is not None), 0.0)


def _maybe(value: float | None, fmt: units.Format) -> str:
    return escape(fmt(value)) if value is not None else "&ndash;"


def _time(ms: float | None) -> str:
    return units.epoch_ms(ms) if ms is not None else "&ndash;"


def _code(value: object) -> str:
    return f"<code>{escape(str(value))}</code>" if value is not None else "&ndash;"
