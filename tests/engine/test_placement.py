"""Where partitions live: spread over executors in proportion to their cores (no Spark)."""

from __future__ import annotations

import collections

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
