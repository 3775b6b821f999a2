"""How the suite runs: the JVMs it starts, and how it is spread over pytest-xdist's processes
(``scripts/test``: ``--dist loadfile``, each module whole in one process, so that its Spark
session and module fixtures are built once).

Every JVM the tests start through ``spark-submit`` (local sessions, the Connect server, the
benchmarks' systems; the standalone cluster sets its own) compiles with the JIT's first tier
only: the tests run small batches through many short queries, where the optimizing compiler's
work is never paid back (a fifth less CPU for the same tests); and they map the classes of Spark
from an archive written once per machine (``class_archive.py``), instead of loading them from
the jars again (under xdist written while the cluster's group runs, the other tests waiting for
it). Behaviour does not change; set ``SPARK_SUBMIT_OPTS`` to override. The Python
processes Spark starts import PySpark from the installed package rather than from its zipped copy
(``python_start/sitecustomize.py``): the same code, compiled once instead of at every start.
Spark itself runs those JVMs with :data:`SPARK_DEFAULTS`: interpreted execution instead of
generated code, no capture of call sites for error messages, and its checkpoint files written
through Hadoop's FileSystem. Spark's results are the same either way (each differential test runs
Spark's query and ours in the same JVM), and the compatibility run (``scripts/compat``), the
demo and ``sparkstate bench`` keep Spark's defaults.

Under xdist, the standalone-cluster package is one group, first: its driver needs a process
with no local ``SparkContext`` yet (one per process). The modules that take longest come next,
so that the processes end close together. Run in one process, the suite keeps pytest's order."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.class_archive import java_options, wait_for_archive  # noqa: E402

from sparkstate.engine.spark.versions import PYSPARK  # noqa: E402

#: Spark's checkpoint file manager over Hadoop's FileSystem (in a package of its own from 4.1).
_STREAMING = "org.apache.spark.sql.execution.streaming"
_CHECKPOINT_FILE_MANAGER = (
    f"{_STREAMING}.FileSystemBasedCheckpointFileManager"
    if PYSPARK < (4, 1)
    else f"{_STREAMING}.checkpointing.FileSystemBasedCheckpointFileManager"
)

#: Spark's defaults in the suite's JVMs (see above), but in a compatibility run.
SPARK_DEFAULTS = {
    # Spark's interpreted execution: compiling the generated code of the suite's thousands of
    # small queries (Janino) was the largest single share of its JVMs' CPU.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # PySpark's capture of each call site for error messages: eight round trips to the JVM
    # around every function call of a classic session.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Spark's checkpoint files through Hadoop's FileSystem instead of its FileContext: the local
    # FileContext starts a process (readlink) for each file it renames or looks up, the
    # FileSystem does not; the files and their checksum files are the same (half the processes
    # the JVM starts, a seventh of its CPU in a micro-batch of Spark's own aggregation).
    "spark.sql.streaming.checkpointFileManagerClass": _CHECKPOINT_FILE_MANAGER,
}

#: Settings of every JVM the suite starts, the compatibility run's too. A test process starts
#: one JVM and keeps it for every module it runs (hundreds of queries, several sessions): a
#: heap with room to spare (``SPARK_DRIVER_MEMORY``, which spark-submit takes where no
#: ``spark.driver.memory`` is set), and Spark's status store, kept with the UI off too, holding
#: the last few hundred jobs and SQL executions rather than a thousand each (their plans and
#: task metrics otherwise fill a 1 GiB heap by the end of the suite, and a JVM whose heap is
#: exhausted exits, failing every test of its process after it).
JVM_SETTINGS = {
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "200",
    "spark.ui.retainedTasks": "10000",
    "spark.sql.ui.retainedExecutions": "100",
    "spark.sql.streaming.ui.retainedQueries": "20",
    "spark.sql.streaming.ui.retainedProgressUpdates": "20",
}
os.environ.setdefault("SPARK_DRIVER_MEMORY", "2g")

#: The JIT's first tier only (see above).
JIT_OPTS = "-XX:TieredStopAtLevel=1"

#: Every Python process the suite starts imports PySpark from the installed package, compiled,
#: not from the zip Spark puts first on its path (``python_start/sitecustomize.py``).
PYTHON_START = str(Path(__file__).resolve().parent / "python_start")
if PYTHON_START not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH", ""), PYTHON_START) if p
    )

#: The local RocksDB copies of the suite's queries: a directory of this process's own, removed
#: when it ends. The default one (``sparkstate-<uid>`` in the temp dir) keeps every query's copy
#: across applications, so that a restart reopens it: thousands per run of the suite.
if "SPARKSTATE_LOCAL_DIR" not in os.environ:
    os.environ["SPARKSTATE_LOCAL_DIR"] = tempfile.mkdtemp(prefix="sparkstate-local-")
    atexit.register(shutil.rmtree, os.environ["SPARKSTATE_LOCAL_DIR"], True)

#: The cluster's package: one group, first.
CLUSTER = "tests/cluster/"
#: Modules that run for minutes, longest first (measured with ``--durations``).
LONGEST = (
    "tests/connect/test_connect.py",
    "tests/chaos/test_chaos.py",
    "tests/engine/test_repartition.py",
    "tests/engine/test_join.py",
    "tests/engine/test_aggregate_functions.py",
    "tests/compat/test_transform_with_state.py",
    "tests/engine/test_state_reader.py",
    "tests/compat/test_state_variables.py",
    "tests/engine/test_state_home.py",
    "tests/engine/test_checkpoint.py",
    "tests/engine/test_port.py",
    "tests/engine/test_arbitrary.py",
)


def _group(item: pytest.Item) -> str:
    module = item.nodeid.split("::")[0]
    return "cluster" if module.startswith(CLUSTER) else module


def _rank(item: pytest.Item) -> int:
    group = _group(item)
    if group == "cluster":
        return 0
    return 1 + LONGEST.index(group) if group in LONGEST else 1 + len(LONGEST)


def pytest_configure(config: pytest.Config) -> None:
    """The options of every ``spark-submit`` (xdist's processes inherit the controller's). Under
    xdist a missing class archive is written while the cluster's group, whose JVMs do not use
    it, runs; the other tests wait for it (:func:`pytest_runtest_setup`)."""
    if "SPARK_SUBMIT_OPTS" in os.environ:
        return
    parallel = bool(config.getoption("numprocesses", None))
    # Spark takes the JVM's ``spark.*`` system properties as its defaults.
    settings = JVM_SETTINGS if COMPAT_RUN else {**SPARK_DEFAULTS, **JVM_SETTINGS}
    properties = [f"-D{k}={v}" for k, v in settings.items()]
    base = " ".join([JIT_OPTS, *properties])
    os.environ["SPARK_SUBMIT_OPTS"] = java_options(base, background=parallel)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start a JVM
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _group(item) != "cluster":
        wait_for_archive()


def pytest_unconfigure(config: pytest.Config) -> None:
    wait_for_archive()  # the controller's child, reaped


#: The fast tier (``-m fast``, ``./scripts/test --fast``): what a developer runs after each
#: change. Whole modules and packages that start no Spark (the stores, their contract, the
#: operators, the runtime, the layers) and one differential query per operator family.
FAST = (
    "tests/store/",
    "tests/operators/",
    "tests/runtime/",
    "tests/test_layers.py",
    "tests/test_console.py",
    "tests/test_package.py",
    "tests/test_docs.py",
    "tests/engine/test_differential.py",  # aggregation, deduplication, the two chained
    "tests/engine/test_windows.py::test_windowed_aggregation_matches_spark",
    "tests/engine/test_session_windows.py::test_session_windows_match_spark",
    "tests/engine/test_join.py::test_join_matches_spark",
    "tests/engine/test_arbitrary.py::test_count_and_remove_match_spark_aipws",
    "tests/engine/test_arbitrary.py::test_count_and_clear_match_spark_tws",
    "tests/engine/test_limit.py::test_limit_matches_spark",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(FAST):
            item.add_marker(pytest.mark.fast)
    if hasattr(config, "workerinput"):  # an xdist worker: the order above
        items.sort(key=_rank)  # stable: a module's tests keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduling by module (``--dist loadfile``), the cluster's package one unit, the
    units in the order the workers collected them (above). (xdist's own groups do not reach it
    under pytest 9: ``--dist loadgroup`` spreads a module's tests.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return "cluster" if module.startswith(CLUSTER) else module

    config.option.loadscopereorder = False
    return ByModule(config, log)


#: Set by ``scripts/compat``: a run of the compatibility suite (``-m versions``) on an older
#: PySpark, where what that PySpark lacks is refused at ``start()`` ("... needs PySpark X").
COMPAT_RUN = os.environ.get("SPARKSTATE_COMPAT_RUN") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """In a compatibility run, a test that the running PySpark refuses with the version it
    needs is reported skipped, with the refusal as the reason (the table of ``scripts/compat``
    lists them); any other failure stays a failure."""
    outcome = yield
    if not COMPAT_RUN or call.excinfo is None:
        return
    from sparkstate.exceptions import ConfigurationError

    refusal = str(call.excinfo.value)
    if call.excinfo.errisinstance(ConfigurationError) and " needs PySpark " in refusal:
        report = outcome.get_result()
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"refused: {refusal}")
