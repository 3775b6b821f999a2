"""The engine: the only package that imports pyspark. Query builder, driver, executor, sinks.

Its public names are imported on first use, so that a process that needs one module of the
engine (Spark's Python data source runner unpickling the clock source, a Python worker) does
not import all of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkstate.engine.api import GroupedStream, StatefulStream, stream
    from sparkstate.engine.export_job import export
    from sparkstate.engine.query import StreamingQuery, add_listener, remove_listener
    from sparkstate.engine.rescale_job import repartition
    from sparkstate.engine.state_source import register
    from sparkstate.engine.writer import DataStreamWriter

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
    "stream",
]

#: Public name -> the module that defines it.
_HOMES = {
    "DataStreamWriter": "sparkstate.engine.writer",
    "GroupedStream": "sparkstate.engine.api",
    "StatefulStream": "sparkstate.engine.api",
    "stream": "sparkstate.engine.api",
    "StreamingQuery": "sparkstate.engine.query",
    "add_listener": "sparkstate.engine.query",
    "remove_listener": "sparkstate.engine.query",
    "export": "sparkstate.engine.export_job",
    "repartition": "sparkstate.engine.rescale_job",
    "register": "sparkstate.engine.state_source",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        msg = f"module 'sparkstate.engine' has no attribute {name!r}"
        raise AttributeError(msg)
    importlib.import_module("sparkstate.engine.spark_versions")  # refuses a PySpark too old
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
