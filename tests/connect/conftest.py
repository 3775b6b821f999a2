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
from tests.module_session import module_session

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

#: What the Connect clients set in their sessions (``connect_cases.main``).
CONF = {"spark.sql.shuffle.partitions": "4", "spark.sql.session.timeZone": "UTC"}


#: A new session's own settings (a running one keeps its own).
SESSION = {
    "spark.ui.enabled": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.schemaInference": "false",
}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with module_session("sparkstate-connect-tests", CONF, SESSION, "local[2,2]") as session:
        yield session
