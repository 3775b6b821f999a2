"""``stop()`` in the middle of a batch: it returns in bounded time, nothing prints a stack trace,
the batch commits nothing, and the next start runs it again; each batch's output is what a
deduplication gives for the files it read, and all of them hold the rows of Spark's own run never
stopped (the queries run in a process of their own, :mod:`tests.engine.stopper`, so that the test
sees everything Spark prints)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

from .conftest import PROVIDERS

REPO = Path(__file__).resolve().parents[2]
#: Bound on one ``stop()``: Spark's own stop, the batch's tasks ending, the sink's cleanup.
STOP_BOUND_S = 20.0
#: What must not appear on the terminal: Java stack frames, a thread killed by an exception,
#: Python tracebacks (Python logging is on, so py4j's logged errors would show).
NOISE = re.compile(r"^\s+at [\w$.]+\(|Exception in thread|StackOverflowError|^Traceback", re.M)


def test_stop_inside_a_batch_is_quiet_and_the_batch_runs_again(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    args = [str(tmp_path), ",".join(PROVIDERS), str(seed)]
    done = subprocess.run(
        [sys.executable, "-m", "tests.engine.stopper", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, f"seed {seed}\n{done.stderr[-5000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    noise = NOISE.search(done.stderr)
    where = slice(max(0, noise.start() - 3000), noise.end() + 2000) if noise else slice(0)
    assert noise is None, f"seed {seed}: printed {noise.group(0)!r}\n{done.stderr[where]}"

    stops = report["stops"]
    assert all(s["stop_s"] < STOP_BOUND_S for s in stops), stops
    abandoned = [s for s in stops if not s["finished"]]
    assert abandoned, f"seed {seed}: no stop fell inside a batch: {stops}"
    for s in abandoned:
        assert s["outcome"] == "failed", s  # the stop reached the batch in flight
        assert not s["commit"], s  # so its state is the previous version
        assert s["rerun"], s  # and the next start ran that batch again
    for s in stops:
        if s["finished"]:
            assert s["commit"] and s["manifest"], s
    # The whole report (pytest would shorten the dict): the stops, and what differs if anything.
    want = {p: True for p in ("spark", *PROVIDERS)}
    assert report["equal"] == want, json.dumps(report, indent=1)
    assert report["staging_left"] == {p: [] for p in PROVIDERS}, json.dumps(report, indent=1)
