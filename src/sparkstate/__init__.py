"""sparkstate: stateful stream processing for PySpark with state in the Python worker.

``import sparkstate as ss`` then ``ss.stream(df).groupBy(...).agg(...).writeStream...start()``.
The engine (and with it pyspark) is imported on first use, so the store and operator layers stay
importable without pyspark.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

__all__ = [
    "DataStreamWriter",
    "ExpiredTimerInfo",
    "GroupState",
    "GroupStateTimeout",
    "GroupedStream",
    "PICKLED",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "StatefulStream",
    "StreamingQuery",
    "TimeMode",
    "TimerValues",
    "__version__",
    "add_listener",
    "export",
    "functions",
    "register",
    "remove_listener",
    "repartition",
    "state",
    "stream",
]

if TYPE_CHECKING:
    from sparkstate import functions
    from sparkstate.engine import (
        DataStreamWriter,
        GroupedStream,
        StatefulStream,
        StreamingQuery,
        add_listener,
        export,
        register,
        remove_listener,
        repartition,
        state,
        stream,
    )
    from sparkstate.operators.arbitrary.group_state import GroupState, GroupStateTimeout
    from sparkstate.operators.arbitrary.processor import (
        ExpiredTimerInfo,
        StatefulProcessor,
        StatefulProcessorHandle,
        TimerValues,
    )
    from sparkstate.operators.arbitrary.schemas import PICKLED
    from sparkstate.operators.arbitrary.timers import TimeMode

_ENGINE = {
    "DataStreamWriter",
    "GroupedStream",
    "StatefulStream",
    "StreamingQuery",
    "add_listener",
    "export",
    "register",
    "remove_listener",
    "repartition",
    "state",
    "stream",
}

#: Arbitrary-state names (no pyspark needed): name -> module.
_OPERATORS = {
    "GroupState": "sparkstate.operators.arbitrary.group_state",
    "GroupStateTimeout": "sparkstate.operators.arbitrary.group_state",
    "StatefulProcessor": "sparkstate.operators.arbitrary.processor",
    "StatefulProcessorHandle": "sparkstate.operators.arbitrary.processor",
    "ExpiredTimerInfo": "sparkstate.operators.arbitrary.processor",
    "TimerValues": "sparkstate.operators.arbitrary.processor",
    "TimeMode": "sparkstate.operators.arbitrary.timers",
    "PICKLED": "sparkstate.operators.arbitrary.schemas",
}


def __getattr__(name: str) -> Any:
    if name in _ENGINE:
        return getattr(importlib.import_module("sparkstate.engine"), name)
    if name in _OPERATORS:
        return getattr(importlib.import_module(_OPERATORS[name]), name)
    if name == "functions":
        return importlib.import_module("sparkstate.functions")
    msg = f"module 'sparkstate' has no attribute {name!r}"
    raise AttributeError(msg)
