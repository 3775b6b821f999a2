"""A stream-stream join's state: each side's rows under their join key, packed in one value per
key with a ``matched`` flag per row, a row count per side, a batch's view of one side's rows
(:class:`SideState`) that loads each key once and writes the changed keys back once, and the
reader's view of a side (:class:`JoinSideView`).
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import to_epoch_micros
from sparkstate.operators.state_views import StateView, as_struct
from sparkstate.operators.ts_index import MARKER, TS_SCHEMA, index_entries
from sparkstate.operators.ts_index import encode_ts as _ts_prefix
from sparkstate.store.base import DEFAULT_CF, StateStore
from sparkstate.store.codec import KeyCodec, ValueCodec
from sparkstate.store.families import ColumnFamily
from sparkstate.store.schema_json import schema_from_json

__all__ = [
    "COUNT_FAMILY",
    "COUNT_KEY_SCHEMA",
    "COUNT_SCHEMA",
    "MATCHED",
    "ROWS_SCHEMA",
    "SIDE_FAMILIES",
    "JoinSide",
    "JoinSideView",
    "SideState",
    "read_counts",
    "recount",
    "row_schema",
    "side_rows_state",
    "side_view",
    "unpack_rows",
    "write_counts",
]

MATCHED = "__ss_matched"
COUNT_SCHEMA = pa.schema([pa.field("rows", pa.int64(), nullable=False)])
COUNT_KEY_SCHEMA = pa.schema([pa.field("side", pa.int8(), nullable=False)])
_COUNT_CF = "$rows"


@dataclasses.dataclass(frozen=True)
class JoinSide:
    """One side of the join as the operator sees it.

    ``fields`` are its columns in the input (and output) batches. ``event_time`` is the column
    of its watermark: its rows at or below the previous batch's watermark are late and dropped,
    and its largest time is reported as the input ``name`` (``late_time``, where given, is the
    column that says which rows are late instead: a window of the side's time whose time itself
    was projected away, as Spark's join reads the window). ``state_time`` is the column whose
    value says when a stored row can no longer match: it is evicted once that value is at or
    below the batch's watermark minus ``state_offset_ms`` (None: kept forever).
    """

    name: str
    fields: tuple[pa.Field, ...]
    event_time: str | None = None
    state_time: str | None = None
    state_offset_ms: int = 0
    late_time: str | None = None
    #: The conjuncts of the condition over this side's columns alone: a row that fails them
    #: joins nothing (an outer side emits it at once with nulls; Spark's ``preJoinFilter``).
    only: pc.Expression | None = None

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def state_watermark_us(self, watermark_ms: int) -> int | None:
        """Rows whose state time is at or below this (microseconds) are evicted; None: none."""
        if self.state_time is None or watermark_ms <= 0:
            return None
        return (watermark_ms - self.state_offset_ms) * 1000


#: The state value of a join key on one side: its rows, each a value-codec row of the side's
#: columns and the matched flag, after its length (uint32 little-endian).
ROWS_SCHEMA = pa.schema([pa.field("rows", pa.binary(), nullable=False)])
_LEN = struct.Struct("<I")
_TS_CODEC = KeyCodec(TS_SCHEMA)


def row_schema(side: JoinSide) -> pa.Schema:
    return pa.schema([*(f.with_nullable(True) for f in side.fields), pa.field(MATCHED, pa.bool_())])


def _pack(rows: list[bytes], counts: list[int]) -> list[bytes]:
    """Per key, its ``counts[i]`` rows (in order) as one value."""
    out, pos, pack = [], 0, _LEN.pack
    for n in counts:
        out.append(b"".join(pack(len(r)) + r for r in rows[pos : pos + n]))
        pos += n
    return out


def unpack_rows(values: list[bytes]) -> tuple[list[bytes], list[int]]:
    """The rows of packed values, and the index of the value each came from."""
    rows: list[bytes] = []
    parents: list[int] = []
    unpack = _LEN.unpack_from
    for i, v in enumerate(values):
        pos, end = 0, len(v)
        while pos < end:
            (n,) = unpack(v, pos)
            rows.append(v[pos + 4 : pos + 4 + n])
            parents.append(i)
            pos += 4 + n
    return rows, parents


def read_counts(store: StateStore) -> dict[str, int]:
    out = {}
    for name, code in (("left", 0), ("right", 1)):
        row = store.get((code,), _COUNT_CF)
        out[name] = int(row[0]) if row is not None else 0
    return out


#: The column family of each side's row count in a partition: not per key, so a rescale does
#: not split it but counts the rows each new partition receives (:func:`recount`).
COUNT_FAMILY = _COUNT_CF
#: The column family of each side's rows, by side.
SIDE_FAMILIES = {"left": DEFAULT_CF, "right": "right"}


def recount(families: pa.Array, keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The :data:`COUNT_FAMILY` entries (physical keys and values) of a partition whose state
    is the physical ``keys`` and ``values`` of the column families named in ``families``: each
    side's rows, counted from its family's values (a key's rows in one value)."""
    codec = ValueCodec(ROWS_SCHEMA)
    count_family = ColumnFamily(_COUNT_CF, COUNT_KEY_SCHEMA, COUNT_SCHEMA)
    out_keys, out_values = [], []
    for code, (_, family) in enumerate(SIDE_FAMILIES.items()):
        blobs = values.filter(pc.equal(families, family)).to_pylist()
        packed = [row[0] for row in codec.decode_many(blobs) if row is not None]
        rows = len(unpack_rows(packed)[0])
        out_keys.append(count_family.physical_key((code,)))
        out_values.append(count_family.value_codec.encode((rows,)))
    return pa.array(out_keys, pa.binary()), pa.array(out_values, pa.binary())


def side_rows_state(
    side: JoinSide, keys: pa.Table, rows: pa.Table, matched: pa.Array, index: pa.Array
) -> dict[str, tuple[pa.Table, pa.Table]]:
    """One side's state made of its rows, one per row Spark kept: the side's column family
    (each join key's rows, in the order of their ``index`` under it, with their ``matched``
    flags) and its time index (where its rows are evicted), as tables of their schemas."""
    key_schema = keys.schema
    family = ColumnFamily(SIDE_FAMILIES[side.name], key_schema, ROWS_SCHEMA)
    encoded = family.key_codec.encode_many_arrow(keys)
    groups = np.asarray(pc.dictionary_encode(encoded).indices, np.int64)
    order = np.lexsort((np.asarray(index.fill_null(0), np.int64), groups))
    counts = np.bincount(groups, minlength=int(groups.max()) + 1 if len(groups) else 0)
    firsts = order[np.r_[0, np.cumsum(counts)[:-1]]] if len(counts) else order[:0]
    flagged = rows.take(pa.array(order)).append_column(
        MATCHED, matched.take(pa.array(order)).fill_null(False)
    )
    packed = _pack(ValueCodec(row_schema(side)).encode_many(flagged), counts.tolist())
    out = {
        family.name: (
            keys.take(pa.array(firsts)),
            pa.table({"rows": pa.array(packed, pa.binary())}, schema=ROWS_SCHEMA),
        )
    }
    if side.state_time is not None:
        times = to_epoch_micros(rows.column(side.state_time))
        out[f"{side.name}$time"] = index_entries(times, keys)
    return out


def write_counts(store: StateStore, counts: dict[str, int]) -> None:
    for name, code in (("left", 0), ("right", 1)):
        store.put((code,), (counts[name],), _COUNT_CF)


class SideState:
    """One side's rows in state during a batch, in whole arrays: the rows of the keys loaded so
    far (each key loaded once, by one multi-get), a key id per row, a matched flag and whether
    the row is still there; the keys whose rows changed are written back once, at the end."""

    def __init__(self, store: StateStore, cf: str, side: JoinSide) -> None:
        self.store = store
        self.fam = store.column_family(cf)
        self.key_codec = self.fam.key_codec
        self.side = side
        self.index_cf = f"{side.name}$time" if side.state_time is not None else None
        self.schema = pa.schema([f.with_nullable(True) for f in side.fields])
        self.row_codec = ValueCodec(row_schema(side))
        #: Encoded key -> key id, and back.
        self.kid_of: dict[bytes, int] = {}
        self.keys: list[bytes] = []
        self._chunks: list[pa.Table] = []
        self._table: pa.Table | None = self.schema.empty_table()
        self.kid = np.zeros(0, np.int64)
        self.matched = np.zeros(0, bool)
        self.alive = np.zeros(0, bool)
        self.dirty: set[int] = set()
        self.index_puts: set[bytes] = set()
        #: Rows that left the state at a match (a left semi join's).
        self.taken = 0

    @property
    def table(self) -> pa.Table:
        """Every loaded or added row (removed ones too; see ``alive``)."""
        if self._table is None:
            self._table = pa.concat_tables(self._chunks).combine_chunks()
            self._chunks = [self._table]
        return self._table

    def _add(self, rows: pa.Table, kids: np.ndarray, matched: np.ndarray) -> None:
        self._chunks.append(pa.Table.from_arrays(rows.columns, schema=self.schema))
        self._table = None
        self.kid = np.concatenate([self.kid, kids])
        self.matched = np.concatenate([self.matched, matched])
        self.alive = np.concatenate([self.alive, np.ones(len(kids), bool)])

    def ids(self, kencs: list[bytes]) -> np.ndarray:
        """The key id of each encoded key, its stored rows loaded the first time it is seen."""
        kid_of = self.kid_of
        fresh = [k for k in dict.fromkeys(kencs) if k not in kid_of]
        if fresh:
            first = len(self.keys)
            for i, k in enumerate(fresh):
                kid_of[k] = first + i
            self.keys.extend(fresh)
            raws = self.store.get_encoded_many(fresh, self.fam.name)
            found = [i for i, r in enumerate(raws) if r is not None]
            if found:
                packed, _ = self.fam.value_codec.decode_many_arrow([raws[i] for i in found])
                row_bytes, parents = unpack_rows(packed.column("rows").to_pylist())
                rows, _ = self.row_codec.decode_many_arrow(row_bytes)
                kids = (first + np.asarray(found, np.int64))[np.asarray(parents, np.int64)]
                flags = np.asarray(rows.column(MATCHED).fill_null(False), bool)
                self._add(rows.select(self.schema.names), kids, flags)
        return np.fromiter((kid_of[k] for k in kencs), np.int64, len(kencs))

    def rows_of(self, kids: np.ndarray) -> np.ndarray:
        """Positions of the rows still there whose key id is among ``kids``."""
        if not len(self.kid):
            return np.zeros(0, np.int64)
        return np.flatnonzero(self.alive & np.isin(self.kid, kids))

    def mark_matched(self, idx: np.ndarray) -> None:
        fresh = idx[~self.matched[idx]]
        if len(fresh):
            self.matched[fresh] = True
            self.dirty.update(np.unique(self.kid[fresh]).tolist())

    def take(self, idx: np.ndarray) -> pa.Table:
        """(Left semi) the rows at ``idx`` (each once): they leave the state."""
        idx = np.unique(idx)
        self.alive[idx] = False
        self.dirty.update(np.unique(self.kid[idx]).tolist())
        self.taken += len(idx)
        return self.table.take(pa.array(idx))

    def append(self, kids: np.ndarray, rows: pa.Table, matched: np.ndarray) -> None:
        self._add(rows.select(self.schema.names), kids, matched)
        self.dirty.update(np.unique(kids).tolist())
        if self.index_cf is not None:
            assert self.side.state_time is not None
            times = to_epoch_micros(rows.column(self.side.state_time))
            present = np.asarray(times.is_valid(), bool)
            if present.any():
                stamps = _TS_CODEC.encode_many(pa.table({"ts_ms": times.filter(present)}))
                keys = self.keys
                self.index_puts.update(
                    map(bytes.__add__, stamps, [keys[k] for k in kids[present].tolist()])
                )

    def evict(self, state_wm_us: int) -> tuple[int, pa.Table] | None:
        """Remove the rows whose state time is at or below ``state_wm_us``: (how many, those
        that never matched)."""
        assert self.index_cf is not None and self.side.state_time is not None
        self.flush_index()
        end = _ts_prefix(state_wm_us + 1)
        doomed_index: list[bytes] = []
        width = len(_ts_prefix(0))
        start = self.store.scan_start(None, self.index_cf)
        for kencs, _ in self.store.range_scan_encoded_chunks(start, end, self.index_cf):
            doomed_index.extend(kencs)
        if not doomed_index:
            self.store.mark_removed(None, end, self.index_cf)
            return None
        kids = np.unique(self.ids([k[width:] for k in doomed_index]))
        idx = self.rows_of(kids)
        times = to_epoch_micros(self.table.column(self.side.state_time).take(pa.array(idx)))
        gone = idx[np.asarray(pc.fill_null(pc.less_equal(times, state_wm_us), False), bool)]
        self.alive[gone] = False
        self.dirty.update(np.unique(self.kid[gone]).tolist())
        self.store.remove_encoded_many(doomed_index, self.index_cf)
        self.store.mark_removed(None, end, self.index_cf)
        unmatched = gone[~self.matched[gone]]
        return len(gone), self.table.take(pa.array(unmatched))

    def flush_index(self) -> None:
        if self.index_cf is not None and self.index_puts:
            keys = sorted(self.index_puts)
            self.store.put_encoded_many(keys, [MARKER] * len(keys), self.index_cf)
            self.index_puts.clear()

    def flush(self) -> None:
        """Write the changed keys back: each key's rows still there, as lists; a key without
        rows is removed."""
        self.flush_index()
        if not self.dirty:
            return
        dirty = np.fromiter(self.dirty, np.int64, len(self.dirty))
        idx = np.flatnonzero(self.alive & np.isin(self.kid, dirty))
        idx = idx[np.argsort(self.kid[idx], kind="stable")]
        kids = self.kid[idx]
        live, counts = np.unique(kids, return_counts=True)
        dead = np.setdiff1d(dirty, live)
        if len(live):
            rows = self.table.take(pa.array(idx)).append_column(
                MATCHED, pa.array(self.matched[idx])
            )
            packed = _pack(self.row_codec.encode_many(rows), counts.tolist())
            values = pa.table({"rows": pa.array(packed, pa.binary())}, schema=ROWS_SCHEMA)
            self.store.put_encoded_many(
                [self.keys[k] for k in live.tolist()],
                self.fam.value_codec.encode_many(values),
                self.fam.name,
            )
        if len(dead):
            self.store.remove_encoded_many([self.keys[k] for k in dead.tolist()], self.fam.name)
        self.dirty.clear()


class JoinSideView(StateView):
    """One side of a stream-stream join: one row per buffered input row, under its join key,
    in the query's column names (Spark's ``joinSide`` view)."""

    def __init__(
        self, family: str, key_schema: pa.Schema, row_schema: pa.Schema, names: dict[str, str]
    ) -> None:
        super().__init__(family)
        self.row_codec = ValueCodec(row_schema)
        #: The side's own columns (not the condition's helpers), as the query names them.
        self.columns = [f.name for f in row_schema if f.name in names]
        self.key_type = pa.struct([f.with_name(names.get(f.name, f.name)) for f in key_schema])
        self.value_type = pa.struct([row_schema.field(c).with_name(names[c]) for c in self.columns])

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field("key", self.key_type), pa.field("value", self.value_type)])

    def _rows_of(
        self, families: dict[str, ColumnFamily], values: Sequence[bytes | None]
    ) -> tuple[pa.Table, list[int]]:
        packed = [v[0] for v in families[self.family].value_codec.decode_many(values) if v]
        at = [i for i, v in enumerate(values) if v is not None]
        row_bytes, parents = unpack_rows(packed)
        rows, _ = self.row_codec.decode_many_arrow(row_bytes)
        return rows.select(self.columns), [at[p] for p in parents]

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        key_table = families[self.family].key_codec.decode_many_arrow(keys)
        key_array = as_struct(key_table.rename_columns([f.name for f in self.key_type]))
        rows, owners = self._rows_of(families, values)
        deleted = [i for i, v in enumerate(values) if v is None]
        key_rows = key_array.take(pa.array(owners + deleted, pa.int64()))
        value = pa.concat_arrays(
            [
                as_struct(rows.rename_columns([f.name for f in self.value_type])),
                pa.nulls(len(deleted), self.value_type),
            ]
        )
        return pa.Table.from_arrays([key_rows, value], schema=self.schema)

    def _change_kinds(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> list[str]:
        _, owners = self._rows_of(families, values)
        return ["update"] * len(owners) + ["delete"] * sum(v is None for v in values)


#: Spark's two stores of a join side's rows (its join state format 2), after the side's name.
KEY_TO_NUM_VALUES = "keyToNumValues"
KEY_WITH_INDEX_TO_VALUE = "keyWithIndexToValue"
#: The field of Spark's ``keyWithIndexToValue`` key beside the join key: a row's place under it.
INDEX = "index"


class SparkStoreView(JoinSideView):
    """One of Spark's stores of a join side, made from the side's rows (``storeName``
    ``left-keyToNumValues`` and the like): ``keyToNumValues``, each join key and its count of
    rows; ``keyWithIndexToValue``, each row under its join key and its place there (``index``),
    with its ``matched`` flag."""

    def __init__(
        self,
        family: str,
        key_schema: pa.Schema,
        row_schema: pa.Schema,
        names: dict[str, str],
        store: str,
    ) -> None:
        super().__init__(family, key_schema, row_schema, names)
        self.store = store
        self.join_key_type = self.key_type
        if store == KEY_TO_NUM_VALUES:
            self.value_type = pa.struct([pa.field("value", pa.int64())])
        else:
            self.key_type = pa.struct([*self.key_type, pa.field(INDEX, pa.int64())])
            self.value_type = pa.struct([*self.value_type, pa.field("matched", pa.bool_())])

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        key_table = families[self.family].key_codec.decode_many_arrow(keys)
        key_array = as_struct(key_table.rename_columns([f.name for f in self.join_key_type]))
        packed = [v[0] for v in families[self.family].value_codec.decode_many(values) if v]
        at = np.array([i for i, v in enumerate(values) if v is not None], np.int64)
        deleted = [i for i, v in enumerate(values) if v is None]
        row_bytes, parents = unpack_rows(packed)
        owners = at[np.asarray(parents, np.int64)] if parents else np.zeros(0, np.int64)
        if self.store == KEY_TO_NUM_VALUES:
            counts = np.bincount(np.asarray(parents, np.int64), minlength=len(packed))
            shown_keys = key_array.take(pa.array(np.r_[at, deleted].astype(np.int64)))
            value = pa.StructArray.from_arrays(
                [pa.array(np.r_[counts, np.zeros(len(deleted))].astype(np.int64))],
                fields=list(self.value_type),
                mask=pa.array([False] * len(at) + [True] * len(deleted)),
            )
            return pa.Table.from_arrays([shown_keys, value], schema=self.schema)
        rows, _ = self.row_codec.decode_many_arrow(row_bytes)
        p = np.asarray(parents, np.int64)
        starts = np.r_[0, np.flatnonzero(np.diff(p)) + 1] if len(p) else np.zeros(0, np.int64)
        index = np.arange(len(p)) - np.repeat(starts, np.diff(np.r_[starts, len(p)]))
        own = key_array.take(pa.array(np.r_[owners, deleted].astype(np.int64)))
        join_key = [own.field(i) for i in range(own.type.num_fields)]
        index_column = pa.array(np.r_[index, np.zeros(len(deleted))].astype(np.int64))
        shown_key = pa.StructArray.from_arrays(
            [*join_key, index_column], fields=list(self.key_type)
        )
        columns = [rows.column(c).combine_chunks() for c in [*self.columns, MATCHED]]
        value = pa.concat_arrays(
            [
                pa.StructArray.from_arrays(columns, fields=list(self.value_type)),
                pa.nulls(len(deleted), self.value_type),
            ]
        )
        return pa.Table.from_arrays([shown_key, value], schema=self.schema)


def side_view(
    described: dict[str, Any],
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    side: str | None,
    store: str | None = None,
) -> JoinSideView:
    """The view of one side's rows (``side``: the reader's ``joinSide``), or of one of Spark's
    stores of them (``store``: ``keyToNumValues`` or ``keyWithIndexToValue``)."""
    if side not in SIDE_FAMILIES:
        msg = (
            "a stream-stream join keeps the rows of both sides: pick one with "
            ".option('joinSide', 'left') or 'right'"
        )
        raise ConfigurationError(msg)
    family = SIDE_FAMILIES[side]
    row_schema = schema_from_json(described["row_schemas"][side])
    names = described.get("column_names") or {
        f.name: f.name for f in row_schema if re.fullmatch(r"__ss_[lr]\d+(_\d+)?", f.name)
    }
    if store is not None:
        return SparkStoreView(family, families[family][0], row_schema, names, store)
    return JoinSideView(family, families[family][0], row_schema, names)
