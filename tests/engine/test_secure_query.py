"""A streaming query in local mode with ``spark.authenticate`` and ``spark.network.crypto.
enabled`` on gives the output it gives with them off; its small batches reach the state homes
from the driver over their authenticated, encrypted TCP; the homes' ports, fuzzed between
batches, change nothing. A driver of its own (``secure_job.py``): Spark's security settings are
the application's, fixed when its ``SparkContext`` starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import PYTHON_START

JOB = Path(__file__).with_name("secure_job.py")
REPO = str(Path(__file__).resolve().parents[2])


def test_a_secure_query_gives_the_output_of_a_plain_one(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join((REPO, PYTHON_START)),
    }
    done = subprocess.run(
        [sys.executable, str(JOB), str(tmp_path), "500"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.split("REPORT", 1)[1])
    plain, secure = report["plain"], report["secure"]
    assert secure["rows"] == plain["rows"]
    assert len(plain["rows"]) > 10
    # The first batch runs through Spark (it starts the homes), the small ones after it from
    # the driver, over the homes' TCP: with the secret and encrypted in the secure run.
    assert secure["direct"][0] is False and all(secure["direct"][1:]), secure["direct"]
    assert plain["direct"] == secure["direct"]
    assert secure["fuzzed"] >= 500 * 4 and plain["fuzzed"] >= 500 * 4
    # The plain run's two homes live on in the JVM beside the secure run's two: homes that
    # take other credentials are other homes.
    assert plain["homes"] == 2 and secure["homes"] == 4
    assert plain["token_only_gets_in"] == [True, True]
    assert sorted(secure["token_only_gets_in"]) == [False, False, True, True]
    assert sorted(secure["secret_gets_in"]) == [False, False, True, True]
    assert secure["secret_mode"] == "0o600"
    assert not secure["secret_in_checkpoint"]
    # Live reads: with the session's credentials from the homes, with the token alone from the
    # checkpoint where the homes refuse it; the same state, each key's last count.
    for run in (plain, secure):
        live = run["live"]
        assert live["values"] == live["token_alone_values"]
        assert {k: v["count"] for k, v in live["values"].items()} == run["counts"]
        assert live["sources"] == ["home"]
    assert plain["live"]["token_alone_sources"] == ["home"]
    assert secure["live"]["token_alone_sources"] == ["checkpoint"]
