"""What a restarted query must share with its checkpoint's ``metadata.json``: the provider, the
partition count, the state location and the stateful operators (state schemas may evolve
compatibly, :mod:`sparkstate.operators.restart`); and a Spark checkpoint without sparkstate's logs
is refused, since it has no state to continue from."""

from __future__ import annotations

from typing import Any

from sparkstate.exceptions import ConfigurationError, ProviderMismatchError, SchemaMismatchError
from sparkstate.operators.restart import check_state_change, same_schema
from sparkstate.store.durable import DurableDir
from sparkstate.store.schema_json import fields_from_json

__all__ = ["check_restart", "refuse_foreign_checkpoint"]

#: The schemas of an operator's description, compared by field names and types.
SCHEMA_PARTS = ("key_schema", "value_schema", "output_schema")


def refuse_foreign_checkpoint(checkpoint: str) -> None:
    """A Spark checkpoint with committed batches but no sparkstate logs has no state for us."""
    commits = DurableDir(checkpoint).child("commits")
    if any(e.name.isdigit() for e in commits.list()):
        msg = (
            f"checkpoint {checkpoint} holds batches of a query that ran without sparkstate, so "
            "there is no state to continue from; start from a new checkpoint location"
        )
        raise ConfigurationError(msg)


def check_restart(
    metadata: dict[str, Any],
    provider: str,
    requested_partitions: str | None,
    state_root: str,
    described: list[dict[str, Any]],
    where: str,
) -> None:
    """The restarted query must match what the checkpoint was written with; state schemas may
    evolve compatibly (:mod:`sparkstate.operators.restart`)."""
    file = f"{where}/metadata.json"
    if metadata.get("provider") != provider:
        msg = (
            f"the checkpoint's state was written by provider {metadata.get('provider')!r} but "
            f"this query uses {provider!r} ({file}); use .option('stateStore', "
            f"{metadata.get('provider')!r}) or a new checkpoint location"
        )
        raise ProviderMismatchError(msg)
    n = int(metadata["num_partitions"])
    if requested_partitions is not None and int(requested_partitions) != n:
        msg = (
            f"the checkpoint has {n} state partitions but this query asks for "
            f"{requested_partitions} ({file}); the partition count is fixed for the life of a "
            "checkpoint: drop the numPartitions option or use a new checkpoint location"
        )
        raise SchemaMismatchError(msg)
    if metadata.get("state_location") != state_root:
        msg = (
            f"the checkpoint's state lives at {metadata.get('state_location')!r} but this query "
            f"uses {state_root!r} ({file}); pass the original .option('stateLocation', ...)"
        )
        raise ConfigurationError(msg)
    before = metadata.get("operators", [])
    kinds_before = [o.get("kind") for o in before]
    kinds_now = [o.get("kind") for o in described]
    if kinds_before != kinds_now:
        msg = (
            f"the query's stateful operators changed: the checkpoint has {kinds_before}, this "
            f"query has {kinds_now} ({file}); restore the original query or use a new "
            "checkpoint location"
        )
        raise ConfigurationError(msg)
    for old, new in zip(before, described, strict=True):
        evolving = check_state_change(old, new, file)  # state schemas may evolve compatibly
        for part in SCHEMA_PARTS:
            if part not in evolving and not same_schema(old.get(part), new.get(part)):
                msg = (
                    f"operator {new['id']} ({new['kind']}): the {part.replace('_', ' ')} changed "
                    f"from {_show(old.get(part))} to {_show(new.get(part))} ({file}); state "
                    "written with the old schema cannot be read: restore the original query or "
                    "use a new checkpoint location"
                )
                raise SchemaMismatchError(msg)
        compared = evolving | set(SCHEMA_PARTS)
        if _without(old, compared) != _without(new, compared):
            msg = (
                f"operator {new['id']} ({new['kind']}) changed: checkpoint has {old}, query has "
                f"{new} ({file}); restore the original query or use a new checkpoint location"
            )
            raise ConfigurationError(msg)


def _without(described: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in described.items() if k not in keys}


def _show(described: Any) -> str:
    try:
        fields = fields_from_json(described)
    except ConfigurationError:
        return repr(described)
    return "[" + ", ".join(f"{name}: {typ}" for name, typ, _ in fields) + "]"
