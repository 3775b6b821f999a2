"""A classic local Spark session in the test process, for Spark's own output of the Connect
tests' queries (the oracle: what Spark's operators give does not depend on the client, and a
query costs less in a classic session than through the server). sparkstate's queries go through
the Connect server, from clients in processes of their own. The session is the one running
already, if another test module made it, set as the clients set theirs for the module."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

#: What the Connect clients set in their sessions (``connect_cases.main``).
CONF = {"spark.sql.shuffle.partitions": "4", "spark.sql.session.timeZone": "UTC"}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    if running is None:
        builder = SparkSession.builder.master("local[2,2]").appName("sparkstate-connect-tests")
        for key, value in {
            "spark.ui.enabled": "false",
            "spark.python.worker.reuse": "true",
            "spark.sql.streaming.schemaInference": "false",
            **CONF,
        }.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        yield session
        session.stop()
        return
    before = {key: running.conf.get(key, None) for key in CONF}
    for key, value in CONF.items():
        running.conf.set(key, value)
    try:
        yield running
    finally:
        for key, value in before.items():
            if value is None:
                running.conf.unset(key)
            else:
                running.conf.set(key, value)
