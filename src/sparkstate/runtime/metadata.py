"""What a restarted query must share with its checkpoint's ``metadata.json``: the provider, the
state location and the stateful operators (state schemas may evolve
compatibly, :mod:`sparkstate.operators.restart`; the partition count may change, which
rescales
the state: :func:`rescale_target`). A checkpoint of Spark's own operators is taken over
(:mod:`sparkstate.runtime.take_over`)."""

from __future__ import annotations

import os
from typing import Any

from sparkstate.exceptions import ConfigurationError, ProviderMismatchError, SchemaMismatchError
from sparkstate.files.durable import DurableDir, canonical_location, local_path
from sparkstate.operators.registry import operator_class
from sparkstate.operators.restart import check_state_change, same_schema
from sparkstate.store.evolution import KEY_NOT_COMPATIBLE, NOT_COMPATIBLE
from sparkstate.store.schema_json import fields_from_json

__all__ = [
    "PARTITIONS_ASKED",
    "check_checkpoint_location",
    "check_num_partitions",
    "check_restart",
    "partitions_asked",
    "rescale_target",
]

#: Where ``metadata.json`` records what the last start asked for: the ``numPartitions`` option
#: (None: not given) and the session's ``spark.sql.shuffle.partitions``.
PARTITIONS_ASKED = "partitions_asked"

#: Where the state of a checkpoint without a ``stateLocation`` lives, under its engine directory.
STATE_DIR = "state"

#: The schemas of an operator's description, compared by field names and types.
SCHEMA_PARTS = ("key_schema", "value_schema", "output_schema")
#: Spark's error condition of a changed schema, for the parts whose state Spark checks too.
SCHEMA_CONDITIONS = {"key_schema": KEY_NOT_COMPATIBLE, "value_schema": NOT_COMPATIBLE}
#: Parts of an operator's description that only name things for readers: not compared.
READER_PARTS = frozenset({"column_names"})


def check_restart(
    metadata: dict[str, Any],
    provider: str,
    state_location: str | None,
    described: list[dict[str, Any]],
    where: str,
) -> SchemaMismatchError | None:
    """The restarted query must match what the checkpoint was written with; state schemas may
    evolve compatibly (:mod:`sparkstate.operators.restart`). ``state_location`` is the
    ``stateLocation`` option (canonical), None for the state in the checkpoint at ``where``.

    A state schema change that Spark refuses too (one with Spark's condition) is returned, not
    raised: Spark refuses it when it plans the query's first batch, and the query fails there
    (the engine's per-batch driver raises it). The first operator's refusal is returned, and
    the operators after it are not compared."""
    file = f"{where}/metadata.json"
    if metadata.get("provider") != provider:
        msg = (
            f"the checkpoint's state was written by provider {metadata.get('provider')!r} but "
            f"this query uses {provider!r} ({file}); use .option('stateStore', "
            f"{metadata.get('provider')!r}) or a new checkpoint location"
        )
        raise ProviderMismatchError(msg)
    _check_state_location(metadata.get("state_location"), state_location, where, file)
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
        if operator_class(str(new["kind"])).renames_keep_state and _unnamed(old) == _unnamed(new):
            continue  # as Spark's: the state's columns renamed, its schemas the same otherwise
        try:
            evolving = check_state_change(old, new, file)  # state schemas may evolve compatibly
            _check_schemas(old, new, evolving, file)
        except SchemaMismatchError as exc:
            if exc.condition is None:
                raise
            return exc
        compared = evolving | set(SCHEMA_PARTS) | READER_PARTS
        if _without(old, compared) != _without(new, compared):
            msg = (
                f"operator {new['id']} ({new['kind']}) changed: checkpoint has {old}, query has "
                f"{new} ({file}); restore the original query or use a new checkpoint location"
            )
            raise ConfigurationError(msg)
    return None


def _unnamed(described: dict[str, Any]) -> Any:
    """An operator's description without its columns' names: each schema's fields as types, and
    where a key or output column's name appears elsewhere (an aggregate's alias, a column the
    operator names), its place instead."""
    places: dict[str, str] = {}
    for part in ("output_schema", "key_schema"):
        for i, (name, _, _) in enumerate(fields_from_json(described.get(part) or [])):
            places[name] = f"{part}[{i}]"

    def unnamed(value: Any, key: str = "") -> Any:
        if key in SCHEMA_PARTS:
            return [(t, nullable) for _, t, nullable in fields_from_json(value or [])]
        if isinstance(value, dict):
            return {k: unnamed(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [unnamed(v) for v in value]
        if isinstance(value, str):
            return places.get(value, value)
        return value

    return unnamed(described)


def _check_schemas(old: dict[str, Any], new: dict[str, Any], evolving: set[str], file: str) -> None:
    """The schemas of an operator that may not evolve stay the checkpoint's."""
    for part in SCHEMA_PARTS:
        if part not in evolving and not same_schema(old.get(part), new.get(part)):
            msg = (
                f"operator {new['id']} ({new['kind']}): the {part.replace('_', ' ')} changed "
                f"from {_show(old.get(part))} to {_show(new.get(part))} ({file}); state "
                "written with the old schema cannot be read: restore the original query or "
                "use a new checkpoint location"
            )
            raise SchemaMismatchError(msg, SCHEMA_CONDITIONS.get(part))


def check_num_partitions(option: Any) -> None:
    """The ``numPartitions`` option, when given, is a whole number of at least 1."""
    if option is None:
        return
    try:
        wanted = int(str(option).strip())
    except ValueError:
        wanted = 0
    if wanted < 1:
        msg = f"option numPartitions must be a whole number >= 1, got {option!r}"
        raise ConfigurationError(msg)


def partitions_asked(option: str | None, session_default: int) -> dict[str, Any]:
    return {"numPartitions": option, "shuffle_partitions": session_default}


def rescale_target(metadata: dict[str, Any], asked: dict[str, Any]) -> int | None:
    """The partition count a restart rescales the state to, or None to keep the checkpoint's.

    What the query asks for is the ``numPartitions`` option, else the session's shuffle
    partitions. A rescale follows a *change* of what was asked at the last start, not a
    difference from the checkpoint's count: a checkpoint rescaled by ``sparkstate
    repartition`` keeps its new count while the query asks what it asked before. A checkpoint
    that does not record the last ask rescales only for a ``numPartitions`` option that
    differs from its count (which such a checkpoint refused before).
    """
    current = int(metadata["num_partitions"])
    before = metadata.get(PARTITIONS_ASKED)
    option = asked["numPartitions"]
    if option is not None:
        wanted = int(option)
        if wanted < 1:
            msg = f"numPartitions must be >= 1, got {wanted}"
            raise ConfigurationError(msg)
        changed = before is None or before.get("numPartitions") != option
    else:
        wanted = int(asked["shuffle_partitions"])  # dropping the option keeps the count
        changed = (
            before is not None
            and before.get("numPartitions") is None
            and before.get("shuffle_partitions") != asked["shuffle_partitions"]
        )
    return wanted if changed and wanted != current and wanted >= 1 else None


def _check_state_location(
    recorded: str | None, chosen: str | None, engine_root: str, file: str
) -> None:
    """The state is where the checkpoint says: in the checkpoint itself (recorded None, which
    moves with it), or at the ``stateLocation`` it was started with. Checkpoints written
    before state in the checkpoint was recorded as None name the engine directory they were in
    then; one that has its state beside it now was moved, and runs where it is."""
    if recorded is not None:
        place = canonical_location(recorded)
        here = place == engine_root
        moved = chosen is None and recorded.rstrip("/").endswith("/sparkstate")
        moved_here = moved and DurableDir(engine_root).exists(STATE_DIR)
        recorded = None if here or moved_here else place
    if recorded == chosen:
        return
    if recorded is None:
        msg = (
            f"the checkpoint keeps its state inside itself ({engine_root}) but this query sets "
            f"stateLocation {chosen!r} ({file}); drop the stateLocation option"
        )
    elif chosen is None:
        msg = (
            f"the checkpoint's state lives at {recorded!r} ({file}); pass "
            f".option('stateLocation', {recorded!r})"
        )
    else:
        msg = (
            f"the checkpoint's state lives at {recorded!r} but this query uses {chosen!r} "
            f"({file}); pass the original .option('stateLocation', ...)"
        )
    raise ConfigurationError(msg)


def check_checkpoint_location(checkpoint: str) -> None:
    """A local checkpoint location must be a directory this process can write (or create)."""
    path = local_path(checkpoint)
    if path is None:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        msg = f"checkpointLocation {path} is a file, not a directory; give a directory"
        raise ConfigurationError(msg)
    engine = os.path.join(path, "sparkstate")
    made = not os.path.isdir(engine)
    try:
        os.makedirs(engine, exist_ok=True)
        probe = os.path.join(engine, f".tmp-probe-{os.getpid()}")
        with open(probe, "wb"):
            pass
        os.remove(probe)
        if made:  # a check writes nothing: the start that follows makes the directory
            os.rmdir(engine)
    except OSError as exc:
        msg = (
            f"cannot write to checkpointLocation {path}: {exc.strerror or exc}; give a "
            "directory this user can write"
        )
        raise ConfigurationError(msg) from exc


def _without(described: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in described.items() if k not in keys}


def _show(described: Any) -> str:
    try:
        fields = fields_from_json(described)
    except ConfigurationError:
        return repr(described)
    return "[" + ", ".join(f"{name}: {typ}" for name, typ, _ in fields) + "]"
