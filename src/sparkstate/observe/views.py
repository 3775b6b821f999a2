"""How a reader shows one store of an operator: the view its class gives (the views themselves
live with the operators: :mod:`sparkstate.operators.state_views`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkstate.operators.registry import layout_of
from sparkstate.operators.state_views import CHANGE_COLUMNS, StateView

__all__ = ["CHANGE_COLUMNS", "StateView", "view_for"]


def view_for(
    described: dict[str, Any],
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    *,
    store_name: str | None = None,
    join_side: str | None = None,
    flatten: bool = True,
    timers: bool = False,
) -> StateView:
    """The view of an operator's store: ``described`` is its entry in ``metadata.json``,
    ``families`` its partition's column families, ``store_name`` a state variable or family,
    ``timers`` its registered timers."""
    layout = layout_of(described["kind"])
    if timers:
        return layout.timers_view(described, families)
    return layout.state_view(
        described, families, store_name=store_name, join_side=join_side, flatten=flatten
    )
