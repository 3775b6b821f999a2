"""A local Spark session for the observe tests that build real checkpoints (the one running
already, if another test module made it); the observe package itself never starts Spark."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    session = running or (
        SparkSession.builder.master("local[2]")
        .appName("sparkstate-observe-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    if running is None:
        session.stop()
