"""The PySpark versions sparkstate runs on (4.0 to 4.3), and what differs between them.

Every difference the engine meets is handled here, one function per difference, so that the rest
of the engine calls one signature whatever the version. What an older version lacks and a query
needs is refused at ``start()`` with the version it needs (:func:`require`).
"""

from __future__ import annotations

import inspect
from typing import Any

import pyspark

#: The running PySpark's (major, minor).
PYSPARK: tuple[int, int] = tuple(int(p) for p in pyspark.__version__.split(".")[:2])  # type: ignore[assignment]
#: The oldest and the newest (major, minor) sparkstate is tested on.
SUPPORTED = ((4, 0), (4, 3))

if SUPPORTED[0] > PYSPARK:  # 3.5: no Python data sources, no transformWithStateInPandas
    _TOO_OLD = (
        f"sparkstate needs PySpark 4.0 or later; this is PySpark {pyspark.__version__}. Its "
        "no-data batches (watermarks, timeouts, timers) and its state reader are Python data "
        "sources (pyspark.sql.datasource), which PySpark has from 4.0"
    )
    raise ImportError(_TOO_OLD)

from pyspark.sql.pandas.types import from_arrow_schema as _from_arrow_schema  # noqa: E402
from pyspark.sql.pandas.types import from_arrow_type as _from_arrow_type  # noqa: E402
from pyspark.sql.pandas.types import to_arrow_type as _to_arrow_type  # noqa: E402

from sparkstate.exceptions import ConfigurationError  # noqa: E402

__all__ = [
    "PYSPARK",
    "SUPPORTED",
    "from_arrow_schema",
    "from_arrow_type",
    "require",
    "to_arrow_type",
]

# 4.2 renamed ``timestamp_utc=True`` to ``timezone="UTC"`` (the same Arrow type).
_UTC: dict[str, Any] = (
    {"timezone": "UTC"}
    if "timezone" in inspect.signature(_to_arrow_type).parameters
    else {"timestamp_utc": True}
)


def to_arrow_type(dt: Any) -> Any:
    """Spark's type as Arrow's, timestamps in UTC."""
    return _to_arrow_type(dt, **_UTC)


def from_arrow_type(at: Any) -> Any:
    """Arrow's type as Spark's, a timestamp without a zone as TIMESTAMP_NTZ (4.2's default;
    4.0 and 4.1 read it as TIMESTAMP unless told)."""
    return _from_arrow_type(at, prefer_timestamp_ntz=True)


def from_arrow_schema(schema: Any) -> Any:
    """:func:`from_arrow_type` of each field."""
    return _from_arrow_schema(schema, prefer_timestamp_ntz=True)


def require(version: tuple[int, int], what: str, *, instead: str = "") -> None:
    """Refuse ``what`` unless the running PySpark is ``version`` or newer; ``instead``: what
    to do on the running one."""
    if version > PYSPARK:
        need = ".".join(map(str, version))
        msg = f"{what} needs PySpark {need} or later; this is PySpark {pyspark.__version__}"
        raise ConfigurationError(f"{msg}. {instead}." if instead else msg)
