"""When a restart rescales the state: a change of what the query asks for since its last start."""

from __future__ import annotations

from typing import Any

import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime.metadata import PARTITIONS_ASKED, partitions_asked, rescale_target


def _metadata(count: int, option: str | None, shuffle: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"num_partitions": count}
    if shuffle is not None:
        out[PARTITIONS_ASKED] = partitions_asked(option, shuffle)
    return out


@pytest.mark.parametrize(
    ("count", "before", "now", "expected"),
    [
        # the session's shuffle partitions changed: rescale to them
        (4, (None, 4), (None, 8), 8),
        # unchanged: keep the count, even where a repartition made it differ
        (4, (None, 4), (None, 4), None),
        (16, (None, 4), (None, 4), None),
        # the numPartitions option changed, or is new: rescale to it
        (4, ("4", 200), ("6", 200), 6),
        (4, (None, 4), ("6", 4), 6),
        # the option dropped: keep the count (what a user was told to do before)
        (6, ("6", 200), (None, 200), None),
        # asked for what the checkpoint has: nothing to do
        (6, ("4", 200), ("6", 200), None),
        # checkpoints that did not record the ask: only an option that differs rescales
        (4, None, (None, 8), None),
        (4, None, ("4", 8), None),
        (4, None, ("3", 8), 3),
    ],
)
def test_rescale_target(
    count: int,
    before: tuple[str | None, int] | None,
    now: tuple[str | None, int],
    expected: int | None,
) -> None:
    metadata = _metadata(count, *before) if before else _metadata(count, None, None)
    assert rescale_target(metadata, partitions_asked(*now)) == expected


def test_a_bad_option_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="numPartitions must be >= 1"):
        rescale_target(_metadata(4, None, 4), partitions_asked("0", 4))
