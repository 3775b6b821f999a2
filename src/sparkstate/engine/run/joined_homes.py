"""The state homes of executors that joined, found before the batch that spreads partitions there.

The driver knows the executors whose homes the last batch's tasks reported (:mod:`.placement`);
an executor that joined is known once Spark runs a task of a batch there, which its scheduler
may not do for several batches. So while Spark's status lists more executors than the driver
knows homes on, the driver runs a small job before the batch: each task finds (or starts) its
executor's state home of its slot and reports it, as a batch's task reports its own. A task on
an executor the driver knows keeps its slot a moment, so that the job's other tasks go to the
executors it does not; the job runs again (a few times, within a few seconds) until a home is
known on every executor listed. The homes found are added to the last batch's reports, and the
batch's placement moves partitions to them at once.

An executor lost and replaced between two batches leaves as many listed, and the last batch's
reports still name the lost one's home. So executors are told apart by their ids, which Spark
never gives twice in an application (a host and port may come back: a replacement on the same
host with a fixed block manager port), and where one listed when the driver last knew a home on
each is listed no more, the job runs until its own tasks found a home on every executor listed.
Where they did, the homes of executors they did not reach and Spark no longer lists (a home
names its executor ``host/id``) are dropped, and their partitions move to the executors below
their share before the batch.
A lost executor may stay listed a moment beside its replacement (until Spark hears of its end):
the search for the one that joined ends once as many homes are known as executors listed, and
the lost one's leaving the list starts the search that drops its home.

No job runs while every executor listed has a known home and none listed before is gone (one
question to Spark's status a batch), nor where the status cannot be read, and a search that
cannot find them all runs at most ``SEARCHES`` times for the same executors listed. The tasks
reach their homes with the query's credentials (Spark's ``spark.authenticate``), as a batch's
tasks do.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pyspark import SparkContext

from sparkstate.engine.run.executor import own_home
from sparkstate.engine.run.placement import HomeSeen, Placement
from sparkstate.runtime import home_client
from sparkstate.store.conf import StoreConf

__all__ = ["JoinedHomes", "executor_id", "executors_listed", "home_job", "job_tasks", "unplaced"]

#: Jobs a search runs at most, and the time after which it starts no other.
ROUNDS = 4
BUDGET_S = 10.0
#: Searches for as many executors listed before the driver gives up on them (then batches
#: through Spark reach them, by chance, as before).
SEARCHES = 3
#: How long a task on an executor the driver knows keeps its slot.
HOLD_S = 0.3
#: Tasks a job runs per core of the executors listed (taken as large as the largest known).
TASKS_PER_CORE = 2
MAX_TASKS = 256
#: The driver's id among the executors Spark's status lists (``SparkContext.DRIVER_IDENTIFIER``).
DRIVER_ID = "driver"

#: A job of ``n`` tasks, told the executors whose homes are known: the homes its tasks report.
HomeJob = Callable[[int, frozenset[str]], list[HomeSeen]]


def executors_listed(context: Any) -> frozenset[str] | None:
    """The ids of the executors the application has, the driver's left out (the status store
    of the JVM's ``SparkContext`` ``context``, which Spark's status tracker reads); None: the
    status cannot be read."""
    try:
        listed = context.statusStore().executorList(True).iterator()
        ids = set()
        while listed.hasNext():
            ids.add(str(listed.next().id()))
    except Exception:  # noqa: BLE001 - a status that cannot be read: nothing to look for
        return None
    ids.discard(DRIVER_ID)
    return frozenset(ids)


def unplaced(placed: int | None, listed: int | None, num_partitions: int) -> bool:
    """Whether executors are ``listed`` that hold no home the driver knows (``placed``: the
    executors it knows homes on, None before a batch reported any), of as many as can hold a
    partition."""
    if placed is None or listed is None:
        return False
    return placed < min(listed, num_partitions)


def job_tasks(homes: Mapping[str, HomeSeen], listed: int) -> int:
    """The tasks of a job that lands on each of ``listed`` executors."""
    cores = max((h.cores for h in homes.values()), default=1)
    return min(MAX_TASKS, TASKS_PER_CORE * max(1, listed) * max(1, cores))


class JoinedHomes:
    """Finds the homes of the executors that joined, for one run of a query (see the module)."""

    def __init__(
        self,
        listed: Callable[[], frozenset[str] | None],
        run_job: HomeJob,
        num_partitions: int,
        *,
        rounds: int = ROUNDS,
        budget_s: float = BUDGET_S,
    ) -> None:
        self._listed = listed
        self._run_job = run_job
        self._num_partitions = num_partitions
        self._rounds = rounds
        self._budget_s = budget_s
        #: The executors listed when the driver last knew a home on each, or gave up looking:
        #: one of them no longer listed starts a search that must find every executor listed.
        self._covered: frozenset[str] | None = None
        #: The executors listed when a search last found a home on each, or that searches
        #: ``SEARCHES`` times: no search again while they are listed (an executor of few
        #: cores may hold no partition, and then no batch reports its home).
        self._settled: frozenset[str] | None = None
        self._searches = 0

    def find(self, placement: Placement) -> int:
        """Add to ``placement`` the homes of the executors listed that it knows none on, and
        drop those of executors gone where a search found all; how many executors were found."""
        listed = self._listed()
        if not listed or listed == self._settled:
            return 0
        self._settled = None
        changed = self._covered is not None and not self._covered <= listed  # one gone
        if not changed and not unplaced(placement.executors(), len(listed), self._num_partitions):
            self._covered, self._searches = listed, 0
            return 0
        before = placement.executor_names()
        done = self._search(placement, listed, changed)
        self._searches += 1
        if done or self._searches >= SEARCHES:
            self._settled = self._covered = listed
            self._searches = 0
        return len(placement.executor_names() - before)

    def _search(self, placement: Placement, listed_ids: frozenset[str], changed: bool) -> bool:
        """Jobs until a home is known on each of the executors listed (where one listed before
        is gone, ``changed``: found by the jobs' tasks themselves, as the last batch's reports
        may name the lost one's), within the rounds and the time of a search; whether that was
        done. Where the tasks found as many executors as are listed, the homes of executors
        neither found nor listed are dropped (one found may not be listed yet, for Spark's
        status follows its scheduler, so a listed one missed keeps its home)."""
        listed = len(listed_ids)
        found: set[str] = set()

        def done() -> bool:
            if len(found) >= listed:
                return True
            return not changed and not unplaced(placement.executors(), listed, self._num_partitions)

        deadline = time.monotonic() + self._budget_s
        for _ in range(self._rounds):
            if done() or time.monotonic() >= deadline:
                break
            reports = self._run_job(job_tasks(placement.homes, listed), placement.executor_names())
            found.update(h.executor for h in reports)
            placement.also_saw(reports)
        if len(found) >= listed:
            still = {e for e in placement.executor_names() if executor_id(e) in listed_ids}
            placement.only_on(found | still)
        return done()


def executor_id(name: str) -> str:
    """Spark's id of the executor a home reported (its name is ``host/id``)."""
    return name.rpartition("/")[2]


def home_job(sc: SparkContext, conf: StoreConf) -> HomeJob:
    """The job of a search on ``sc``'s executors: each task reports its executor's home of its
    slot, started if need be (the slots and credentials of ``conf``, as a batch's tasks)."""

    def run(n: int, known: frozenset[str]) -> list[HomeSeen]:
        task = functools.partial(
            _report_home, conf.home_auth, conf.home_encrypt, max(1, conf.python_workers), known
        )
        rows = sc.parallelize(range(n), n).mapPartitionsWithIndex(task).collect()
        return [HomeSeen(*row) for row in rows]

    return run


def _report_home(
    auth: bool,
    encrypt: bool,
    slots: int,
    known: frozenset[str],
    index: int,
    rows: Iterable[Any],
) -> Iterator[tuple[str, str, int]]:
    """A task of the job (in a Python worker): its executor's home of its slot, reported; on an
    executor the driver knows, after keeping the slot a moment."""
    executor = home_client.executor_process()
    if executor is None:
        return
    home = own_home(executor, index % slots, home_client.credentials(auth, encrypt))
    if home is None:
        return
    if home[1] in known:
        time.sleep(HOLD_S)
    yield home
