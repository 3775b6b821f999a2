"""Event-time watermarks with Spark's rules.

The watermark of batch ``b`` is chosen before ``b`` runs, from what batches ``< b`` saw: for each
watermarked input, the largest event time so far minus its delay; across inputs, the minimum (or
the maximum, with ``spark.sql.streaming.multipleWatermarkPolicy=max``). It never moves back, and it
stays 0 until an input has seen an event time.

The checkpoint keeps the watermark and the policy the query first ran with (Spark keeps the
policy in its offset log, and a restart takes it over the session's conf). A new run of the
query starts from that watermark with no input's event time seen yet, as Spark's tracker does:
an input counts as 0 again until it reads a row.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from sparkstate.exceptions import ConfigurationError

__all__ = ["WATERMARK_DELAY_KEY", "WatermarkSpec", "WatermarkTracker", "parse_delay_ms"]

#: Where Spark records a column's watermark: its delay in ms, in the column's metadata.
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"

_MS = {
    "microsecond": 0.001,
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
    "month": 31 * 86_400_000,  # Spark's CalendarInterval: a month counts as 31 days here
    "year": 12 * 31 * 86_400_000,
}
_ABBREV = {"us": "microsecond", "ms": "millisecond", "s": "second", "sec": "second",
           "min": "minute", "m": "minute", "h": "hour", "d": "day"}  # fmt: skip
_PART = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")


def parse_delay_ms(delay: str) -> int:
    """Milliseconds of an interval string such as ``"10 minutes"`` or ``"1 hour 30 seconds"``."""
    text = delay.strip().lower()
    text = text.removeprefix("interval").strip()
    pos, total = 0, 0.0
    if not text:
        msg = f"empty watermark delay {delay!r}; write e.g. '10 minutes'"
        raise ConfigurationError(msg)
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None:
            msg = f"cannot parse watermark delay {delay!r}; write e.g. '10 minutes' or '1 hour'"
            raise ConfigurationError(msg)
        unit = m.group(2).rstrip("s") if m.group(2) not in ("s", "ms", "us") else m.group(2)
        unit = _ABBREV.get(unit, unit)
        if unit not in _MS:
            msg = (
                f"unknown unit {m.group(2)!r} in watermark delay {delay!r}; use one of {list(_MS)}"
            )
            raise ConfigurationError(msg)
        total += float(m.group(1)) * _MS[unit]
        pos = m.end()
    if total < 0:
        msg = f"watermark delay must not be negative, got {delay!r}"
        raise ConfigurationError(msg)
    return int(total)


@dataclasses.dataclass(frozen=True)
class WatermarkSpec:
    """``withWatermark(column, delay)`` of one input."""

    column: str
    delay: str

    @property
    def delay_ms(self) -> int:
        return parse_delay_ms(self.delay)


@dataclasses.dataclass
class WatermarkTracker:
    """Per input: the largest event time seen (ms); and the watermark in force."""

    delays_ms: dict[str, int]
    policy: str = "min"
    max_event_time_ms: dict[str, int] = dataclasses.field(default_factory=dict)
    watermark_ms: int = 0

    def __post_init__(self) -> None:
        if self.policy not in ("min", "max"):
            msg = f"multipleWatermarkPolicy must be 'min' or 'max', got {self.policy!r}"
            raise ConfigurationError(msg)

    def observe(self, name: str, max_event_time_ms: int | None) -> None:
        """Record the largest event time a finished batch saw on input ``name``."""
        if max_event_time_ms is None:
            return
        old = self.max_event_time_ms.get(name)
        if old is None or max_event_time_ms > old:
            self.max_event_time_ms[name] = max_event_time_ms

    def advance(self) -> bool:
        """Compute the watermark for the next batch; True if it moved."""
        if not self.delays_ms:
            return False
        # An input that has not seen an event time yet counts as 0, as in Spark's tracker.
        candidates = [
            self.max_event_time_ms[name] - delay if name in self.max_event_time_ms else 0
            for name, delay in self.delays_ms.items()
        ]
        new = min(candidates) if self.policy == "min" else max(candidates)
        if new > self.watermark_ms:
            self.watermark_ms = new
            return True
        return False

    def to_dict(self) -> dict[str, Any]:
        return {
            "watermark_ms": self.watermark_ms,
            "max_event_time_ms": dict(self.max_event_time_ms),
            "policy": self.policy,
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Go back to the tracker as :meth:`to_dict` saved it (within a run of the query)."""
        self.resume(data)
        self.max_event_time_ms = {k: int(v) for k, v in data.get("max_event_time_ms", {}).items()}

    def resume(self, data: dict[str, Any]) -> None:
        """Start a new run of the query from the tracker :meth:`to_dict` saved: its watermark
        and policy, and no input's event time seen yet (Spark's tracker keeps neither across a
        restart: an input counts as 0 until it reads a row, so the watermark waits for it)."""
        self.watermark_ms = int(data.get("watermark_ms", 0))
        self.max_event_time_ms = {}
        self.policy = str(data.get("policy", self.policy))
        self.__post_init__()
