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
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import is_late, max_event_time_ms, to_epoch_micros
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.operators.ts_index import MARKER, MARKER_SCHEMA, index_key_schema
from sparkstate.store.base import StateStore

__all__ = ["JOIN_TYPES", "JoinSide", "StreamingJoin"]

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
        self.key_schema = pa.schema([f.with_nullable(True) for f in key_fields])
        nullable = [f.with_nullable(True) for f in (*left.fields, *right.fields)]
        self.input_schema = pa.schema(
            [pa.field(SIDE_COLUMN, pa.int8(), nullable=False), *self.key_schema, *nullable]
        )
        self.value_schema = _list_schema(left)
        self._right_values = _list_schema(right)
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
            "right": (self.key_schema, self._right_values),
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
        out["right_value_schema"] = [str(f) for f in self._right_values]
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
            "left": _SideState(store, "default", self.left, self.key_schema),
            "right": _SideState(store, "right", self.right, self.key_schema),
        }
        counts = _read_counts(store)
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
                if batch is not None and batch.num_rows:
                    m.num_output_rows += batch.num_rows
                    yield batch
        for name, state in states.items():
            counts[name] -= state.taken
            m.num_rows_removed += state.taken
            state.flush()
        _write_counts(store, counts)
        m.num_rows_total = (m.num_rows_total or 0) + counts["left"] + counts["right"]
        # Rows of a side no watermark evicts: its state only grows (an inner join without
        # watermarks, as in Spark); said in the progress, where Spark says nothing.
        forever = sum(counts[s.name] for s in (self.left, self.right) if s.state_time is None)
        m.custom["numRowsNeverEvicted"] = m.custom.get("numRowsNeverEvicted", 0) + forever
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
        if ctx.watermark_for_late_rows_ms <= 0:
            return rows
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
        keys = rows.select(self.key_schema.names)
        kencs = mine.key_codec.encode_many(keys)
        theirs.load(kencs)
        candidates = theirs.rows_of(kencs)  # (state rows, key position)
        pairs_this, pairs_other = self._match(rows, kencs, candidates, this, other)
        # Mark the other side's state rows that matched, and this side's input rows.
        if not (self.join_type == "leftSemi" and this is self.right):
            theirs.mark_matched(candidates, pairs_other)
        matched = np.zeros(rows.num_rows, bool)
        matched[pairs_this] = True
        out: list[pa.RecordBatch] = []
        semi = self.join_type == "leftSemi"
        if semi and this is self.left:
            first = np.unique(pairs_this)
            if len(first):
                out.append(
                    _batch(rows.take(pa.array(first)).select(this.names), self.output_schema)
                )
        elif semi:
            # Right input: the stored left rows it matches are emitted, and leave the state.
            fresh = theirs.take(candidates, pairs_other)
            if fresh.num_rows:
                out.append(_batch(fresh.select(other.names), self.output_schema))
        elif len(pairs_this):
            left_rows, right_rows = (
                (rows.take(pa.array(pairs_this)), candidates[0].take(pa.array(pairs_other)))
                if this is self.left
                else (candidates[0].take(pa.array(pairs_other)), rows.take(pa.array(pairs_this)))
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
            mine.append(
                [kencs[i] for i in idx],
                rows.take(pa.array(idx)).select(this.names),
                matched[idx],
            )
        return out, stored

    def _match(
        self,
        rows: pa.Table,
        kencs: list[bytes],
        candidates: tuple[pa.Table, np.ndarray],
        this: JoinSide,
        other: JoinSide,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (input row, state row) with equal keys for which the condition holds."""
        state_rows, state_key_pos = candidates
        if state_rows.num_rows == 0 or rows.num_rows == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        # Key identity by encoded key: a position per distinct key on both sides. A null key
        # equals a null key here, as in Spark's state (rows with null keys reach the join only
        # in a full outer join, where Spark's optimizer infers no not-null filter).
        ids = {k: i for i, k in enumerate(dict.fromkeys(kencs))}
        left_ids = np.fromiter((ids[k] for k in kencs), np.int64, len(kencs))
        probe = pa.table({"id": left_ids, _ROW: np.arange(rows.num_rows)})
        build = pa.table({"id": state_key_pos, _OTHER: np.arange(state_rows.num_rows)})
        pairs = probe.join(build, "id", join_type="inner", use_threads=False)
        this_idx = np.asarray(pairs.column(_ROW), np.int64)
        other_idx = np.asarray(pairs.column(_OTHER), np.int64)
        if self.condition is not None and len(this_idx):
            a = rows.take(pa.array(this_idx)).select(this.names)
            b = state_rows.take(pa.array(other_idx)).select(other.names)
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


def _list_schema(side: JoinSide) -> pa.Schema:
    return pa.schema(
        [
            *(pa.field(f.name, pa.list_(f.type)) for f in side.fields),
            pa.field(MATCHED, pa.list_(pa.bool_())),
        ]
    )


def _batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    cols = []
    for f in schema:
        col = table.column(f.name)
        if col.type != f.type:
            col = col.cast(f.type)
        cols.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _read_counts(store: StateStore) -> dict[str, int]:
    out = {}
    for name, code in (("left", 0), ("right", 1)):
        row = store.get((code,), _COUNT_CF)
        out[name] = int(row[0]) if row is not None else 0
    return out


def _write_counts(store: StateStore, counts: dict[str, int]) -> None:
    for name, code in (("left", 0), ("right", 1)):
        store.put((code,), (counts[name],), _COUNT_CF)


class _SideState:
    """One side's rows in state: loaded per key as needed, written back once per batch."""

    def __init__(self, store: StateStore, cf: str, side: JoinSide, key_schema: pa.Schema):
        self.store = store
        self.fam = store.column_family(cf)
        self.key_codec = self.fam.key_codec
        self.side = side
        self.key_schema = key_schema
        self.index_cf = f"{side.name}$time" if side.state_time is not None else None
        #: Loaded keys: encoded key -> rows table (side columns + matched), in stored order.
        self.rows: dict[bytes, pa.Table] = {}
        self.dirty: set[bytes] = set()
        self.index_puts: set[bytes] = set()
        #: Rows that left the state at a match (a left semi join's).
        self.taken = 0
        self.list_schema = _list_schema(side)
        self.row_schema = pa.schema(
            [*(f.with_nullable(True) for f in side.fields), pa.field(MATCHED, pa.bool_())]
        )

    def load(self, kencs: list[bytes]) -> None:
        wanted = [k for k in dict.fromkeys(kencs) if k not in self.rows]
        if not wanted:
            return
        raws = self.store.get_encoded_many(wanted, self.fam.name)
        present = [(k, r) for k, r in zip(wanted, raws, strict=True) if r is not None]
        for k in wanted:
            self.rows[k] = self.row_schema.empty_table()
        if not present:
            return
        values, _ = self.fam.value_codec.decode_many_arrow([r for _, r in present])
        parents = np.asarray(pc.list_parent_indices(values.column(MATCHED)), np.int64)
        flat = pa.table(
            {f.name: pc.list_flatten(values.column(f.name)) for f in self.list_schema},
            schema=self.row_schema,
        )
        bounds = np.searchsorted(parents, np.arange(len(present) + 1))
        for i, (k, _) in enumerate(present):
            self.rows[k] = flat.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))

    def rows_of(self, kencs: list[bytes]) -> tuple[pa.Table, np.ndarray]:
        """The stored rows of the distinct keys in ``kencs``, and per row the position of its key
        among those distinct keys (the order of first appearance, as ``_match`` numbers them)."""
        distinct = list(dict.fromkeys(kencs))
        parts, pos = [], []
        for i, k in enumerate(distinct):
            t = self.rows.get(k)
            if t is not None and t.num_rows:
                parts.append(t)
                pos.append(np.full(t.num_rows, i, np.int64))
        self._last = distinct
        if not parts:
            return self.row_schema.empty_table(), np.zeros(0, np.int64)
        return pa.concat_tables(parts).combine_chunks(), np.concatenate(pos)

    def mark_matched(
        self, candidates: tuple[pa.Table, np.ndarray], matched_rows: np.ndarray
    ) -> None:
        if not len(matched_rows):
            return
        table, _ = candidates
        flags = np.asarray(table.column(MATCHED), bool).copy()
        if flags[matched_rows].all():
            return
        flags[matched_rows] = True
        self._rewrite(
            table.set_column(table.schema.get_field_index(MATCHED), MATCHED, pa.array(flags))
        )

    def take(self, candidates: tuple[pa.Table, np.ndarray], matched_rows: np.ndarray) -> pa.Table:
        """(Left semi) the stored rows matched now, each once; they leave the state."""
        table, _ = candidates
        if not len(matched_rows):
            return table.slice(0, 0)
        gone = np.zeros(table.num_rows, bool)
        gone[matched_rows] = True
        self.taken += int(gone.sum())
        self._rewrite(table.filter(pa.array(~gone)), keep=~gone)
        return table.filter(pa.array(gone))

    def _rewrite(self, table: pa.Table, keep: np.ndarray | None = None) -> None:
        """Replace the rows of the keys ``rows_of`` last returned by ``table``: the same rows
        in the same order, or (``keep``) those of them it marks."""
        start = new_start = 0
        for k in self._last:
            n = self.rows[k].num_rows
            if n:
                kept = n if keep is None else int(keep[start : start + n].sum())
                self.rows[k] = table.slice(new_start, kept)
                self.dirty.add(k)
                start += n
                new_start += kept

    def append(self, kencs: list[bytes], rows: pa.Table, matched: np.ndarray) -> None:
        full = rows.append_column(MATCHED, pa.array(matched, pa.bool_()))
        full = pa.Table.from_arrays(full.columns, schema=self.row_schema)
        order: dict[bytes, list[int]] = {}
        for i, k in enumerate(kencs):
            order.setdefault(k, []).append(i)
        for k, idx in order.items():
            self.load([k]) if k not in self.rows else None
            self.rows[k] = pa.concat_tables([self.rows[k], full.take(pa.array(idx))])
            self.dirty.add(k)
        if self.index_cf is not None:
            assert self.side.state_time is not None
            times = to_epoch_micros(rows.column(self.side.state_time))
            for k, t in zip(kencs, times.to_pylist(), strict=True):
                if t is not None:
                    self.index_puts.add(_ts_prefix(int(t)) + k)

    def evict(self, state_wm_us: int) -> tuple[int, pa.Table] | None:
        """Remove the rows whose state time is at or below ``state_wm_us``: (how many, those
        that never matched)."""
        assert self.index_cf is not None and self.side.state_time is not None
        self.flush_index()
        end = _ts_prefix(state_wm_us + 1)
        doomed_index: list[bytes] = []
        keys: dict[bytes, None] = {}
        width = len(_ts_prefix(0))
        for kencs, _ in self.store.range_scan_encoded_chunks(None, end, self.index_cf):
            doomed_index.extend(kencs)
            for k in kencs:
                keys[k[width:]] = None
        if not doomed_index:
            return None
        self.load(list(keys))
        removed = 0
        unmatched: list[pa.Table] = []
        for k in keys:
            t = self.rows[k]
            if not t.num_rows:
                continue
            times = to_epoch_micros(t.column(self.side.state_time))
            gone = np.asarray(pc.fill_null(pc.less_equal(times, state_wm_us), False), bool)
            if not gone.any():
                continue
            removed += int(gone.sum())
            old = t.filter(pa.array(gone))
            unmatched.append(old.filter(pc.invert(old.column(MATCHED))))
            self.rows[k] = t.filter(pa.array(~gone))
            self.dirty.add(k)
        self.store.remove_encoded_many(doomed_index, self.index_cf)
        out = pa.concat_tables(unmatched) if unmatched else self.row_schema.empty_table()
        return removed, out

    def flush_index(self) -> None:
        if self.index_cf is not None and self.index_puts:
            keys = sorted(self.index_puts)
            self.store.put_encoded_many(keys, [MARKER] * len(keys), self.index_cf)
            self.index_puts.clear()

    def flush(self) -> None:
        self.flush_index()
        if not self.dirty:
            return
        live = [k for k in self.dirty if self.rows[k].num_rows]
        dead = [k for k in self.dirty if not self.rows[k].num_rows]
        if live:
            tables = [self.rows[k] for k in live]
            lengths = np.array([t.num_rows for t in tables], np.int64)
            flat = pa.concat_tables(tables).combine_chunks()
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            lists = pa.table(
                {
                    f.name: pa.ListArray.from_arrays(offsets, flat.column(f.name).combine_chunks())
                    for f in self.row_schema
                }
            )
            values = pa.Table.from_arrays(lists.columns, schema=self.list_schema)
            self.store.put_encoded_many(
                live, self.fam.value_codec.encode_many(values), self.fam.name
            )
        if dead:
            self.store.remove_encoded_many(dead, self.fam.name)
        self.dirty.clear()


def _ts_prefix(ts_us: int) -> bytes:
    from sparkstate.operators.ts_index import encode_ts

    return encode_ts(ts_us)
