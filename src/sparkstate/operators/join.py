"""Stream-stream join: both sides' rows wait in state until the watermark says they can no
longer match, as in Spark's ``StreamingSymmetricHashJoinExec``.

The input is one stream of both sides (a tagged union): a side column (``0`` left, ``1`` right),
the equi-join key columns, and each side's columns (null on the other side's rows). The engine
shuffles it by the key, so a partition holds both sides' state for its keys.

Per batch, in Spark's order: the left input joins the right state and joins the left state;
then the right input joins the left state (the new left rows included) and joins the right
state. A pair joins when the keys are equal and ``condition`` holds. Then each side's rows at or
below its state watermark are evicted; an outer side emits its evicted rows that never matched,
with nulls for the other side. A left semi join emits a left row once, at its first match.

State per side: a column family keyed by the join key whose value holds the key's rows as one
list per column, plus a ``matched`` flag per row; an ``(event time, key)`` index per side whose
state is evicted, so eviction is one range scan; a row count per side.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import is_late, max_event_time_ms, to_epoch_micros
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.operators.ts_index import MARKER, MARKER_SCHEMA, TS_SCHEMA, index_key_schema
from sparkstate.operators.ts_index import encode_ts as _ts_prefix
from sparkstate.store.base import DEFAULT_CF, ColumnFamily, StateStore
from sparkstate.store.codec import KeyCodec, ValueCodec
from sparkstate.store.schema_json import schema_to_json

__all__ = [
    "COUNT_FAMILY",
    "JOIN_TYPES",
    "MATCHED",
    "SIDE_FAMILIES",
    "JoinSide",
    "StreamingJoin",
    "read_counts",
    "recount",
    "unpack_rows",
]

#: Spark's names of the join types a stream-stream join supports.
JOIN_TYPES = ("inner", "leftOuter", "rightOuter", "fullOuter", "leftSemi")
SIDE_COLUMN = "__ss_side"
MATCHED = "__ss_matched"
_COUNT_SCHEMA = pa.schema([pa.field("rows", pa.int64(), nullable=False)])
_COUNT_KEY_SCHEMA = pa.schema([pa.field("side", pa.int8(), nullable=False)])
_COUNT_CF = "$rows"
_ROW = "__ss_row"  # position of a row in its side's input or state table
_OTHER = "__ss_other"


@dataclasses.dataclass(frozen=True)
class JoinSide:
    """One side of the join as the operator sees it.

    ``fields`` are its columns in the input (and output) batches. ``event_time`` is the column
    of its watermark: its rows at or below the previous batch's watermark are late and dropped,
    and its largest time is reported as the input ``name``. ``state_time`` is the column whose
    value says when a stored row can no longer match: it is evicted once that value is at or
    below the batch's watermark minus ``state_offset_ms`` (None: kept forever).
    """

    name: str
    fields: tuple[pa.Field, ...]
    event_time: str | None = None
    state_time: str | None = None
    state_offset_ms: int = 0
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


class StreamingJoin(StatefulOperator):
    """``left.join(right, condition, how)`` over two streams, state in the store."""

    kind: ClassVar[str] = "join"
    progress_name: ClassVar[str] = "symmetricHashJoin"
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append",)

    def __init__(
        self,
        join_type: str,
        key_fields: list[pa.Field],
        left: JoinSide,
        right: JoinSide,
        condition: pc.Expression | None = None,
        column_names: dict[str, str] | None = None,
    ) -> None:
        if join_type not in JOIN_TYPES:
            msg = f"join type must be one of {JOIN_TYPES}, got {join_type!r}"
            raise ConfigurationError(msg)
        names = [f.name for f in key_fields] + left.names + right.names
        if len(set(names)) != len(names) or SIDE_COLUMN in names:
            msg = f"join: key and side columns must have distinct names, got {names}"
            raise ConfigurationError(msg)
        for side in (left, right):
            for col in (side.event_time, side.state_time):
                if col is not None and col not in side.names:
                    msg = f"join: {side.name} side has no column {col!r} ({side.names})"
                    raise ConfigurationError(msg)
        self.join_type = join_type
        self.left, self.right = left, right
        self.condition = condition
        #: The query's names of the key and side columns, by their names here (for readers).
        self.column_names = dict(column_names or {})
        self.key_schema = pa.schema([f.with_nullable(True) for f in key_fields])
        nullable = [f.with_nullable(True) for f in (*left.fields, *right.fields)]
        self.input_schema = pa.schema(
            [pa.field(SIDE_COLUMN, pa.int8(), nullable=False), *self.key_schema, *nullable]
        )
        self.value_schema = ROWS_SCHEMA
        self._rows = {"left": _row_schema(left), "right": _row_schema(right)}
        if join_type == "leftSemi":
            self.output_schema = pa.schema(left.fields)
        else:
            self.output_schema = pa.schema(
                [
                    *(f.with_nullable(f.nullable or join_type in ("rightOuter", "fullOuter"))
                      for f in left.fields),
                    *(f.with_nullable(f.nullable or join_type in ("leftOuter", "fullOuter"))
                      for f in right.fields),
                ]
            )  # fmt: skip

    def column_families(self) -> dict[str, tuple[pa.Schema, pa.Schema]]:
        out = {
            "right": (self.key_schema, ROWS_SCHEMA),
            _COUNT_CF: (_COUNT_KEY_SCHEMA, _COUNT_SCHEMA),
        }
        for side in (self.left, self.right):
            if side.state_time is not None:
                out[f"{side.name}$time"] = (index_key_schema(self.key_schema), MARKER_SCHEMA)
        return out

    def time_trigger(self) -> str | None:
        evicts = self.left.state_time is not None or self.right.state_time is not None
        return "event" if evicts else None

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["join_type"] = self.join_type
        out["row_schemas"] = {name: schema_to_json(s) for name, s in self._rows.items()}
        if self.column_names:
            out["column_names"] = self.column_names
        return out

    # --- processing ------------------------------------------------------------------------------

    def process(
        self, store: StateStore, batches: Iterator[pa.RecordBatch], ctx: BatchContext
    ) -> Iterator[pa.RecordBatch]:
        m = ctx.metrics
        started = time.perf_counter()
        received = [b for b in batches if b.num_rows]
        table = (
            pa.Table.from_batches(received).combine_chunks()
            if received
            else self.input_schema.empty_table()
        )
        m.num_input_rows += table.num_rows
        side = table.column(SIDE_COLUMN)
        states = {
            "left": _SideState(store, SIDE_FAMILIES["left"], self.left),
            "right": _SideState(store, SIDE_FAMILIES["right"], self.right),
        }
        counts = read_counts(store)
        out: list[pa.RecordBatch] = []
        order = ((0, self.left, self.right), (1, self.right, self.left))
        if self.join_type == "leftSemi":  # Spark 4.3 runs the right input first (SPARK-55973)
            order = order[::-1]
        for code, this, other in order:
            rows = table.filter(pc.equal(side, code)).select([*self.key_schema.names, *this.names])
            rows = self._drop_late(self._drop_null_keys(rows, this), this, ctx)
            rows, at_once = self._pre_join(rows, this)
            out.extend(at_once)
            if rows.num_rows == 0:
                continue
            joined, stored = self._join_input(rows, this, other, states, ctx)
            out.extend(joined)
            counts[this.name] += stored
            m.num_rows_updated += stored
            _count(m, this.name, "NumRowsUpdated", stored)
        m.all_updates_time_ms += int((time.perf_counter() - started) * 1000)
        for batch in out:
            m.num_output_rows += batch.num_rows
            yield batch
        started = time.perf_counter()
        for this in (self.left, self.right):
            state = states[this.name]
            for batch, removed in self._evict(state, ctx):
                counts[this.name] -= removed
                m.num_rows_removed += removed
                _count(m, this.name, "NumRowsRemoved", removed)
                if batch is not None and batch.num_rows:
                    m.num_output_rows += batch.num_rows
                    yield batch
        for name, state in states.items():
            counts[name] -= state.taken
            m.num_rows_removed += state.taken
            _count(m, name, "NumRowsRemoved", state.taken)
            state.flush()
        _write_counts(store, counts)
        m.num_rows_total = (m.num_rows_total or 0) + counts["left"] + counts["right"]
        # Rows of a side no watermark evicts: its state only grows (an inner join without
        # watermarks, as in Spark); said in the progress, where Spark says nothing.
        forever = sum(counts[s.name] for s in (self.left, self.right) if s.state_time is None)
        _count(m, "num", "RowsNeverEvicted", forever)
        for name, rows in counts.items():  # each side's share of Spark's fields
            _count(m, name, "NumRowsTotal", rows)
        m.all_removals_time_ms += int((time.perf_counter() - started) * 1000)

    def _preserves(self, side: JoinSide) -> bool:
        """Whether the join emits ``side``'s unmatched rows (with nulls for the other side)."""
        if side is self.left:
            return self.join_type in ("leftOuter", "fullOuter")
        return self.join_type in ("rightOuter", "fullOuter")

    def _drop_null_keys(self, rows: pa.Table, side: JoinSide) -> pa.Table:
        """Without the rows whose key has a null where Spark's optimizer filters them out before
        the join (and before its watermark sees them): every side but an outer join's preserved
        one."""
        if self.join_type == "fullOuter" or self._preserves(side):
            return rows
        nulls = _any_null(rows.select(self.key_schema.names))
        return rows.filter(pa.array(~nulls)) if nulls.any() else rows

    def _pre_join(self, rows: pa.Table, side: JoinSide) -> tuple[pa.Table, list[pa.RecordBatch]]:
        """The rows that pass the side's own conjuncts; a preserved side's rows that fail them
        are emitted at once with nulls."""
        out: list[pa.RecordBatch] = []
        if side.only is not None and rows.num_rows:
            ok = _holds(rows, side.only)
            if not ok.all():
                if self._preserves(side):
                    out.append(self._with_nulls(side, rows.filter(pa.array(~ok))))
                rows = rows.filter(pa.array(ok))
        return rows, out

    def _with_nulls(self, side: JoinSide, rows: pa.Table) -> pa.RecordBatch:
        """Output rows of ``side``'s ``rows`` with nulls for the other side's columns."""
        nulls_for = self.right if side is self.left else self.left
        filler = pa.table({f.name: pa.nulls(rows.num_rows, f.type) for f in nulls_for.fields})
        return self._pairs(rows, filler) if side is self.left else self._pairs(filler, rows)

    def _drop_late(self, rows: pa.Table, side: JoinSide, ctx: BatchContext) -> pa.Table:
        """Observe the side's event time, then drop its rows at or below the previous batch's
        watermark (counted)."""
        if side.event_time is None:
            return rows
        times = rows.column(side.event_time)
        ctx.metrics.observe_input_event_time(side.name, max_event_time_ms(times))
        late = is_late(times, ctx.watermark_for_late_rows_ms)
        dropped = int(pc.sum(late).as_py() or 0)
        if not dropped:
            return rows
        ctx.metrics.num_rows_dropped_by_watermark += dropped
        return rows.filter(pc.invert(late))

    def _join_input(
        self,
        rows: pa.Table,
        this: JoinSide,
        other: JoinSide,
        states: dict[str, _SideState],
        ctx: BatchContext,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Join one side's input with the other side's state, then with this side's state for
        later input; returns the joined rows and how many rows were stored."""
        mine, theirs = states[this.name], states[other.name]
        kencs = mine.key_codec.encode_many(rows.select(self.key_schema.names))
        kids = theirs.ids(kencs)  # the other side's rows of these keys, loaded
        pairs_this, pairs_other = self._match(rows, kids, theirs, this, other)
        semi = self.join_type == "leftSemi"
        if not (semi and this is self.right):
            theirs.mark_matched(pairs_other)
        matched = np.zeros(rows.num_rows, bool)
        matched[pairs_this] = True
        out: list[pa.RecordBatch] = []
        if semi and this is self.left:
            first = np.unique(pairs_this)
            if len(first):
                out.append(
                    _batch(rows.take(pa.array(first)).select(this.names), self.output_schema)
                )
        elif semi:
            # Right input: the stored left rows it matches are emitted, and leave the state.
            fresh = theirs.take(pairs_other)
            if fresh.num_rows:
                out.append(_batch(fresh.select(other.names), self.output_schema))
        elif len(pairs_this):
            mine_rows = rows.take(pa.array(pairs_this))
            their_rows = theirs.table.take(pa.array(pairs_other))
            left_rows, right_rows = (
                (mine_rows, their_rows) if this is self.left else (their_rows, mine_rows)
            )
            out.append(self._pairs(left_rows, right_rows))
        # Store this side's input rows (Spark's rules): a left row always, even one the
        # eviction below removes again (so that an outer join emits it); a right row unless the
        # watermark already passes it, or it is an outer side's row that matched nothing.
        keep = np.ones(rows.num_rows, bool)
        if semi and this is self.left:
            keep &= ~matched  # emitted already: nothing more to say about it
        state_wm = this.state_watermark_us(ctx.watermark_ms)
        if this is self.right and state_wm is not None and this.state_time is not None:
            t = to_epoch_micros(rows.column(this.state_time))
            expired = np.asarray(pc.fill_null(pc.less_equal(t, state_wm), False), bool)
            if self._preserves(this):
                expired &= matched
            keep &= ~expired
        stored = int(keep.sum())
        if stored:
            idx = np.flatnonzero(keep)
            own = mine.ids([kencs[i] for i in idx.tolist()])  # loads this side's rows too
            mine.append(own, rows.take(pa.array(idx)).select(this.names), matched[idx])
        return out, stored

    def _match(
        self,
        rows: pa.Table,
        kids: np.ndarray,
        theirs: _SideState,
        this: JoinSide,
        other: JoinSide,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (input row, the other side's state row) with equal keys for which the
        condition holds. A null key equals a null key here, as in Spark's state (rows with null
        keys reach the join only in a full outer join, where Spark infers no not-null filter)."""
        candidates = theirs.rows_of(np.unique(kids))
        if not len(candidates) or rows.num_rows == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        probe = pa.table({"id": kids, _ROW: np.arange(rows.num_rows)})
        build = pa.table({"id": theirs.kid[candidates], _OTHER: candidates})
        pairs = probe.join(build, "id", join_type="inner", use_threads=False)
        this_idx = np.asarray(pairs.column(_ROW), np.int64)
        other_idx = np.asarray(pairs.column(_OTHER), np.int64)
        if self.condition is not None and len(this_idx):
            a = rows.take(pa.array(this_idx)).select(this.names)
            b = theirs.table.take(pa.array(other_idx)).select(other.names)
            both = pa.Table.from_arrays(
                [*a.columns, *b.columns], names=[*a.column_names, *b.column_names]
            )
            ok = _holds(both, self.condition)
            this_idx, other_idx = this_idx[ok], other_idx[ok]
        return this_idx, other_idx

    def _pairs(self, left_rows: pa.Table, right_rows: pa.Table) -> pa.RecordBatch:
        cols = [
            *left_rows.select(self.left.names).columns,
            *right_rows.select(self.right.names).columns,
        ]
        return _batch(pa.Table.from_arrays(cols, schema=self.output_schema), self.output_schema)

    def _evict(
        self, state: _SideState, ctx: BatchContext
    ) -> Iterator[tuple[pa.RecordBatch | None, int]]:
        side = state.side
        state_wm = side.state_watermark_us(ctx.watermark_ms)
        if state_wm is None:
            return
        gone = state.evict(state_wm)
        if gone is None:
            return
        removed, unmatched = gone
        if not self._preserves(side) or unmatched.num_rows == 0:
            yield None, removed
            return
        yield self._with_nulls(side, unmatched), removed


def _count(m: Any, prefix: str, name: str, n: int) -> None:
    """Add ``n`` to the operator's own metric ``prefix + name`` (``leftNumRowsTotal``, ...)."""
    key = prefix + name
    m.custom[key] = m.custom.get(key, 0) + n


def _holds(table: pa.Table, condition: pc.Expression) -> np.ndarray:
    """Per row of ``table``, whether ``condition`` is true (null counts as false)."""
    marked = table.append_column(_ROW, pa.array(np.arange(table.num_rows)))
    kept = marked.filter(condition)
    ok = np.zeros(table.num_rows, bool)
    ok[np.asarray(kept.column(_ROW), np.int64)] = True
    return ok


def _any_null(keys: pa.Table) -> np.ndarray:
    out = np.zeros(keys.num_rows, bool)
    for col in keys.columns:
        if col.null_count:
            out |= np.asarray(col.is_null(), bool)
    return out


#: The state value of a join key on one side: its rows, each a value-codec row of the side's
#: columns and the matched flag, after its length (uint32 little-endian).
ROWS_SCHEMA = pa.schema([pa.field("rows", pa.binary(), nullable=False)])
_LEN = struct.Struct("<I")
_TS_CODEC = KeyCodec(TS_SCHEMA)


def _row_schema(side: JoinSide) -> pa.Schema:
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


def _batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    cols = []
    for f in schema:
        col = table.column(f.name)
        if col.type != f.type:
            col = col.cast(f.type)
        cols.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


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
    count_family = ColumnFamily(_COUNT_CF, _COUNT_KEY_SCHEMA, _COUNT_SCHEMA)
    out_keys, out_values = [], []
    for code, (_, family) in enumerate(SIDE_FAMILIES.items()):
        blobs = values.filter(pc.equal(families, family)).to_pylist()
        packed = [row[0] for row in codec.decode_many(blobs) if row is not None]
        rows = len(unpack_rows(packed)[0])
        out_keys.append(count_family.physical_key((code,)))
        out_values.append(count_family.value_codec.encode((rows,)))
    return pa.array(out_keys, pa.binary()), pa.array(out_values, pa.binary())


def _write_counts(store: StateStore, counts: dict[str, int]) -> None:
    for name, code in (("left", 0), ("right", 1)):
        store.put((code,), (counts[name],), _COUNT_CF)


class _SideState:
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
        self.row_codec = ValueCodec(_row_schema(side))
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
        for kencs, _ in self.store.range_scan_encoded_chunks(None, end, self.index_cf):
            doomed_index.extend(kencs)
        if not doomed_index:
            return None
        kids = np.unique(self.ids([k[width:] for k in doomed_index]))
        idx = self.rows_of(kids)
        times = to_epoch_micros(self.table.column(self.side.state_time).take(pa.array(idx)))
        gone = idx[np.asarray(pc.fill_null(pc.less_equal(times, state_wm_us), False), bool)]
        self.alive[gone] = False
        self.dirty.update(np.unique(self.kid[gone]).tolist())
        self.store.remove_encoded_many(doomed_index, self.index_cf)
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
