"""A state home on its own, without Spark: started by a worker that forks itself, or as a new
interpreter where the worker runs other threads; a slow job that keeps its heartbeat; a home
that hangs, given up and killed; a job that fails with an OSError of its own.

The worker is a small script in a process of its own (``WORKER``), which plays the executor too
(the home ends with it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

WORKER = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    import pyarrow as pa
    from pyspark import cloudpickle
    from sparkstate.exceptions import StateHomeError
    from sparkstate.runtime import home_client
    from sparkstate.runtime.home import ProcessRef

    homes, mode = sys.argv[1], sys.argv[2]
    home_client.home_dir = lambda: homes
    if mode == "spawn":  # another thread runs: the worker must not fork
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    me = ProcessRef.of(os.getpid())

    def slow(task):
        rows = 0
        for batch in task.inputs:
            rows += batch.num_rows
            time.sleep(0.6)  # 2.4 s in all, the silence limit is 1 s
        yield pa.record_batch({"rows": [rows]})
        task.ready()
        return os.getpid()

    def run(job, batches, silence_s):
        out = home_client.run_in_home(
            home_client.connect(me, 0), cloudpickle.dumps(job), iter(batches), "a test job",
            silence_s)
        got = []
        while True:
            try:
                got.append(next(out).to_pylist())
            except StopIteration as done:
                return got, done.value

    batches = [pa.record_batch({"v": list(range(10))}) for _ in range(4)]
    started = time.monotonic()
    got, pid = run(slow, batches, 1.0)
    report = {"output": got, "pid": pid, "slow_s": time.monotonic() - started}
    with open(f"/proc/{pid}/comm") as f:
        report["name"] = f.read().strip()
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        report["spawned"] = b"sparkstate.runtime.home" in f.read()
    with open(os.path.join(homes, os.listdir(homes)[0].rsplit("-", 1)[0] + "-0.pid")) as f:
        report["pid_file"] = int(f.read())

    threading.Timer(0.5, os.kill, (pid, signal.SIGSTOP)).start()
    started = time.monotonic()
    try:
        run(slow, batches, 1.0)
    except StateHomeError as exc:
        report["hung"] = str(exc)
    report["hung_s"] = time.monotonic() - started
    time.sleep(0.2)
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        report["after"] = stat[stat.rindex(")") + 2]
    except OSError:
        report["after"] = "gone"
    got, again = run(slow, batches[:1], 1.0)  # the next task starts a new home
    report["again"] = [got, again != pid]

    def full(task):  # a job whose own write fails: the task's error, the home lives on
        for _ in task.inputs:
            pass
        raise OSError(28, "No space left on device")
        yield

    try:
        run(full, batches[:1], 1.0)
    except Exception as exc:
        report["job_error"] = [type(exc).__name__, str(exc)]
    report["after_error"] = run(slow, batches[:1], 1.0)[1] == again
    print("REPORT", json.dumps(report), flush=True)
    """
)


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_a_home_starts_keeps_its_heartbeat_and_a_hung_one_is_given_up(
    tmp_path: Path, mode: str
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with tempfile.TemporaryDirectory(prefix="homes-") as homes:  # short, for sockets
        done = subprocess.run(
            [sys.executable, str(script), homes, mode], capture_output=True, timeout=120
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads(done.stdout.decode().split("REPORT", 1)[1])
    assert report["output"] == [[{"rows": 40}]]
    assert report["slow_s"] > 2.0  # slower than the silence limit, kept alive by its heartbeat
    assert report["name"] == "sparkstate-home"
    assert report["spawned"] == (mode == "spawn")
    assert report["pid_file"] == report["pid"]
    assert (
        "sent nothing for 1 s, not even its heartbeat: it hangs and was killed" in report["hung"]
    ), report
    assert report["hung_s"] < 10, report
    assert report["after"] in ("gone", "Z"), report  # killed (a spawned one is a zombie child)
    assert report["again"] == [[[{"rows": 10}]], True], report
    # An OSError of the job's own (a full disk) is the task's error, not a lost connection.
    assert report["job_error"][0] == "OSError", report
    assert "No space left on device" in report["job_error"][1], report
    assert report["after_error"], report  # the same home runs the next task


def test_a_home_is_reached_at_the_host_spark_gave_its_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other executors reach a home at its executor's ``--hostname`` (what the driver reaches
    the executor at), not at what the machine's name resolves to (loopback on many hosts)."""
    from sparkstate.runtime.home import ProcessRef, advertised_host

    monkeypatch.delenv("SPARKSTATE_HOME_HOST", raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.9.9.9")
    code = "import time; time.sleep(30)"
    args = ["--driver-url", "spark://x", "--executor-id", "3", "--hostname", "10.1.2.3"]
    with subprocess.Popen([sys.executable, "-c", code, *args]) as executor:
        try:
            ref = ProcessRef.of(executor.pid)
            deadline = time.monotonic() + 10
            while b"--hostname" not in Path(f"/proc/{executor.pid}/cmdline").read_bytes():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert advertised_host(ref) == "10.1.2.3"
            monkeypatch.setenv("SPARKSTATE_HOME_HOST", "10.4.4.4")  # the user's word wins
            assert advertised_host(ref) == "10.4.4.4"
        finally:
            executor.kill()
    monkeypatch.delenv("SPARKSTATE_HOME_HOST")
    # A local master's JVM (the driver) has no --hostname: Spark's SPARK_LOCAL_IP, if set.
    assert advertised_host(ProcessRef.of(os.getpid())) == "10.9.9.9"


def test_homes_keep_their_sockets_where_a_sockets_path_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Unix socket's path has at most 107 bytes: under a long temp directory (a YARN
    container's), the homes' directory is in /tmp instead, and every socket path fits."""
    from sparkstate.runtime import home_client
    from sparkstate.runtime.home import ProcessRef

    me = ProcessRef.of(os.getpid())
    assert me is not None
    long_tmp = "/" + "/".join(["usercache", "appcache", "application_1_0001", "container_1"] * 3)
    monkeypatch.setattr(tempfile, "tempdir", long_tmp)
    assert home_client.home_dir() == f"/tmp/sparkstate-homes-{os.getuid()}"
    assert len(os.fsencode(home_client.home_path(me, 127))) <= 107
    monkeypatch.setattr(tempfile, "tempdir", "/var/tmp")
    assert home_client.home_dir() == f"/var/tmp/sparkstate-homes-{os.getuid()}"
