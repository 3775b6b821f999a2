"""Timers of ``StatefulProcessor``: time modes, ``TimerValues``, and where timers are stored.

Spark's rules (``TimerStateImpl``, ``TransformWithStateExec``): timers need a time mode other
than ``None``; registering a timer that exists, or deleting one that does not, does nothing; after
the input of a batch, every timer with ``expiry <= threshold`` fires, in expiry order, the threshold
being the batch's processing time (``ProcessingTime``) or the watermark (``EventTime``); a fired
timer is deleted after its ``handleExpiredTimer`` call.

Storage: ``$timers`` maps a grouping key to its sorted expiries (``listTimers`` is one point
read), ``$timer_index`` orders ``(expiry, key)`` for the range scan that finds due timers.
"""

from __future__ import annotations

import bisect
import struct
from typing import Any, ClassVar

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.state_errors import InvalidStateValueError
from sparkstate.operators.ts_index import TimestampIndex
from sparkstate.store.base import StateStore

__all__ = [
    "TIMERS_CF",
    "TIMERS_VALUE_SCHEMA",
    "TIMER_INDEX_CF",
    "ExpiredTimerInfo",
    "TimeMode",
    "TimerState",
    "TimerValues",
    "pack_expiries",
    "time_mode",
    "timer_expiries",
]

TIMERS_CF = "$timers"
TIMER_INDEX_CF = "$timer_index"
TIMERS_VALUE_SCHEMA = pa.schema([pa.field("expiries", pa.binary(), nullable=False)])


class TimeMode:
    """The time modes of ``transformWithState`` (the strings PySpark passes)."""

    NONE: ClassVar[str] = "None"
    PROCESSING_TIME: ClassVar[str] = "ProcessingTime"
    EVENT_TIME: ClassVar[str] = "EventTime"


_MODES = {m.lower(): m for m in (TimeMode.NONE, TimeMode.PROCESSING_TIME, TimeMode.EVENT_TIME)}


def time_mode(value: Any) -> str:
    """The canonical time mode name for ``value`` (any case, ``_`` ignored)."""
    key = str(value if value is not None else "none").replace("_", "").lower()
    if key not in _MODES:
        msg = f"unknown time mode {value!r}; use one of {sorted(_MODES.values())}"
        raise ConfigurationError(msg)
    return _MODES[key]


class TimerValues:
    """The batch's processing time and watermark as a handler sees them (-1: not available)."""

    __slots__ = ("_currentProcessingTimeInMs", "_currentWatermarkInMs")

    def __init__(self, currentProcessingTimeInMs: int = -1, currentWatermarkInMs: int = -1) -> None:  # noqa: N803
        self._currentProcessingTimeInMs = currentProcessingTimeInMs
        self._currentWatermarkInMs = currentWatermarkInMs

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802 - PySpark's names
        return self._currentProcessingTimeInMs

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self._currentWatermarkInMs

    def __repr__(self) -> str:
        return (
            f"TimerValues(processingTimeMs={self._currentProcessingTimeInMs}, "
            f"watermarkMs={self._currentWatermarkInMs})"
        )


class ExpiredTimerInfo:
    """The expiry of the timer that fired."""

    __slots__ = ("_expiryTimeInMs",)

    def __init__(self, expiryTimeInMs: int = -1) -> None:  # noqa: N803
        self._expiryTimeInMs = expiryTimeInMs

    def getExpiryTimeInMs(self) -> int:  # noqa: N802
        return self._expiryTimeInMs

    def __repr__(self) -> str:
        return f"ExpiredTimerInfo(expiryTimeMs={self._expiryTimeInMs})"


def pack_expiries(expiries: list[int]) -> bytes:
    return struct.pack(f"<{len(expiries)}q", *expiries)


def timer_expiries(blob: bytes) -> list[int]:
    """A key's timers, as stored in :data:`TIMERS_CF`, in expiry order."""
    return _unpack(blob)


def _unpack(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 8}q", blob))


class TimerState:
    """The timers of one partition during one batch: a per-key cache over the two families."""

    def __init__(self) -> None:
        self._cache: dict[bytes, list[int]] = {}
        self._dirty: set[bytes] = set()
        self.index = TimestampIndex(TIMER_INDEX_CF)

    def _load(self, store: StateStore, kenc: bytes) -> list[int]:
        found = self._cache.get(kenc)
        if found is None:
            raw = store.get_encoded(kenc, TIMERS_CF)
            if raw is None:
                found = []
            else:
                found = _unpack(store.column_family(TIMERS_CF).value_codec.decode(raw)[0])
            self._cache[kenc] = found
        return found

    def register(self, store: StateStore, kenc: bytes, expiry_ms: Any) -> None:
        ts = _check_ts(expiry_ms)
        timers = self._load(store, kenc)
        pos = bisect.bisect_left(timers, ts)
        if pos < len(timers) and timers[pos] == ts:
            return  # Spark logs "already exists" and does nothing
        timers.insert(pos, ts)
        self._dirty.add(kenc)
        self.index.add(kenc, ts)

    def delete(self, store: StateStore, kenc: bytes, expiry_ms: Any) -> None:
        ts = _check_ts(expiry_ms)
        timers = self._load(store, kenc)
        pos = bisect.bisect_left(timers, ts)
        if pos == len(timers) or timers[pos] != ts:
            return  # Spark logs "does not exist" and does nothing
        del timers[pos]
        self._dirty.add(kenc)
        self.index.remove(kenc, ts)

    def timers_of(self, store: StateStore, kenc: bytes) -> list[int]:
        return [*self._load(store, kenc)]

    def flush(self, store: StateStore) -> tuple[int, int]:
        """Write changed keys and the index; returns (rows written, rows deleted)."""
        puts: list[bytes] = []
        deletes: list[bytes] = []
        for kenc in self._dirty:
            (puts if self._cache[kenc] else deletes).append(kenc)
        if puts:
            encode = store.column_family(TIMERS_CF).value_codec.encode
            store.put_encoded_many(
                puts, [encode((pack_expiries(self._cache[k]),)) for k in puts], TIMERS_CF
            )
        if deletes:
            store.remove_encoded_many(deletes, TIMERS_CF)
        self._dirty.clear()
        self.index.flush(store)
        return len(puts), len(deletes)

    def due(self, store: StateStore, threshold_ms: int) -> list[tuple[int, bytes]]:
        """``(expiry, key)`` of every timer with ``expiry <= threshold_ms`` (flush first)."""
        return self.index.due(store, threshold_ms)


def _check_ts(value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        msg = f"timer expiry must be an int of epoch milliseconds, got {value!r}"
        raise InvalidStateValueError(msg)
    ts = int(value)
    if not -(1 << 63) <= ts < (1 << 63) - 1:
        msg = f"timer expiry {ts} is out of the int64 range"
        raise InvalidStateValueError(msg)
    return ts
