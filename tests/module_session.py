"""The Spark session of a test module that needs only a local one: the session running already
(another module's, under xdist's one process per worker), with the module's settings applied
for the module and restored after it, or a session of its own, stopped after the module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any


@contextlib.contextmanager
def module_session(
    app: str, conf: Mapping[str, str], builder_conf: Mapping[str, str], master: str
) -> Iterator[Any]:
    """``conf``: the settings the module's tests expect (set on a running session too);
    ``builder_conf``: those of a new session only (``spark.ui.enabled``, ...)."""
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    if running is None:
        builder = SparkSession.builder.master(master).appName(app)
        for key, value in {**builder_conf, **conf}.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()
        return
    with session_conf(running, conf):
        yield running


@contextlib.contextmanager
def session_conf(session: Any, conf: Mapping[str, str]) -> Iterator[None]:
    """``conf`` set on ``session`` inside, each setting restored (or unset) after."""
    before = {key: session.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, value)
