"""A local Spark session for the observe tests that build real checkpoints (the one running
already, if another test module made it, set as these tests expect for the module); the observe
package itself never starts Spark."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

#: What the observe tests expect of the session: their checkpoints have two state partitions.
CONF = {"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    if running is None:
        builder = SparkSession.builder.master("local[2]").appName("sparkstate-observe-tests")
        for key, value in {"spark.ui.enabled": "false", **CONF}.items():
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
