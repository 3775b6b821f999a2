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


def test_the_command_s_help_is_plain_text() -> None:
    """``--help`` of the command, of each subcommand and of each benchmark, as a terminal shows
    it: no reST markup."""
    from sparkstate.cli import BENCHES

    command = Path(sys.executable).with_name("sparkstate")
    commands = ["demo", "bench", "inspect", "report", "repartition", "export"]
    commands += [f"bench {name}" for name in BENCHES]
    for args in (["--help"], *([*name.split(), "--help"] for name in commands)):
        done = subprocess.run(
            [str(command), *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert "``" not in done.stdout and ":func:" not in done.stdout, done.stdout
    said = subprocess.run(
        [str(command), "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    assert "inspect a checkpoint" in " ".join(said.split())  # as wrapped for the terminal
