"""``sparkstate inspect`` as a terminal shows it, through Rich: label/value lines, tables of the
partitions and the last batches, sizes and counts as a person reads them (:mod:`.units`), times
in UTC."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from sparkstate.files.durable import join_uri
from sparkstate.observe import units
from sparkstate.observe.key_lookup import KeyLookup
from sparkstate.store.capabilities import shares_files

__all__ = ["ROW_SOURCES", "event_text", "key", "not_found", "summary"]

#: The width of the labels of label/value lines, their indent included, so that blocks line up.
_LABEL = 12
#: How the rows per partition were counted, by the document's ``source``.
ROW_SOURCES = {
    "changelog": "num_keys recorded in each partition's changelog of the committed version",
    "loaded": "counted in each partition's state, loaded read-only",
}


def _labelled(lines: Sequence[tuple[str, RenderableType]]) -> Table:
    """Label/value lines, indented, a long value wrapped under itself."""
    grid = Table.grid(padding=(0, 0, 0, 2), pad_edge=True)
    grid.add_column(min_width=_LABEL, no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in lines:
        grid.add_row(label, value)
    return grid


def _table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    align: str,
    total: Sequence[str] | None = None,
) -> RenderableType:
    """A table with a rule under its header (and above its ``total``, a row of sums),
    indented as the label/value lines; ``align`` per column, ``l`` or ``r``."""
    table = Table(box=box.SIMPLE, show_edge=False, show_footer=total is not None)
    for i, (name, a) in enumerate(zip(header, align, strict=True)):
        footer = total[i] if total is not None else ""
        table.add_column(name, footer=footer, justify="left" if a == "l" else "right")
    for row in rows:
        table.add_row(*row)
    return Padding(table, (0, 0, 0, 1))  # and a cell's own padding of 1


def _title(text: str) -> Text:
    return Text(text, style="bold")


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _schema(fields: list[dict[str, str]]) -> str:
    return ", ".join(f"{f['name']} {f['type']}" for f in fields) or "(none)"


def _when(iso: str | None) -> str:
    """An ISO time as ``2024-01-01 00:00:10`` (UTC); ``-`` for none."""
    if not iso:
        return "-"
    t = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return units.epoch_ms(t.timestamp() * 1000)


# --- the summary ---------------------------------------------------------------------------------


def summary(doc: dict[str, Any]) -> RenderableType:
    query, batches = doc["query"], doc["batches"]
    lines: list[tuple[str, RenderableType]] = [
        ("query", str(query["id"]) + (f" ({query['name']})" if query["name"] else "")),
        (
            "provider",
            f"{query['provider']}, {query['partitions']} state partitions, "
            f"output mode {query['output_mode']}",
        ),
    ]
    where = query["state_location"] or "in the checkpoint"
    lines.append(("location", f"{where} ({join_uri(query['state_root'], 'state')})"))
    lines.append(("batches", _batches(batches)))
    lines.append(("watermark", _watermark(doc["watermark"])))
    lines += [("history", event_text(event)) for event in doc.get("history", [])]
    out: list[RenderableType] = [_title(f"sparkstate checkpoint {doc['checkpoint']}")]
    out.append(_labelled(lines))
    for op in doc["operators"]:
        out += ["", *_operator(op, doc["query"]["provider"])]
    out += ["", *_progress(doc["progress"], len(doc["operators"]))]
    return Group(*out)


def _batches(b: dict[str, Any]) -> str:
    if b["committed"] == 0:
        return "none committed yet"
    n = b["committed"]
    text = f"{b['first']} to {b['last']} committed ({n} batch{'es' if n != 1 else ''})"
    if b["shown"] != b["last"]:
        text += f"; shown: after batch {b['shown']}"
    return f"{text}; state version {b['state_version']}, committed {_when(b['committed_at'])}"


def event_text(e: dict[str, Any]) -> str:
    """One event of a checkpoint's history (:func:`sparkstate.observe.inspect.history`)."""
    if e["event"] == "taken_over_from_spark":
        return (
            f"taken over from Spark's own operators ({e['spark_provider']}) after its batch "
            f"{e['batch']}, {_when(e['at'])}"
        )
    if e["event"] == "migrated":
        return (
            f"migrated the state of operator(s) {e['operators']} to a changed query after "
            f"batch {e['batch']}, {_when(e['at'])}"
        )
    return str(e)


def _watermark(w: dict[str, Any]) -> str:
    if w["ms"] is None:
        return "none"
    events = ", ".join(
        f"{name} {units.epoch_ms(ms)}" for name, ms in sorted(w["max_event_time_ms"].items())
    )
    return f"{units.epoch_ms(w['ms'])} (max event time: {events or '-'})"


def _operator(op: dict[str, Any], provider: str) -> list[RenderableType]:
    title = f"operator {op['id']}: {op['name']} ({op['kind']}"
    if op.get("time_mode"):
        title += f", time mode {op['time_mode']}"
    lines: list[tuple[str, RenderableType]] = [("key", _schema(op["key"]))]
    stores = op["stores"]
    if len(stores) == 1 and stores[0]["name"] == "default":
        lines.append(("value", _schema(stores[0]["value"])))
    elif stores:
        grid = Table.grid(padding=(0, 2))
        for _ in range(3):
            grid.add_column(overflow="fold")
        for s in stores:
            grid.add_row(s["name"], _state_type(s), _store_schema(s))
        lines.append(("state" if any("state_type" in s for s in stores) else "stores", grid))
    lines.append(("families", ", ".join(op["column_families"]) or "-"))
    return [_title(title + ")"), _labelled(lines), *_partitions(op, provider)]


def _state_type(store: dict[str, Any]) -> str:
    return str(store.get("state_type", "")) + (" with TTL" if store.get("ttl") else "")


def _store_schema(store: dict[str, Any]) -> str:
    if "map_key" in store:
        return f"{_schema(store['map_key'])} -> {_schema(store['value'])}"
    return _schema(store["value"])


def _files(f: dict[str, int]) -> str:
    """A kind of files: how many, and their size (``4 (63.8 kB)``)."""
    return f"{_count(f['files'])} ({units.byte_size(f['bytes'])})" if f["files"] else "0"


def _versions(v: dict[str, Any]) -> str:
    if not v["count"]:
        return "-"
    return f"{v['oldest']}..{v['newest']}"


def _partitions(op: dict[str, Any], provider: str) -> list[RenderableType]:
    sst = any(p["sst"]["files"] for p in op["partitions"]) or shares_files(provider)
    kinds = ["changelogs", "snapshots", *(["sst"] if sst else [])]
    header = ["partition", "versions", "changelogs", "snapshots"]
    header += ["sst files"] if sst else []
    header.append("rows")
    rows = [
        [
            str(p["partition"]),
            _versions(p["versions"]),
            *(_files(p[kind]) for kind in kinds),
            _count(p["rows"]),
        ]
        for p in op["partitions"]
    ]
    files = op["files"]
    total = ["all", "", *(_files(files[kind]) for kind in kinds)]
    total.append(_count(op["rows"]["partitions_sum"]))
    return [_table(header, rows, "r" * len(header), total), _labelled(_rows(op["rows"]))]


def _rows(r: dict[str, Any]) -> list[tuple[str, RenderableType]]:
    if r["batch"] is None:
        return [("rows", "none: no batch committed yet")]
    text = f"{_count(r['total'])} after batch {r['batch']}, as commits/{r['batch']}.json records"
    if r["partitions_sum"] is not None and r["partitions_sum"] != r["total"]:
        text += f" (the partitions' counts add up to {_count(r['partitions_sum'])})"
    out: list[tuple[str, RenderableType]] = [("rows", text)]
    sources = [ROW_SOURCES.get(s, s) for s in (r["source"] or "").split("+") if s]
    if sources:
        out.append(("", f"per partition: {'; '.join(sources)}"))
    return out


def _progress(progress: dict[str, Any], n_ops: int) -> list[RenderableType]:
    if not progress["batches"]:
        return [_title(f"progress: {progress.get('error') or 'no batch logged yet'}")]
    batches = progress["batches"]
    header = ["batch", "time", "input rows", "duration"]
    header += ["state rows"] if n_ops == 1 else [f"op {i} rows" for i in range(n_ops)]
    rows = []
    for b in batches:
        duration = "-" if b["duration_ms"] is None else units.duration_ms(b["duration_ms"])
        state = [_count(r) for r in b["state_rows"]]
        state += ["-"] * (len(header) - 4 - len(state))
        rows.append(
            [str(b["batch_id"]), _when(b["time"]), _count(b["input_rows"]), duration, *state]
        )
    title = _title(f"last {len(batches)} batches ({progress['where']})")
    return [title, _table(header, rows, "rlrr" + "r" * (len(header) - 4))]


# --- a key ---------------------------------------------------------------------------------------


def _value(value: Any, top: bool = False) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        inner = ", ".join(f"{k}={_value(v)}" for k, v in value.items())
        return inner if top else f"{{{inner}}}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, datetime.datetime):
        return units.epoch_ms(value.timestamp() * 1000)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, decimal.Decimal | datetime.date):
        return str(value)
    return str(value)


def _key_text(key: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in key.items())


def _where(lookup: KeyLookup) -> str:
    if lookup.found_by == "hash":
        return "Spark's hash partition of the key, where the query's shuffle sent it"
    return "every partition searched: a key column's type has no hash here"


def key(lookup: KeyLookup) -> RenderableType:
    op = lookup.operator
    lines: list[tuple[str, RenderableType]] = [
        ("key", _key_text(lookup.key)),
        ("partition", f"{lookup.partition} ({_where(lookup)})"),
    ]
    single = len(lookup.stores) == 1
    for name, rows in lookup.stores.items():
        label = "value" if single else name
        if not rows:
            lines.append((label, "(none)"))
        for i, row in enumerate(rows):
            lines.append((label if i == 0 else "", _row(row)))
    title = _title(f"operator {op.id}: {op.name} ({op.kind}), after batch {lookup.batch_id}")
    return Group(title, _labelled(lines))


def _row(row: dict[str, Any]) -> str:
    """A row of a store without its key: its one column's value (a struct's fields, a list's
    elements, a map's entries as ``key -> value``), or ``name=value`` per column."""
    if len(row) != 1:
        return _value(row, top=True)
    ((name, value),) = row.items()
    if name == "map_value" and isinstance(value, list):
        return "{" + ", ".join(f"{_value(e['key'])} -> {_value(e['value'])}" for e in value) + "}"
    return _value(value, top=True)


def not_found(lookup: KeyLookup) -> str:
    op = lookup.operator
    searched = ", ".join(map(str, lookup.searched))
    where = (
        f"searched partition {searched} (Spark's hash partition of the key)"
        if lookup.found_by == "hash"
        else f"searched partitions {searched} (all: a key column's type has no hash here)"
    )
    return (
        f"key {_key_text(lookup.key)} is not in the state of operator {op.id} ({op.name}) "
        f"after batch {lookup.batch_id}: {where}"
    )
