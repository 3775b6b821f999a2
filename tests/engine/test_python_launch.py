"""The interpreter Spark starts for the clock source (``sparkstate.engine.spark.python_launch``): it
imports the installed PySpark, not the copy zipped inside it, and runs what Spark asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from sparkstate.engine.spark import python_launch
from sparkstate.engine.spark.python_launch import installed_zips_dropped, launcher

PY4J = "py4j-0.10.9.9"


def _site(root: Path, *, py4j_installed: bool = True) -> tuple[str, str, str]:
    """A site directory with a pip-installed PySpark: its zips and the directory."""
    lib = root / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("")
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / f"{PY4J}-src.zip").write_bytes(b"")
    if py4j_installed:
        (root / f"{PY4J}.dist-info").mkdir()
    return str(lib / "pyspark.zip"), str(lib / f"{PY4J}-src.zip"), str(root)


def test_the_installed_packages_zips_are_dropped(tmp_path: Path) -> None:
    pyspark_zip, py4j_zip, site = _site(tmp_path)
    other = str(tmp_path / "elsewhere")
    assert installed_zips_dropped([pyspark_zip, py4j_zip, other, site]) == [other, site]


def test_py4j_zip_stays_where_its_version_is_not_installed(tmp_path: Path) -> None:
    pyspark_zip, py4j_zip, site = _site(tmp_path, py4j_installed=False)
    assert installed_zips_dropped([pyspark_zip, py4j_zip, site]) == [py4j_zip, site]


def test_zips_stay_where_the_package_is_not_on_the_path(tmp_path: Path) -> None:
    pyspark_zip, py4j_zip, _ = _site(tmp_path)
    assert installed_zips_dropped([pyspark_zip, py4j_zip]) == [pyspark_zip, py4j_zip]


def test_a_spark_distributions_zips_stay(tmp_path: Path) -> None:
    """SPARK_HOME/python/lib: not inside an installed ``pyspark`` package."""
    home = tmp_path / "spark-4.1.0-bin"
    (home / "python" / "lib").mkdir(parents=True)
    (home / "python" / "pyspark").mkdir()
    (home / "python" / "pyspark" / "__init__.py").write_text("")
    zipped = str(home / "python" / "lib" / "pyspark.zip")
    path = [zipped, str(home / "python")]
    assert installed_zips_dropped(path) == path


PROBE = """
import sys, pyspark
print(pyspark.__file__)
print(sys.argv[1:])
sys.exit(3)
"""


@pytest.mark.skipif(os.name != "posix", reason="the launcher is a POSIX shell script")
def test_the_launcher_runs_the_module_with_pyspark_compiled(tmp_path: Path) -> None:
    """Started as Spark starts a worker (its zips first on ``PYTHONPATH``): the module runs with
    its arguments and exit status, and imports PySpark from the installed package."""
    (tmp_path / "probe_module.py").write_text(PROBE)
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*-src.zip"))]
    assert Path(zips[0]).is_file()
    script = launcher(sys.executable)
    assert script is not None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*zips, str(tmp_path)])}
    env.pop("PYTHONSTARTUP", None)
    done = subprocess.run(
        [script, "-m", "probe_module", "a b", "--c"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    imported, argv = done.stdout.splitlines()
    assert imported == pyspark.__file__
    assert argv == str(["a b", "--c"])
    # Without the launcher, the same interpreter imports it from the zip:
    plain = subprocess.run(
        [sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "pyspark.zip" in plain.stdout


@pytest.mark.skipif(os.name != "posix", reason="the launcher is a POSIX shell script")
def test_other_arguments_go_to_the_interpreter_as_they_are() -> None:
    script = launcher(sys.executable)
    assert script is not None
    done = subprocess.run(
        [script, "-c", "import sys; print(sys.argv[1:]); sys.exit(4)", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (4, "['x']"), done.stderr


def test_one_launcher_per_interpreter() -> None:
    assert launcher(sys.executable) == launcher(sys.executable)
    made = launcher(sys.executable)
    assert made is not None and launcher(made) == made  # never a launcher of a launcher
    assert python_launch._LAUNCHERS[sys.executable] == launcher(sys.executable)


FORKED = """
import os, sys
from sparkstate.engine.spark.python_launch import launcher
made = launcher(sys.executable)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a child forked from the driver ends: its exit handlers run
os.waitpid(pid, 0)
print(os.path.exists(made))
print(made)
"""


@pytest.mark.skipif(os.name != "posix", reason="the launcher is a POSIX shell script")
def test_the_launcher_lives_as_long_as_the_process_that_made_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=60, check=True
    )
    alive_after_child, made = done.stdout.split()
    assert alive_after_child == "True"  # not removed by a forked child's exit
    assert not os.path.exists(made)  # removed at the exit of the process that made it
