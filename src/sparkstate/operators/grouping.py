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
from sparkstate.operators._arrow import is_late, max_event_time_ms
from sparkstate.operators.base import OperatorMetrics
from sparkstate.operators.state_errors import InvalidOutputError
from sparkstate.store.base import ColumnFamily
from sparkstate.store.codec import KeyCodec

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
    metrics.observe_event_time(max_event_time_ms(event_time))
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


def pandas_groups(groups: KeyGroups) -> Callable[[int, int], Iterator[Any]]:
    """``data(start, end)``: an iterator of one DataFrame with the group's rows (index from 0),
    cut from a single conversion of the whole input."""
    import pandas as pd

    iloc = groups.table.to_pandas().iloc
    range_index = pd.RangeIndex
    detach = hasattr(iloc[0:0], "_is_copy")

    def data(start: int, end: int) -> Iterator[Any]:
        frame = iloc[start:end]
        frame.index = range_index(end - start)
        if detach:  # the user owns it: no SettingWithCopyWarning (groups never overlap)
            frame._is_copy = None
        return iter((frame,))

    return data


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


def rows_of(table: pa.Table, fmt: str) -> list[Any]:
    """All rows of ``table`` as tuples, dicts or ``Row`` objects (``fmt`` in ``ROW_FORMATS``)."""
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


def _frame_columns(frame: Any, positions: list[int]) -> list[list[Any]]:
    """Python values of some columns of a DataFrame, by position (a hot path: frames returned
    per key are tiny, so this avoids building a Series per column where pandas allows)."""
    iter_arrays = getattr(frame, "_iter_column_arrays", None)
    if iter_arrays is None:  # not pandas 2: the public, slower way
        return [frame.iloc[:, i].tolist() for i in positions]
    arrays = list(iter_arrays())
    out = []
    for i in positions:
        arr = arrays[i]
        if getattr(arr.dtype, "kind", "O") in "mM":  # numpy datetimes: tolist() gives ints
            out.append(frame.iloc[:, i].tolist())
        else:
            out.append(arr.tolist())
    return out


class OutputCollector:
    """Gathers output rows of user functions and emits record batches of ``schema``.

    ``sink()`` takes iterables of tuples (positional), dicts (by name) or objects with
    ``asDict()``; ``add_frame`` takes a pandas DataFrame. ``where`` names the function in errors.
    """

    def __init__(self, schema: pa.Schema, where: str) -> None:
        self.schema = schema
        self.where = where
        self.num_rows = 0
        self._rows: list[Any] = []
        self._batches: list[pa.RecordBatch] = []
        self._names = schema.names
        self._from_pandas = False

    def add_frame(self, frame: Any) -> None:
        """A pandas DataFrame: columns by name if all output fields are there, else by position.

        Its values join the pending rows (``tolist`` per column: far cheaper than an Arrow
        conversion per small frame); NaN and NaT become nulls, as PySpark converts them.
        """
        if not hasattr(frame, "columns"):
            msg = f"{self.where} must yield pandas.DataFrame objects, got {type(frame).__name__}"
            raise InvalidOutputError(msg)
        if len(frame) == 0:
            return
        labels = list(frame.columns)
        names = self._names
        if labels == names:
            positions = list(range(len(names)))
        elif frame.columns.is_unique and all(n in labels for n in names):
            positions = [labels.index(n) for n in names]
        elif len(labels) == len(names):
            positions = list(range(len(names)))
        else:
            msg = (
                f"{self.where} returned a DataFrame with columns {[str(c) for c in labels]}; "
                f"the output schema has {len(names)} fields {names}"
            )
            raise InvalidOutputError(msg)
        columns = _frame_columns(frame, positions)
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
        width = len(self._names)
        try:
            columns = list(zip(*rows, strict=True))
        except ValueError:
            columns = []
        if len(columns) != width:
            rows = [self._as_tuple(r) for r in rows]
            columns = list(zip(*rows, strict=True)) or [()] * width
        try:
            arrays = [
                pa.array(c, type=f.type, from_pandas=self._from_pandas)
                for c, f in zip(columns, self.schema, strict=True)
            ]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            msg = f"{self.where} returned rows that do not fit the output {self.schema}: {exc}"
            raise InvalidOutputError(msg) from exc
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

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
