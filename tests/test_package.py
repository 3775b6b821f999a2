"""The package as a user installs it: its version, written in one place, and the command's."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import sparkstate


def test_the_installed_version_is_the_one_in_the_source() -> None:
    assert metadata.version("sparkstate") == sparkstate.__version__


def test_the_command_says_its_version_and_the_pyspark_it_runs_with() -> None:
    command = Path(sys.executable).with_name("sparkstate")
    done = subprocess.run(
        [str(command), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert done.returncode == 0, done.stderr
    pyspark = metadata.version("pyspark")
    assert done.stdout.strip() == f"sparkstate {sparkstate.__version__} (PySpark {pyspark})"
