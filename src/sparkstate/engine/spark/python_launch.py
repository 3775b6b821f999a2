"""The interpreters Spark starts on this machine, importing PySpark compiled, not from its zip.

Spark starts a new interpreter for a Python streaming source at every start of a query (its
source runner), a daemon per data-source step once per session, and the Python workers' daemon
once per application, each with PySpark's own ``pyspark.zip`` and py4j's zip first on
``PYTHONPATH``. Python keeps no compiled files for a module imported from a zip: such an
interpreter compiles PySpark at every start, 1.4 s of CPU against 0.3 s from the installed
package's compiled files, which was most of what the clock added to a query's start.

Where the zip is the installed ``pyspark`` package's own (a pip install: the same files under
``pyspark/python/lib``, with ``pyspark`` and its pinned py4j installed beside it on the path),
the launcher drops it from the path and runs the module Spark asked for. Any other zip (a Spark
distribution's ``SPARK_HOME``) stays where Spark put it. Two things start through a launcher:
the clock source, registered with one as its interpreter (:func:`register_with_launcher`), and
on a local master the Python workers (the SparkContext's ``pythonExec``, set by
:func:`sparkstate.engine.spark.workers.choose_interpreter`). Nothing that can run on another machine
does, for the launcher is a file of this one. This file is also the launcher's code: Spark runs
``<launcher> -m <module> [args]``, and the launcher ``<python> -c <this file> -m <module>
[args]``.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import Any

#: Where a pip-installed PySpark keeps the zips Spark puts on its workers' path.
_LIB = os.path.join("pyspark", "python", "lib")


def installed_zips_dropped(path: list[str]) -> list[str]:
    """``path`` without the zips of the installed ``pyspark`` package that is on it: its
    ``pyspark.zip``, and py4j's zip where that py4j version is installed there too."""
    return [entry for entry in path if not _installed_zip(entry, path)]


def _installed_zip(entry: str, path: list[str]) -> bool:
    name = os.path.basename(entry)
    lib = os.path.dirname(entry)
    if not lib.endswith(os.sep + _LIB):
        return False
    site = lib[: -len(os.sep + _LIB)]
    if not os.path.isfile(os.path.join(site, "pyspark", "__init__.py")):
        return False
    real_site = os.path.realpath(site)
    if not any(os.path.realpath(p or os.curdir) == real_site for p in path if p != entry):
        return False  # the installed package is not importable: the zip is all there is
    if name == "pyspark.zip":
        return True
    if name.startswith("py4j-") and name.endswith("-src.zip"):
        version = name[: -len("-src.zip")]
        return os.path.isdir(os.path.join(site, f"{version}.dist-info"))
    return False


def main() -> None:
    """``python -c <this file> -m module [args]``: ``python -m module [args]``, with the path
    of :func:`installed_zips_dropped`; with other arguments, ``python [args]`` as it is."""
    import runpy

    if len(sys.argv) < 3 or sys.argv[1] != "-m":  # not what Spark runs: the interpreter runs it
        os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    sys.path[:] = installed_zips_dropped(sys.path)
    module = sys.argv[2]
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


#: The launcher made for each interpreter in this process (None: none can be made).
_LAUNCHERS: dict[str, str | None] = {}
_LOCK = threading.Lock()


def launcher(python: str) -> str | None:
    """An executable that starts ``python`` as :func:`main` does (made once per process, in a
    directory of its own removed at exit; ``python`` itself where it is one), or None where
    there can be none: not a POSIX system, or a temporary directory that runs nothing
    (``noexec``)."""
    import atexit
    import shlex
    import tempfile

    if os.name != "posix":
        return None
    with _LOCK:
        if python in _LAUNCHERS:
            return _LAUNCHERS[python]
        if python in _LAUNCHERS.values():  # a launcher already
            return python
        script: str | None = None
        directory = tempfile.mkdtemp(prefix="sparkstate-python-")
        atexit.register(_remove, directory, os.getpid())
        if not os.statvfs(directory).f_flag & getattr(os, "ST_NOEXEC", 0):
            with open(__file__, encoding="utf-8") as f:
                code = f.read()
            script = os.path.join(directory, "python")
            with open(script, "w", encoding="utf-8") as f:
                f.write(f'#!/bin/sh\nexec {shlex.quote(python)} -c {shlex.quote(code)} "$@"\n')
            os.chmod(script, 0o700)
        _LAUNCHERS[python] = script
        return script


def _remove(directory: str, owner: int) -> None:
    """At exit of the process that made ``directory`` (not of a child forked from it)."""
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)


def launched(path: str) -> str | None:
    """The interpreter ``path`` starts where it is a launcher of this process, else None."""
    with _LOCK:
        return next((python for python, made in _LAUNCHERS.items() if made == path), None)


def register_with_launcher(spark: Any, source: type) -> bool:
    """Register the Python data source ``source`` on ``spark`` (a classic session) with the
    launcher of the session's interpreter as the interpreter Spark starts for it; False where
    that cannot be done (Spark Connect, no launcher), and it is not registered."""
    sc: Any = getattr(spark, "_sc", None)
    python = getattr(sc, "pythonExec", None)
    if not python:
        return False
    script = launcher(python)
    if script is None:
        return False
    try:
        from pyspark.core.rdd import _prepare_for_python_RDD
    except ImportError:  # not where PySpark 4.0-4.3 have it: Spark's own registration
        return False

    pickled, broadcasts, env, includes = _prepare_for_python_RDD(sc, source)
    jvm = sc._jvm
    function = jvm.SimplePythonFunction(
        bytearray(pickled), env, includes, script, sc.pythonVer, broadcasts, sc._javaAccumulator
    )
    data_source = getattr(
        jvm, "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource"
    )(function)
    spark._jsparkSession.dataSource().registerPython(source.name(), data_source)  # type: ignore[attr-defined]
    return True


if __name__ == "__main__":  # the launcher: python -c <this file> -m module [args]
    main()
