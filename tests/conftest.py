"""How the suite is spread over pytest-xdist's processes, when ``SPARKSTATE_TEST_WORKERS`` asks
for them (``scripts/test``: ``--dist loadfile``, each module whole in one process, so that its
Spark session and module fixtures are built once).

The standalone-cluster modules come first: their driver needs a process with no local
``SparkContext`` yet (one per process). The modules that take longest come next, so that the
processes end close together. Run in one process, the suite keeps pytest's own order."""

from __future__ import annotations

import pytest

#: The cluster's package: one group, first.
CLUSTER = "tests/cluster/"
#: Modules that run for minutes, longest first (measured with ``--durations``).
LONGEST = (
    "tests/compat/test_transform_with_state.py",
    "tests/bench/test_bench_smoke.py",
    "tests/connect/test_connect.py",
    "tests/engine/test_join.py",
    "tests/engine/test_repartition.py",
    "tests/compat/test_state_variables.py",
    "tests/engine/test_aggregate_functions.py",
    "tests/engine/test_state_reader.py",
    "tests/engine/test_arbitrary.py",
    "tests/engine/test_port.py",
)


def _group(item: pytest.Item) -> str:
    module = item.nodeid.split("::")[0]
    return "cluster" if module.startswith(CLUSTER) else module


def _rank(item: pytest.Item) -> int:
    group = _group(item)
    if group == "cluster":
        return 0
    return 1 + LONGEST.index(group) if group in LONGEST else 1 + len(LONGEST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getvalue("dist") in (None, "no"):
        return
    items.sort(key=_rank)  # stable: a module's tests keep their order
