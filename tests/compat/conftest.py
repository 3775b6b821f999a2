"""Spark's own PySpark tests of stateful streaming, ported with only the query wrapped.

Each module re-states one of Spark's test files (``python/pyspark/sql/tests/...`` in Apache
Spark): the same inputs, processors and per-batch assertions, the query built through
``ss.stream(df)`` and run on both of our providers. The session is the one running already, if
another test module made it, set as Spark's test cases expect for the module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_REPO, os.environ.get("PYTHONPATH", "")) if p
)

from tests.module_session import module_session  # noqa: E402

PROVIDERS = ["memory", "rocksdb"]

#: What Spark's stateful test cases run with (its ReusedSQLTestCase plus the suites' own conf).
CONF = {
    "spark.sql.shuffle.partitions": "5",
    "spark.sql.session.timeZone": "UTC",
}


#: A new session's own settings (a running one keeps its own).
SESSION = {
    "spark.ui.enabled": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.schemaInference": "false",
}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with module_session("sparkstate-compat-tests", CONF, SESSION, "local[2,2]") as session:
        yield session


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    """The state store provider a wrapped query runs on: every case runs on both."""
    return str(request.param)


#: The two APIs of transformWithState: ``transformWithStateInPandas`` and ``transformWithState``.
MODES = ("pandas", "row")
_cases_in: dict[str, int] = {}


@pytest.hookimpl(tryfirst=True)  # before the fixtures' own parameters
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A case that runs in both modes (a ``mode`` argument) and on both providers runs twice,
    not four times: once in each mode, the modes on different providers, which providers
    alternating from one case of a module to the next. Each case still runs on both providers and
    in both modes, and each mode on both providers over the module: the mode is the API layer, the
    provider the store below it, and the cases that differ between providers (restarts,
    evolution, TTL) run on both either way."""
    names = metafunc.fixturenames
    if "mode" not in names or "provider" not in names:
        return
    module = metafunc.module.__name__
    turn = _cases_in.get(module, 0)
    _cases_in[module] = turn + 1
    providers = PROVIDERS if turn % 2 == 0 else PROVIDERS[::-1]
    pairs = list(zip(providers, MODES, strict=True))
    metafunc.parametrize(("provider", "mode"), pairs, ids=[f"{p}-{m}" for p, m in pairs])


@pytest.fixture
def st(spark: Any, tmp_path: Path) -> Any:
    """A Scala ``testStream`` scenario's harness (``stream_test.py``), on both providers."""
    from .stream_test import StreamTest

    return StreamTest(spark, tmp_path, PROVIDERS)
