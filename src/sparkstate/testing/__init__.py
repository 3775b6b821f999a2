"""Test helpers for users of sparkstate: the provider contract suite, store factories, a
Spark-free harness for stateful logic (``group_state_harness``, ``processor_harness``), and
helpers for differential tests against Spark (``FileFeed``, ``Collector``, ``normalize``).

``StateStoreContract`` and ``expected_failure`` need pytest; they are imported on first use, so
that importing ``sparkstate.testing`` for the other helpers does not.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from sparkstate.testing.differential import Collector, FileFeed, normalize
from sparkstate.testing.factory import KEY_SCHEMA, VALUE_SCHEMA, ProviderFactory

if TYPE_CHECKING:
    from sparkstate.testing.contract import StateStoreContract, expected_failure
    from sparkstate.testing.harness import (
        BatchResult,
        OperatorHarness,
        group_state_harness,
        processor_harness,
    )

__all__ = [
    "KEY_SCHEMA",
    "VALUE_SCHEMA",
    "BatchResult",
    "Collector",
    "FileFeed",
    "OperatorHarness",
    "ProviderFactory",
    "StateStoreContract",
    "expected_failure",
    "group_state_harness",
    "normalize",
    "processor_harness",
]
_HARNESS = {"BatchResult", "OperatorHarness", "group_state_harness", "processor_harness"}
_LAZY = {"StateStoreContract", "expected_failure"}

_CONTRACT = "sparkstate.testing.contract"


def __getattr__(name: str) -> Any:
    if name in _HARNESS:
        from sparkstate.testing import harness

        return getattr(harness, name)
    if name not in _LAZY:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    if _CONTRACT not in sys.modules:
        import pytest

        # Plain asserts in the suite then report the values compared, as in the user's own tests.
        pytest.register_assert_rewrite(_CONTRACT)
    from sparkstate.testing import contract

    return getattr(contract, name)
