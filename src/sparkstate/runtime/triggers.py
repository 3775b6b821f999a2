"""When a query needs a batch without new data, and how the driver asks for one.

An operator says what drives its time-based work with ``time_trigger()`` (Spark's
``shouldRunAnotherBatch``): ``"event"`` wants a batch whenever the watermark moved (event-time
timeouts and timers may be due), ``"processing"`` wants one once its earliest processing-time
timeout or timer (``OperatorMetrics.next_timer_ms``) comes due. The driver turns that into a
request in ``clock.json`` under the engine's checkpoint directory (:func:`next_request`); the
engine's clock source reads it (:func:`wants_batch`) and makes Spark run the batch.

``clock.json`` holds:

- ``requested_at_ms``: set when the watermark moved past one that event-time work uses; a batch
  is wanted if it is later than the source's current tick;
- ``due_ms``: the earliest processing-time timeout or timer of any partition; a batch is wanted
  once the clock passes it (so, unlike Spark, an idle query with nothing due runs no batch).

A damaged ``clock.json`` is logged as a warning naming it and read as no request: it holds no
state and no output, only when to run the next batch without data, and the driver writes it
again after the next batch. Failing the query for it would stop a pipeline that loses at most
a no-data batch until the next data comes.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sparkstate.exceptions import CorruptStateFileError, MissingVersionError
from sparkstate.files.durable import DurableDir
from sparkstate.files.json_files import json_object, read_json

if TYPE_CHECKING:  # the clock source reads this module in Spark's source runner: kept light
    from sparkstate.runtime.records import TaskReport

__all__ = ["CLOCK_FILE", "next_request", "read_clock", "wants_batch", "write_clock"]

log = logging.getLogger("sparkstate.runtime")

CLOCK_FILE = "clock.json"
#: What ``clock.json`` holds (each an int, or null for no request).
REQUEST_FIELDS = ("requested_at_ms", "due_ms")
GOING_ON = (
    "Going on as if no batch without data were requested: the file holds no state, and the "
    "query writes it again after its next batch (deleting it is safe)."
)


def read_clock(directory: DurableDir) -> dict[str, Any]:
    """The driver's last request; ``{}`` before the first one, and if ``clock.json`` is damaged
    (with a warning naming it; see the module)."""
    try:
        return read_json(directory, CLOCK_FILE, GOING_ON, _request)
    except MissingVersionError:
        return {}
    except CorruptStateFileError as exc:
        _warn_once(str(exc))
        return {}


def _request(data: bytes) -> dict[str, Any]:
    request = json_object(data)
    for field in REQUEST_FIELDS:
        value = request.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            msg = f"{field!r} is {json.dumps(value)}, not a number of milliseconds"
            raise TypeError(msg)
    return request


@functools.lru_cache(maxsize=16)
def _warn_once(message: str) -> None:
    """Log ``message`` the first time only: the clock source reads the file at every poll."""
    log.warning("%s", message)


def write_clock(directory: DurableDir, request: Mapping[str, Any]) -> None:
    """Record the driver's request (``requested_at_ms``, ``due_ms``; see the module)."""
    body = {"requested_at_ms": request.get("requested_at_ms"), "due_ms": request.get("due_ms")}
    directory.write_atomic(CLOCK_FILE, json.dumps(body, sort_keys=True).encode("utf-8"))


def wants_batch(request: Mapping[str, Any], tick_ms: int, now_ms: int) -> bool:
    """Whether the driver's ``request`` asks for a batch after the one at ``tick_ms``."""
    requested = request.get("requested_at_ms")
    if requested is not None and int(requested) > tick_ms:
        return True
    due = request.get("due_ms")
    return due is not None and now_ms > int(due)


def next_request(
    previous: Mapping[str, Any],
    triggers: Mapping[int, str | None],
    watermark_moved: bool,
    reports: Iterable[TaskReport],
    now_ms: int,
) -> dict[str, Any]:
    """The request after a batch, from the operators' triggers (by operator id) and the batch's
    task reports: a batch now if the watermark moved and an operator is event-driven; one once
    the earliest processing-time timeout or timer comes due."""
    requested = previous.get("requested_at_ms")
    if watermark_moved and "event" in triggers.values():
        requested = now_ms
    due: int | None = None
    for r in reports:
        if triggers.get(r.op) != "processing":
            continue
        ts = r.operator.next_timer_ms
        if ts is not None and (due is None or ts < due):
            due = int(ts)
    return {"requested_at_ms": requested, "due_ms": due}
