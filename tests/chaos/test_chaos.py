"""The chaos run, short: a dozen batches of the three queries on a two-worker cluster, one fault
of each kind (a Python worker, a state home, an executor and the driver SIGKILLed at random
moments, and an executor's disk lost with a kill in the lazy restore that follows), and every
sink's rows and every query's state equal to the run without faults.

The long run is ``./scripts/chaos`` (200 batches, 60 faults by default)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.chaos.run import KINDS, chaos, describe
from tests.cluster.conftest import java_missing

pytestmark = pytest.mark.cluster


def test_a_short_chaos_run_loses_nothing_and_counts_nothing_twice(tmp_path: Path) -> None:
    reason = java_missing()
    if reason:
        pytest.skip(reason)
    # Faults 2-4 s apart: the four land before the queries finish (small batches run fast).
    # A snapshot after every version: a restore after the first batch restores from one (with
    # the default, faults that land before the fifth, as on a loaded machine, replay changelogs
    # from the start, which counts no restore).
    summary = chaos(
        batches=12, faults=len(KINDS), seed=3, gap=(2.0, 4.0), work=tmp_path, snapshot_deltas=1
    )
    assert summary["faults"] == {kind: 1 for kind in KINDS}, describe(summary)
    assert summary["driver_starts"] >= 2, describe(summary)
    compared = summary["compared"]
    assert all(c["rows"] > 0 for c in compared.values()), describe(summary)
    assert summary["differences"] == 0, describe(summary)
    # (restores from a snapshot are lazy here; with an executor killed and a disk lost, some
    # partitions restored from one, and the lost disk's were killed part way through)
    assert summary["restores"]["lazy"] > 0, describe(summary)
