"""What the engine needs of a planned stream-stream join (:class:`JoinPlan`): its operator, its
input (the tagged union of both sides) and output, and the stages of its sides' own steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql.types import StructType

from sparkstate.engine.plan.stage import Stage
from sparkstate.operators.join import StreamingJoin

__all__ = ["JoinPlan"]


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
    #: reads and its SQL (:meth:`sparkstate.engine.plan.join.analysis.JoinAnalysis.pushed`).
    pushed: dict[str, list[tuple[frozenset[str], str]]] = dataclasses.field(default_factory=dict)
    #: Spark's types of the join key's columns, the key of both sides' state.
    key_struct: StructType = dataclasses.field(default_factory=StructType)
    #: One side's rows (``left`` or ``right``; a DataFrame of the side's columns, by the names
    #: the query gives them) as the operator's input holds them, the columns named in the
    #: third argument carried along: Spark's state of the join, taken over.
    side_rows: Callable[[str, DataFrame, Sequence[str]], DataFrame] | None = None
    #: What Spark refuses of a side's steps when the query starts, not where it is written
    #: (its streaming checks, such as a deduplication within a watermark the side lacks).
    refused: Exception | None = None

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


def _reader(
    side_of: Callable[[DataFrame], DataFrame],
) -> Callable[[DataFrame, dict[int, DataFrame]], DataFrame]:
    def read(batch: DataFrame, outputs: dict[int, DataFrame]) -> DataFrame:
        return side_of(batch)

    return read
