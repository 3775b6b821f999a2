"""What users' functions receive and return, value for value as PySpark hands it over.

PySpark 4.3 converts a group's Arrow rows for ``applyInPandasWithState`` with its UDF converter:
timestamps become naive ``datetime64[ns]`` wall clock in the session time zone
(``spark.sql.session.timeZone``), ``timestamp_ntz`` becomes ``datetime64[ns]``; integers and
booleans take their pandas dtype per group (a group with a null gets ``float64`` / ``object``, one
without keeps ``int32`` / ``bool``); maps and structs become dicts, arrays object ndarrays.
``transformWithStateInPandas`` then rebuilds each group's frame from its rows
(``itertuples`` -> ``DataFrame``), so integers widen to ``int64``, floats to ``float64`` and a
column name that is not a Python identifier is renamed ``_<position>``. Row-mode functions get
Python values from Arrow, timestamps aware in the session time zone.

On the way back, a naive ``datetime64`` column of a returned frame is wall clock in the session
time zone (the earlier instant where the clock falls back), as PySpark reads it.

``applyInPandasWithState``'s ``GroupState`` holds a timestamp field as PySpark's does: ``get``
gives a naive ``datetime`` of the session time zone's wall clock, and ``update`` takes a naive
one (``datetime`` or ``pd.Timestamp``) as that wall clock, an aware one as its instant.
"""

from __future__ import annotations

import datetime
import keyword
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "DEFAULT_TIME_ZONE",
    "GroupFrames",
    "empty_timed_out_frame",
    "frame_of",
    "in_session_zone",
    "rebuilt_from_rows",
    "state_instant",
    "state_wall_clock",
    "to_utc",
]

DEFAULT_TIME_ZONE = "UTC"
#: Zone names whose wall clock is UTC's (no conversion needed).
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "GMT", "Z", "+00:00", "Etc/GMT"})
#: ``Table.to_pandas`` options of PySpark's converter for nested types.
_NESTED_OPTIONS = {
    "date_as_object": True,
    "coerce_temporal_nanoseconds": True,
    "integer_object_nulls": True,
}


def _has_aware_timestamp(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return t.tz is not None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_aware_timestamp(t.value_type)
    if pa.types.is_map(t):
        return _has_aware_timestamp(t.key_type) or _has_aware_timestamp(t.item_type)
    if pa.types.is_struct(t):
        return any(_has_aware_timestamp(f.type) for f in t)
    return False


def _zone_type(t: pa.DataType, tz: str) -> pa.DataType:
    """``t`` with every zone-aware timestamp in it re-labelled to ``tz`` (same instants)."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz=tz) if t.tz is not None else t
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_zone_type(t.value_type, tz)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_zone_type(t.value_type, tz)))
    if pa.types.is_map(t):
        return pa.map_(_zone_type(t.key_type, tz), _zone_type(t.item_type, tz))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_zone_type(f.type, tz)) for f in t])
    return t


def in_session_zone(table: pa.Table, time_zone: str) -> pa.Table:
    """``table`` with its zone-aware timestamps in ``time_zone`` (what row-mode functions see:
    ``datetime`` values aware in the session time zone, as PySpark's ``as_py`` gives them)."""
    if not any(_has_aware_timestamp(t) for t in table.schema.types):
        return table
    schema = pa.schema([f.with_type(_zone_type(f.type, time_zone)) for f in table.schema])
    return table.cast(schema)


def _local_ns(col: pa.ChunkedArray | pa.Array, time_zone: str) -> Any:
    """A timestamp column as naive nanoseconds: wall clock in ``time_zone`` if zone-aware."""
    t = col.type
    if t.tz is not None and time_zone not in _UTC_NAMES:
        col = pc.local_timestamp(col.cast(pa.timestamp(t.unit, tz=time_zone)))
    return col.cast(pa.timestamp("ns"))  # a zone-aware column in UTC: its UTC wall clock


def _nested_converter(t: pa.DataType, time_zone: str) -> Callable[[Any], Any] | None:
    """PySpark's per-value fix-up of a nested column after ``to_pandas`` (None: nothing to do)."""
    import pandas as pd

    if pa.types.is_timestamp(t):
        if t.tz is None:
            return lambda value: pd.Timestamp(value)

        def local(value: Any) -> Any:
            ts = pd.Timestamp(value)
            ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts
            return ts.tz_convert(time_zone).tz_localize(None)

        return local
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = _nested_converter(t.value_type, time_zone)
        if element is None:
            return None
        conv = element

        def array(value: Any) -> Any:
            items = [conv(v) if v is not None else None for v in value]
            return np.array(items) if isinstance(value, np.ndarray) else items

        return array
    if pa.types.is_map(t):
        kc, vc = _nested_converter(t.key_type, time_zone), _nested_converter(t.item_type, time_zone)
        if kc is None and vc is None:
            return dict
        kf = kc or (lambda v: v)
        vf = vc or (lambda v: v)
        return lambda value: {
            (kf(k) if k is not None else k): (vf(v) if v is not None else v) for k, v in value
        }
    if pa.types.is_struct(t):
        names = _dedup_names([f.name for f in t])
        convs = [_nested_converter(f.type, time_zone) for f in t]
        return lambda value: {
            n: c(v) if c is not None and v is not None else v
            for n, c, v in zip(names, convs, (value.get(n) for n in names), strict=True)
        }
    return None


def _dedup_names(names: Sequence[str]) -> list[str]:
    """Duplicate field names suffixed ``_0``, ``_1``... (PySpark's dicts for structs)."""
    if len(set(names)) == len(names):
        return list(names)
    seen: dict[str, int] = {}
    counts = {n: names.count(n) for n in names}
    out = []
    for n in names:
        if counts[n] > 1:
            out.append(f"{n}_{seen.get(n, 0)}")
            seen[n] = seen.get(n, 0) + 1
        else:
            out.append(n)
    return out


def _is_nested(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_map(t)
        or pa.types.is_struct(t)
    )


def _nested_series(col: pa.ChunkedArray, time_zone: str) -> Any:
    series = col.to_pandas(**_NESTED_OPTIONS)
    conv = _nested_converter(col.type, time_zone)
    if conv is not None:
        series = series.apply(lambda v: conv(v) if v is not None else None)
    return series


def frame_of(table: pa.Table, time_zone: str) -> Any:
    """``table`` as the pandas DataFrame PySpark hands a pandas function (index from 0): one
    ``to_pandas`` of the table with its timestamps made naive in Arrow first; nested columns
    converted apart and put back in their places."""
    types = table.schema.types
    if not any(pa.types.is_timestamp(t) or _is_nested(t) for t in types):
        return table.to_pandas()
    nested = [i for i, t in enumerate(types) if _is_nested(t)]
    flat = table
    for i, t in enumerate(types):
        if pa.types.is_timestamp(t):
            naive = _local_ns(table.column(i), time_zone)
            flat = flat.set_column(i, pa.field(table.schema.names[i], naive.type), naive)
    if nested:
        flat = flat.select([i for i in range(len(types)) if i not in nested])
    frame = flat.to_pandas()
    for i in nested:
        name = table.schema.names[i]
        frame.insert(i, name, _nested_series(table.column(i), time_zone), allow_duplicates=True)
    return frame


def _null_sensitive(t: pa.DataType) -> bool:
    """Whether a column's pandas dtype depends on nulls (integers: float64; booleans: object)."""
    return bool(pa.types.is_integer(t) or pa.types.is_boolean(t))


class GroupFrames:
    """Each group's rows as a DataFrame cut from one conversion of the whole input, with the dtype
    PySpark gives that group: a boolean column keeps ``bool`` in a group without nulls even if
    another group has some; so does an integer column with ``per_group_integers``
    (``applyInPandasWithState`` converts each group alone; ``transformWithStateInPandas``
    converts a whole Arrow batch, and its integers stay ``float64`` once the batch has a null,
    while its booleans come back as ``bool`` when the frame is rebuilt from rows)."""

    def __init__(
        self,
        table: pa.Table,
        starts: Sequence[int],
        time_zone: str,
        *,
        per_group_integers: bool = True,
    ) -> None:
        frame = frame_of(table, time_zone)
        self._detach = hasattr(frame.iloc[0:0], "_is_copy")
        self._starts = np.asarray(starts[:-1], dtype=np.int64)
        self._ilocs = [frame.iloc]
        #: Per group: which frame its rows are cut from (0: as converted; 1: the fixable columns
        #: without nulls; -1: some of them fixed one by one, ``_fixes``).
        self._choice: dict[int, int] = {}
        self._fixes: list[tuple[int, Any, np.ndarray]] = []
        clean_in: list[np.ndarray] = []
        filled = table
        for i, field in enumerate(table.schema):
            col = table.column(i)
            if not _null_sensitive(field.type) or col.null_count == 0 or not len(self._starts):
                continue
            if pa.types.is_integer(field.type) and not per_group_integers:
                continue
            nulls = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=np.int64)
            clean = np.add.reduceat(nulls, self._starts) == 0
            if clean.any():
                clean_in.append(clean)
                dtype = pa.schema([field]).empty_table().to_pandas().dtypes.iloc[0]
                self._fixes.append((i, dtype, clean))
                filler = pa.scalar(False if pa.types.is_boolean(field.type) else 0, field.type)
                filled = filled.set_column(i, field, col.fill_null(filler))
        if clean_in:
            stacked = np.vstack(clean_in)
            choice = np.where(stacked.all(axis=0), 1, np.where(stacked.any(axis=0), -1, 0))
            self._choice = dict(zip(self._starts.tolist(), choice.tolist(), strict=True))
            # a group without nulls in those columns takes their values where they were filled
            self._ilocs.append(frame_of(filled, time_zone).iloc)

    def frame(self, start: int, end: int) -> Any:
        import pandas as pd

        choice = self._choice.get(start, 0) if self._choice else 0
        frame = self._ilocs[max(choice, 0)][start:end]
        frame.index = pd.RangeIndex(end - start)
        if self._detach:  # the user owns it: no SettingWithCopyWarning (groups never overlap)
            frame._is_copy = None
        if choice < 0:
            group = int(np.searchsorted(self._starts, start))
            for i, dtype, clean in self._fixes:
                if clean[group]:
                    frame.isetitem(i, frame.iloc[:, i].astype(dtype))
        return frame

    def iterators(self) -> Callable[[int, int], Iterator[Any]]:
        """``data(start, end)``: an iterator of the group's one DataFrame."""
        cut = self.frame
        return lambda start, end: iter((cut(start, end),))


def rebuilt_from_rows(frame: Any) -> Any:
    """``frame`` as ``transformWithStateInPandas`` rebuilds it from its rows
    (``DataFrame(list(frame.itertuples(index=False)))``), without a Python step per row."""
    import pandas as pd

    names = [str(c) for c in frame.columns]
    renamed = _namedtuple_names(names)
    changes: dict[int, Any] = {}
    for i, dtype in enumerate(frame.dtypes):
        kind = getattr(dtype, "kind", "O")
        if kind in "iu" and dtype != np.int64:
            changes[i] = np.int64
        elif kind == "f" and dtype != np.float64:
            changes[i] = np.float64
    if not changes and renamed == names:
        return frame
    frame = frame.copy(deep=False)
    for i, dtype in changes.items():
        frame.isetitem(i, frame.iloc[:, i].astype(dtype))
    frame.columns = pd.Index(renamed, dtype=object)
    return frame


def _namedtuple_names(names: list[str]) -> list[str]:
    """The field names ``collections.namedtuple(..., rename=True)`` gives (``itertuples``)."""
    seen: set[str] = set()
    out = []
    for i, name in enumerate(names):
        bad = not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_")
        out.append(f"_{i}" if bad or name in seen else name)
        seen.add(name)
    return out


def empty_timed_out_frame(names: Sequence[str]) -> Any:
    """The frame a timed-out key gets in ``applyInPandasWithState``: no rows, object columns."""
    import pandas as pd

    return pd.DataFrame(columns=list(names))


def to_utc(series: Any, time_zone: str) -> Any:
    """A returned timestamp column as UTC instants: naive values are wall clock in
    ``time_zone`` (a clock that falls back takes standard time, as PySpark does)."""
    dtype = series.dtype
    if getattr(dtype, "kind", "O") != "M":
        return series
    if getattr(dtype, "tz", None) is None:
        return series.dt.tz_localize(time_zone, ambiguous=False).dt.tz_convert("UTC")
    return series.dt.tz_convert("UTC")


def state_wall_clock(value: Any, time_zone: str) -> Any:
    """A stored timestamp (an aware ``datetime``) as ``applyInPandasWithState``'s state gives
    it: a naive ``datetime``, the wall clock in ``time_zone``."""
    import pandas as pd

    if value is None:
        return None
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts
    return ts.tz_convert(time_zone).tz_localize(None).to_pydatetime()


def state_instant(value: Any, time_zone: str) -> Any:
    """A timestamp a function put in ``applyInPandasWithState``'s state, as an aware
    ``datetime`` to store: a naive one is wall clock in ``time_zone``."""
    import pandas as pd

    if not isinstance(value, datetime.datetime | np.datetime64):
        return value  # the codec says what else it takes
    ts = pd.Timestamp(value)
    if ts.tzinfo is None:
        ts = ts.tz_localize(time_zone, ambiguous=False, nonexistent="shift_forward")
    return ts.tz_convert("UTC").to_pydatetime()
