"""What every Python process of the suite runs first: Spark's Python processes import PySpark
from the installed package rather than from the copy of it zipped inside that package.

Spark puts ``<pyspark>/python/lib/pyspark.zip`` (and py4j's zip) first on the path of every Python
process it starts: its daemon and workers, the data-source planners, and the runner that each
Python streaming source has for the life of its query. Python compiles a module imported from a
zip on every import (a zip keeps no compiled code) and reads the zip's directory again whenever
the import caches are cleared, which each worker does: about half a second of CPU in every such
process, where the installed package, compiled by pip, loads at once. The zip is dropped from the
path only where it is the zip of the very package installed beside it (the same PySpark, file for
file), so what runs is unchanged. ``tests/conftest.py`` puts this directory on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys


def _installed(package: str) -> str | None:
    """The directory on the path (outside a zip) that holds ``package``."""
    for entry in sys.path:
        init = os.path.join(entry, package, "__init__.py")
        if not entry.endswith(".zip") and os.path.isfile(init):
            return entry
    return None


def _zips_to_drop() -> set[str]:
    site = _installed("pyspark")
    if site is None:
        return set()
    lib = os.path.join(site, "pyspark", "python", "lib")
    drop = {os.path.join(lib, "pyspark.zip")}
    if _installed("py4j") is not None:
        drop.update(e for e in sys.path if os.path.dirname(e) == lib and "py4j" in e)
    return drop


_DROP = _zips_to_drop()
sys.path[:] = [entry for entry in sys.path if entry not in _DROP]

# A test that records what every process does to durable storage (tests/sync_recorder.py).
if os.environ.get("SPARKSTATE_RECORD_SYNCS"):
    from tests.sync_recorder import install

    install(os.environ["SPARKSTATE_RECORD_SYNCS"])
