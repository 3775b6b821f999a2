"""Time to live of ``StatefulProcessor`` state, as Spark's ``transformWithState`` defines it.

* TTL needs the ``ProcessingTime`` time mode and a positive duration (0 or None: no TTL);
* every write of a value sets its expiration to the batch's processing time plus the TTL;
* a value whose expiration is at or before the batch's processing time is expired: reads do not
  see it, and the end-of-batch cleanup deletes it (``StateTTL.isExpired``:
  ``batchTimestampMs >= expirationMs``);
* the cleanup finds expired values through a ``(expiration, key)`` index per state variable (for
  list and map state, the earliest expiration of the key's elements), never by a full scan.
"""

from __future__ import annotations

from typing import Any

from sparkstate.operators.arbitrary.state_errors import (
    InvalidStateValueError,
    UnsupportedStateOperationError,
)
from sparkstate.operators.ts_index import NO_TS

__all__ = ["TTL_FIELD", "check_ttl", "expiration_ms", "is_expired", "ttl_cf_name"]

#: The extra value field holding a value's expiration, in epoch milliseconds.
TTL_FIELD = "__expires_ms"


def ttl_cf_name(state_name: str) -> str:
    """The TTL index column family of a state variable."""
    return f"$ttl_{state_name}"


def check_ttl(ttl_ms: Any, time_mode: str, state_name: str) -> int | None:
    """The TTL in milliseconds (None when disabled), refusing what Spark refuses."""
    if ttl_ms is None:
        return None
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        msg = f"TTL of state {state_name!r} must be an int of milliseconds, got {ttl_ms!r}"
        raise InvalidStateValueError(msg)
    if ttl_ms == 0:
        return None
    if time_mode != "ProcessingTime":
        msg = (
            f"cannot use TTL for state {state_name!r} in time mode {time_mode!r}: TTL needs "
            "timeMode='ProcessingTime'"
        )
        raise UnsupportedStateOperationError(msg)
    if ttl_ms < 0:
        msg = f"TTL of state {state_name!r} must be positive, got {ttl_ms} ms"
        raise InvalidStateValueError(msg)
    return ttl_ms


def expiration_ms(batch_timestamp_ms: int, ttl_ms: int | None) -> int:
    """Expiration of a value written in this batch (``NO_TS`` without TTL)."""
    return NO_TS if ttl_ms is None else batch_timestamp_ms + ttl_ms


def is_expired(expiration: int, batch_timestamp_ms: int) -> bool:
    """Spark's rule: expired once the batch's processing time reaches the expiration."""
    return expiration != NO_TS and expiration <= batch_timestamp_ms
