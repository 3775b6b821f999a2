"""Plan how to load a version: a base (empty, a snapshot, or the local copy) plus changelogs.

Each changelog names its parent attempt, so the plan follows the committed lineage backwards from
the requested attempt until it reaches version 0, a usable snapshot, or the local copy's attempt.
The plan names the changelogs to replay; the provider reads each one when it applies it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sparkstate.exceptions import MissingVersionError
from sparkstate.store.versions.layout import VersionIndex, VersionRef

__all__ = ["LoadPlan", "plan_load"]


@dataclasses.dataclass
class LoadPlan:
    """Start from ``snapshot`` (or the local copy, or nothing) and apply ``changelogs`` in order."""

    target: VersionRef | None
    snapshot: VersionRef | None = None
    from_local: bool = False
    changelogs: list[VersionRef] = dataclasses.field(default_factory=list)


def plan_load(
    target: VersionRef | None,
    index: VersionIndex,
    delta_ext: str,
    parent_of: Callable[[VersionRef], VersionRef | None],
    *,
    local: VersionRef | None = None,
    skip_snapshots: frozenset[VersionRef] = frozenset(),
    where: str = "",
) -> LoadPlan:
    """Walk back from ``target`` (None = version 0) to the nearest base; see the module doc.

    ``parent_of`` reads the parent attempt from a changelog (and checks the file on the way).
    """
    plan = LoadPlan(target)
    chain: list[VersionRef] = []
    cur = target
    while cur is not None:
        if local is not None and cur == local:
            plan.from_local = True
            break
        if index.has(cur, "snapshot") and cur not in skip_snapshots:
            plan.snapshot = cur
            break
        if not index.has(cur, delta_ext):
            msg = (
                f"{where}: cannot load version {target}: the {delta_ext} file for {cur} is "
                "missing and no usable snapshot covers it"
            )
            raise MissingVersionError(msg)
        chain.append(cur)
        cur = parent_of(cur)
    chain.reverse()
    plan.changelogs = chain
    return plan
