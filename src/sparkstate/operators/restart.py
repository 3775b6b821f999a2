"""What may change in an operator's state when a query restarts on its checkpoint.

``StatefulOperator.describe()`` is recorded in the checkpoint's ``metadata.json`` at the first
start and compared at every restart. The state schemas in it may evolve as a store's value schema
may (:mod:`sparkstate.store.evolution`: nullable fields added, fields dropped or reordered):
``state_schema`` of ``applyInPandasWithState`` / ``flatMapGroupsWithState`` (with the
``value_schema`` derived from it) and the schema of each ``StatefulProcessor`` state variable
(``state``), whose output schema may change too (its output is not in its state, as in Spark).
A processor's state written under Spark's Avro state encoding (``state_encoding``
``avro``) may also widen a field's type as Avro's schema resolution does; the encoding itself
stays the checkpoint's. The rest of the description must stay equal; the caller checks that.

Only the recorded schema is compared here; the stores compare with every schema they ever held
(a dropped field that comes back with another type) when they open.
"""

from __future__ import annotations

from typing import Any

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.operators.arbitrary.transform_with_state import (
    AVRO,
    DEFAULT_ENCODING,
    STATE_ENCODING,
)
from sparkstate.operators.registry import OPERATORS
from sparkstate.store.evolution import Field, condition, incompatibility, refusal, show_fields
from sparkstate.store.schema_json import fields_from_json

__all__ = ["check_state_change", "same_schema"]


def _fields(described: Any) -> list[Field]:
    """Fields of a recorded schema, in any form sparkstate wrote (:mod:`sparkstate.store.
    schema_json`); descriptions written before nullability was recorded give None."""
    return [] if described is None else fields_from_json(described)


def same_schema(old: Any, new: Any) -> bool:
    """Whether two recorded schemas have the same field names and types, whatever form each was
    recorded in (nullability is not compared: earlier versions did not record it)."""
    return [f[:2] for f in _fields(old)] == [f[:2] for f in _fields(new)]


def _check_fields(old: Any, new: Any, what: str, where: str, *, widening: bool = False) -> None:
    before, after = _fields(old), _fields(new)
    reason = incompatibility([before], after, widening=widening)
    if reason is not None:
        shown = f"{show_fields(after)} ({where})"
        msg = refusal(what, show_fields(before), shown, reason, widening=widening)
        raise SchemaMismatchError(msg, condition(widening))


def _check_encoding(old: dict[str, Any], new: dict[str, Any], op: str, where: str) -> bool:
    """The state encoding (Spark's ``spark.sql.streaming.stateStore.encodingFormat``) stays
    what the checkpoint was written with; returns whether it is Avro (types may widen)."""
    was = old.get(STATE_ENCODING, DEFAULT_ENCODING)
    now = new.get(STATE_ENCODING, DEFAULT_ENCODING)
    if was != now:
        msg = (
            f"{op}: spark.sql.streaming.stateStore.encodingFormat changed from {was!r} to "
            f"{now!r} ({where}); the state was written with {was!r}: set it back to {was!r}, "
            "or start from a new checkpoint location"
        )
        raise ConfigurationError(msg)
    return bool(now == AVRO)


def _check_variables(
    old: dict[str, Any], new: dict[str, Any], op: str, where: str, *, widening: bool = False
) -> None:
    if sorted(old) != sorted(new):
        msg = (
            f"{op}: the state variables changed from {sorted(old)} to {sorted(new)} ({where}); "
            "init() must create the variables the checkpoint has: restore the original "
            "processor, or start from a new checkpoint location"
        )
        raise ConfigurationError(msg)
    for name in sorted(new):
        was = {k: v for k, v in old[name].items() if k not in ("schema", "key_schema")}
        now = {k: v for k, v in new[name].items() if k not in ("schema", "key_schema")}
        if was != now or not same_schema(old[name].get("key_schema"), new[name].get("key_schema")):
            msg = (
                f"{op}: state variable {name!r} changed from {was} to {now} ({where}); only its "
                "schema may evolve: restore the original processor, or start from a new "
                "checkpoint location"
            )
            raise ConfigurationError(msg)
        what = f"{op}: the schema of state variable {name!r}"
        was, now = old[name].get("schema"), new[name].get("schema")
        _check_fields(was, now, what, where, widening=widening)


def check_state_change(old: dict[str, Any], new: dict[str, Any], where: str) -> set[str]:
    """Refuse an incompatible change of the state schemas between two descriptions of an
    operator; returns the keys checked here (the caller compares the others for equality)."""
    op = f"operator {new.get('id')} ({new.get('kind')})"
    checked: set[str] = set()
    kind = OPERATORS.get(str(new.get("kind")))
    if kind is not None and not kind.output_in_state:
        checked.add("output_schema")  # the input passed through: its columns may change
    if "state_schema" in old or "state_schema" in new:
        what = f"{op}: the state schema"
        _check_fields(old.get("state_schema"), new.get("state_schema"), what, where)
        checked |= {"state_schema", "value_schema"}
    if "state" in old or "state" in new:
        avro = _check_encoding(old, new, op, where)
        variables = old.get("state") or {}, new.get("state") or {}
        _check_variables(*variables, op, where, widening=avro)
        # a StatefulProcessor's output is not in its state (its variables are): as in Spark,
        # it may change
        checked |= {"state", STATE_ENCODING, "output_schema"}
    return checked
