"""Arrow plumbing shared by the arbitrary-state operators: input in, group by key, rows out.

``concat_batches`` and ``on_time_rows`` read a partition's input and drop the rows behind the
watermark. ``group_by_key`` sorts it by the grouping columns (ascending, nulls first, the order
in which Spark calls the user function) and cuts it into one slice per key, all in Arrow; the
encoded key of each group is what the store is addressed with. ``OutputCollector`` turns what
user functions return (tuples, dicts, ``Row``-like objects, pandas frames) into record batches of
the output schema.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import event_time_stats, is_late
from sparkstate.operators.arbitrary.state_errors import InvalidOutputError
from sparkstate.operators.arbitrary.user_types import (
    DEFAULT_TIME_ZONE,
    GroupFrames,
    in_session_zone,
    to_utc,
)
from sparkstate.operators.base import OperatorMetrics
from sparkstate.store.codec import KeyCodec
from sparkstate.store.families import ColumnFamily

__all__ = [
    "ROW_FORMATS",
    "KeyGroups",
    "OutputCollector",
    "concat_batches",
    "decode_present",
    "group_by_key",
    "key_schema_of",
    "make_row_class",
    "on_time_rows",
    "pandas_groups",
    "rows_of",
]

#: How rows are handed to a row-based user function.
ROW_FORMATS = ("tuple", "dict", "row")
#: Output rows gathered before a record batch is emitted.
OUTPUT_CHUNK = 65536


@dataclasses.dataclass
class KeyGroups:
    """A partition's input sorted by key: group ``i`` is rows ``starts[i]:starts[i + 1]``."""

    table: pa.Table
    key_bytes: list[bytes]
    keys: list[tuple[Any, ...]]
    starts: list[int]

    def __len__(self) -> int:
        return len(self.key_bytes)


def key_schema_of(input_schema: pa.Schema, key_columns: Sequence[str], api: str) -> pa.Schema:
    """The grouping key schema (nullable fields of the input), with a clear error for typos."""
    if not key_columns:
        msg = f"{api}: at least one grouping column is needed"
        raise ConfigurationError(msg)
    missing = [c for c in key_columns if c not in input_schema.names]
    if missing:
        msg = f"{api}: no grouping column(s) {missing} in the input {input_schema.names}"
        raise ConfigurationError(msg)
    return pa.schema([input_schema.field(c).with_nullable(True) for c in key_columns])


def concat_batches(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """A partition's non-empty input batches as one table (an empty table of ``schema`` if none)."""
    collected = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(collected) if collected else schema.empty_table()


def on_time_rows(
    table: pa.Table,
    metrics: OperatorMetrics,
    event_time_column: str | None,
    watermark_ms: int | None,
) -> pa.Table:
    """The input rows to process: all of them counted as input rows and their largest event time
    observed; with a ``watermark_ms``, the rows at or before it dropped (Spark's late-row rule)
    and counted as dropped by watermark."""
    metrics.num_input_rows += table.num_rows
    if event_time_column is None or not table.num_rows:
        return table
    event_time = table.column(event_time_column)
    metrics.observe_event_times(event_time_stats(event_time))
    if watermark_ms is None:
        return table
    late = is_late(event_time, watermark_ms)
    dropped = int(pc.sum(late).as_py() or 0)
    if dropped:
        metrics.num_rows_dropped_by_watermark += dropped
        table = table.filter(pc.invert(late))
    return table


def _select(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = []
    for field in schema:
        col = table.column(field.name)
        columns.append(col if col.type == field.type else col.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def group_by_key(table: pa.Table, key_schema: pa.Schema, codec: KeyCodec) -> KeyGroups:
    """Sort ``table`` by the key columns and find each key's rows (vectorized)."""
    n = table.num_rows
    if n == 0:
        return KeyGroups(table, [], [], [0])
    names = key_schema.names
    order = pc.sort_indices(table, sort_keys=[(c, "ascending", "at_start") for c in names])
    table = table.take(order)
    key_table = _select(table, key_schema)
    encoded = codec.encode_many(key_table)
    if n == 1:
        firsts = np.zeros(1, np.int64)
    else:
        arr = pa.array(encoded, pa.binary())
        differs = np.asarray(pc.not_equal(arr.slice(1), arr.slice(0, n - 1)))
        firsts = np.concatenate([[0], np.flatnonzero(differs) + 1])
    idx = firsts.tolist()
    key_bytes = [encoded[i] for i in idx]
    key_cols = [c.take(pa.array(firsts)).to_pylist() for c in key_table.columns]
    keys = list(zip(*key_cols, strict=True))
    return KeyGroups(table, key_bytes, keys, [*idx, n])


def pandas_groups(
    groups: KeyGroups, time_zone: str = DEFAULT_TIME_ZONE
) -> Callable[[int, int], Iterator[Any]]:
    """``data(start, end)``: an iterator of one DataFrame with the group's rows (index from 0)
    typed as PySpark types them (:mod:`.user_types`), cut from one conversion of the input."""
    return GroupFrames(groups.table, groups.starts, time_zone).iterators()


def decode_present(fam: ColumnFamily, raws: Sequence[bytes | None]) -> list[Any]:
    """Decoded values of a multi-get (None where absent), decoding only what is there."""
    present = [i for i, r in enumerate(raws) if r is not None]
    out: list[Any] = [None] * len(raws)
    if present:
        if len(present) == len(raws):
            return fam.value_codec.decode_many(raws)
        decoded = fam.value_codec.decode_many([raws[i] for i in present])
        for i, value in zip(present, decoded, strict=True):
            out[i] = value
    return out


def make_row_class(names: Sequence[str]) -> type[tuple[Any, ...]]:
    """A tuple subclass like ``pyspark.sql.Row``: ``row.name``, ``row["name"]``, ``row[0]``,
    ``row.asDict()``."""
    fields = tuple(names)
    index = {n: i for i, n in enumerate(fields)}

    def __getitem__(self: tuple[Any, ...], item: Any) -> Any:  # noqa: N807
        if type(item) is str:
            try:
                item = index[item]
            except KeyError:
                msg = f"no field {item!r} in Row with fields {list(fields)}"
                raise KeyError(msg) from None
        return tuple.__getitem__(self, item)

    def asDict(self: tuple[Any, ...]) -> dict[str, Any]:  # noqa: N802 - PySpark's name
        return dict(zip(fields, self, strict=True))

    def __repr__(self: tuple[Any, ...]) -> str:  # noqa: N807
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(fields, self, strict=True))
        return f"Row({inner})"

    namespace: dict[str, Any] = {
        "__slots__": (),
        "__fields__": fields,
        "__getitem__": __getitem__,
        "__repr__": __repr__,
        "asDict": asDict,
    }
    for i, name in enumerate(fields):
        if name.isidentifier() and not keyword.iskeyword(name) and name not in namespace:
            namespace[name] = property(itemgetter(i))
    return type("Row", (tuple,), namespace)


def rows_of(table: pa.Table, fmt: str, time_zone: str = DEFAULT_TIME_ZONE) -> list[Any]:
    """All rows of ``table`` as tuples, dicts or ``Row`` objects (``fmt`` in ``ROW_FORMATS``),
    timestamps aware in the session ``time_zone`` as PySpark's row-mode functions get them."""
    table = in_session_zone(table, time_zone)
    if fmt == "dict":
        dicts: list[Any] = table.to_pylist()
        return dicts
    columns = [c.to_pylist() for c in table.columns]
    rows: list[Any] = list(zip(*columns, strict=True)) if columns else [()] * table.num_rows
    if fmt == "row":
        cls = make_row_class(table.schema.names)
        new = tuple.__new__
        rows = [new(cls, r) for r in rows]
    return rows


def _frame_columns(frame: Any, positions: list[int], zoned: set[int], time_zone: str) -> list[Any]:
    """Python values of some columns of a DataFrame, by position (a hot path: frames returned
    per key are tiny, so this avoids building a Series per column where pandas allows).
    Columns at ``zoned`` positions of the output are zone-aware timestamps: a naive
    ``datetime64`` there is wall clock in ``time_zone``."""
    iter_arrays = getattr(frame, "_iter_column_arrays", None)
    arrays = list(iter_arrays()) if iter_arrays is not None else None
    out = []
    for n, i in enumerate(positions):
        arr = arrays[i] if arrays is not None else None
        if arr is None or getattr(arr.dtype, "kind", "O") in "mM":  # tolist() gives ints
            series = frame.iloc[:, i]
            out.append((to_utc(series, time_zone) if n in zoned else series).tolist())
        else:
            out.append(arr.tolist())
    return out


def _first_misfit(values: Sequence[Any], typ: pa.DataType, from_pandas: bool) -> Any:
    """The first of ``values`` that does not convert to ``typ`` (for an error message)."""
    for v in values:
        try:
            pa.array([v], type=typ, from_pandas=from_pandas)
        except Exception:  # noqa: BLE001 - any failure is the one to show
            return v
    return None


class OutputCollector:
    """Gathers output rows of user functions and emits record batches of ``schema``.

    ``sink()`` takes iterables of tuples (positional), dicts (by name) or objects with
    ``asDict()``; ``add_frame`` takes a pandas DataFrame. ``where`` names the function in errors.
    ``time_zone`` is the session time zone naive timestamps of returned frames are read in;
    ``exact_width``: a frame must have as many columns as the schema (``applyInPandasWithState``).
    """

    def __init__(
        self,
        schema: pa.Schema,
        where: str,
        time_zone: str = DEFAULT_TIME_ZONE,
        *,
        exact_width: bool = False,
    ) -> None:
        self.schema = schema
        self.where = where
        self.num_rows = 0
        self._rows: list[Any] = []
        self._batches: list[pa.RecordBatch] = []
        self._names = schema.names
        self._from_pandas = False
        self._time_zone = time_zone
        self._exact_width = exact_width
        self._zoned = {
            n for n, t in enumerate(schema.types) if pa.types.is_timestamp(t) and t.tz is not None
        }

    def add_frame(self, frame: Any) -> None:
        """A pandas DataFrame, its columns matched as PySpark matches them: by name when any
        label is a string, else by position. NaN and NaT become nulls, as PySpark converts them.

        Its values join the pending rows (``tolist`` per column: far cheaper than an Arrow
        conversion per small frame).
        """
        if not hasattr(frame, "columns"):
            msg = f"{self.where} must yield pandas.DataFrame objects, got {type(frame).__name__}"
            raise InvalidOutputError(msg)
        labels = list(frame.columns)
        names = self._names
        if self._exact_width and len(labels) != len(names) and not (not labels and frame.empty):
            msg = (
                "[RESULT_COLUMN_SCHEMA_MISMATCH] Number of columns of the returned data doesn't "
                f"match specified schema. Expected: {len(names)} Actual: {len(labels)} "
                f"({self.where} returned columns {[str(c) for c in labels]}; the output "
                f"schema has {names})"
            )
            raise InvalidOutputError(msg)
        if len(frame) == 0:
            return
        if labels == names:
            positions = list(range(len(names)))
        elif any(isinstance(c, str) for c in labels):
            missing = [n for n in names if n not in labels]
            if missing:
                msg = (
                    f"{self.where} returned a DataFrame without column(s) {missing}: it has "
                    f"{[str(c) for c in labels]}; the output schema has {names} (columns are "
                    "matched by name when the DataFrame's labels are strings, as in PySpark)"
                )
                raise InvalidOutputError(msg)
            positions = [labels.index(n) for n in names]
        elif len(labels) >= len(names):
            positions = list(range(len(names)))
        else:
            msg = (
                f"{self.where} returned a DataFrame with columns {[str(c) for c in labels]}; "
                f"the output schema has {len(names)} fields {names}"
            )
            raise InvalidOutputError(msg)
        columns = _frame_columns(frame, positions, self._zoned, self._time_zone)
        self._from_pandas = True
        self._rows.extend(zip(*columns, strict=True))
        if len(self._rows) >= OUTPUT_CHUNK:
            self._flush_rows()

    def _flush_rows(self) -> None:
        if self._rows:
            rows = self._rows.copy()
            self._rows.clear()  # in place: ``sink()`` handed out this list's ``extend``
            self._batches.append(self._to_batch(rows))

    def _to_batch(self, rows: list[Any]) -> pa.RecordBatch:
        first = rows[0]
        if not isinstance(first, tuple):
            rows = [self._as_tuple(r) for r in rows]
        elif hasattr(first, "__fields__"):
            rows = self._rows_by_name(rows)
        width = len(self._names)
        try:
            columns = list(zip(*rows, strict=True))
        except ValueError:
            columns = []
        if len(columns) != width:
            rows = [self._as_tuple(r) for r in rows]
            columns = list(zip(*rows, strict=True)) or [()] * width
        arrays = []
        for c, f in zip(columns, self.schema, strict=True):
            try:
                arrays.append(pa.array(c, type=f.type, from_pandas=self._from_pandas))
            except (
                pa.ArrowInvalid,
                pa.ArrowTypeError,
                TypeError,
                ValueError,
                OverflowError,
            ) as exc:
                sample = _first_misfit(c, f.type, self._from_pandas)
                msg = (
                    f"{self.where} returned a value for the output column {f.name!r} that does "
                    f"not convert to its type {f.type} (e.g. {sample!r} of type "
                    f"{type(sample).__name__}): {exc}"
                )
                raise InvalidOutputError(msg) from exc
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _rows_by_name(self, rows: list[Any]) -> list[Any]:
        """``Row`` objects matched to the output by field name, as PySpark's row-mode
        ``transformWithState`` does (``asDict`` then Arrow by name: a missing field is null,
        an extra one ignored); rows whose fields are the output's stay as they are."""
        names = tuple(self._names)
        out = []
        for row in rows:
            fields = getattr(row, "__fields__", None)
            if fields is None or tuple(fields) == names:
                out.append(row)
            else:
                values = dict(zip(fields, row, strict=True))
                out.append(tuple(values.get(n) for n in names))
        return out

    def _as_tuple(self, row: Any) -> tuple[Any, ...]:
        if isinstance(row, dict):
            missing = [n for n in self._names if n not in row]
            if missing:
                msg = f"{self.where} returned a row without field(s) {missing}: {row!r}"
                raise InvalidOutputError(msg)
            return tuple(row[n] for n in self._names)
        if hasattr(row, "asDict") and not isinstance(row, tuple):
            return self._as_tuple(row.asDict())
        if isinstance(row, tuple | list):
            if len(row) != len(self._names):
                msg = (
                    f"{self.where} returned a row of {len(row)} values for the "
                    f"{len(self._names)} output fields {self._names}: {row!r}"
                )
                raise InvalidOutputError(msg)
            return tuple(row)
        msg = f"{self.where} returned {row!r}; rows must be tuples, dicts or Row objects"
        raise InvalidOutputError(msg)

    @property
    def has_batches(self) -> bool:
        return bool(self._batches)

    def sink(self) -> Callable[[Iterable[Any]], None]:
        """The fastest way in: ``list.extend`` of the pending rows (call ``ready`` now and then;
        a non-iterable result raises TypeError, which ``check_result`` turns into a clear error).
        """
        return self._rows.extend

    def frame_sink(self) -> Callable[[Any], None]:
        """The way in for pandas functions: each result is an iterable of DataFrames."""
        add_frame = self.add_frame

        def emit(result: Any) -> None:
            if hasattr(result, "columns"):
                msg = f"{self.where} must return an iterator of DataFrames, not a DataFrame"
                raise InvalidOutputError(msg)
            for frame in result:
                add_frame(frame)

        return emit

    def ready(self) -> bool:
        """Whether batches are ready to drain (flushing a full chunk of pending rows first)."""
        if len(self._rows) >= OUTPUT_CHUNK:
            self._flush_rows()
        return bool(self._batches)

    def check_result(self, exc: BaseException) -> None:
        """Raise a clear error instead of ``exc`` when it is ``extend`` refusing a non-iterable."""
        if isinstance(exc, TypeError) and "not iterable" in str(exc):
            msg = f"{self.where} must return an iterable of rows ({exc})"
            raise InvalidOutputError(msg) from exc

    def drain(self, final: bool = False) -> Iterator[pa.RecordBatch]:
        """Batches ready so far (all of them, pending rows included, when ``final``)."""
        if final:
            self._flush_rows()
        batches, self._batches = self._batches, []
        for batch in batches:
            self.num_rows += batch.num_rows
            yield batch
