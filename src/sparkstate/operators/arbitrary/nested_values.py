"""Nested state values as PySpark hands them to a ``StatefulProcessor``: an array is a new
``list``, a struct a ``Row`` (``row.name``, ``row["name"]``, equal to PySpark's ``Row`` of the
same values), a map a ``dict``, at every depth.

The store's codecs give what ``pyarrow``'s ``to_pylist()`` gives (dicts for structs, lists of
pairs for maps); :func:`user_converter` turns a decoded row into PySpark's forms, building new
containers each time so that a user who mutates a value they read does not change the state
without an ``update``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from sparkstate.operators.grouping import make_row_class

__all__ = ["user_converter"]

Convert = Callable[[Any], Any]


def user_converter(schema: pa.Schema) -> Callable[[tuple[Any, ...]], tuple[Any, ...]] | None:
    """A function from a decoded row of ``schema`` to the row a user sees; None when no column
    is nested (the decoded row is already what PySpark gives)."""
    converts = [_converter(f.type) for f in schema]
    if all(c is None for c in converts):
        return None

    def convert(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            v if c is None or v is None else c(v) for c, v in zip(converts, row, strict=False)
        )

    return convert


def _converter(t: pa.DataType) -> Convert | None:
    """From the decoded form, or from what a user wrote in this batch (tuples, named tuples,
    Rows or dicts for structs, dicts or pairs for maps, numpy arrays for arrays)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _converter(t.value_type)

        def to_list(v: Any) -> list[Any]:
            items = v.tolist() if isinstance(v, np.ndarray) else v
            if element is None:
                return list(items)
            return [None if x is None else element(x) for x in items]

        return to_list
    if pa.types.is_map(t):
        key, item = _converter(t.key_type), _converter(t.item_type)

        def to_dict(v: Any) -> dict[Any, Any]:
            pairs = v.items() if isinstance(v, dict) else v
            return {
                (k if key is None else key(k)): (x if item is None or x is None else item(x))
                for k, x in pairs
            }

        return to_dict
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        converts = [_converter(t.field(i).type) for i in range(t.num_fields)]
        row_class = make_row_class(names)
        new = tuple.__new__

        def to_row(v: Any) -> Any:
            if isinstance(v, tuple) and hasattr(v, "__fields__") and hasattr(v, "asDict"):
                v = v.asDict()
            values = [v.get(n) for n in names] if isinstance(v, dict) else list(v)
            return new(
                row_class,
                [
                    x if c is None or x is None else c(x)
                    for c, x in zip(converts, values, strict=True)
                ],
            )

        return to_row
    return None
