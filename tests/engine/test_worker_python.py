"""The workers' interpreter: chosen and checked at ``start()``
(``sparkstate.engine.spark.workers``).

The Spark tests run ``worker_python_job.py`` in a process of its own (its own SparkSession, so
its own ``PYSPARK_PYTHON``), without ``PYTHONPATH``: the workers then find sparkstate only where
their interpreter has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

import sparkstate
from sparkstate.engine.spark import workers
from sparkstate.engine.spark.python_launch import launched, launcher

JOB = Path(__file__).with_name("worker_python_job.py")
SRC = str(Path(sparkstate.__file__).resolve().parents[1])


class Runs(NamedTuple):
    results: list[dict[str, Any]]
    stderr: str
    root: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """One driver process, two sessions: the workers run an interpreter without sparkstate
    (``PYSPARK_PYTHON`` = a bare venv of the driver's Python version), then nothing is set."""
    tmp = tmp_path_factory.mktemp("worker-python")
    bare = tmp / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    settings = [f"PYSPARK_PYTHON={bare / 'bin' / 'python'}", "unset"]
    proc = subprocess.run(
        [sys.executable, str(JOB), SRC, str(tmp / "job"), *settings],
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["setting"] for r in results] == settings, proc.stdout[-2000:] + proc.stderr[-5000:]
    return Runs(results, proc.stderr, tmp / "job")


@pytest.mark.spark
def test_workers_without_sparkstate_fail_at_start_with_the_fix(
    runs: Runs,
) -> None:
    out = runs.results[0]
    python = out["setting"].partition("=")[2]
    print(f"\nstart() failed after {out['elapsed_s']:.1f} s:\n{out.get('error')}")
    assert out.get("error_type") == "ConfigurationError", out
    msg = out["error"]
    assert f"their interpreter {python} (Python 3." in msg
    assert "set by PYSPARK_PYTHON" in msg
    assert "cannot import sparkstate: ModuleNotFoundError: No module named 'sparkstate'" in msg
    assert "sparkstate and rocksdict installed" in msg
    assert f"PYSPARK_PYTHON={sys.executable} " in msg
    assert f'.config("spark.pyspark.python", "{sys.executable}")' in msg
    for java in ("org.apache.spark", "Py4J", "\tat "):
        assert java not in msg
        assert java not in runs.stderr
    # Nothing started and nothing written: the check runs before the checkpoint is used.
    assert out["active_queries"] == 0
    assert not (runs.root / "0" / "checkpoint" / "sparkstate" / "metadata.json").exists()
    assert out["elapsed_s"] < 120


@pytest.mark.spark
def test_local_workers_run_the_drivers_interpreter_when_nothing_is_set(
    runs: Runs,
) -> None:
    # PySpark's choice would be python3 from PATH, without sparkstate's dependencies here. The
    # workers get the sparkstate under test from spark.executorEnv.PYTHONPATH.
    out = runs.results[1]
    print(f"\nstart() took {out['start_s']:.1f} s, the whole query {out['elapsed_s']:.1f} s")
    assert "error" not in out, out["error"]
    assert out["python_exec_before"] == "python3"
    assert out["python_exec_runs"] == sys.executable  # through its launcher

    assert out["worker_executable"] == sys.executable
    assert out["rows"] == [["a", 3], ["b", 1], ["c", 1]]


# --------------------------------------------------------------------------- without Spark


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


def fake_session(master: str, python_exec: str = "python3", **conf: str) -> Any:
    return SimpleNamespace(
        conf=FakeConf(conf), _sc=SimpleNamespace(master=master, pythonExec=python_exec)
    )


def test_builder_spark_pyspark_python_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    # PySpark reads spark.pyspark.python only in spark-submit; a builder's setting counts too.
    monkeypatch.setenv("PYSPARK_PYTHON", "/env/python")
    spark = fake_session("spark://h:7077", "/env/python", **{"spark.pyspark.python": "/c/py"})
    chosen = workers.choose_interpreter(spark)
    assert (chosen.path, spark._sc.pythonExec) == ("/c/py", "/c/py")
    assert chosen.source == "set by spark.pyspark.python"


def test_pyspark_python_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/env/python")
    spark = fake_session("local[2]", "/env/python")
    assert workers.choose_interpreter(spark).source == "set by PYSPARK_PYTHON"
    assert spark._sc.pythonExec == "/env/python"


def test_nothing_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    local = fake_session("local[*]")
    assert workers.choose_interpreter(local).path == sys.executable
    # Through the launcher of the driver's interpreter (PySpark imported compiled):
    assert local._sc.pythonExec == launcher(sys.executable)
    assert launched(local._sc.pythonExec) == sys.executable
    assert workers.choose_interpreter(local).path == sys.executable  # the same at every start
    # On a cluster the driver's path may not exist on the executors: PySpark's default stays.
    remote = fake_session("spark://h:7077")
    chosen = workers.choose_interpreter(remote)
    assert (chosen.path, remote._sc.pythonExec) == ("python3", "python3")
    assert "python3 from the executors' PATH" in chosen.source
    # Set on the SparkContext by the user's code: kept.
    own = fake_session("local[*]", "/own/python")
    assert workers.choose_interpreter(own).path == "/own/python"


def test_a_local_master_starts_the_chosen_interpreter_through_its_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    local = fake_session("local[2]", sys.executable)
    for _ in range(2):  # the same at every start: the launcher is known for what it starts
        chosen = workers.choose_interpreter(local)
        assert (chosen.path, chosen.source) == (sys.executable, "set by PYSPARK_PYTHON")
        assert launched(local._sc.pythonExec) == sys.executable
    # An interpreter that cannot be found is left to Spark, which names it when it fails:
    missing = fake_session("local[2]", **{"spark.pyspark.python": "/no/such/python"})
    assert workers.choose_interpreter(missing).path == "/no/such/python"
    assert missing._sc.pythonExec == "/no/such/python"


def test_local_workers_of_the_driver_s_interpreter_need_no_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's interpreter on a local master finds sparkstate where the driver did (this
    venv's site directory or a path its .pth adds): no check job. Elsewhere, the job runs."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    modules = (*workers.TASK_MODULES, "sparkstate.store.rocksdb")
    own = workers.Interpreter(sys.executable, "the driver's")
    found = workers._same_as_driver(fake_session("local[2]", sys.executable), own, modules)
    assert found is not None
    assert found.executable == sys.executable
    assert found.modules["sparkstate"] == sparkstate.__file__
    assert found.sparkstate_version == sparkstate.__version__
    other = workers.Interpreter(str(tmp_path / "python"), "PYSPARK_PYTHON")
    assert workers._same_as_driver(fake_session("local[2]"), other, modules) is None
    cluster = fake_session("spark://h:7077", sys.executable)
    assert workers._same_as_driver(cluster, own, modules) is None
    # A module only on the driver's own sys.path: the workers would not find it.
    (tmp_path / "only_here.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    only = (*workers.TASK_MODULES, "only_here")
    assert workers._same_as_driver(fake_session("local[2]"), own, only) is None
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # ... unless the workers' path has it
    assert workers._same_as_driver(fake_session("local[2]"), own, only) is not None
    given = fake_session("local[2]", **{workers.EXECUTOR_PYTHONPATH: str(tmp_path)})
    monkeypatch.delenv("PYTHONPATH")
    assert workers._same_as_driver(given, own, only) is not None
    assert workers._same_as_driver(fake_session("local[2]"), own, ("no_such_module",)) is None


def test_spark_connect_is_not_chosen_for() -> None:
    spark = SimpleNamespace(conf=FakeConf({}))  # no SparkContext
    assert workers.choose_interpreter(spark).path is None


@pytest.mark.parametrize(
    ("java_message", "reason"),
    [
        (
            'Job aborted: java.io.IOException: Cannot run program "/no/python": error=2, '
            "No such file or directory\n\tat java.base/java.lang.ProcessBuilder.start",
            'Cannot run program "/no/python": error=2, No such file or directory',
        ),
        (
            "An exception was thrown from the Python worker:\n  File ...\n"
            "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] "
            "Python in worker has different version: 3.10 than that in driver: 3.11, PySpark "
            "cannot run with different minor versions.\n\tat org.apache.spark.api.python",
            "[PYTHON_VERSION_MISMATCH] Python in worker has different version: 3.10 than that "
            "in driver: 3.11, PySpark cannot run with different minor versions.",
        ),
        ("something else\n\tat org.apache.spark.Foo", "RuntimeError: something else"),
    ],
)
def test_a_failed_check_job_is_reported_in_a_line(java_message: str, reason: str) -> None:
    chosen = workers.Interpreter("/no/python", "set by PYSPARK_PYTHON")
    msg = workers._job_failed(chosen, RuntimeError(java_message), "memory")
    assert msg.startswith(
        "the Python workers could not run sparkstate's check task with /no/python "
        f"(set by PYSPARK_PYTHON): {reason}. Run the workers with an interpreter that has "
        "sparkstate installed"
    )
    assert "\tat " not in msg


def test_the_probe_reports_the_first_import_that_fails() -> None:
    probe = workers._import_probe(("sparkstate", "sparkstate_no_such_module", "json"))
    report = json.loads(probe(0))
    assert report["executable"] == sys.executable
    assert report["modules"] == {"sparkstate": sparkstate.__file__}
    assert report["failed"] == [
        "sparkstate_no_such_module",
        "ModuleNotFoundError: No module named 'sparkstate_no_such_module'",
    ]
    assert report["sparkstate_version"] == sparkstate.__version__
    assert workers._what("sparkstate.store.rocksdb.provider", "rocksdb") == (
        "sparkstate.store.rocksdb.provider (the state store provider 'rocksdb')"
    )
