"""README's "Running on a cluster", step by step, on a standalone cluster of its own whose nodes
have nothing installed (no ``PYTHONPATH``, no ``PYSPARK_PYTHON``): a virtual environment with
sparkstate (a wheel built from this repository, installed without pyspark) and its runtime
dependencies, packed with venv-pack, shipped with ``spark-submit --archives``, the workers'
interpreter ``./environment/bin/python``, a stateful query with the rocksdb store, and a look from
inside tasks at where their Python and sparkstate come from.

What differs from the README only saves time: pip installs into the environment from outside
(``pip --python``) instead of activating it, the archive is not compressed (it goes over
loopback), and the wheel is built while the dependencies install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import HOST, SESSION_CONF, SPARK_HOME, Cluster, java_missing

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
#: Two batches (one file each): keys in both, and keys in one only.
INPUT = [
    [{"k": "a", "v": 1}, {"k": "b", "v": 10}, {"k": "a", "v": 2}, {"k": "c", "v": 5}],
    [{"k": "a", "v": 4}, {"k": "d", "v": 7}, {"k": "b", "v": -3}],
]


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check", *args]


def pack_environment(root: Path) -> tuple[Path, dict[str, float]]:
    """``pyspark_venv.tar.gz`` under ``root``: sparkstate, pyarrow, pandas, numpy, rocksdict,
    xxhash (the checksums of the SST files a lazy restore reads in place)."""
    times: dict[str, float] = {}
    started = time.monotonic()
    # The wheel is built from a copy of the sources, so that the build leaves nothing in the repo.
    source = root / "source"
    shutil.copytree(
        REPO / "src" / "sparkstate",
        source / "src" / "sparkstate",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    wheel = subprocess.Popen(
        _pip("wheel", "--no-deps", "-w", str(root / "dist"), str(source)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    venv = root / "pyspark_venv"
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    deps = ["pyarrow", "pandas", "numpy", "rocksdict", "xxhash"]
    constraints = str(REPO / "constraints.txt")
    subprocess.run(
        _pip("--python", python, "install", "--no-compile", "-c", constraints, *deps), check=True
    )
    times["dependencies"] = time.monotonic() - started
    out, _ = wheel.communicate(timeout=600)
    assert wheel.returncode == 0, out
    (built,) = (root / "dist").glob("sparkstate-*.whl")
    # Not pyspark: the executors put the cluster's own on the workers' path.
    subprocess.run(
        _pip("--python", python, "install", "--no-compile", "--no-deps", str(built)), check=True
    )
    times["sparkstate"] = time.monotonic() - started
    archive = root / "pyspark_venv.tar.gz"
    subprocess.run(
        [sys.executable, "-m", "venv_pack", "--quiet", "--compress-level", "0"]
        + ["-p", str(venv), "-o", str(archive)],
        check=True,
    )
    times["packed"] = time.monotonic() - started
    return archive, times


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and two 1-core workers whose executors find no Python packages of ours."""
    reason = java_missing()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("venv_pack")
    c = Cluster(tmp_path_factory.mktemp("bare-cluster"), python_env=False)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def expected_rows() -> list[list[Any]]:
    """Update mode: after each batch, the running count and sum of every key it had."""
    n: dict[str, int] = {}
    total: dict[str, int] = {}
    out = []
    for batch, rows in enumerate(INPUT):
        for r in rows:
            n[r["k"]] = n.get(r["k"], 0) + 1
            total[r["k"]] = total.get(r["k"], 0) + r["v"]
        out += [[batch, k, n[k], total[k]] for k in sorted({r["k"] for r in rows})]
    return out


def test_a_packed_environment_runs_a_stateful_query(bare_cluster: Cluster, tmp_path: Path) -> None:
    archive, times = pack_environment(tmp_path)
    print(
        f"\npacked environment: {archive.stat().st_size / 2**20:.0f} MiB; "
        + ", ".join(f"{k} after {v:.1f} s" for k, v in times.items())
    )
    work = tmp_path / "job"  # on this machine's disk: every node of a loopback cluster reaches it
    for i, rows in enumerate(INPUT):
        f = work / "input" / f"{i}.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("\n".join(json.dumps(r) for r in rows))
        os.utime(f, (1_000_000 + i, 1_000_000 + i))  # the file source takes the oldest first

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR")
    }
    env.update(
        {
            "SPARK_HOME": SPARK_HOME,
            "SPARK_LOCAL_IP": HOST,
            # The driver (client mode) runs here, in an environment with sparkstate ...
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": str(REPO / "src"),  # ... the one under test (the driver's only)
            # ... and the workers in the unpacked archive, relative to each executor's directory.
            "PYSPARK_PYTHON": "./environment/bin/python",
        }
    )
    # The cluster's session settings, but the workers' Python: the archive's (PYSPARK_PYTHON).
    conf = {k: v for k, v in SESSION_CONF.items() if k != "spark.pyspark.python"}
    conf["spark.scheduler.maxRegisteredResourcesWaitingTime"] = "90s"
    command = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", bare_cluster.master_url]
    command += ["--archives", f"{archive}#environment"]
    for k, v in conf.items():
        command += ["--conf", f"{k}={v}"]
    command += [str(Path(__file__).with_name("packed_job.py")), str(work)]
    started = time.monotonic()
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path)
    )
    print(f"spark-submit ran {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, proc.stderr[-8000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-8000:]
    result = json.loads(lines[-1])
    print("the job, seconds after its start:", result["times"])

    assert sorted(result["rows"]) == expected_rows()
    # Every task ran the shipped interpreter and imported sparkstate and rocksdict from the
    # shipped environment, in its executor's directory; pyspark came from the cluster.
    executors = {t["cwd"] for t in result["tasks"]}
    print("tasks ran in", sorted(executors))
    for task in result["tasks"]:
        env_dir = os.path.join(task["cwd"], "environment")
        assert task["executable"] == os.path.join(env_dir, "bin", "python"), task
        for module in ("sparkstate", "rocksdict", "pyarrow"):
            assert task["modules"][module].startswith(env_dir + os.sep), task
        assert "pyspark.zip" in task["modules"]["pyspark"], task
    # The rocksdb store kept its local copies in executors' own directories.
    copies = bare_cluster.executor_dirs("sparkstate-local")
    assert copies, "no executor has a local RocksDB directory"
    assert all((d.parent / "environment").is_dir() for d in copies.values()), copies
