"""``StatefulProcessor`` and its handle: PySpark's ``transformWithState`` API without the JVM.

A processor declares its state variables in ``init(handle)``. The operator calls ``init`` once
when it is built, with a *declaring* handle that only records what is asked for (Spark does the
same on the driver), so the store's column families are known before the first batch; then, in
every batch of every partition, ``init`` runs again with a live handle, the handlers run, and
``close`` ends the batch.

The handle enforces Spark's life cycle (``StatefulProcessorHandleImpl``): state variables are
created only in ``init``; timers need a time mode and a grouping key, and are refused once timers
have been processed; TTL needs the ``ProcessingTime`` mode.

A state variable's schema (a list's elements, a map's values) may evolve across restarts as a
store's value schema may (nullable fields added, fields dropped or reordered), or be
``sparkstate.PICKLED`` for any picklable object; user keys of a map stay schema-encoded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from sparkstate.operators.arbitrary.deleted_vars import retire
from sparkstate.operators.arbitrary.schemas import SchemaLike, state_schema_of, to_arrow_schema
from sparkstate.operators.arbitrary.state_collections import ListState, MapState
from sparkstate.operators.arbitrary.state_errors import UnsupportedStateOperationError
from sparkstate.operators.arbitrary.state_rows import forget
from sparkstate.operators.arbitrary.state_vars import KeyContext, ValueState, VarSpec
from sparkstate.operators.arbitrary.timers import (
    ExpiredTimerInfo,
    TimeMode,
    TimerState,
    TimerValues,
)
from sparkstate.operators.arbitrary.ttl import check_ttl
from sparkstate.store.base import StateStore

__all__ = [
    "ExpiredTimerInfo",
    "ProcessorSession",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "TimerValues",
    "declare_state",
]

#: Life stages of a handle, in order (Spark's ``StatefulProcessorHandleState``).
CREATED, INITIALIZED, DATA_PROCESSED, TIMER_PROCESSED, CLOSED = range(5)
_STAGE_NAMES = ["CREATED", "INITIALIZED", "DATA_PROCESSED", "TIMER_PROCESSED", "CLOSED"]


class StatefulProcessor(ABC):
    """User logic of ``transformWithState``: subclass it (or PySpark's class of the same name)."""

    @abstractmethod
    def init(self, handle: Any) -> None:
        """Create the state variables (``handle.getValueState(...)`` etc.)."""

    @abstractmethod
    def handleInputRows(  # noqa: N802 - PySpark's names
        self,
        key: Any,
        rows: Any,
        timerValues: TimerValues,  # noqa: N803
    ) -> Any:
        """Rows of one key (Row iterator, or DataFrame iterator in pandas mode) -> output."""

    def handleExpiredTimer(  # noqa: N802
        self,
        key: Any,
        timerValues: TimerValues,
        expiredTimerInfo: ExpiredTimerInfo,  # noqa: N803
    ) -> Any:
        """A timer of ``key`` fired; return output rows (or frames)."""
        return iter(())

    def handleInitialState(  # noqa: N802, B027 - optional, as in PySpark
        self,
        key: Any,
        initialState: Any,
        timerValues: TimerValues,  # noqa: N803
    ) -> None:
        """One initial-state row (or frame) of ``key``, in the first batch only."""

    def close(self) -> None:  # noqa: B027 - optional, as in PySpark
        """End of a batch on a partition."""


def _spec(
    kind: str,
    name: Any,
    schema: SchemaLike,
    ttl: Any,
    time_mode: str,
    key_schema: SchemaLike | None = None,
) -> VarSpec:
    if not isinstance(name, str) or not name or name.startswith("$"):
        msg = f"state variable name must be a non-empty string not starting with '$', got {name!r}"
        raise UnsupportedStateOperationError(msg)
    value_schema, pickled = state_schema_of(schema, f"schema of state {name!r}")
    return VarSpec(
        name=name,
        kind=kind,
        schema=value_schema,
        key_schema=None
        if key_schema is None
        else to_arrow_schema(key_schema, f"key schema of map state {name!r}"),
        ttl_ms=check_ttl(ttl, time_mode, name),
        pickled=pickled,
    )


#: The counts of Spark's ``transformWithState`` progress (``customMetrics``) that the handle keeps.
HANDLE_METRICS = (
    "numValueStateVars",
    "numListStateVars",
    "numMapStateVars",
    "numValueStateWithTTLVars",
    "numListStateWithTTLVars",
    "numMapStateWithTTLVars",
    "numDeletedStateVars",
    "numRegisteredTimers",
    "numDeletedTimers",
)


class _HandleBase:
    """The parts of the handle shared by declaring and live handles."""

    def __init__(self, time_mode: str) -> None:
        self.time_mode = time_mode
        self.stage = CREATED
        self.specs: dict[str, VarSpec] = {}
        #: Variables ``deleteIfExists`` deleted in this ``init``: created again, they are new.
        self.deleted: set[str] = set()

    def _declare(self, spec: VarSpec) -> VarSpec:
        if self.stage != CREATED:
            msg = (
                f"cannot create state variable {spec.name!r} in stage "
                f"{_STAGE_NAMES[self.stage]}: create state variables in init()"
            )
            raise UnsupportedStateOperationError(msg)
        if spec.name in self.specs and spec.name not in self.deleted:
            msg = f"state variable {spec.name!r} is defined twice in init()"
            raise UnsupportedStateOperationError(msg)
        self.specs[spec.name] = spec
        self.deleted.discard(spec.name)
        return spec

    def getValueState(  # noqa: N802
        self,
        stateName: str,  # noqa: N803
        schema: SchemaLike,
        ttlDurationMs: int | None = None,  # noqa: N803
    ) -> Any:
        return self._make(_spec("value", stateName, schema, ttlDurationMs, self.time_mode))

    def getListState(  # noqa: N802
        self,
        stateName: str,  # noqa: N803
        schema: SchemaLike,
        ttlDurationMs: int | None = None,  # noqa: N803
    ) -> Any:
        return self._make(_spec("list", stateName, schema, ttlDurationMs, self.time_mode))

    def getMapState(  # noqa: N802
        self,
        stateName: str,  # noqa: N803
        userKeySchema: SchemaLike,  # noqa: N803
        valueSchema: SchemaLike,  # noqa: N803
        ttlDurationMs: int | None = None,  # noqa: N803
    ) -> Any:
        spec = _spec("map", stateName, valueSchema, ttlDurationMs, self.time_mode, userKeySchema)
        return self._make(spec)

    def _make(self, spec: VarSpec) -> Any:
        raise NotImplementedError

    def _check_timers(self, what: str) -> None:
        if self.time_mode == TimeMode.NONE:
            msg = f"cannot {what} with time mode 'None': use 'ProcessingTime' or 'EventTime'"
            raise UnsupportedStateOperationError(msg)
        if not INITIALIZED <= self.stage < TIMER_PROCESSED:
            msg = f"cannot {what} in stage {_STAGE_NAMES[self.stage]}"
            raise UnsupportedStateOperationError(msg)


class _Declared:
    """What a declaring handle returns: a state variable that must not be used yet."""

    def __init__(self, spec: VarSpec) -> None:
        self._spec = spec

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        msg = (
            f"state variable {self._spec.name!r} was used while the processor was being "
            "planned (init() must only create state variables, not read or write them)"
        )
        raise UnsupportedStateOperationError(msg)


class _DeclaringHandle(_HandleBase):
    """Records the state variables ``init`` creates; refuses everything else."""

    def _make(self, spec: VarSpec) -> Any:
        return _Declared(self._declare(spec))

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802, N803
        self._check_timers("register a timer")

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802, N803
        self._check_timers("delete a timer")

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        self._check_timers("list timers")
        return iter(())

    def deleteIfExists(self, stateName: str) -> None:  # noqa: N802, N803
        """Nothing to delete while planning (the variable may be created again)."""
        self.deleted.add(stateName)


def declare_state(processor: Any, time_mode: str) -> dict[str, VarSpec]:
    """The state variables ``processor.init`` creates (init and close run once, Spark's
    PRE_INIT step)."""
    handle = _DeclaringHandle(time_mode)
    processor.init(handle)
    processor.close()
    return handle.specs


class ProcessorSession:
    """One batch on one partition: the implicit key, the state variables, the timers."""

    def __init__(self, store: StateStore, time_mode: str, batch_ts: int) -> None:
        self.store = store
        self.time_mode = time_mode
        self.ctx = KeyContext(batch_ts)
        self.vars: dict[str, ValueState | ListState | MapState] = {}
        self.timers = TimerState()

    def bind(self, spec: VarSpec) -> ValueState | ListState | MapState:
        var: ValueState | ListState | MapState
        if spec.kind == "value":
            var = ValueState(spec, self.ctx, self.store)
        elif spec.kind == "list":
            var = ListState(spec, self.ctx, self.store)
        else:
            var = MapState(spec, self.ctx, self.store)
        self.vars[spec.name] = var
        return var

    def prefetch(self, kencs: list[bytes]) -> None:
        for var in self.vars.values():
            if isinstance(var, ValueState):
                var.prefetch(kencs)

    def flush(self) -> tuple[int, int]:
        updated = removed = 0
        for var in self.vars.values():
            u, r = var.flush()
            updated, removed = updated + u, removed + r
        u, r = self.timers.flush(self.store)
        return updated + u, removed + r

    def evict_expired(self) -> int:
        self.ctx.kenc = self.ctx.key = None
        return sum(var.evict_expired() for var in self.vars.values())

    def purge(self, name: str) -> int:
        """Delete every entry of a column family (``deleteIfExists``); 0 if there is none.
        A variable object of that name obtained before fails from now on, as in Spark."""
        var = self.vars.pop(name, None)
        if var is not None:
            retire(var)
        try:
            self.store.column_family(name)
        except ValueError:
            return 0
        keys = [k for k, _ in self.store.range_scan_encoded(cf=name)]
        if keys:
            self.store.remove_encoded_many(keys, name)
        forget(self.store, name)
        return len(keys)


class StatefulProcessorHandle(_HandleBase):
    """The live handle of a batch: state variables, timers, for the current implicit key."""

    def __init__(self, session: ProcessorSession, declared: dict[str, VarSpec]) -> None:
        super().__init__(session.time_mode)
        self._session = session
        self._declared = declared
        #: Spark's ``customMetrics`` of the handle's calls in this task (summed over partitions).
        self.counts: dict[str, int] = dict.fromkeys(HANDLE_METRICS, 0)

    def _make(self, spec: VarSpec) -> Any:
        spec = self._declare(spec)
        kind = spec.kind.capitalize()
        self.counts[f"num{kind}StateVars"] += 1
        if spec.ttl_ms is not None:
            self.counts[f"num{kind}StateWithTTLVars"] += 1
        planned = self._declared.get(spec.name)
        if planned is None or planned.describe() != spec.describe():
            msg = (
                f"state variable {spec.name!r} differs from the one init() created when the "
                f"query was planned ({planned and planned.describe()} vs {spec.describe()}); "
                "init() must create the same state variables every time"
            )
            raise UnsupportedStateOperationError(msg)
        return self._session.bind(spec)

    def _key(self, what: str) -> bytes:
        self._check_timers(what)
        kenc = self._session.ctx.kenc
        if kenc is None:
            msg = f"cannot {what} without an implicit grouping key"
            raise UnsupportedStateOperationError(msg)
        return kenc

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802, N803
        """Fire ``handleExpiredTimer`` for the current key at ``expiryTimestampMs``."""
        kenc = self._key("register a timer")
        self._session.timers.register(self._session.store, kenc, expiryTimestampMs)
        self.counts["numRegisteredTimers"] += 1

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802, N803
        kenc = self._key("delete a timer")
        self._session.timers.delete(self._session.store, kenc, expiryTimestampMs)
        self.counts["numDeletedTimers"] += 1

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        """The current key's timers, earliest first."""
        kenc = self._key("list timers")
        return iter(self._session.timers.timers_of(self._session.store, kenc))

    def deleteIfExists(self, stateName: str) -> None:  # noqa: N802, N803
        """Purge a state variable's data (only in ``init``)."""
        if self.stage != CREATED:
            msg = f"cannot delete state variable {stateName!r} outside init()"
            raise UnsupportedStateOperationError(msg)
        self._session.purge(stateName)
        self.deleted.add(stateName)
        self.counts["numDeletedStateVars"] += 1
