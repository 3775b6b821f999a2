"""A local Spark session shared by the engine tests, and a file source the tests feed."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Test-only providers (tests.engine.faults) must import in the driver and in Python workers.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_REPO, os.environ.get("PYTHONPATH", "")) if p
)

from pyspark.sql import SparkSession  # noqa: E402

from sparkstate.testing import FileFeed  # noqa: E402

#: The session's ``spark.sql.shuffle.partitions``: the state partitions of every query that does
#: not choose its own. Two, as many as the session has cores: every batch's stateful tasks run in
#: one wave (with four, each batch scheduled two, and each query kept twice the stores).
PARTITIONS = 2

PROVIDERS = ["memory"]
try:
    from sparkstate.store.registry import provider_class

    provider_class("rocksdb")
    PROVIDERS.append("rocksdb")
except Exception:  # noqa: BLE001 - the rocksdb provider lands separately
    pass


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2,2]")  # two cores; a failed task is retried once
        .appName("sparkstate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(PARTITIONS))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.schemaInference", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


@pytest.fixture
def feed(tmp_path: Path) -> FileFeed:
    return FileFeed(tmp_path / "input")
