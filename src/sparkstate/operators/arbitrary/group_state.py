"""``GroupState`` and ``GroupStateTimeout``: PySpark's per-key state object, without the JVM.

The surface and the errors follow ``pyspark.sql.streaming.state.GroupState`` (PySpark 4.3) and
Scala's ``GroupStateImpl``:

* the timeout is reset on every call: a function that wants one sets it again each time;
* ``setTimeoutDuration`` needs ``ProcessingTimeTimeout`` and a positive duration; the timeout is
  the batch's processing time plus the duration;
* ``setTimeoutTimestamp`` needs ``EventTimeTimeout``, a positive timestamp and, once a watermark
  exists, one that is not earlier than the watermark;
* ``getCurrentWatermarkMs`` fails when the query has no watermark;
* ``update(None)`` fails; ``get`` on an absent state fails, ``getOption`` returns None.

What the operator writes after the call (``decision``) is Spark's rule: a removed state without a
timeout is deleted; otherwise the row is written when the state was updated or removed or the
timeout differs from the *old* timeout. The old timeout is the stored one for Scala's
``flatMapGroupsWithState``; PySpark's ``applyInPandasWithState`` compares with -1 (its
``oldTimeoutTimestamp`` is always ``NO_TIMESTAMP``), so a call that neither updates the state nor
sets a timeout leaves the stored timeout as it was there.

With ``sparkstate.PICKLED`` as the state schema, ``PickledGroupState`` takes and returns any
picklable object instead of a tuple of fields.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any, ClassVar

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.state_errors import (
    InvalidStateValueError,
    StateNotExistsError,
    UnsupportedStateOperationError,
)

__all__ = [
    "NO_TIMESTAMP",
    "GroupState",
    "GroupStateClock",
    "GroupStateTimeout",
    "PickledGroupState",
    "parse_duration_ms",
    "timeout_conf",
]

#: Spark's "no timestamp" value for timeouts and watermarks.
NO_TIMESTAMP = -1


class GroupStateTimeout:
    """The timeout configurations of ``applyInPandasWithState`` (the same strings as PySpark)."""

    NoTimeout: ClassVar[str] = "NoTimeout"
    ProcessingTimeTimeout: ClassVar[str] = "ProcessingTimeTimeout"
    EventTimeTimeout: ClassVar[str] = "EventTimeTimeout"


_TIMEOUTS = {
    t.lower(): t
    for t in (
        GroupStateTimeout.NoTimeout,
        GroupStateTimeout.ProcessingTimeTimeout,
        GroupStateTimeout.EventTimeTimeout,
    )
}


def timeout_conf(value: Any) -> str:
    """The canonical timeout name for ``value`` (a GroupStateTimeout string, any case)."""
    name = str(getattr(value, "name", value)).strip()
    found = _TIMEOUTS.get(name.lower()) or _TIMEOUTS.get(f"{name.lower()}timeout")
    if found is None:
        msg = f"unknown timeout {value!r}; use one of {sorted(_TIMEOUTS.values())}"
        raise ConfigurationError(msg)
    return found


_UNIT_MS = {
    "ms": 1,
    "milli": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_DURATION_PART = re.compile(r"\s*(\d+)\s*([a-z]+)\s*")


def parse_duration_ms(value: Any) -> int:
    """Milliseconds of an int, a ``timedelta`` or an interval string such as ``"1 hour 5 min"``."""
    if isinstance(value, bool):
        msg = f"duration must be an int of milliseconds, got {value!r}"
        raise InvalidStateValueError(msg)
    if isinstance(value, int):
        return value
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("interval")
        total, pos = 0, 0
        while pos < len(text):
            m = _DURATION_PART.match(text, pos)
            if m is None or m.group(2) not in _UNIT_MS:
                break
            total += int(m.group(1)) * _UNIT_MS[m.group(2)]
            pos = m.end()
        if pos == len(text) and pos > 0:
            return total
        msg = f"cannot parse duration {value!r}; use e.g. '10 seconds' or an int of milliseconds"
        raise InvalidStateValueError(msg)
    if hasattr(value, "__index__"):
        return int(value)
    msg = f"duration must be an int of milliseconds, got {type(value).__name__}"
    raise InvalidStateValueError(msg)


@dataclasses.dataclass(frozen=True)
class GroupStateClock:
    """What every GroupState of one batch shares: the clocks and the timeout configuration."""

    timeout: str
    processing_time_ms: int
    watermark_ms: int
    watermark_present: bool
    #: The operator's name in messages ("applyInPandasWithState", "flatMapGroupsWithState").
    api: str = "flatMapGroupsWithState"


class GroupState:
    """The state of one grouping key during one call of the user function."""

    NO_TIMESTAMP: ClassVar[int] = NO_TIMESTAMP
    #: What an operation the query's timeout or watermark does not allow raises (the engine's
    #: state classes raise one that is PySpark's ``PySparkRuntimeError`` too, as PySpark's do).
    unsupported_error: ClassVar[type[UnsupportedStateOperationError]] = (
        UnsupportedStateOperationError
    )
    __slots__ = (
        "_clock",
        "_defined",
        "_old_timeout_ts",
        "_removed",
        "_timed_out",
        "_timeout_ts",
        "_updated",
        "_value",
        "_width",
    )

    def __init__(
        self,
        clock: GroupStateClock,
        value: tuple[Any, ...] | None,
        width: int,
        *,
        timed_out: bool = False,
        old_timeout_ts: int = NO_TIMESTAMP,
    ) -> None:
        self._clock = clock
        self._value = value
        self._width = width
        self._defined = value is not None
        self._updated = False
        self._removed = False
        self._timeout_ts = NO_TIMESTAMP
        self._old_timeout_ts = old_timeout_ts
        self._timed_out = timed_out

    # --- PySpark's surface ------------------------------------------------------------------

    @property
    def exists(self) -> bool:
        """Whether the key has a state."""
        return self._defined

    @property
    def get(self) -> tuple[Any, ...]:
        """The state value; raises when there is none."""
        if self._defined:
            return self._value  # type: ignore[return-value]
        msg = "State is either not defined or has already been removed"
        raise StateNotExistsError(msg)

    @property
    def getOption(self) -> tuple[Any, ...] | None:  # noqa: N802 - PySpark's name
        """The state value, or None."""
        return self._value if self._defined else None

    @property
    def hasTimedOut(self) -> bool:  # noqa: N802
        """Whether the function is called because the key timed out (empty input)."""
        return self._timed_out

    @property
    def oldTimeoutTimestamp(self) -> int:  # noqa: N802
        """The timeout the operator compares with to decide whether the timeout changed."""
        return self._old_timeout_ts

    def update(self, newValue: Any) -> None:  # noqa: N803
        """Set the state value (a tuple of the state schema's fields, in order)."""
        if newValue is None:
            msg = "'None' is not a valid state value"
            raise InvalidStateValueError(msg)
        value = newValue if type(newValue) is tuple else self._as_tuple(newValue)
        if len(value) != self._width:
            msg = (
                f"state value {value!r} has {len(value)} fields; the state schema has {self._width}"
            )
            raise InvalidStateValueError(msg)
        self._value = value
        self._defined = True
        self._updated = True
        self._removed = False

    def _as_tuple(self, value: Any) -> tuple[Any, ...]:
        if isinstance(value, dict):
            msg = "a state value must be a tuple of field values, not a dict"
            raise InvalidStateValueError(msg)
        try:
            return tuple(value)
        except TypeError:
            msg = f"a state value must be a tuple of field values, got {value!r}"
            raise InvalidStateValueError(msg) from None

    def remove(self) -> None:
        """Remove the key's state."""
        self._defined = False
        self._updated = False
        self._removed = True

    def setTimeoutDuration(self, durationMs: Any) -> None:  # noqa: N802, N803
        """Time out ``durationMs`` after the batch's processing time (ProcessingTimeTimeout)."""
        if self._clock.timeout != GroupStateTimeout.ProcessingTimeTimeout:
            msg = (
                "Cannot set timeout duration without enabling processing time timeout in "
                f"{self._clock.api}"
            )
            raise self.unsupported_error(msg)
        duration = parse_duration_ms(durationMs)
        if duration <= 0:
            msg = f"Timeout duration must be positive, got {durationMs!r}"
            raise InvalidStateValueError(msg)
        self._timeout_ts = duration + self._clock.processing_time_ms

    def setTimeoutTimestamp(self, timestampMs: Any) -> None:  # noqa: N802, N803
        """Time out when the watermark passes ``timestampMs`` (EventTimeTimeout)."""
        if self._clock.timeout != GroupStateTimeout.EventTimeTimeout:
            msg = (
                "Cannot set timeout timestamp without enabling event time timeout in "
                f"{self._clock.api}"
            )
            raise self.unsupported_error(msg)
        if isinstance(timestampMs, datetime.datetime):
            ts = int(timestampMs.timestamp() * 1000)
        elif isinstance(timestampMs, int) and not isinstance(timestampMs, bool):
            ts = timestampMs
        elif hasattr(timestampMs, "__index__"):
            ts = int(timestampMs)
        else:
            msg = f"timeout timestamp must be an int of epoch milliseconds, got {timestampMs!r}"
            raise InvalidStateValueError(msg)
        if ts <= 0:
            msg = f"Timeout timestamp must be positive, got {ts}"
            raise InvalidStateValueError(msg)
        watermark = self._clock.watermark_ms
        if watermark != NO_TIMESTAMP and ts < watermark:
            msg = (
                f"Timeout timestamp ({ts}) cannot be earlier than the current watermark "
                f"({watermark})"
            )
            raise InvalidStateValueError(msg)
        self._timeout_ts = ts

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802
        """The event-time watermark of the batch; fails when the query has none."""
        if not self._clock.watermark_present:
            msg = (
                "Cannot get event time watermark timestamp without setting watermark before "
                f"{self._clock.api}"
            )
            raise self.unsupported_error(msg)
        return self._clock.watermark_ms

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802
        """The batch's processing time (constant within a batch, also when it is replayed)."""
        return self._clock.processing_time_ms

    def __str__(self) -> str:
        return f"GroupState({self._value!r})" if self._defined else "GroupState(<undefined>)"

    __repr__ = __str__

    # --- what the operator reads back ----------------------------------------------------------

    @property
    def timeout_timestamp_ms(self) -> int:
        """The timeout set during this call (``NO_TIMESTAMP`` when none)."""
        return self._timeout_ts

    def decision(self, compare_timeout_ts: int) -> tuple[str, tuple[Any, ...] | None, int]:
        """What to write: ``("remove", None, -1)``, ``("put", value_or_None, timeout)`` or
        ``("keep", None, -1)``; ``compare_timeout_ts`` is the old timeout of Spark's rule."""
        ts = self._timeout_ts
        if self._removed and ts == NO_TIMESTAMP:
            return "remove", None, NO_TIMESTAMP
        if self._updated or self._removed or ts != compare_timeout_ts:
            value = self._value if self._defined else None
            if value is None and ts == NO_TIMESTAMP:
                return "remove", None, NO_TIMESTAMP  # Spark keeps an empty row; nobody sees it
            return "put", value, ts
        return "keep", None, NO_TIMESTAMP


class PickledGroupState(GroupState):
    """The ``GroupState`` of a ``sparkstate.PICKLED`` state: its value is any picklable object
    (kept internally as a 1-tuple, so the operator treats both kinds alike)."""

    __slots__ = ()

    @property
    def get(self) -> Any:
        """The state value; raises when there is none."""
        return super().get[0]

    @property
    def getOption(self) -> Any:  # noqa: N802 - PySpark's name
        """The state value, or None."""
        return self._value[0] if self._defined else None  # type: ignore[index]

    def update(self, newValue: Any) -> None:  # noqa: N803
        """Set the state value: any picklable object but None."""
        if newValue is None:
            msg = "'None' is not a valid state value"
            raise InvalidStateValueError(msg)
        super().update((newValue,))
