"""The PySpark versions sparkstate runs on (4.2 and 4.3), and what differs between them (with
4.0 and 4.1 too, for which it is not yet supported: see the README).

Every difference the engine meets is handled here, one function per difference, so that the rest
of the engine calls one signature whatever the version. What an older version lacks and a query
needs is refused at ``start()`` with the version it needs (:func:`require`).
"""

from __future__ import annotations

import inspect
from typing import Any

import pyspark
from pyspark.sql.pandas.types import from_arrow_schema as _from_arrow_schema
from pyspark.sql.pandas.types import from_arrow_type as _from_arrow_type
from pyspark.sql.pandas.types import to_arrow_type as _to_arrow_type

from sparkstate.exceptions import ConfigurationError

__all__ = [
    "PYSPARK",
    "SUPPORTED",
    "from_arrow_schema",
    "from_arrow_type",
    "require",
    "to_arrow_type",
]

#: The running PySpark's (major, minor).
PYSPARK: tuple[int, int] = tuple(int(p) for p in pyspark.__version__.split(".")[:2])  # type: ignore[assignment]
#: The oldest and the newest (major, minor) sparkstate is tested on.
SUPPORTED = ((4, 2), (4, 3))

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


def require(version: tuple[int, int], what: str) -> None:
    """Refuse ``what`` unless the running PySpark is ``version`` or newer."""
    if version > PYSPARK:
        need = ".".join(map(str, version))
        msg = f"{what} needs PySpark {need} or later; this is PySpark {pyspark.__version__}"
        raise ConfigurationError(msg)
