"""What an operator kind knows about the state it keeps, asked by those who read it without
running the operator: the state reader, ``sparkstate inspect`` and rescale
(:mod:`sparkstate.observe`).

Each answer is a class method of the operator's class over its entry in ``metadata.json``
(``described``: what :meth:`~sparkstate.operators.base.StatefulOperator.describe` wrote), so a
checkpoint is read without building the operator. The defaults here fit state kept under the
operator's key in one store; an operator whose state is shown otherwise overrides them in its
own module. The classes are found by kind in :mod:`sparkstate.operators.registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.state_views import KeyValueView, StateView
from sparkstate.store.base import DEFAULT_CF, StateStore

__all__ = ["DeriveFamilies", "Families", "ShownStore", "StateLayout"]

#: The column families of an operator's stores: name -> (key schema, value schema).
Families = dict[str, tuple[pa.Schema, pa.Schema]]
#: A store as the reader shows it: the label it is shown under, and the ``storeName`` and
#: ``joinSide`` options that pick it.
ShownStore = tuple[str, str | None, str | None]
#: Computes a partition's derived column families from its other families' rows: the
#: families, physical keys and values in; the derived entries' physical keys and values out.
DeriveFamilies = Callable[[pa.Array, pa.Array, pa.Array], tuple[pa.Array, pa.Array]]


class StateLayout:
    """How an operator's state is laid out and shown; the defaults: one store, one row per
    key, the key and value as stored."""

    #: ``operatorName`` in Spark's ``stateOperators`` progress ("" where the kind is unknown).
    progress_name: ClassVar[str] = ""
    #: Spark's names of the operator's state stores (``stateStoreName`` of ``state-metadata``).
    spark_store_names: ClassVar[tuple[str, ...]] = (DEFAULT_CF,)
    #: Why the state has no key to look up (completes "operator 0 (name) ..."); None: it has.
    unkeyed: ClassVar[str | None] = None
    #: Whether the store's key count is the operator's row count (a join keeps many rows under
    #: one key, and counts them itself: :meth:`rows_in_state`).
    rows_are_keys: ClassVar[bool] = True
    #: Whether Spark keeps the state without its columns' names, so that a restart that only
    #: renames columns (a grouping column, an aggregate's alias) goes on with it.
    renames_keep_state: ClassVar[bool] = False
    #: Whether ``sparkstate export`` writes the state in the form of Spark's default provider
    #: (:meth:`spark_stores`, :meth:`spark_partitioning`).
    exported_to_spark: ClassVar[bool] = False

    @classmethod
    def state_view(
        cls,
        described: dict[str, Any],
        families: Families,
        *,
        store_name: str | None = None,
        join_side: str | None = None,
        flatten: bool = True,
    ) -> StateView:
        """The view of the store the reader's ``storeName`` (a state variable or column family)
        and ``joinSide`` options pick; ``families`` are a partition's column families."""
        if join_side is not None:
            kind = described["kind"]
            msg = f"joinSide applies to a stream-stream join; operator {described['id']} is {kind}"
            raise ConfigurationError(msg)
        return cls.store_view(described, families, store_name, flatten)

    @classmethod
    def store_view(
        cls, described: dict[str, Any], families: Families, store_name: str | None, flatten: bool
    ) -> StateView:
        """The view of store ``store_name`` (None: the operator's own)."""
        if store_name not in (None, DEFAULT_CF):
            if store_name not in families:
                kind = described["kind"]
                msg = f"operator {described['id']} ({kind}) has no store {store_name!r}"
                raise ConfigurationError(msg)
            key, value = families[store_name]
            return KeyValueView(store_name, key, value)
        key, value = families[DEFAULT_CF]
        return cls.default_view(described, key, value)

    @classmethod
    def default_view(cls, described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
        """The view of the operator's own store, in Spark's shape of this operator's state."""
        return KeyValueView(DEFAULT_CF, key, value)

    @classmethod
    def timers_view(cls, described: dict[str, Any], families: Families) -> StateView:
        """The view of the registered timers (the reader's ``readRegisteredTimers``)."""
        msg = (
            f"readRegisteredTimers reads the timers of a transformWithState operator with "
            f"a time mode; operator {described['id']} ({described['kind']}) has none"
        )
        raise ConfigurationError(msg)

    @classmethod
    def shown_stores(
        cls, described: dict[str, Any], store_name: str | None, join_side: str | None
    ) -> list[ShownStore]:
        """The stores shown for the options given: the one they pick (by default, the
        operator's own)."""
        return [(store_name or join_side or DEFAULT_CF, store_name, join_side)]

    @classmethod
    def shown_key(cls, described: dict[str, Any], key_schema: pa.Schema) -> list[tuple[str, str]]:
        """The columns of the key as the reader shows them: (name shown, store's key column)."""
        return [(name, name) for name in key_schema.names]

    @classmethod
    def shuffle_columns(cls, described: dict[str, Any], key_schema: pa.Schema) -> list[str]:
        """The columns the engine shuffles the operator's input by (``repartition(n, *cols)``),
        which decide the partition a key's state is in."""
        return list(key_schema.names)

    @classmethod
    def spark_stores(cls, described: dict[str, Any]) -> list[str] | None:
        """Spark's stores of this operator's state, for ``sparkstate export``, each read with
        the reader's ``storeName`` (``default``: the operator's own view); None where
        sparkstate does not write this state in Spark's form."""
        return list(cls.spark_store_names) if cls.exported_to_spark else None

    @classmethod
    def spark_partitioning(
        cls, described: dict[str, Any], store: str, shown_key: list[str]
    ) -> tuple[list[str], list[str]]:
        """How Spark's own operator keeps one of its stores (``store``), for ``sparkstate
        export``: of the key's fields as the reader shows them (``shown_key``), those in
        Spark's state key, and those its partitioning hashes, in order ([]: all of it in
        partition 0, a global operator's state). By default, the key as shown, all hashed."""
        return list(shown_key), list(shown_key)

    @classmethod
    def derived_families(cls) -> tuple[tuple[str, ...], DeriveFamilies | None]:
        """The column families not moved by a rescale but computed again in each new partition
        from the rows it received, and how (None: the operator counts them again itself)."""
        return (), None

    @classmethod
    def rows_in_state(cls, store: StateStore) -> int:
        """The operator's rows in a partition's loaded state."""
        return max(0, store.total_keys())

    @classmethod
    def spark_properties(cls, described: dict[str, Any], output_mode: str) -> str | None:
        """Spark's ``operatorProperties`` in ``state-metadata`` (JSON), where it has any."""
        return None

    @classmethod
    def summary(cls, described: dict[str, Any]) -> dict[str, Any]:
        """What ``inspect`` shows of the operator beside its key and stores."""
        return {}

    @classmethod
    def store_summary(cls, described: dict[str, Any], store: str) -> dict[str, Any]:
        """What ``inspect`` shows of one of the operator's stores beside its columns."""
        return {}
