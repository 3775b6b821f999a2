"""Migrating a checkpoint's state to a changed query (``.option("stateMigration", ...)``): what the
logs say, in what order.

A restart whose state schemas changed is refused, as Spark refuses it. With a migration, the
state every operator holds after the last committed batch ``L`` is read (the state reader's
rows), converted where the operator changed, and written as version ``L + 1`` of the changed
query's operators in a new *generation* of the state: ``migrated/<L>/`` under the state's
root, with its own ``_schema.json`` files (the old generation's files stay as they were, under
their schemas). Written in this order, so that a migration killed at any point either never
happened or completes:

1. The new generation's ``_schema.json`` files and state, under fresh checkpoint ids: nothing
   names them yet.
2. ``commits/L.json`` rewritten: the new checkpoint ids, and ``migration`` (the generation and
   the changed query's operators). The commit point.
3. ``metadata.json``: the changed query's operators and the generation
   (``state_generation``), which every reader of the state follows. A start finishes this step
   when it finds step 2 done (:func:`settle_migration`).

Killed before step 2, the old query still runs on the checkpoint, and the migration runs again
at the next start that asks for it. The state of batches before ``L`` stays in the old
generation: a read of it after the migration is refused (its versions are not in the new one).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sparkstate.files.durable import join_uri
from sparkstate.runtime.logs import CheckpointLog
from sparkstate.runtime.progress import format_time
from sparkstate.runtime.records import OperatorCommit
from sparkstate.store.schema_file import schema_description

__all__ = [
    "GENERATION",
    "MIGRATED",
    "Migration",
    "commit_migration",
    "plan_migration",
    "settle_migration",
    "state_root_of",
]

#: ``metadata.json``'s field naming the state's generation under its root (absent: the first).
GENERATION = "state_generation"
#: ``metadata.json``'s record of the migrations: ``[{"batch_id", "changed", "at"}, ...]``.
MIGRATED = "migrated"


def state_root_of(metadata: dict[str, Any], root: str) -> str:
    """Where the operators' stores are: the state's root, or the generation a migration wrote
    under it."""
    generation = metadata.get(GENERATION)
    return join_uri(root, str(generation)) if generation else root


@dataclasses.dataclass(frozen=True)
class Migration:
    """The migration of the checkpoint at ``location`` after its batch ``batch_id``."""

    location: str
    engine_root: str
    #: The state's root (the checkpoint's engine directory, or ``stateLocation``).
    root: str
    batch_id: int
    num_partitions: int
    provider: str
    #: The operators as the checkpoint has them, and as the changed query has them.
    old_operators: list[dict[str, Any]]
    new_operators: list[dict[str, Any]]

    @property
    def generation(self) -> str:
        return f"migrated/{self.batch_id}"

    @property
    def state_root(self) -> str:
        """Where the migrated state is written."""
        return join_uri(self.root, self.generation)

    @property
    def version(self) -> int:
        return self.batch_id + 1

    @property
    def changed(self) -> list[int]:
        """The ids of the operators whose description changed."""
        old = {int(o["id"]): o for o in self.old_operators}
        return [int(o["id"]) for o in self.new_operators if old.get(int(o["id"])) != o]

    def schema_record(self, families: dict[str, Any]) -> dict[str, Any]:
        return schema_description(self.provider, families, self.num_partitions)


def plan_migration(
    location: str,
    engine_root: str,
    root: str,
    metadata: dict[str, Any],
    new_operators: list[dict[str, Any]],
) -> Migration | None:
    """The migration of the checkpoint's state to ``new_operators``; None where no batch has
    committed (there is no state to migrate)."""
    latest = CheckpointLog(engine_root, location).latest_commit()
    if latest is None:
        return None
    return Migration(
        location=location,
        engine_root=engine_root,
        root=root,
        batch_id=latest.batch_id,
        num_partitions=int(metadata["num_partitions"]),
        provider=str(metadata["provider"]),
        old_operators=list(metadata.get("operators", [])),
        new_operators=new_operators,
    )


def commit_migration(plan: Migration, written: dict[int, dict[int, tuple[str, int]]]) -> None:
    """Step 2, the commit point (``written``: per operator and partition, the checkpoint id of
    the version written and the operator's rows in it), and step 3."""
    log_ = CheckpointLog(plan.engine_root, plan.location)
    previous = log_.read_commit(plan.batch_id)
    assert previous is not None
    operators = {
        int(op["id"]): OperatorCommit.of_written(
            int(op["id"]), written.get(int(op["id"]), {}), plan.num_partitions, "the migration"
        )
        for op in plan.new_operators
    }
    log_.write_commit(
        dataclasses.replace(
            previous,
            operators=operators,
            migration={
                "generation": plan.generation,
                "operators": plan.new_operators,
                "changed": plan.changed,
                "at": format_time(time.time()),
            },
        )
    )
    settle_migration(plan.engine_root)


def settle_migration(engine_root: str) -> bool:
    """Step 3, where the last commit is a migration's and ``metadata.json`` does not follow it
    yet; returns whether it wrote it."""
    log_ = CheckpointLog(engine_root)
    metadata = log_.read_metadata()
    latest = log_.latest_commit()
    if metadata is None or latest is None or latest.migration is None:
        return False
    generation = latest.migration["generation"]
    if metadata.get(GENERATION) == generation:
        return False
    done = {k: latest.migration[k] for k in ("changed", "at")}
    history = [*metadata.get(MIGRATED, []), {"batch_id": latest.batch_id, **done}]
    log_.write_metadata(
        {
            **metadata,
            "operators": latest.migration["operators"],
            GENERATION: generation,
            MIGRATED: history,
        }
    )
    return True
