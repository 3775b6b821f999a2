"""Where partitions live: spread over executors in proportion to their cores (no Spark)."""

from __future__ import annotations

import collections
import types
from typing import Any

from sparkstate.engine.run import joined_homes
from sparkstate.engine.run.joined_homes import JoinedHomes, executors_listed, job_tasks, unplaced
from sparkstate.engine.run.placement import HomeSeen, Placement, balanced


def homes(*spec: tuple[str, int, int]) -> dict[str, HomeSeen]:
    """(executor, cores, homes) -> every home, addressed ``<executor>-<n>``."""
    out = {}
    for executor, cores, n in spec:
        for i in range(n):
            out[f"{executor}-{i}"] = HomeSeen(f"{executor}-{i}", executor, cores)
    return out


def per_executor(owners: dict[int, str], known: dict[str, HomeSeen]) -> dict[str, int]:
    return dict(collections.Counter(known[a].executor for a in owners.values()))


def test_three_of_four_on_one_executor_spread_two_and_two_moving_one() -> None:
    known = homes(("a", 1, 1), ("b", 1, 1))
    owners = {0: "a-0", 1: "a-0", 2: "a-0", 3: "b-0"}
    after = balanced(owners, known)
    assert per_executor(after, known) == {"a": 2, "b": 2}
    assert sum(after[p] != owners[p] for p in owners) == 1  # one partition moved, once
    assert balanced(after, known) == after  # and it stays


def test_counts_differ_by_at_most_one_on_equal_cores() -> None:
    known = homes(("a", 1, 2), ("b", 1, 2), ("c", 1, 1))
    owners = {p: "a-0" for p in range(10)}
    counts = per_executor(balanced(owners, known), known)
    assert sorted(counts.values()) == [3, 3, 4]


def test_shares_follow_the_cores() -> None:
    known = homes(("big", 2, 2), ("small", 1, 1))
    owners = {p: ("small-0" if p < 4 else "big-0") for p in range(6)}
    after = balanced(owners, known)
    assert per_executor(after, known) == {"big": 4, "small": 2}
    assert collections.Counter(a for a in after.values() if a.startswith("big")) == {
        "big-0": 2,
        "big-1": 2,
    }  # the least used home of the executor takes each moved partition


def test_an_executor_that_joins_gets_its_share_and_an_unknown_home_stays() -> None:
    known = homes(("a", 1, 1), ("b", 1, 1), ("c", 1, 1))
    owners = {0: "a-0", 1: "a-0", 2: "b-0", 3: "b-0", 4: "gone-0", 5: "b-0"}
    after = balanced(owners, known)
    assert after[4] == "gone-0"  # a home no task reported: its partition is left alone
    assert per_executor({p: a for p, a in after.items() if p != 4}, known) == {
        "a": 2,
        "b": 2,
        "c": 1,
    }


def test_one_executor_or_none_known_changes_nothing() -> None:
    owners = {0: "a-0", 1: "a-0"}
    assert balanced(owners, homes(("a", 1, 1))) == owners
    assert balanced(owners, {}) == owners
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    assert per_executor(placement.owners({0: owners})[0], placement.homes) == {"a": 1, "b": 1}


class Cluster:
    """Executors as Spark's status lists them (by name), and a job of home reports that reaches
    those named in ``reached`` (one round each) and always the executors known and listed."""

    def __init__(self, listed: str, reached: list[set[str]]) -> None:
        self.listed: frozenset[str] | None = frozenset(listed)
        self.reached = reached
        self.jobs: list[tuple[int, frozenset[str]]] = []

    def run_job(self, n: int, known: frozenset[str]) -> list[HomeSeen]:
        self.jobs.append((n, known))
        here = self.reached.pop(0) if self.reached else set()
        alive = known & (self.listed or frozenset())
        return [HomeSeen(f"{e}-0", e, 1) for e in sorted(alive | here)]


def test_a_joined_executor_is_found_before_the_batch_and_gets_its_share_at_once() -> None:
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    cluster = Cluster("abc", [set(), {"c"}])  # the first job's tasks miss it
    search = JoinedHomes(lambda: cluster.listed, cluster.run_job, num_partitions=4)
    assert search.find(placement) == 1
    assert [n for n, _ in cluster.jobs] == [6, 6]  # two tasks a core of the three executors
    assert cluster.jobs[0][1] == {"a", "b"}  # (whose tasks keep their slot a moment)
    assert placement.executor_names() == {"a", "b", "c"}  # added to the batch's reports
    owners = {0: "a-0", 1: "a-0", 2: "b-0", 3: "b-0"}
    assert sorted(per_executor(placement.owners({0: owners})[0], placement.homes).values()) == [
        1,
        1,
        2,
    ]


def test_no_job_while_every_executor_listed_is_known_or_the_status_cannot_be_read() -> None:
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    cluster = Cluster("ab", [])
    search = JoinedHomes(lambda: cluster.listed, cluster.run_job, num_partitions=4)
    assert search.find(placement) == 0
    cluster.listed = None
    assert search.find(placement) == 0
    cluster.listed = frozenset()  # a local master's: the driver only
    assert search.find(placement) == 0
    placement.saw(homes(("a", 1, 1), ("b", 1, 1), ("c", 1, 1), ("d", 1, 1)).values())
    cluster.listed = frozenset("abcde")  # more executors than partitions: as many as hold one
    assert search.find(placement) == 0  # are enough
    cluster.listed = frozenset("abcde")  # the same again
    assert search.find(placement) == 0
    assert cluster.jobs == []
    assert search.find(Placement()) == 0  # no batch reported homes yet
    assert cluster.jobs == []


def test_a_search_is_bounded_and_given_up_until_the_executors_listed_change() -> None:
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    cluster = Cluster("abc", [])  # never reached
    search = JoinedHomes(lambda: cluster.listed, cluster.run_job, num_partitions=4, rounds=2)
    for _ in range(joined_homes.SEARCHES):
        assert search.find(placement) == 0
    assert len(cluster.jobs) == 2 * joined_homes.SEARCHES
    assert search.find(placement) == 0
    assert len(cluster.jobs) == 2 * joined_homes.SEARCHES  # given up on
    cluster.listed, cluster.reached = frozenset("abcd"), [{"c", "d"}]  # another joins:
    assert search.find(placement) == 2  # looked for again


def test_an_executor_replaced_between_batches_is_searched_and_the_lost_home_dropped() -> None:
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    cluster = Cluster("ab", [])
    search = JoinedHomes(lambda: cluster.listed, cluster.run_job, num_partitions=4)
    assert search.find(placement) == 0
    cluster.listed = None  # the status cannot be read
    assert search.find(placement) == 0
    assert cluster.jobs == []
    cluster.listed, cluster.reached = frozenset("ac"), [{"c"}]  # b lost, c in its place
    assert search.find(placement) == 1
    assert cluster.jobs == [(4, frozenset("ab"))]
    assert placement.executor_names() == {"a", "c"}
    assert placement.lost == {"b-0"}
    owners = {0: "a-0", 1: "a-0", 2: "b-0", 3: "b-0"}
    after = placement.owners({0: owners})[0]
    assert after == {0: "a-0", 1: "a-0", 2: "c-0", 3: "c-0"}  # b's partitions, at once
    assert search.find(placement) == 0  # settled on a and c
    placement.saw(homes(("a", 1, 1), ("c", 1, 1)).values())  # the batch's reports
    assert search.find(placement) == 0
    assert placement.lost == set()
    assert len(cluster.jobs) == 1


def test_a_replacement_not_found_keeps_the_homes_known_and_is_given_up_on() -> None:
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    cluster = Cluster("ab", [])
    search = JoinedHomes(lambda: cluster.listed, cluster.run_job, num_partitions=4, rounds=2)
    assert search.find(placement) == 0
    cluster.listed = frozenset("ac")  # c's tasks never run
    for _ in range(joined_homes.SEARCHES):
        assert search.find(placement) == 0
    assert len(cluster.jobs) == 2 * joined_homes.SEARCHES
    assert placement.executor_names() == {"a", "b"}  # nothing dropped on a partial search
    assert placement.lost == set()
    assert search.find(placement) == 0
    assert len(cluster.jobs) == 2 * joined_homes.SEARCHES  # given up on


def test_a_lost_executor_still_listed_beside_its_replacement_is_searched_twice() -> None:
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    cluster = Cluster("ab", [])
    alive = frozenset("ac")

    def run_job(n: int, known: frozenset[str]) -> list[HomeSeen]:  # b's tasks never run
        return [h for h in cluster.run_job(n, known) if h.executor in alive]

    search = JoinedHomes(lambda: cluster.listed, run_job, num_partitions=4)
    assert search.find(placement) == 0
    cluster.listed, cluster.reached = frozenset("abc"), [{"c"}]  # b died, not yet heard of
    assert search.find(placement) == 1  # c joined: found
    assert placement.executor_names() == {"a", "b", "c"}  # b not reached, not all: kept
    assert search.find(placement) == 0
    assert len(cluster.jobs) == 1  # as many homes known as listed: settled
    cluster.listed = alive  # Spark heard of b's end: one more search, b's home dropped
    assert search.find(placement) == 0
    assert placement.executor_names() == {"a", "c"}
    assert placement.lost == {"b-0"}
    assert search.find(placement) == 0
    assert len(cluster.jobs) == 2


def test_a_search_drops_no_home_of_an_executor_still_listed() -> None:
    """A search that reaches as many executors as are listed, one of them not listed yet
    (Spark's status follows its scheduler) while it misses a listed one, keeps the listed one's
    home: only the home of an executor neither reached nor listed is dropped."""
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1), ("x", 1, 1)).values())
    cluster = Cluster("abx", [])

    def run_job(n: int, known: frozenset[str]) -> list[HomeSeen]:  # b's tasks do not run
        return [h for h in cluster.run_job(n, known) if h.executor != "b"]

    search = JoinedHomes(lambda: cluster.listed, run_job, num_partitions=4)
    assert search.find(placement) == 0
    cluster.listed, cluster.reached = frozenset("ab"), [{"n"}]  # x lost; n not listed yet
    assert search.find(placement) == 1
    assert placement.executor_names() == {"a", "b", "n"}
    assert placement.lost == {"x-0"}


def test_a_home_names_its_executor_by_host_and_spark_id() -> None:
    assert joined_homes.executor_id("10.0.0.7/12") == "12"
    assert joined_homes.executor_id("a") == "a"


def test_a_lost_executor_not_replaced_has_its_home_dropped() -> None:
    placement = Placement()
    placement.saw(homes(("a", 1, 1), ("b", 1, 1)).values())
    cluster = Cluster("ab", [])
    search = JoinedHomes(lambda: cluster.listed, cluster.run_job, num_partitions=4)
    assert search.find(placement) == 0
    cluster.listed = frozenset("a")
    assert search.find(placement) == 0
    assert placement.executor_names() == {"a"}
    owners = {0: "a-0", 1: "b-0"}
    assert placement.owners({0: owners})[0] == {0: "a-0", 1: "a-0"}


def test_a_lost_home_moves_its_partitions_to_those_below_their_share() -> None:
    known = homes(("a", 1, 1), ("c", 1, 1))
    owners = {0: "a-0", 1: "b-0", 2: "a-0", 3: "b-0", 4: "gone-0"}
    after = balanced(owners, known, lost={"b-0"})
    assert after[4] == "gone-0"  # not known lost: left alone
    assert {after[0], after[2]} == {"a-0"}
    assert {after[1], after[3]} == {"c-0"}
    assert balanced(owners, homes(("a", 1, 1)), lost={"b-0"}) == {**owners, 1: "a-0", 3: "a-0"}
    assert balanced(owners, {}, lost={"b-0"}) == owners


class Status:
    """The status store of a JVM ``SparkContext``, as py4j shows it: executors by id."""

    def __init__(self, ids: list[str] | None) -> None:
        self.ids = ids
        self.left: list[str] = []

    def statusStore(self) -> Status:  # noqa: N802 - the JVM's names
        if self.ids is None:
            msg = "the JVM is gone"
            raise RuntimeError(msg)
        return self

    def executorList(self, active_only: bool) -> Status:  # noqa: N802
        assert active_only
        return self

    def iterator(self) -> Status:
        self.left = list(self.ids or [])
        return self

    def hasNext(self) -> bool:  # noqa: N802
        return bool(self.left)

    def next(self) -> Any:
        i = self.left.pop(0)
        return types.SimpleNamespace(id=lambda: i)


def test_executors_listed_by_id_the_driver_left_out() -> None:
    assert executors_listed(Status(["driver", "0", "2"])) == {"0", "2"}
    assert executors_listed(Status(["driver"])) == frozenset()
    assert executors_listed(Status(None)) is None


def test_unplaced_counts_the_executors_that_can_hold_a_partition() -> None:
    assert unplaced(2, 3, num_partitions=4)
    assert not unplaced(3, 3, num_partitions=4)
    assert not unplaced(2, 3, num_partitions=2)
    assert not unplaced(None, 3, num_partitions=4)
    assert not unplaced(2, None, num_partitions=4)
    assert job_tasks(homes(("a", 4, 1)), 3) == 24
    assert job_tasks({}, 0) == 2
