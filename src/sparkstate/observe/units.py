"""Numbers as a person reads them: counts (``1.2k``), bytes (``3.4 MB``, Rich's), durations
(``850 ms``, ``1.2 s``) and times (``2024-01-01 00:01:40``)."""

from __future__ import annotations

import datetime
from collections.abc import Callable

from rich import filesize

__all__ = ["Format", "byte_size", "count", "duration_ms", "epoch_ms", "parse_time_ms", "rate"]

#: How a value is shown: an axis tick or a table cell.
Format = Callable[[float], str]

_COUNT_UNITS = ("", "k", "M", "G", "T", "P")


def _scaled(value: float, units: tuple[str, ...], sep: str) -> str:
    """``value`` in steps of 1000 with the unit of its step, three significant digits."""
    magnitude = abs(value)
    step = 0
    while magnitude >= 999.5 and step < len(units) - 1:
        magnitude /= 1000
        step += 1
    sign = "-" if value < 0 else ""
    return f"{sign}{_short(magnitude)}{sep}{units[step]}".rstrip()


def count(value: float) -> str:
    """``1234`` -> ``1.23k``; ``12`` -> ``12``; ``0.5`` -> ``0.5``."""
    return _scaled(value, _COUNT_UNITS, "")


def rate(value: float) -> str:
    """Rows per second: ``1234.5`` -> ``1.23k/s``."""
    return f"{count(value)}/s"


def byte_size(value: float) -> str:
    """``3_400_000`` -> ``3.4 MB``; ``512`` -> ``512 bytes`` (powers of 1000, as the unit
    names say: :func:`rich.filesize.decimal`)."""
    return filesize.decimal(round(value))


def duration_ms(value: float) -> str:
    """``850`` -> ``850 ms``; ``1200`` -> ``1.2 s``; ``150_000`` -> ``2.5 min``."""
    magnitude = abs(value)
    for limit, unit, scale in ((1000, "ms", 1), (60_000, "s", 1000), (3_600_000, "min", 60_000)):
        if magnitude < limit:
            return f"{_short(value / scale)} {unit}"
    return f"{_short(value / 3_600_000)} h"


def _short(value: float) -> str:
    """Three significant digits (more before the point), no trailing zeros."""
    magnitude = abs(value)
    digits = 0 if magnitude >= 99.95 else 1 if magnitude >= 9.995 else 2
    if 0 < magnitude < 0.995:
        digits = 3 if magnitude >= 0.0995 else 4
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def epoch_ms(value: float) -> str:
    """Milliseconds since the epoch as a UTC time, to the second (milliseconds if it has any)."""
    t = datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{t.microsecond // 1000:03d}" if t.microsecond // 1000 else text


def parse_time_ms(text: object) -> float | None:
    """A progress timestamp (``2024-01-01T00:00:00.000Z``) in milliseconds since the epoch;
    None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return t.timestamp() * 1000
