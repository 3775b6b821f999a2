"""What a ported case needs besides the query: the wrap, and marks that hold only for ours.

``SPARKSTATE_COMPAT_ORACLE=spark`` runs the same cases through Spark's own operator (the input
left unwrapped, the ``stateStore`` option ignored by Spark), to check that a port still asserts
what Spark's test asserts; the xfail marks then do not apply.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

ORACLE = os.environ.get("SPARKSTATE_COMPAT_ORACLE", "") == "spark"


def wrap(df: Any) -> Any:
    """The query's input as a port gives it: wrapped in ``ss.stream`` (Spark's own: as it is)."""
    if ORACLE:
        return df
    import sparkstate as ss

    return ss.stream(df)


def ours_fail(reason: str) -> pytest.MarkDecorator:
    """A strict xfail of a scenario sparkstate fails today; Spark's own operator is never marked."""
    return pytest.mark.xfail(not ORACLE, strict=True, reason=reason)


def xfail_on(request: pytest.FixtureRequest, provider: str, reason: str, *on: str) -> None:
    """Mark the running case xfail (strict) when it runs on one of ``on`` (every provider if
    none is named); Spark's own operator is never marked."""
    if ORACLE or (on and provider not in on):
        return
    request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


class TextFiles:
    """A directory of text files a file source reads in the order they were written: each file
    gets a modification time one second after the previous one (where Spark's tests sleep)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._mtime = float(int(time.time())) - 1000.0

    def write(self, name: str, text: str) -> None:
        tmp = self.path / f".tmp-{name}"
        tmp.write_text(text)
        self._mtime += 1.0
        os.utime(tmp, (self._mtime, self._mtime))
        tmp.rename(self.path / name)
