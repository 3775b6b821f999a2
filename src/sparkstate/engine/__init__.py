"""The engine: the only package that imports pyspark. Query builder, driver, executor, sinks."""

from sparkstate.engine.api import DataStreamWriter, GroupedStream, StatefulStream, stream
from sparkstate.engine.query import StreamingQuery, add_listener, remove_listener
from sparkstate.engine.repartition import repartition
from sparkstate.engine.state_source import register

__all__ = [
    "DataStreamWriter",
    "GroupedStream",
    "StatefulStream",
    "StreamingQuery",
    "add_listener",
    "register",
    "remove_listener",
    "repartition",
    "stream",
]
