"""The engine: the only package that imports pyspark. Query builder, driver, executor, sinks.

Its public names are imported on first use, so that a process that needs one module of the
engine (Spark's Python data source runner unpickling the clock source, a Python worker) does
not import all of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkstate.engine.api.live import state
    from sparkstate.engine.api.stream import GroupedStream, StatefulStream, stream
    from sparkstate.engine.api.writer import DataStreamWriter
    from sparkstate.engine.jobs.export import export
    from sparkstate.engine.jobs.rescale import repartition
    from sparkstate.engine.run.query import StreamingQuery, add_listener, remove_listener
    from sparkstate.engine.spark.state_source import register

__all__ = [
    "DataStreamWriter",
    "GroupedStream",
    "StatefulStream",
    "StreamingQuery",
    "add_listener",
    "register",
    "remove_listener",
    "export",
    "repartition",
    "state",
    "stream",
]

#: Public name -> the module that defines it.
_HOMES = {
    "DataStreamWriter": "sparkstate.engine.api.writer",
    "GroupedStream": "sparkstate.engine.api.stream",
    "StatefulStream": "sparkstate.engine.api.stream",
    "stream": "sparkstate.engine.api.stream",
    "StreamingQuery": "sparkstate.engine.run.query",
    "add_listener": "sparkstate.engine.run.query",
    "remove_listener": "sparkstate.engine.run.query",
    "export": "sparkstate.engine.jobs.export",
    "repartition": "sparkstate.engine.jobs.rescale",
    "register": "sparkstate.engine.spark.state_source",
    "state": "sparkstate.engine.api.live",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        msg = f"module 'sparkstate.engine' has no attribute {name!r}"
        raise AttributeError(msg)
    importlib.import_module("sparkstate.engine.spark.versions")  # refuses a PySpark too old
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
