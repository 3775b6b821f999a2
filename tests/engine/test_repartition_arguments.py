"""``ss.repartition`` refuses a missing location or a count below one before it reads anything,
under Spark's error classes, as ``StreamingCheckpointManager.repartition`` does."""

from __future__ import annotations

import pytest

import sparkstate as ss
from sparkstate.exceptions import ConfigurationError


@pytest.mark.parametrize(
    ("location", "count", "error_class"),
    [
        (None, 5, "STATE_REPARTITION_INVALID_PARAMETER.IS_NULL"),
        ("", 5, "STATE_REPARTITION_INVALID_PARAMETER.IS_EMPTY"),
        ("  ", 5, "STATE_REPARTITION_INVALID_PARAMETER.IS_EMPTY"),
        ("test", 0, "STATE_REPARTITION_INVALID_PARAMETER.IS_NOT_GREATER_THAN_ZERO"),
        ("test", -3, "STATE_REPARTITION_INVALID_PARAMETER.IS_NOT_GREATER_THAN_ZERO"),
    ],
)
def test_refused_before_the_checkpoint_is_read(
    location: str | None, count: int, error_class: str
) -> None:
    with pytest.raises(ConfigurationError, match=error_class.replace(".", r"\.")):
        ss.repartition(None, location, count)  # type: ignore[arg-type]
