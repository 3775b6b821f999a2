"""``ss.state``: a query's state read live (:mod:`sparkstate.observe.live`), with the credentials
its state homes ask for taken from the session (Spark's ``spark.authenticate`` and its secret)."""

from __future__ import annotations

import os
from typing import Any

from sparkstate.engine.spark.security import credentials_for
from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.live import LiveState
from sparkstate.runtime.home_channel import NO_CREDENTIALS, Credentials

__all__ = ["state"]


def state(
    query_or_checkpoint: Any,
    operator: int | str | None = None,
    *,
    store: str | None = None,
    join_side: str | None = None,
    spark: Any = None,
    secret: str | bytes | None = None,
    encrypt: bool | None = None,
) -> LiveState:
    """The state of a query's stateful operator, read live: from the state homes that hold it
    while the query runs, else from its checkpoint.

    ``query_or_checkpoint``: a sparkstate ``StreamingQuery`` or its checkpoint's location;
    ``operator``: the operator's id or name (needed where the query has several); ``store``: a
    ``transformWithState`` variable, or a store of the operator; ``join_side``: a join's side.
    The homes' credentials come from ``spark`` (default: the query's session, else the active
    one) when Spark's ``spark.authenticate`` is on there; from a process without the
    application's session (a web service), give ``secret`` (the application's
    ``spark.authenticate.secret``) and ``encrypt`` (whether ``spark.network.crypto.enabled``
    or ``spark.ssl.enabled`` is on).
    """
    if isinstance(query_or_checkpoint, (str, os.PathLike)):
        location = os.fspath(query_or_checkpoint)
    else:
        spark = spark if spark is not None else getattr(query_or_checkpoint, "sparkSession", None)
        location = getattr(query_or_checkpoint, "checkpoint_location", None)
        if not isinstance(location, str):
            msg = (
                "ss.state reads a sparkstate query (what ss.stream(...).writeStream.start() "
                f"returns) or a checkpoint location, not {type(query_or_checkpoint).__name__}"
            )
            raise ConfigurationError(msg)
    if secret is not None:
        key = secret.encode() if isinstance(secret, str) else secret
        credentials = Credentials(key, bool(encrypt))
    else:
        session = spark if spark is not None else _active_session()
        credentials = NO_CREDENTIALS if session is None else credentials_for(session)
    return LiveState(location, operator, store=store, join_side=join_side, credentials=credentials)


def _active_session() -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()
