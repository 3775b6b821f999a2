"""Reading Spark's analysis of a stream-stream join (:class:`JoinAnalysis`): the join keys, the
filters of one side, the condition over both evaluated in the worker, each side's watermark and
state watermark, and the rules for which joins are allowed; the result is a
:class:`~sparkstate.engine.plan.join.planned.JoinPlan`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from sparkstate.engine.plan.carried_time import carry_event_time
from sparkstate.engine.plan.join.planned import JoinPlan
from sparkstate.engine.spark.connect_analysis import ConnectJoin
from sparkstate.engine.spark.expressions import (
    as_attribute,
    conjuncts_of,
    from_side_columns,
    inferred_filters,
    is_watermarked,
    join_node,
    key_columns,
    metadata_of,
    node_name,
    quoted,
    seq_list,
    side_column_names,
    side_columns,
    side_shape,
    spark_stateful,
    spark_type_of,
    sql_of,
    stateful_side,
    struct_fields,
    time_of,
)
from sparkstate.engine.spark.schema import arrow_schema
from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.join import SIDE_COLUMN, JoinSide, StreamingJoin
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY

__all__ = ["JoinAnalysis"]

log = logging.getLogger("sparkstate.engine.plan.join.plan")  # the name it has always logged under

JOIN_NAMES = {
    "leftOuter": "LeftOuter",
    "rightOuter": "RightOuter",
    "fullOuter": "FullOuter",
    "leftSemi": "LeftSemi",
}
COMPARISONS = {
    "EqualTo": pc.equal,
    "LessThan": pc.less,
    "LessThanOrEqual": pc.less_equal,
    "GreaterThan": pc.greater,
    "GreaterThanOrEqual": pc.greater_equal,
}
#: The column of each side that carries its event time past its projections.
CARRIED = {"left": "__ss_lcarried", "right": "__ss_rcarried"}
#: A watermark far from 0, so that Spark's state watermark of it is defined: the difference is
#: the state's offset (Spark's formula is linear in the watermark).
PROBE_WATERMARK_MS = 10**12


class JoinAnalysis:
    def __init__(
        self,
        left: DataFrame,
        right: DataFrame,
        plan: Any,
        join_type: str,
        upstream: frozenset[str],
        connect: ConnectJoin | None = None,
    ) -> None:
        """``plan`` is Spark's analyzed plan of the join; from a Spark Connect client,
        ``connect`` is where it was made (:mod:`sparkstate.engine.spark.connect_analysis`)."""
        self.left, self.right = left, right
        self.join_type = join_type
        self.jvm: Any = connect.jvm if connect else left.sparkSession._jvm  # noqa: SLF001
        #: An expression of ``plan`` as SQL over the sides' columns.
        self.sql: Callable[[Any], str] = connect.sql if connect else sql_of
        node = plan
        while node_name(node) != "Join":
            if node_name(node) not in ("Project", "SubqueryAlias") or node.children().size() != 1:
                msg = f"join: cannot read Spark's plan of the join ({node_name(node)} above it)"
                raise ConfigurationError(msg)
            node = node.children().apply(0)
        self.top = plan
        self.node = node
        self.upstream = upstream
        for side, child in (("left", node.left()), ("right", node.right())):
            stateful = None if side in upstream else spark_stateful(child)
            if stateful is not None:
                raise ConfigurationError(stateful_side(side, stateful))
        self.left_attrs = seq_list(node.left().output())
        self.right_attrs = seq_list(node.right().output())
        self.left_set = node.left().outputSet()
        self.right_set = node.right().outputSet()
        self.extras: dict[str, list[tuple[str, Column]]] = {"left": [], "right": []}
        self.is_connect = connect is not None
        #: The sides whose event time is carried past their projections (carried_time.py).
        self.carried: dict[str, DataFrame] = {}

    # --- the condition ---------------------------------------------------------------------------

    def _side_of(self, expr: Any) -> str | None:
        refs = expr.references()
        if refs.subsetOf(self.left_set):
            return "left"
        if refs.subsetOf(self.right_set):
            return "right"
        return None

    def _computed(self, side: str, expr: Any) -> str:
        """A column of ``side`` holding ``expr`` (over that side only), computed in Spark."""
        names = self.extras[side]
        name = f"__ss_{side[0]}x{len(names)}"
        names.append((name, F.expr(self.sql(expr))))
        return name

    def _between(self, expr: Any) -> list[Any] | None:
        """``x BETWEEN lo AND hi`` as its two comparisons, as Spark's optimizer hands it to its
        own join; ``None`` for any other expression."""
        if node_name(expr) != "Between":
            return None
        x, lo, hi = expr.input(), expr.lower(), expr.upper()
        if not x.deterministic():
            return None
        expressions = self.jvm.org.apache.spark.sql.catalyst.expressions
        return [expressions.GreaterThanOrEqual(x, lo), expressions.LessThanOrEqual(x, hi)]

    def _condition(self) -> Any:
        """The join's condition (a Scala ``Option``), its ``BETWEEN`` conjuncts as comparisons."""
        cond = self.node.condition()
        if not cond.isDefined():
            return cond
        conjuncts = conjuncts_of(cond.get())
        parts = [p for c in conjuncts for p in (self._between(c) or [c])]
        if len(parts) == len(conjuncts):
            return cond
        joined = parts[0]
        for part in parts[1:]:
            joined = self.jvm.org.apache.spark.sql.catalyst.expressions.And(joined, part)
        return self.jvm.scala.Some(joined)

    def _pairs_expression(self, expr: Any) -> pc.Expression:
        """``expr`` over both sides as a pyarrow expression over side columns."""
        side = self._side_of(expr)
        if side is not None:
            return pc.field(self._computed(side, expr))
        between = self._between(expr)
        if between is not None:
            low, high = (self._pairs_expression(c) for c in between)
            return low & high
        kind = node_name(expr)
        children = seq_list(expr.children())
        if kind == "And":
            return self._pairs_expression(children[0]) & self._pairs_expression(children[1])
        if kind == "Or":
            return self._pairs_expression(children[0]) | self._pairs_expression(children[1])
        if kind == "Not":
            return ~self._pairs_expression(children[0])
        if kind in COMPARISONS:
            a, b = (self._pairs_expression(c) for c in children)
            return COMPARISONS[kind](a, b)
        msg = (
            f"join: the condition {self.sql(expr)} compares the two sides in a way sparkstate does "
            "not evaluate yet; write it as comparisons (=, <, <=, >, >=) between an expression "
            "of one side and one of the other, e.g. r.ts <= l.ts + INTERVAL 1 HOUR"
        )
        raise ConfigurationError(msg)

    def _null_safe(self, pair: tuple[Any, Any]) -> list[tuple[Any, Any]]:
        """The keys of ``a <=> b``, as Spark's ``ExtractEquiJoinKeys`` makes them: each side's
        expression with its type's default for null, and whether it is null (so a null
        matches a null, and the keys themselves are never null)."""
        expressions = self.jvm.org.apache.spark.sql.catalyst.expressions
        to_seq = self.jvm.org.apache.spark.api.python.PythonUtils.toSeq

        def coalesced(x: Any) -> Any:
            return expressions.Coalesce(to_seq([x, expressions.Literal.default(x.dataType())]))

        a, b = pair
        return [(coalesced(a), coalesced(b)), (expressions.IsNull(a), expressions.IsNull(b))]

    def _inferred(self) -> dict[str, list[Any]]:
        """Per side, the filters Spark's optimizer infers for it from the condition and the
        other side's filters (``InferFiltersFromConstraints``) and moves before the join, so
        that the rows they drop never reach its state. Not on an outer join's preserved side
        (Spark infers none there), nor on a side with stateful steps before the join, nor
        from a Connect client (whose plan is the stand-ins')."""
        if self.is_connect:
            return {}
        session = self.left.sparkSession._jsparkSession  # noqa: SLF001
        join = join_node(session.sessionState().optimizer().execute(self.top))
        if join is None:
            return {}
        preserved = {
            "left": self.join_type in ("leftOuter", "fullOuter"),
            "right": self.join_type in ("rightOuter", "fullOuter"),
        }
        return {
            side: inferred_filters(getattr(self.node, side)(), getattr(join, side)())
            for side in ("left", "right")
            if not preserved[side] and side not in self.upstream
        }

    def plan(self) -> JoinPlan:
        cond = self._condition()
        conjuncts = conjuncts_of(cond.get()) if cond.isDefined() else []
        keys: list[tuple[Any, Any]] = []
        only: dict[str, list[Any]] = {"left": [], "right": []}
        both: list[Any] = []
        for c in conjuncts:
            kind = node_name(c)
            if kind in ("EqualTo", "EqualNullSafe"):
                a, b = seq_list(c.children())
                sides = (self._side_of(a), self._side_of(b))
                if sides in (("left", "right"), ("right", "left")):
                    pair = (a, b) if sides[0] == "left" else (b, a)
                    keys += self._null_safe(pair) if kind == "EqualNullSafe" else [pair]
                    continue
            side = self._side_of(c)
            if side is not None and c.deterministic():
                only[side].append(c)
            else:
                both.append(c)
        for side, found in self._inferred().items():
            only[side] += [c for c in found if not any(c.semanticEquals(o) for o in only[side])]
        if not keys:
            msg = "Stream-stream join without equality predicate is not supported"
            raise ConfigurationError(msg)
        condition = None
        for c in both:
            e = self._pairs_expression(c)
            condition = e if condition is None else condition & e
        return self._build(keys, only, condition, cond)

    # --- watermarks ------------------------------------------------------------------------------

    def _watermark_attr(self, side: str) -> Any | None:
        """The side's event-time column: its watermarked timestamp. A window of it carries the
        watermark too: where the time itself is gone, it is carried past the side's
        projections (the watermark is its maximum), unless a stateful step before the join
        observes it (an upstream side): then the window is the side's event time, as Spark's
        join finds it."""
        attrs = self.left_attrs if side == "left" else self.right_attrs
        marked = [a for a in attrs if a.metadata().contains(WATERMARK_DELAY_KEY)]
        times = [a for a in marked if struct_fields(a) is None]
        if side in self.upstream:
            return (times or marked or [None])[0]
        frame = self.left if side == "left" else self.right
        if marked and not times and not self.upstream and not self.is_connect:
            carried = carry_event_time(frame, CARRIED[side])
            if carried is not None:
                self.carried[side] = carried
                return marked[0]
        if marked and not times:
            msg = (
                f"join: the side with columns {[str(a.name()) for a in attrs]} carries its "
                f"watermark only in {str(marked[0].name())!r}; keep the watermarked event-time "
                "column among the side's columns (sparkstate computes the watermark from it)"
            )
            raise ConfigurationError(msg)
        return times[0] if times else None

    def _state_offset_ms(self, side: str, cond: Any) -> int | None:
        """Spark's state value watermark of ``side`` as an offset below the join's watermark."""
        helper = self.jvm.org.apache.spark.sql.catalyst.analysis.StreamingJoinHelper
        this, other = (
            (self.left_set, self.right_set) if side == "left" else (self.right_set, self.left_set)
        )
        found = helper.getStateValueWatermark(
            this, other, cond, self.jvm.scala.Some(PROBE_WATERMARK_MS)
        )
        if not found.isDefined():
            return None
        return PROBE_WATERMARK_MS - int(found.get())

    # --- the plan --------------------------------------------------------------------------------

    def _build(
        self,
        keys: list[tuple[Any, Any]],
        only: dict[str, list[Any]],
        condition: pc.Expression | None,
        cond: Any,
    ) -> JoinPlan:
        jt = self.join_type
        wm: dict[str, Any] = {
            "left": self._watermark_attr("left"),
            "right": self._watermark_attr("right"),
        }
        key_wm = next(
            (i for i, (a, b) in enumerate(keys) if is_watermarked(a) or is_watermarked(b)), None
        )
        offsets = {
            s: (self._state_offset_ms(s, cond) if wm[s] is not None else None)
            for s in ("left", "right")
        }
        state_cols: dict[str, str | None]
        if key_wm is not None:
            state_cols = {s: f"__ss_{s[0]}key" for s in ("left", "right")}
            offsets = {"left": 0, "right": 0}
        else:
            state_cols = {
                s: (f"__ss_{s[0]}wm" if offsets[s] is not None else None) for s in ("left", "right")
            }
        self._check_allowed(key_wm is not None, offsets)
        if state_cols["left"] is None and state_cols["right"] is None:
            log.warning(
                "this %s join has no watermark to evict its state by: both sides' rows stay in "
                "state for the life of the query (as in Spark); progress shows them as "
                "customMetrics.numRowsNeverEvicted",
                jt,
            )
        # Per side: its columns, the extras the condition needs, its event time and state time.
        preserved = {
            "left": jt in ("leftOuter", "fullOuter"),
            "right": jt in ("rightOuter", "fullOuter"),
        }
        frames: dict[str, DataFrame] = {}
        shapes: dict[str, Callable[[DataFrame, Sequence[str]], DataFrame]] = {}
        parts: dict[str, tuple[list[StructField], str | None, str | None, pc.Expression | None]]
        parts = {}
        sides = {"left": self.left, "right": self.right, **self.carried}
        for s, df, attrs in (
            ("left", sides["left"], self.left_attrs),
            ("right", sides["right"], self.right_attrs),
        ):
            cols: list[Column] = []
            for i, a in enumerate(attrs):
                cols += side_columns(f"__ss_{s[0]}{i}", F.col(quoted(a.name())), a)
            extra_cols = [c.alias(n) for n, c in self.extras[s]]
            side_only = None
            pred = None
            if only[s]:
                pred = F.expr(" AND ".join(f"({self.sql(c)})" for c in only[s]))
                if preserved[s]:
                    extra_cols.append(F.coalesce(pred, F.lit(False)).alias(f"__ss_{s[0]}only"))
                    side_only = pc.field(f"__ss_{s[0]}only")
                    pred = None
            event_time = late_time = None
            if wm[s] is not None:
                event_time = f"__ss_{s[0]}wm"
                time = time_of(F.col(quoted(wm[s].name())), wm[s])
                if s in self.carried:  # the watermark from the time, late rows by the window
                    late_time = f"__ss_{s[0]}late"
                    extra_cols.append(time.alias(late_time))
                    time = F.col(CARRIED[s])
                extra_cols.append(time.alias(event_time))
            if key_wm is not None:
                k = keys[key_wm][0 if s == "left" else 1]
                extra_cols.append(time_of(F.expr(self.sql(k)), k).alias(f"__ss_{s[0]}key"))
            key_cols = [
                col
                for i, (a, b) in enumerate(keys)
                for col in key_columns(i, a if s == "left" else b, self.sql)
            ]
            shapes[s] = side_shape(pred, [*key_cols, *cols, *extra_cols])
            frames[s] = shapes[s](df, ())
            fields = [f for f in frames[s].schema.fields if not f.name.startswith("__ss_k")]
            parts[s] = (fields, event_time, late_time, side_only)
        # Key types: the left side's; the right side's keys are cast to them.
        key_struct = StructType(
            [f for f in frames["left"].schema.fields if f.name.startswith("__ss_k")]
        )
        built: dict[str, JoinSide] = {}
        for s in ("left", "right"):
            fields, event_time, late_time, side_only = parts[s]
            arrow = arrow_schema(StructType(fields), nullable=True)
            built[s] = JoinSide(
                s,
                tuple(arrow),
                event_time=event_time,
                late_time=late_time,
                state_time=state_cols[s],
                state_offset_ms=offsets[s] or 0,
                only=side_only,
            )
        operator = StreamingJoin(
            jt,
            list(arrow_schema(key_struct, nullable=True)),
            built["left"],
            built["right"],
            condition,
            self._column_names(keys),
        )
        union_of, side_rows = self._union(frames, key_struct, shapes)
        union = union_of(sides["left"], sides["right"], ())
        output_struct = StructType(
            [
                StructField(f.name, spark_type_of(f, frames), True, metadata_of(f.name, frames))
                for f in operator.output_schema
            ]
        )
        watermarks = [
            (s, f"__ss_{s[0]}wm", int(wm[s].metadata().getLong(WATERMARK_DELAY_KEY)))
            for s in ("left", "right")
            if wm[s] is not None
        ]
        lags = [offsets[s] for s in ("left", "right") if state_cols[s] is not None]
        return JoinPlan(
            operator,
            union,
            output_struct,
            [f.name for f in key_struct.fields],
            self._output_columns(),
            watermarks,
            max([0, *[lag for lag in lags if lag is not None]]),
            union_of,
            {side: "input" if i == 0 else f"input.{i}" for i, (side, *_) in enumerate(watermarks)},
            pushed=self._pushed(keys, only, preserved),
            key_struct=key_struct,
            side_rows=side_rows,
        )

    def _pushed(
        self, keys: list[tuple[Any, Any]], only: dict[str, list[Any]], preserved: dict[str, bool]
    ) -> dict[str, list[tuple[frozenset[str], str]]]:
        """Per side the row filters Spark's optimizer moves into the side's input (its columns
        and the SQL): a key column is not null (inferred from the equality), and the
        condition's conjuncts over the side alone; none on an outer join's preserved side."""
        out: dict[str, list[tuple[frozenset[str], str]]] = {"left": [], "right": []}
        for i, s in enumerate(("left", "right")):
            if preserved[s]:
                continue
            for pair in keys:
                key = pair[i]
                if node_name(key) == "AttributeReference":
                    name = str(key.name())
                    out[s].append((frozenset([name]), f"{quoted(name)} IS NOT NULL"))
            for c in only[s]:
                names = frozenset(str(a.name()) for a in seq_list(c.references().toSeq()))
                out[s].append((names, self.sql(c)))
        return out

    def _union(
        self,
        frames: dict[str, DataFrame],
        key_struct: StructType,
        shapes: dict[str, Callable[[DataFrame, Sequence[str]], DataFrame]],
    ) -> tuple[
        Callable[[DataFrame, DataFrame, tuple[str, ...]], DataFrame],
        Callable[[str, DataFrame, Sequence[str]], DataFrame],
    ]:
        """The tagged union of a left and a right DataFrame (shaped as the sides are), the
        sides named in its third argument shuffled by the join key (into the session's
        shuffle partitions, the state partitions while a batch runs); and one side's rows
        alone as the union holds them (:attr:`JoinPlan.side_rows`)."""
        left_fields = frames["left"].schema.fields
        right_fields = frames["right"].schema.fields
        lcols = [f for f in left_fields if not f.name.startswith("__ss_k")]
        rcols = [f for f in right_fields if not f.name.startswith("__ss_k")]
        keys = [F.col(f.name).cast(f.dataType).alias(f.name) for f in key_struct.fields]
        left_select = [
            F.lit(0).cast("tinyint").alias(SIDE_COLUMN),
            *keys,
            *[F.col(f.name) for f in lcols],
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in rcols],
        ]
        right_select = [
            F.lit(1).cast("tinyint").alias(SIDE_COLUMN),
            *keys,
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in lcols],
            *[F.col(f.name) for f in rcols],
        ]

        by_key = [F.col(f.name) for f in key_struct.fields]

        selects = {"left": left_select, "right": right_select}

        def side_rows(side: str, rows: DataFrame, keep: Sequence[str]) -> DataFrame:
            return shapes[side](rows, keep).select(*selects[side], *keep)

        def union_of(left: DataFrame, right: DataFrame, shuffled: tuple[str, ...]) -> DataFrame:
            frames = {"left": side_rows("left", left, ()), "right": side_rows("right", right, ())}
            for s in shuffled:
                frames[s] = frames[s].repartition(*by_key)
            return frames["left"].unionByName(frames["right"])

        return union_of, side_rows

    def _column_names(self, keys: list[tuple[Any, Any]]) -> dict[str, str]:
        """The query's names of the operator's key and side columns (for the state reader)."""
        names: dict[str, str] = {}
        for i, (a, _) in enumerate(keys):
            fields = struct_fields(a)
            name = str(a.name()) if node_name(a) == "AttributeReference" else self.sql(a)
            if fields is None:
                names[f"__ss_k{i}"] = name
            else:
                names.update({f"__ss_k{i}_{j}": f"{name}.{f}" for j, f in enumerate(fields)})
        for s, attrs in (("l", self.left_attrs), ("r", self.right_attrs)):
            for i, a in enumerate(attrs):
                names.update(side_column_names(f"__ss_{s}{i}", a))
        return names

    def _output_columns(self) -> list[Column]:
        """Spark's output of the join, from the operator's columns: under the attribute ids of
        Spark's, so that a side's own column (``left["key"]``) resolves after the join as in
        Spark (not from a Connect client, whose ids are the server's)."""
        by_id: dict[int, Column] = {}
        for s, attrs in (("l", self.left_attrs), ("r", self.right_attrs)):
            for i, a in enumerate(attrs):
                by_id[a.exprId().id()] = from_side_columns(f"__ss_{s}{i}", a)
        out = []
        top = (
            seq_list(self.top.projectList())
            if node_name(self.top) == "Project"
            else seq_list(self.top.output())
        )
        for e in top:
            name = e.name()
            metadata = json.loads(e.metadata().json())  # the watermarks' delays among them
            if node_name(e) == "Alias":  # a full outer USING join's key: coalesce(left, right)
                parts = [by_id[c.exprId().id()] for c in seq_list(e.child().children())]
                column = F.coalesce(*parts)
            else:
                column = by_id[e.exprId().id()]
            if self.is_connect:
                out.append(column.alias(name, metadata=metadata))
            else:
                out.append(as_attribute(self.jvm, column, e.toAttribute()))
        return out

    def _check_allowed(self, key_watermark: bool, offsets: dict[str, int | None]) -> None:
        jt = self.join_type
        if jt == "inner" or key_watermark:
            return
        if jt in ("leftOuter", "leftSemi"):
            ok = offsets["left"] is not None
        elif jt == "rightOuter":
            ok = offsets["right"] is not None
        else:
            ok = offsets["left"] is not None or offsets["right"] is not None
        if not ok:
            msg = (
                f"Stream-stream {JOIN_NAMES[jt]} join between two streaming DataFrame/Datasets "
                "is not supported without a watermark in the join keys, or a watermark on the "
                "nullable side and an appropriate range condition"
            )
            raise ConfigurationError(msg)
