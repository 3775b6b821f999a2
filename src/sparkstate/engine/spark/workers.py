"""Which Python the workers run, checked once before a query starts.

A worker that cannot import sparkstate fails deep inside Spark, in the first batch, with a Java
stack trace. :func:`check_workers` runs one tiny DataFrame job first (a plain Python UDF, so the
worker needs nothing but PySpark to run it) that tries the imports a stateful task makes and
reports the interpreter; a failure becomes a :class:`ConfigurationError` naming the interpreter,
what did not import and the setting that fixes it. The answer is kept per application and
interpreter, so only the first ``start()`` of a process pays for the job; and a local session
whose workers run the driver's own interpreter, where the driver imported sparkstate from a
directory every worker has on its path, pays nothing (:func:`_same_as_driver`).

The interpreter is chosen the way PySpark does (``PYSPARK_PYTHON``, else ``python3`` from
``PATH``), with two differences on a classic session: ``spark.pyspark.python`` counts also when
set on the builder of a script that spark-submit did not start (PySpark reads it only in
spark-submit), and with a ``local`` master and nothing set the workers run the driver's own
interpreter (``sys.executable``), which has sparkstate since the driver imported it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import platform
import re
import shutil
import site
import sys
import time
from collections.abc import Callable
from typing import Any

from sparkstate.engine.spark.python_launch import launcher
from sparkstate.exceptions import ConfigurationError
from sparkstate.store.registry import provider_class

__all__ = ["Interpreter", "WorkerPython", "check_workers", "choose_interpreter"]

log = logging.getLogger("sparkstate.engine")

#: What PySpark runs when nothing is set (``SparkContext.pythonExec``).
PYSPARK_DEFAULT = "python3"
#: Where a local session's workers find what the driver adds to their path.
EXECUTOR_PYTHONPATH = "spark.executorEnv.PYTHONPATH"
#: What every stateful task imports in the worker (pyarrow and the operators with it).
TASK_MODULES = ("sparkstate", "sparkstate.runtime.tasks")
#: Providers whose third-party module the message names with the fix.
_PROVIDER_PACKAGES = {"rocksdb": "rocksdict"}
#: Results of successful checks: (application, interpreter, modules) -> what the workers run.
_CHECKED: dict[tuple[str | None, str | None, tuple[str, ...]], WorkerPython] = {}


@dataclasses.dataclass(frozen=True)
class Interpreter:
    """The workers' interpreter as the driver sees it (``None`` on Spark Connect, where the
    server decides) and the setting it comes from, for messages."""

    path: str | None
    source: str


@dataclasses.dataclass(frozen=True)
class WorkerPython:
    """What the check task found in a worker: its interpreter, Python version, the file each
    module was imported from, and sparkstate's version there."""

    executable: str
    version: str
    modules: dict[str, str | None]
    sparkstate_version: str | None
    elapsed_s: float


def choose_interpreter(spark: Any) -> Interpreter:
    """The interpreter the workers will run, set on the session's SparkContext where PySpark
    would otherwise ignore the user's ``spark.pyspark.python`` or, on a local master with nothing
    set, run ``python3`` from ``PATH`` instead of the driver's interpreter.

    On a local master the workers start through the interpreter's launcher
    (:mod:`sparkstate.engine.spark.python_launch`): their daemon, started once per application and
    interpreter, imports PySpark compiled instead of compiling it from Spark's zip (about 1 s)."""
    sc: Any = getattr(spark, "_sc", None)
    if not hasattr(sc, "pythonExec"):  # Spark Connect: the server's workers, not ours to set
        return Interpreter(None, "chosen by the Spark Connect server")
    known = _BY_LAUNCHER.get(sc.pythonExec)
    chosen = _interpreter(spark, sc) if known is None else known
    if known is not None and spark.conf.get("spark.pyspark.python", None) not in (None, known.path):
        chosen = _interpreter(spark, sc)  # the setting changed since
    sc.pythonExec = chosen.path
    if str(sc.master).startswith("local") and chosen.path and shutil.which(chosen.path):
        script = launcher(chosen.path)
        if script is not None:
            _BY_LAUNCHER[script] = chosen
            sc.pythonExec = script
    return chosen


#: The interpreter each launcher set as a SparkContext's ``pythonExec`` starts.
_BY_LAUNCHER: dict[str, Interpreter] = {}


def _interpreter(spark: Any, sc: Any) -> Interpreter:
    conf = spark.conf.get("spark.pyspark.python", None)
    if conf:
        return Interpreter(conf, "set by spark.pyspark.python")
    env = os.environ.get("PYSPARK_PYTHON")
    if env and sc.pythonExec == env:
        return Interpreter(env, "set by PYSPARK_PYTHON")
    if sc.pythonExec != PYSPARK_DEFAULT:
        return Interpreter(sc.pythonExec, "set on the SparkContext (pythonExec)")
    if str(sc.master).startswith("local"):
        return Interpreter(
            sys.executable,
            "the driver's interpreter: neither PYSPARK_PYTHON nor spark.pyspark.python is set",
        )
    return Interpreter(
        PYSPARK_DEFAULT,
        "PySpark's default, python3 from the executors' PATH: "
        "neither PYSPARK_PYTHON nor spark.pyspark.python is set",
    )


def check_workers(spark: Any, provider: str) -> WorkerPython:
    """Choose the workers' interpreter, then check once per application and interpreter that it
    can run a stateful task with ``provider`` (a provider name or ``"pkg.mod:Class"``).

    Raises :class:`ConfigurationError` naming the interpreter, what failed and the fix.
    """
    interpreter = choose_interpreter(spark)
    modules = (*TASK_MODULES, provider_class(provider).__module__)
    key = (spark.conf.get("spark.app.id", None), interpreter.path, modules)
    found = _CHECKED.get(key)
    if found is None:
        found = _same_as_driver(spark, interpreter, modules)
    if found is None:
        found = _run_check(spark, interpreter, modules, provider)
        log.info(
            "the Python workers run %s (Python %s); checked in %.2f s",
            found.executable,
            found.version,
            found.elapsed_s,
        )
        _CHECKED[key] = found
    return found


def _same_as_driver(
    spark: Any, interpreter: Interpreter, modules: tuple[str, ...]
) -> WorkerPython | None:
    """What the workers run, known without a job, or None: on a local master whose workers run
    the driver's own interpreter, each module the driver imported from a directory that is on
    the path every worker starts with (the interpreter's site directories and what their
    ``.pth`` files add, ``PYTHONPATH``, ``spark.executorEnv.PYTHONPATH``, the working directory)
    is the file the workers import. A module found elsewhere (a driver that put it on its own
    ``sys.path``) is checked by the job."""
    sc: Any = getattr(spark, "_sc", None)
    if sc is None or not str(sc.master).startswith("local") or interpreter.path is None:
        return None
    if os.path.abspath(interpreter.path) != os.path.abspath(sys.executable):
        return None  # not resolved: a venv's interpreter is a link to the system's
    roots = _worker_path(spark)
    found: dict[str, str | None] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the job says what fails, in the workers
            return None
        top = sys.modules[name.partition(".")[0]]
        file = getattr(top, "__file__", None)
        if file is None:
            return None
        root = os.path.dirname(file)
        if os.path.basename(file) == "__init__.py":
            root = os.path.dirname(root)
        if os.path.realpath(root) not in roots:
            return None
        found[name] = getattr(module, "__file__", None)
    return WorkerPython(
        executable=sys.executable,
        version=platform.python_version(),
        modules=found,
        sparkstate_version=getattr(sys.modules["sparkstate"], "__version__", None),
        elapsed_s=0.0,
    )


def _worker_path(spark: Any) -> set[str]:
    """The directories on the path a local worker of the driver's interpreter starts with."""
    dirs = [*site.getsitepackages(), site.getusersitepackages(), os.getcwd()]
    for directory in list(dirs):
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(directory, name)) as f:
                    lines = [line.strip() for line in f]
            except OSError:
                continue
            dirs += [line for line in lines if line and not line.startswith(("#", "import"))]
    for value in (os.environ.get("PYTHONPATH"), spark.conf.get(EXECUTOR_PYTHONPATH, None)):
        dirs += [d for d in (value or "").split(os.pathsep) if d]
    return {os.path.realpath(d) for d in dirs}


def _run_check(
    spark: Any, interpreter: Interpreter, modules: tuple[str, ...], provider: str
) -> WorkerPython:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    # A plain UDF (not Arrow): the worker needs only PySpark to run it and report.
    probe = F.udf(_import_probe(modules), StringType(), useArrow=False)
    started = time.monotonic()
    try:
        rows = spark.range(0, 1, 1, 1).select(probe(F.lit(0))).collect()
    except Exception as exc:
        raise ConfigurationError(_job_failed(interpreter, exc, provider)) from exc
    elapsed = time.monotonic() - started
    report: dict[str, Any] = json.loads(rows[0][0])
    where = f"{report['executable']} (Python {report['version']}; {interpreter.source})"
    failed = report["failed"]
    if failed:
        module, error = failed
        msg = (
            f"the Python workers cannot run sparkstate: their interpreter {where} "
            f"cannot import {_what(module, provider)}: {error}. {_fix(provider)}"
        )
        raise ConfigurationError(msg)
    driver_version = getattr(sys.modules["sparkstate"], "__version__", None)
    if report["sparkstate_version"] != driver_version:
        msg = (
            f"the Python workers run sparkstate {report['sparkstate_version']} "
            f"(from {report['modules']['sparkstate']}, interpreter {where}) but the driver "
            f"runs {driver_version}: install the same version for both"
        )
        raise ConfigurationError(msg)
    return WorkerPython(
        executable=report["executable"],
        version=report["version"],
        modules=report["modules"],
        sparkstate_version=report["sparkstate_version"],
        elapsed_s=elapsed,
    )


def _import_probe(modules: tuple[str, ...]) -> Callable[[int], str]:
    """The check task's function. It is a closure so that cloudpickle ships it by value: a
    worker without sparkstate must be able to run it."""

    def probe(_: int) -> str:
        import importlib
        import json
        import platform
        import sys

        found: dict[str, str | None] = {}
        failed: list[str] = []
        for name in modules:
            try:
                found[name] = getattr(importlib.import_module(name), "__file__", None)
            except Exception as exc:  # noqa: BLE001 - reported to the driver
                failed = [name, f"{type(exc).__name__}: {exc}"]
                break
        version = getattr(sys.modules.get("sparkstate"), "__version__", None)
        return json.dumps(
            {
                "executable": sys.executable,
                "version": platform.python_version(),
                "modules": found,
                "failed": failed,
                "sparkstate_version": version,
            }
        )

    return probe


def _what(module: str, provider: str) -> str:
    if module in TASK_MODULES:
        return module
    return f"{module} (the state store provider {provider!r})"


def _fix(provider: str) -> str:
    """How to give the workers the driver's interpreter, which has what they need."""
    needs = " and ".join(filter(None, ["sparkstate", _PROVIDER_PACKAGES.get(provider)]))
    exe = sys.executable
    return (
        f"Run the workers with an interpreter that has {needs} installed, such as the driver's: "
        f"set PYSPARK_PYTHON={exe} before the SparkSession is created, or "
        f'.config("spark.pyspark.python", "{exe}") on its builder '
        f"(spark-submit: --conf spark.pyspark.python={exe}); on a cluster, see "
        "'Running on a cluster' in sparkstate's README."
    )


#: What makes a failed check job's message worth a line (the rest is a Java stack trace).
_REASONS = (
    re.compile(r'Cannot run program "[^"]*": [^\n]*'),
    re.compile(r"\[PYTHON_VERSION_MISMATCH\][^\n]*"),
    re.compile(r"(?:ModuleNotFoundError|ImportError): [^\n]*"),
)


def _job_failed(interpreter: Interpreter, exc: BaseException, provider: str) -> str:
    text = str(exc)
    reason = next((m.group(0) for p in _REASONS if (m := p.search(text))), None)
    if reason is None:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        reason = f"{type(exc).__name__}: {lines[0][:300] if lines else '(no message)'}"
    who = interpreter.path or "the workers' interpreter"
    return (
        f"the Python workers could not run sparkstate's check task with {who} "
        f"({interpreter.source}): {reason}. {_fix(provider)}"
    )
