"""Stateful operators over Arrow record batches and a state store. Imports no pyspark."""

from sparkstate.operators.aggregation.aggregate import AggregateFunction, StreamingAggregate
from sparkstate.operators.aggregation.session_window import SessionWindowAggregate
from sparkstate.operators.base import BatchContext, OperatorMetrics, StatefulOperator
from sparkstate.operators.dedup import Deduplicate, DeduplicateWithinWatermark
from sparkstate.operators.limit import StreamingLimit

__all__ = [
    "AggregateFunction",
    "BatchContext",
    "Deduplicate",
    "DeduplicateWithinWatermark",
    "OperatorMetrics",
    "SessionWindowAggregate",
    "StatefulOperator",
    "StreamingAggregate",
    "StreamingLimit",
]
