"""Where each state partition lives: spread over the executors in proportion to their cores.

A partition stays in the state home that committed its last version (the commit names it, and
the next batch's task connects there wherever Spark runs it). Left alone, the partitions stay
where batch 0's tasks happened to land, three of four on one executor, say, whose one core then
runs three tasks each batch while the other waits. So before each batch the driver moves
partitions from executors that hold more than their share to those that hold less: a share is
the partition count times the executor's cores over all executors' cores, and a partition moves
while that brings the two closer (on executors of equal cores: until their counts differ by at
most one). A moved partition's next task connects to a home of the executor it moves to, which
restores its state from the checkpoint at the committed version: the move is fenced as any other
(the commit names the attempt), and happens once.

The executors known are those whose homes the last batch's tasks reported: a home that ran a
task, and a home a task's worker keeps on its own executor while it sends the task to another
(so that an executor that just joined is known after its first task, and holds its share from
the batch after). An executor that no task reported in the last batch is left out: lost, its
partitions moved already (a task whose owner cannot be reached takes the partition over). An
executor that joined is looked for on purpose before the batch, where Spark's status lists more
executors than homes are known, or no more one it listed before (:mod:`.joined_homes`): its
home is added to the reports, and it holds its share from that batch on. Where that search found
a home on every executor listed, the homes on others are dropped (an executor lost, and perhaps
replaced, between two batches): their partitions are placed anew, on the executors below their
share, before the batch's tasks would try to reach them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

__all__ = ["HomeSeen", "Placement", "balanced"]


@dataclasses.dataclass(frozen=True)
class HomeSeen:
    """A state home a task reported: its address, its executor's id and the executor's cores."""

    address: str
    executor: str
    cores: int


def balanced(
    owners: Mapping[int, str], homes: Mapping[str, HomeSeen], lost: Collection[str] = ()
) -> dict[int, str]:
    """``owners`` (partition -> home address) with partitions moved so that each executor of
    ``homes`` holds its share (see the module's docstring). Partitions whose home is ``lost``
    go, one by one, to the executor furthest below its share; those whose home is neither in
    ``homes`` nor lost stay where they are, counted for nobody."""
    cores: dict[str, int] = {}
    addresses: dict[str, list[str]] = {}
    for home in homes.values():
        cores[home.executor] = max(1, home.cores)
        addresses.setdefault(home.executor, []).append(home.address)
    held: dict[str, list[int]] = {e: [] for e in cores}
    orphans: list[int] = []
    for p, address in owners.items():
        seen = homes.get(address)
        if seen is not None:
            held[seen.executor].append(p)
        elif address in lost:
            orphans.append(p)
    out = dict(owners)
    if not cores:
        return out
    total = sum(cores.values())
    placed = sum(len(ps) for ps in held.values()) + len(orphans)

    def excess(e: str) -> float:
        return len(held[e]) - placed * cores[e] / total

    for p in sorted(orphans):
        under = min(held, key=lambda e: (excess(e), e))
        held[under].append(p)
        out[p] = _least_used(addresses[under], out.values())
    if len(cores) < 2 or placed == 0:
        return out
    while True:
        over = max(held, key=lambda e: (excess(e), e))
        under = min(held, key=lambda e: (excess(e), e))
        if excess(over) - excess(under) <= 1 + 1e-9:
            return out
        p = max(held[over])
        held[over].remove(p)
        held[under].append(p)
        out[p] = _least_used(addresses[under], out.values())


def _least_used(addresses: list[str], owners: Iterable[str]) -> str:
    """Of an executor's homes, the one that holds the fewest partitions."""
    used = list(owners)
    return min(sorted(addresses), key=used.count)


@dataclasses.dataclass
class Placement:
    """The homes the driver knows, from the reports of the last batch (see the module)."""

    homes: dict[str, HomeSeen] = dataclasses.field(default_factory=dict)
    #: Homes known gone since the last batch's reports (:meth:`only_on`).
    lost: set[str] = dataclasses.field(default_factory=set)

    def saw(self, reported: Iterable[HomeSeen]) -> None:
        """The homes the last batch's tasks reported (those of earlier batches are forgotten:
        an executor no task reported may be gone)."""
        self.homes = {h.address: h for h in reported}
        self.lost = set()

    def also_saw(self, found: Iterable[HomeSeen]) -> None:
        """Homes found besides the last batch's reports (an executor that joined): added."""
        self.homes.update((h.address, h) for h in found)

    def only_on(self, executors: Collection[str]) -> None:
        """The homes known on ``executors`` kept, those on others dropped as lost (a search
        found a home on every executor Spark lists: the others are gone, and the partitions
        their homes hold are placed anew)."""
        gone = {a for a, h in self.homes.items() if h.executor not in executors}
        self.lost |= gone
        self.homes = {a: h for a, h in self.homes.items() if a not in gone}

    def executor_names(self) -> frozenset[str]:
        """The executors the homes known are on."""
        return frozenset(h.executor for h in self.homes.values())

    def executors(self) -> int | None:
        """How many executors the homes known are on (None: no home known)."""
        return len({h.executor for h in self.homes.values()}) or None

    def owners(self, owners: Mapping[int, Mapping[int, str]]) -> dict[int, dict[int, str]]:
        """Each operator's owners, balanced."""
        return {
            op: balanced(by_partition, self.homes, self.lost) for op, by_partition in owners.items()
        }
