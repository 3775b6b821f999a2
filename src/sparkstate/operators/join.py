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

import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators._arrow import (
    event_time_stats,
    is_late,
    max_event_time_ms,
    to_epoch_micros,
)
from sparkstate.operators.base import BatchContext, StatefulOperator
from sparkstate.operators.join_state import (
    COUNT_FAMILY,
    COUNT_KEY_SCHEMA,
    COUNT_SCHEMA,
    INDEX,
    KEY_TO_NUM_VALUES,
    KEY_WITH_INDEX_TO_VALUE,
    MATCHED,
    ROWS_SCHEMA,
    SIDE_FAMILIES,
    JoinSide,
    SideState,
    read_counts,
    recount,
    row_schema,
    side_rows_state,
    side_view,
    unpack_rows,
    write_counts,
)
from sparkstate.operators.spark_state import (
    KEY_NOT_COMPATIBLE,
    VALUE_NOT_COMPATIBLE,
    SparkRows,
    by_name,
    fields_of,
)
from sparkstate.operators.state_layout import DeriveFamilies, Families, ShownStore
from sparkstate.operators.state_views import StateView
from sparkstate.operators.ts_index import MARKER_SCHEMA, index_key_schema
from sparkstate.store.base import StateStore
from sparkstate.store.schema_json import schema_to_json

__all__ = [
    "COUNT_FAMILY",
    "JOIN_TYPES",
    "MATCHED",
    "SIDE_FAMILIES",
    "SPARK_INDEX",
    "JoinSide",
    "StreamingJoin",
    "read_counts",
    "recount",
    "unpack_rows",
]

#: Spark's names of the join types a stream-stream join supports.
JOIN_TYPES = ("inner", "leftOuter", "rightOuter", "fullOuter", "leftSemi")
SIDE_COLUMN = "__ss_side"
#: The column of a row's place under its join key in Spark's state (its ``index``), taken over.
SPARK_INDEX = "__ss_index"
_ROW = "__ss_row"  # position of a row in its side's input or state table
_OTHER = "__ss_other"


class StreamingJoin(StatefulOperator):
    """``left.join(right, condition, how)`` over two streams, state in the store."""

    kind: ClassVar[str] = "join"
    exported_to_spark: ClassVar[bool] = True
    progress_name: ClassVar[str] = "symmetricHashJoin"
    supported_output_modes: ClassVar[tuple[str, ...]] = ("append",)
    #: Spark keeps two stores per side; ours keeps a side's rows in one column family.
    spark_store_names: ClassVar[tuple[str, ...]] = tuple(
        f"{side}-{store}"
        for side in ("left", "right")
        for store in ("keyToNumValues", "keyWithIndexToValue")
    )
    rows_are_keys: ClassVar[bool] = False

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
            for col in (side.event_time, side.state_time, side.late_time):
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
        self._rows = {"left": row_schema(left), "right": row_schema(right)}
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
            COUNT_FAMILY: (COUNT_KEY_SCHEMA, COUNT_SCHEMA),
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

    # --- its state, as the reader shows it -------------------------------------------------------

    @classmethod
    def state_view(
        cls,
        described: dict[str, Any],
        families: Families,
        *,
        store_name: str | None = None,
        join_side: str | None = None,
        flatten: bool = True,
    ) -> StateView:
        """A side's rows (``joinSide``); one of Spark's stores of them (``storeName``
        ``left-keyWithIndexToValue`` and the like); a column family by its name."""
        if store_name is None:
            return side_view(described, families, join_side)
        side, _, store = store_name.partition("-")
        if side in SIDE_FAMILIES:
            if store not in (KEY_TO_NUM_VALUES, KEY_WITH_INDEX_TO_VALUE):
                msg = (
                    f"a join side has Spark's stores {side}-{KEY_TO_NUM_VALUES} and "
                    f"{side}-{KEY_WITH_INDEX_TO_VALUE}, not {store_name!r}; its rows are "
                    f".option('joinSide', {side!r})"
                )
                raise ConfigurationError(msg)
            return side_view(described, families, side, store)
        return super().state_view(
            described, families, store_name=store_name, join_side=join_side, flatten=flatten
        )

    def from_spark_state(self, key: pa.StructArray, value: pa.StructArray) -> SparkRows:
        """Rows of both sides as the operator's input holds them (the take-over computes them
        from Spark's rows): ``key`` the join key, ``value`` :data:`SIDE_COLUMN`, each side's
        columns, the row's :data:`MATCHED` flag and its :data:`SPARK_INDEX`."""
        keys = by_name(fields_of(key), self.key_schema, KEY_NOT_COMPATIBLE, "join key column")
        values = dict(fields_of(value))
        out: SparkRows = {}
        for code, side in enumerate((self.left, self.right)):
            mine = pc.equal(values[SIDE_COLUMN], code)
            rows = by_name(
                [(c, values[c].filter(mine)) for c in side.names],
                pa.schema([f.with_nullable(True) for f in side.fields]),
                VALUE_NOT_COMPATIBLE,
                f"{side.name} column",
            )
            out.update(
                side_rows_state(
                    side,
                    keys.filter(mine),
                    rows,
                    values[MATCHED].filter(mine),
                    values[SPARK_INDEX].filter(mine),
                )
            )
        return out

    @classmethod
    def spark_partitioning(
        cls, described: dict[str, Any], store: str, shown_key: list[str]
    ) -> tuple[list[str], list[str]]:
        """Spark hashes the join key (not a row's ``index`` under it)."""
        return list(shown_key), [f for f in shown_key if f != INDEX]

    @classmethod
    def shown_stores(
        cls, described: dict[str, Any], store_name: str | None, join_side: str | None
    ) -> list[ShownStore]:
        """Both sides, unless one store is asked for."""
        if store_name is None and join_side is None:
            return [(side, None, side) for side in SIDE_FAMILIES]
        return super().shown_stores(described, store_name, join_side)

    @classmethod
    def derived_families(cls) -> tuple[tuple[str, ...], DeriveFamilies | None]:
        """Each side's row count: counted again from the rows a partition holds."""
        return (COUNT_FAMILY,), recount

    @classmethod
    def rows_in_state(cls, store: StateStore) -> int:
        return sum(read_counts(store).values())

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
            "left": SideState(store, SIDE_FAMILIES["left"], self.left),
            "right": SideState(store, SIDE_FAMILIES["right"], self.right),
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
        write_counts(store, counts)
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
        ctx.metrics.observe_event_times(event_time_stats(times))
        if side.late_time is not None:
            times = rows.column(side.late_time)
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
        states: dict[str, SideState],
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
        theirs: SideState,
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
        self, state: SideState, ctx: BatchContext
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


def _batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    cols = []
    for f in schema:
        col = table.column(f.name)
        if col.type != f.type:
            col = col.cast(f.type)
        cols.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return pa.RecordBatch.from_arrays(cols, schema=schema)
