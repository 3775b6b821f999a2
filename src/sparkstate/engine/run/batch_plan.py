"""A classic session's plan of the stateful stages, made once per run of the query and reused by
every batch after it.

Building the stages' DataFrame over a batch costs the driver about a hundred ms a batch: the
partial aggregate and the shuffle through py4j, and ``mapInArrow``, which pickles the task
function and analyses the plan. In a classic session neither is needed after a run's first batch:

- each stage's task function is made once
  (:func:`~sparkstate.engine.run.executor.task_function_of_run`) and reads its batch from the
  payload the driver sets around the batch's job (:mod:`sparkstate.engine.run.batch_payload`);
- Spark's foreachBatch hands each batch as a ``LogicalRDD`` leaf of the same output attributes,
  so the chain of logical plan nodes between it and the sink's DataFrame, recorded at the run's
  first batch, is rebuilt over the next batch's leaf (``withNewChildren``, node by node) and
  given to the sink as it is (``Dataset.ofRows``).

A plan whose chain is not single-child all the way down (a join, a union, the initial state
of batch 0), or a batch whose leaf is not that of the recorded plan, is built as each batch
builds it under Spark Connect.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from sparkstate.engine.plan.stage import Stage
from sparkstate.engine.run.attempts import CountedAttempts
from sparkstate.engine.run.executor import task_function_of_run
from sparkstate.runtime.tasks import TaskSpec

__all__ = ["RunPlan"]

log = logging.getLogger("sparkstate.engine")

TaskFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
#: The recorded plan of the stateful stages over a batch.
STAGES = "stages"
#: The leaf class of a foreachBatch DataFrame's plan.
BATCH_LEAF = "LogicalRDD"


@dataclasses.dataclass
class _Chain:
    """The sink DataFrame's logical plan as a chain of single-child nodes over the batch leaf."""

    #: The JVM plan nodes from the sink DataFrame's down, the leaf left out.
    nodes: list[Any]
    #: The JVM ``Seq`` of the leaf's output attributes.
    leaf_output: Any
    #: The ``ofRows`` of the session's ``Dataset`` class (classic.Dataset in PySpark 4).
    of_rows: Callable[[Any, Any], Any]
    #: Scala's empty list: ``nil.$colon$colon(x)`` is ``Seq(x)`` in one py4j call.
    nil: Any


class RunPlan:
    """What the driver of one run of a query in a classic session makes once: each stage's
    task function, and the plan of the stages over a batch."""

    def __init__(self, counted: CountedAttempts | None) -> None:
        self.counted = counted
        self._functions: dict[int, tuple[Stage, str, TaskFunction]] = {}
        #: The recorded plans, by what they are of: the stages' (``STAGES``), or the input the
        #: driver reads for a direct batch (engine/run/direct_batch.py).
        self._chains: dict[str, _Chain] = {}
        #: The plans recorded or found not to be a chain (tried once, then again only after a
        #: batch the recorded plan did not fit).
        self._recorded: set[str] = set()
        #: The JVM query of the run, and Spark's count of the rows its last batch with data
        #: read (a small one lets the next batch run from the driver, engine/run/direct_batch.py).
        self.spark_query: Any = None
        self.input_rows: int | None = None
        #: Why no batch of the run runs from the driver any more (None: they may).
        self.direct_off: str | None = None
        #: How many executors hold the state homes the last batch reported (None: unknown).
        self.executors_placed: int | None = None

    def task_function(self, stage: Stage, spec: TaskSpec) -> TaskFunction:
        """The task function of ``stage`` for the run (``spec``: its spec in any batch)."""
        made = self._functions.get(stage.op_id)
        if made is None or made[0] is not stage or made[1] != spec.output_mode:
            fixed = dataclasses.replace(spec, lineage={}, owners={})  # the payload has them
            made = (stage, spec.output_mode, task_function_of_run(fixed, self.counted))
            self._functions[stage.op_id] = made
        return made[2]

    def reused(self, batch: DataFrame, of: str = STAGES) -> DataFrame | None:
        """The DataFrame ``of`` (the stages') over ``batch``, the recorded plan over its leaf;
        None: none is recorded, or ``batch`` is not over a leaf of the recorded plan's
        attributes."""
        chain = self._chains.get(of)
        if chain is None:
            return None
        leaf = _leaf(batch._jdf.logicalPlan(), of_class=False)
        if leaf is None or not leaf.output().equals(chain.leaf_output):
            log.info("the batch's rows are not those of the recorded plan; planned anew")
            del self._chains[of]  # this batch's plan is recorded instead
            self._recorded.discard(of)
            return None
        plan = leaf
        for node in reversed(chain.nodes):
            plan = node.withNewChildren(getattr(chain.nil, "$colon$colon")(plan))
        session = batch.sparkSession
        return type(batch)(chain.of_rows(session._jsparkSession, plan), session)

    def record(self, batch: DataFrame, output: DataFrame, reusable: bool, of: str = STAGES) -> None:
        """Keep ``output``'s plan over ``batch``'s leaf for the batches after it, as the plan
        ``of`` (the stages'), where it is a chain of single-child nodes (``reusable``: it holds
        nothing of the batch but its leaf)."""
        if of in self._recorded or not reusable:
            return
        self._recorded.add(of)
        nodes: list[Any] = []
        node = output._jdf.logicalPlan()
        children = node.children()
        while children.size() == 1:
            nodes.append(node)
            node = children.head()
            children = node.children()
        leaf = _leaf(batch._jdf.logicalPlan())
        if children.size() != 0 or leaf is None or not node.equals(leaf):
            log.info("the stateful stages' plan is not a chain over the batch; planned each batch")
            return
        jvm: Any = batch.sparkSession.sparkContext._jvm
        dataset: Any = functools.reduce(getattr, batch._jdf.getClass().getName().split("."), jvm)
        nil = getattr(getattr(jvm.scala.collection.immutable, "Nil$"), "MODULE$")
        self._chains[of] = _Chain(nodes, leaf.output(), dataset.ofRows, nil)


def _leaf(plan: Any, of_class: bool = True) -> Any | None:
    """The batch's leaf under ``plan`` through single-child nodes; None if there is none (or,
    ``of_class``, it is not a foreachBatch leaf: a py4j round trip less without)."""
    children = plan.children()
    while children.size() == 1:
        plan = children.head()
        children = plan.children()
    if children.size() != 0:
        return None
    if of_class and plan.getClass().getSimpleName() != BATCH_LEAF:
        return None
    return plan
