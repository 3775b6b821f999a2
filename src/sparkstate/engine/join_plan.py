"""Planning a stream-stream join: Spark's analysis of ``left.join(right, on, how)``, read back.

Spark analyses the join the user wrote (the same ``on`` and ``how``), so column resolution, the
``USING`` output and implicit casts are Spark's own. From its condition:

- equalities between one side's expression and the other's are the join keys: each side
  computes its key in Spark, and the tagged union of both sides is shuffled by them;
- conjuncts over one side only are filtered in Spark before the join (Spark's optimizer pushes
  them down), except on an outer join's preserved side, whose rows that fail them are emitted
  at once with nulls (Spark's pre-join filter): the side computes them as a flag;
- the other conjuncts are evaluated in the worker over candidate pairs: every sub-expression
  over one side only is computed by that side in Spark, so the worker compares columns and
  combines the comparisons with ``AND`` / ``OR`` / ``NOT``.

Each side's state watermark is Spark's (``StreamingJoinHelper.getStateValueWatermark``, or the
join key when it carries a watermark), and so are the rules for which joins are allowed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from sparkstate.engine.join_connect import ConnectJoin, connect_stateful_step, stand_in_join
from sparkstate.engine.session import is_connect
from sparkstate.engine.spark_schema import arrow_schema
from sparkstate.engine.stage import PlanContext, Planned, Stage
from sparkstate.engine.steps import JoinStep, StatelessStep
from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.join import SIDE_COLUMN, JoinSide, StreamingJoin
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY, WatermarkSpec

__all__ = ["JoinInput", "JoinPlan", "plan_join", "plan_join_after", "plan_join_step"]

log = logging.getLogger(__name__)

#: Spark's ``JoinType`` names by the spellings PySpark accepts (lower case, no underscores).
_JOIN_TYPES = {
    "inner": "inner",
    "outer": "fullOuter",
    "full": "fullOuter",
    "fullouter": "fullOuter",
    "leftouter": "leftOuter",
    "left": "leftOuter",
    "rightouter": "rightOuter",
    "right": "rightOuter",
    "leftsemi": "leftSemi",
    "semi": "leftSemi",
    "leftanti": "leftAnti",
    "anti": "leftAnti",
    "cross": "cross",
}
_SPARK_NAMES = {
    "leftOuter": "LeftOuter",
    "rightOuter": "RightOuter",
    "fullOuter": "FullOuter",
    "leftSemi": "LeftSemi",
}
_COMPARISONS = {
    "EqualTo": pc.equal,
    "LessThan": pc.less,
    "LessThanOrEqual": pc.less_equal,
    "GreaterThan": pc.greater,
    "GreaterThanOrEqual": pc.greater_equal,
}
#: A watermark far from 0, so that Spark's state watermark of it is defined: the difference is
#: the state's offset (Spark's formula is linear in the watermark).
_PROBE_WATERMARK_MS = 10**12


@dataclasses.dataclass
class JoinPlan:
    """What the engine needs of a join: the operator, its input and output."""

    operator: StreamingJoin
    #: The tagged union of both sides: the operator's input stream.
    union: DataFrame
    #: Spark schema of the operator's output (left columns, then right columns).
    output_struct: StructType
    partition_columns: list[str]
    #: The query's output columns from the operator's (Spark's names and order).
    output_columns: list[Column]
    #: The watermark inputs: per side with a watermark, its event-time column in the union and
    #: the delay in milliseconds, left first.
    watermarks: list[tuple[str, str, int]]
    #: How far the join's output watermark is behind its input watermark (Spark 4: the
    #: smallest of the input watermark and the sides' state watermarks).
    output_lag_ms: int = 0
    #: The tagged union of a left and a right DataFrame (a batch's), shaped as the sides are;
    #: the sides named in its third argument shuffled by the join key first.
    union_of: Callable[[DataFrame, DataFrame, tuple[str, ...]], DataFrame] | None = None
    #: The tracker's name of each side whose event times the join itself observes.
    tracker_inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Per side with stateful steps before the join: their stages, in the order they run.
    chains: dict[str, list[Stage]] = dataclasses.field(default_factory=dict)
    #: Per side with stateful steps before the join: the tracker's names of the side's
    #: watermark, which the first of them observes.
    chain_inputs: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: How a batch of the query's input holds each side (with ``chains`` only).
    side_of: dict[str, Callable[[DataFrame], DataFrame]] = dataclasses.field(default_factory=dict)
    #: Per side, the filters Spark's optimizer moves into the side's input: the columns each
    #: reads and its SQL (:meth:`_Planner._pushed`).
    pushed: dict[str, list[tuple[frozenset[str], str]]] = dataclasses.field(default_factory=dict)

    def _chain_ids(self, op_id: int) -> dict[str, list[int]]:
        """Operator ids of each side's steps, in the order they run, below the join ``op_id``
        as Spark numbers them: from the join down, its left input's steps, then its right's."""
        out: dict[str, list[int]] = {}
        next_id = op_id + 1
        for side in ("left", "right"):
            count = len(self.chains.get(side, []))
            out[side] = list(range(next_id + count - 1, next_id - 1, -1))
            next_id += count
        return out

    def input_stages(self, op_id: int) -> list[Stage]:
        """The stages of the stateful steps before the join ``op_id``, the left side's then the
        right's; the first of a side reads that side of the batch and observes its watermark."""
        out: list[Stage] = []
        for side, ids in self._chain_ids(op_id).items():
            for i, (stage, new_id) in enumerate(zip(self.chains.get(side, []), ids, strict=True)):
                first = i == 0
                out.append(
                    dataclasses.replace(
                        stage,
                        op_id=new_id,
                        source=_reader(self.side_of[side]) if first else None,
                        event_time_inputs=self.chain_inputs.get(side, ()) if first else (),
                        after=list(stage.after),
                    )
                )
        return out

    def source(self, op_id: int) -> Callable[[DataFrame, dict[int, DataFrame]], DataFrame] | None:
        """How the join stage ``op_id`` reads a batch: None when the query's input is the
        tagged union itself; else the union of each side as the batch holds it or as the last
        step before the join on that side outputs it."""
        if not self.chains:
            return None
        assert self.union_of is not None
        union_of, side_of = self.union_of, self.side_of
        last = {side: ids[-1] if ids else None for side, ids in self._chain_ids(op_id).items()}

        # A step's output is shuffled by the join key before the union: a union's tasks are
        # numbered across its inputs, so the step's tasks, which would run in the union's
        # stage, would not run as their own partitions.
        shuffled = tuple(s for s in ("left", "right") if last[s] is not None)

        def read(batch: DataFrame, outputs: dict[int, DataFrame]) -> DataFrame:
            frames = [
                side_of[s](batch) if (i := last[s]) is None else outputs[i]
                for s in ("left", "right")
            ]
            return union_of(frames[0], frames[1], shuffled)

        return read


def join_type_of(how: str | None) -> str:
    """Spark's join type for PySpark's ``how`` (any case, underscores ignored)."""
    if how is None:
        return "inner"
    if not isinstance(how, str):
        msg = f"join: how must be a string, got {type(how).__name__}"
        raise ConfigurationError(msg)
    found = _JOIN_TYPES.get(how.lower().replace("_", ""))
    if found is None:
        msg = (
            f"Unsupported join type '{how}'. Supported join types include: 'inner', 'outer', "
            "'full', 'fullouter', 'full_outer', 'leftouter', 'left', 'left_outer', "
            "'rightouter', 'right', 'right_outer', 'leftsemi', 'left_semi', 'semi', "
            "'leftanti', 'left_anti', 'anti', 'cross'."
        )
        raise ConfigurationError(msg)
    if found == "leftAnti":
        msg = "LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported"
        raise ConfigurationError(msg)
    if found == "cross":
        msg = "Stream-stream join without equality predicate is not supported (a cross join)"
        raise ConfigurationError(msg)
    return found


def plan_join(
    left: DataFrame,
    right: DataFrame,
    on: Any,
    how: str | None,
    upstream: frozenset[str] = frozenset(),
) -> JoinPlan:
    """Plan ``left.join(right, on, how)`` over two streaming DataFrames (watermarks applied).

    ``upstream``: the sides that are the output of a stateful step, whose watermark that step
    observes on its own input; the join finds the side's event time (for late rows) in the
    column that carries the watermark, a window of it included, as Spark's join does."""
    join_type = join_type_of(how)
    if isinstance(on, str) and not (on in left.columns and on in right.columns):
        on = F.expr(on)  # a SQL condition rather than the name of a column of both sides
    for name, df in (("left", left), ("right", right)):
        if not df.isStreaming:
            msg = f"join: the {name} side must be a streaming DataFrame (a stream-stream join)"
            raise ConfigurationError(msg)
        if len(set(df.columns)) != len(df.columns):
            msg = f"join: the {name} side has duplicate column names {df.columns}; rename them"
            raise ConfigurationError(msg)
    if is_connect(left.sparkSession):
        for name, df in (("left", left), ("right", right)):
            stateful = None if name in upstream else connect_stateful_step(df)
            if stateful is not None:
                raise ConfigurationError(_stateful_side(name, stateful))
        analysed = stand_in_join(left, right, on, how or "inner")
        return _Planner(left, right, analysed.plan, join_type, upstream, analysed).plan()
    try:
        plan = left.join(right, on, how or "inner")._jdf.queryExecution().analyzed()  # noqa: SLF001
    except Exception as exc:
        msg = f"join: {exc}"
        raise ConfigurationError(msg) from exc
    return _Planner(left, right, plan, join_type, upstream).plan()


def plan_join_step(step: JoinStep, at: PlanContext) -> Planned:
    """The join's stage: its input is the stream itself (the tagged union of both sides); its
    output is renamed to Spark's columns of the join. Its sides' own stateful steps run before
    it, and the steps after it see the watermark as far behind as Spark 4 puts it."""
    if at.output_mode != "append":
        msg = (
            "Join between two streaming DataFrames/Datasets is not supported in "
            f"{at.output_mode.title()} output mode, only in Append output mode"
        )
        raise ConfigurationError(msg)
    plan: JoinPlan = step.plan
    rename = StatelessStep("select", tuple(plan.output_columns))
    stage = Stage(
        at.op_id,
        plan.operator,
        plan.output_struct,
        plan.partition_columns,
        lambda batch: batch,
        after=[rename],
        inputs=dict(plan.tracker_inputs),
        source=plan.source(at.op_id),
    )
    names = [f.name for f in plan.output_struct.fields]
    output = plan.union.select(*names).select(*plan.output_columns)
    return Planned(stage, output, plan.input_stages(at.op_id), plan.output_lag_ms)


def _stateful_side(side: str, stateful: str) -> str:
    return (
        f"join: the {side} side runs a stateful step in Spark ({stateful}); wrap that side's "
        "input in ss.stream() and write the step on it, so that sparkstate runs it before the join"
    )


#: The query input's column telling a join's left input's rows (0) from its right's (1), when
#: a side has a stateful step before the join.
INPUT_COLUMN = "__ss_input"


@dataclasses.dataclass(frozen=True)
class JoinInput:
    """One side of a join as the user wrote it: its input stream (watermarks applied) and the
    stateful steps between that input and the join."""

    df: DataFrame
    steps: tuple[Any, ...]
    watermark: WatermarkSpec | None


def plan_join_after(
    left: JoinInput, right: JoinInput, on: Any, how: str | None
) -> tuple[JoinPlan, DataFrame, tuple[WatermarkSpec, ...]]:
    """Plan a join whose inputs have stateful steps of their own (a deduplication, a windowed
    aggregation in append mode), as Spark 4 runs it: each side's steps run on that side's
    rows, their output is the join's input on that side, and every operator uses the query's
    watermark (Spark's propagation: deduplication and aggregation pass their input watermark
    on). The query's input is the tagged union of both inputs as they come; the watermarks are
    each side's, observed by the first step that reads that side.

    Returns the plan, the query's input and its watermarks (left's first)."""
    from sparkstate.engine.plan import plan_chain  # plan.py plans each side's steps

    join_type_of(how)
    sides = {"left": left, "right": right}
    names: dict[str, str] = {}
    specs: list[WatermarkSpec] = []
    source, side_of, columns = _tagged_inputs(left.df, right.df)
    chains: dict[str, list[Stage]] = {}
    outputs: dict[str, DataFrame] = {}
    for s, side in sides.items():
        wm = side.watermark
        if wm is not None:
            names[s] = "input" if not specs else f"input.{len(specs)}"
            specs.append(WatermarkSpec(columns[s][wm.column], wm.delay))
        if side.steps:
            column = wm.column if wm else None
            delay = wm.delay_ms if wm else None
            chains[s], outputs[s] = plan_chain(side.df, side.steps, "append", column, delay)
        else:
            outputs[s] = side.df
    plan = plan_join(outputs["left"], outputs["right"], on, how, frozenset(chains))
    for s, chain in chains.items():
        chain[-1] = _with_pushed_filters(chain[-1], plan.pushed.get(s, []))
    plan.tracker_inputs = {s: n for s, n in names.items() if s not in chains}
    plan.chain_inputs = {s: (n,) for s, n in names.items() if s in chains}
    plan.chains = chains
    plan.side_of = side_of
    return plan, source, tuple(specs)


def _with_pushed_filters(stage: Stage, pushed: list[tuple[frozenset[str], str]]) -> Stage:
    """An aggregation before the join with the filters Spark pushes below it: those over its
    grouping columns alone (Spark's optimizer moves a filter over an aggregation's grouping
    keys before it), applied to each key's partial aggregate, which has those columns. A
    deduplication keeps them above it, as Spark does."""
    from sparkstate.operators.aggregate import StreamingAggregate

    operator = stage.operator
    if not isinstance(operator, StreamingAggregate):
        return stage
    plain = {k for k in operator.output_keys if isinstance(k, str)}
    filters = [sql for names, sql in pushed if names <= plain]
    if not filters:
        return stage
    predicate = F.expr(" AND ".join(f"({sql})" for sql in filters))
    prepare = stage.prepare

    def filtered(batch: DataFrame) -> DataFrame:
        return prepare(batch).where(predicate)

    return dataclasses.replace(stage, prepare=filtered)


def _tagged_inputs(
    left: DataFrame, right: DataFrame
) -> tuple[DataFrame, dict[str, Callable[[DataFrame], DataFrame]], dict[str, dict[str, str]]]:
    """Both inputs as one stream: :data:`INPUT_COLUMN`, the left's columns, the right's (null
    on the other side's rows); how to read each side back from a batch of it; the stream's
    name of each side's columns."""
    frames = {"left": left, "right": right}
    columns = {
        s: {f.name: f"__ss_{s[0]}in{i}" for i, f in enumerate(df.schema.fields)}
        for s, df in frames.items()
    }

    def tagged(s: str, tag: int) -> DataFrame:
        selected = [F.lit(tag).cast("tinyint").alias(INPUT_COLUMN)]
        for other, df in frames.items():
            for f in df.schema.fields:
                name = columns[other][f.name]
                if other == s:
                    selected.append(F.col(_quoted(f.name)).alias(name))
                else:
                    selected.append(F.lit(None).cast(f.dataType).alias(name))
        return frames[s].select(*selected)

    source = tagged("left", 0).unionByName(tagged("right", 1))

    def reader(s: str, tag: int) -> Callable[[DataFrame], DataFrame]:
        back = [F.col(name).alias(original) for original, name in columns[s].items()]

        def side_of(batch: DataFrame) -> DataFrame:
            return batch.where(F.col(INPUT_COLUMN) == tag).select(*back)

        return side_of

    return source, {"left": reader("left", 0), "right": reader("right", 1)}, columns


class _Planner:
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
        ``connect`` is where it was made (:mod:`sparkstate.engine.join_connect`)."""
        self.left, self.right = left, right
        self.join_type = join_type
        self.jvm: Any = connect.jvm if connect else left.sparkSession._jvm  # noqa: SLF001
        #: An expression of ``plan`` as SQL over the sides' columns.
        self.sql: Callable[[Any], str] = connect.sql if connect else _sql
        node = plan
        while _name(node) != "Join":
            if _name(node) not in ("Project", "SubqueryAlias") or node.children().size() != 1:
                msg = f"join: cannot read Spark's plan of the join ({_name(node)} above it)"
                raise ConfigurationError(msg)
            node = node.children().apply(0)
        self.top = plan
        self.node = node
        self.upstream = upstream
        for side, child in (("left", node.left()), ("right", node.right())):
            stateful = None if side in upstream else _spark_stateful(child)
            if stateful is not None:
                raise ConfigurationError(_stateful_side(side, stateful))
        self.left_attrs = _seq(node.left().output())
        self.right_attrs = _seq(node.right().output())
        self.left_set = node.left().outputSet()
        self.right_set = node.right().outputSet()
        self.extras: dict[str, list[tuple[str, Column]]] = {"left": [], "right": []}

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

    def _pairs_expression(self, expr: Any) -> pc.Expression:
        """``expr`` over both sides as a pyarrow expression over side columns."""
        side = self._side_of(expr)
        if side is not None:
            return pc.field(self._computed(side, expr))
        kind = _name(expr)
        children = _seq(expr.children())
        if kind == "And":
            return self._pairs_expression(children[0]) & self._pairs_expression(children[1])
        if kind == "Or":
            return self._pairs_expression(children[0]) | self._pairs_expression(children[1])
        if kind == "Not":
            return ~self._pairs_expression(children[0])
        if kind in _COMPARISONS:
            a, b = (self._pairs_expression(c) for c in children)
            return _COMPARISONS[kind](a, b)
        msg = (
            f"join: the condition {self.sql(expr)} compares the two sides in a way sparkstate does "
            "not evaluate yet; write it as comparisons (=, <, <=, >, >=) between an expression "
            "of one side and one of the other, e.g. r.ts <= l.ts + INTERVAL 1 HOUR"
        )
        raise ConfigurationError(msg)

    def plan(self) -> JoinPlan:
        cond = self.node.condition()
        conjuncts = _conjuncts(cond.get()) if cond.isDefined() else []
        keys: list[tuple[Any, Any]] = []
        only: dict[str, list[Any]] = {"left": [], "right": []}
        both: list[Any] = []
        for c in conjuncts:
            kind = _name(c)
            if kind == "EqualTo":
                a, b = _seq(c.children())
                sides = (self._side_of(a), self._side_of(b))
                if sides == ("left", "right"):
                    keys.append((a, b))
                    continue
                if sides == ("right", "left"):
                    keys.append((b, a))
                    continue
            side = self._side_of(c)
            if side is not None and c.deterministic():
                only[side].append(c)
            else:
                both.append(c)
        if not keys:
            msg = "Stream-stream join without equality predicate is not supported"
            raise ConfigurationError(msg)
        condition = None
        for c in both:
            e = self._pairs_expression(c)
            condition = e if condition is None else condition & e
        return self._build(keys, only, condition, cond)

    # --- watermarks ------------------------------------------------------------------------------

    def _watermark_attr(self, attrs: list[Any], upstream: bool) -> Any | None:
        """The side's event-time column: its watermarked timestamp. A window of it carries the
        watermark too; the time itself must be there, since the watermark is its maximum,
        unless a stateful step before the join observes it (``upstream``): then the window
        is the side's event time, as Spark's join finds it."""
        marked = [a for a in attrs if a.metadata().contains(WATERMARK_DELAY_KEY)]
        times = [a for a in marked if _struct_fields(a) is None]
        if upstream:
            return (times or marked or [None])[0]
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
            this, other, cond, self.jvm.scala.Some(_PROBE_WATERMARK_MS)
        )
        if not found.isDefined():
            return None
        return _PROBE_WATERMARK_MS - int(found.get())

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
            "left": self._watermark_attr(self.left_attrs, "left" in self.upstream),
            "right": self._watermark_attr(self.right_attrs, "right" in self.upstream),
        }
        key_wm = next((i for i, (a, b) in enumerate(keys) if _marked(a) or _marked(b)), None)
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
        shapes: dict[str, Callable[[DataFrame], DataFrame]] = {}
        parts: dict[str, tuple[list[StructField], str | None, pc.Expression | None]] = {}
        for s, df, attrs in (
            ("left", self.left, self.left_attrs),
            ("right", self.right, self.right_attrs),
        ):
            cols: list[Column] = []
            for i, a in enumerate(attrs):
                cols += _side_columns(f"__ss_{s[0]}{i}", F.col(_quoted(a.name())), a)
            extra_cols = [c.alias(n) for n, c in self.extras[s]]
            side_only = None
            pred = None
            if only[s]:
                pred = F.expr(" AND ".join(f"({self.sql(c)})" for c in only[s]))
                if preserved[s]:
                    extra_cols.append(F.coalesce(pred, F.lit(False)).alias(f"__ss_{s[0]}only"))
                    side_only = pc.field(f"__ss_{s[0]}only")
                    pred = None
            event_time = None
            if wm[s] is not None:
                event_time = f"__ss_{s[0]}wm"
                extra_cols.append(_time_of(F.col(_quoted(wm[s].name())), wm[s]).alias(event_time))
            if key_wm is not None:
                k = keys[key_wm][0 if s == "left" else 1]
                extra_cols.append(_time_of(F.expr(self.sql(k)), k).alias(f"__ss_{s[0]}key"))
            key_cols = [
                col
                for i, (a, b) in enumerate(keys)
                for col in _key_columns(i, a if s == "left" else b, self.sql)
            ]
            shapes[s] = _shape(pred, [*key_cols, *cols, *extra_cols])
            frames[s] = shapes[s](df)
            fields = [f for f in frames[s].schema.fields if not f.name.startswith("__ss_k")]
            parts[s] = (fields, event_time, side_only)
        # Key types: the left side's; the right side's keys are cast to them.
        key_struct = StructType(
            [f for f in frames["left"].schema.fields if f.name.startswith("__ss_k")]
        )
        built: dict[str, JoinSide] = {}
        for s in ("left", "right"):
            fields, event_time, side_only = parts[s]
            arrow = arrow_schema(StructType(fields), nullable=True)
            built[s] = JoinSide(
                s,
                tuple(arrow),
                event_time=event_time,
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
        union_of = self._union(frames, key_struct, shapes)
        union = union_of(self.left, self.right, ())
        output_struct = StructType(
            [
                StructField(f.name, _spark_type(f, frames), True, _metadata(f.name, frames))
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
                if _name(key) == "AttributeReference":
                    name = str(key.name())
                    out[s].append((frozenset([name]), f"{_quoted(name)} IS NOT NULL"))
            for c in only[s]:
                names = frozenset(str(a.name()) for a in _seq(c.references().toSeq()))
                out[s].append((names, self.sql(c)))
        return out

    def _union(
        self,
        frames: dict[str, DataFrame],
        key_struct: StructType,
        shapes: dict[str, Callable[[DataFrame], DataFrame]],
    ) -> Callable[[DataFrame, DataFrame, tuple[str, ...]], DataFrame]:
        """The tagged union of a left and a right DataFrame (shaped as the sides are), the
        sides named in its third argument shuffled by the join key (into the session's
        shuffle partitions, the state partitions while a batch runs)."""
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

        def union_of(left: DataFrame, right: DataFrame, shuffled: tuple[str, ...]) -> DataFrame:
            frames = {
                "left": shapes["left"](left).select(*left_select),
                "right": shapes["right"](right).select(*right_select),
            }
            for s in shuffled:
                frames[s] = frames[s].repartition(*by_key)
            return frames["left"].unionByName(frames["right"])

        return union_of

    def _column_names(self, keys: list[tuple[Any, Any]]) -> dict[str, str]:
        """The query's names of the operator's key and side columns (for the state reader)."""
        names: dict[str, str] = {}
        for i, (a, _) in enumerate(keys):
            fields = _struct_fields(a)
            name = a.name() if hasattr(a, "name") else self.sql(a)
            if fields is None:
                names[f"__ss_k{i}"] = name
            else:
                names.update({f"__ss_k{i}_{j}": f"{name}.{f}" for j, f in enumerate(fields)})
        for s, attrs in (("l", self.left_attrs), ("r", self.right_attrs)):
            for i, a in enumerate(attrs):
                names.update(_column_names(f"__ss_{s}{i}", a))
        return names

    def _output_columns(self) -> list[Column]:
        """Spark's output of the join, from the operator's columns."""
        by_id: dict[int, Column] = {}
        for s, attrs in (("l", self.left_attrs), ("r", self.right_attrs)):
            for i, a in enumerate(attrs):
                by_id[a.exprId().id()] = _from_side_columns(f"__ss_{s}{i}", a)
        out = []
        top = (
            _seq(self.top.projectList())
            if _name(self.top) == "Project"
            else _seq(self.top.output())
        )
        for e in top:
            name = e.name()
            metadata = json.loads(e.metadata().json())  # the watermarks' delays among them
            if _name(e) == "Alias":  # a full outer USING join's key: coalesce(left, right)
                parts = [by_id[c.exprId().id()] for c in _seq(e.child().children())]
                column = F.coalesce(*parts)
            else:
                column = by_id[e.exprId().id()]
            out.append(column.alias(name, metadata=metadata))
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
                f"Stream-stream {_SPARK_NAMES[jt]} join between two streaming DataFrame/Datasets "
                "is not supported without a watermark in the join keys, or a watermark on the "
                "nullable side and an appropriate range condition"
            )
            raise ConfigurationError(msg)


def _shape(pred: Column | None, columns: list[Column]) -> Callable[[DataFrame], DataFrame]:
    """A side's DataFrame as the join reads it: filtered by ``pred``, then ``columns``."""

    def shape(df: DataFrame) -> DataFrame:
        return (df if pred is None else df.where(pred)).select(*columns)

    return shape


def _reader(
    side_of: Callable[[DataFrame], DataFrame],
) -> Callable[[DataFrame, dict[int, DataFrame]], DataFrame]:
    def read(batch: DataFrame, outputs: dict[int, DataFrame]) -> DataFrame:
        return side_of(batch)

    return read


def _time_of(col: Column, expr: Any) -> Column:
    """The time of ``col`` (the value of Spark expression ``expr``) as Spark's watermark reads
    it: the column itself, or a window struct's ``end``."""
    if str(expr.dataType().typeName()) == "struct":
        return col.getField("end")
    return col


def _struct_fields(expr: Any) -> list[str] | None:
    """The field names of a struct-typed Spark expression (a window), None for other types."""
    dtype = expr.dataType()
    if str(dtype.typeName()) != "struct":
        return None
    return [str(n) for n in dtype.fieldNames()]


def _column_names(name: str, attr: Any) -> dict[str, str]:
    """The query's name of each column :func:`_side_columns` makes of ``attr``."""
    fields = _struct_fields(attr)
    if fields is None:
        return {name: attr.name()}
    return {f"{name}_{j}": f"{attr.name()}.{f}" for j, f in enumerate(fields)}


def _side_columns(name: str, col: Column, attr: Any) -> list[Column]:
    """A side's column as the union carries it: as it is, or a struct (a window) as its fields
    and whether it is there at all, since state values are flat."""
    fields = _struct_fields(attr)
    if fields is None:
        return [col.alias(name)]
    return [
        col.isNotNull().alias(f"{name}_present"),
        *[col.getField(f).alias(f"{name}_{j}") for j, f in enumerate(fields)],
    ]


def _from_side_columns(name: str, attr: Any) -> Column:
    """The column :func:`_side_columns` split, put back together."""
    fields = _struct_fields(attr)
    if fields is None:
        return F.col(name)
    struct = F.struct(*[F.col(f"{name}_{j}").alias(f) for j, f in enumerate(fields)])
    return F.when(F.col(f"{name}_present"), struct)


def _key_columns(i: int, expr: Any, sql: Callable[[Any], str]) -> list[Column]:
    """Key ``i`` of one side as key columns: the expression, or the fields of a struct (a
    window) one by one, since state keys are flat."""
    col = F.expr(sql(expr))
    fields = _struct_fields(expr)
    if fields is None:
        return [col.alias(f"__ss_k{i}")]
    return [col.getField(f).alias(f"__ss_k{i}_{j}") for j, f in enumerate(fields)]


def _spark_type(field: pa.Field, frames: dict[str, DataFrame]) -> Any:
    for df in frames.values():
        if field.name in df.columns:
            return df.schema[field.name].dataType
    msg = f"join: no column {field.name}"
    raise ConfigurationError(msg)


def _metadata(name: str, frames: dict[str, DataFrame]) -> dict[str, Any]:
    for df in frames.values():
        if name in df.columns:
            return dict(df.schema[name].metadata or {})
    return {}


def _marked(expr: Any) -> bool:
    return _name(expr) == "AttributeReference" and bool(
        expr.metadata().contains(WATERMARK_DELAY_KEY)
    )


#: Spark's logical plan nodes of stateful streaming operators.
_SPARK_STATEFUL = (
    "Aggregate",
    "Deduplicate",
    "DeduplicateWithinWatermark",
    "Join",
    "FlatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState",
    "TransformWithState",
    "TransformWithStateInPySpark",
    "GlobalLimit",
)


def _spark_stateful(plan: Any) -> str | None:
    """The name of a stateful streaming operator in Spark's ``plan``, if it has one."""
    if not plan.isStreaming():
        return None
    if _name(plan) in _SPARK_STATEFUL:
        return _name(plan)
    for child in _seq(plan.children()):
        found = _spark_stateful(child)
        if found is not None:
            return found
    return None


def _conjuncts(expr: Any) -> list[Any]:
    if _name(expr) == "And":
        a, b = _seq(expr.children())
        return _conjuncts(a) + _conjuncts(b)
    return [expr]


def _sql(expr: Any) -> str:
    return str(expr.sql())


def _name(node: Any) -> str:
    return str(node.getClass().getSimpleName())


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
