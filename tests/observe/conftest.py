"""A local Spark session for the observe tests that build real checkpoints (the one running
already, if another test module made it, set as these tests expect for the module); the observe
package itself never starts Spark."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.module_session import module_session

#: What the observe tests expect of the session: their checkpoints have two state partitions.
CONF = {"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with module_session(
        "sparkstate-observe-tests", CONF, {"spark.ui.enabled": "false"}, "local[2]"
    ) as session:
        yield session
