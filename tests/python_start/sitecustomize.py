"""What every Python process of the suite runs first: Spark's Python processes import PySpark
from the installed package rather than from the copy of it zipped inside that package.

Spark puts ``<pyspark>/python/lib/pyspark.zip`` (and py4j's zip) first on the path of every Python
process it starts: its daemon and workers, the data-source planners, and the runner that each
Python streaming source has for the life of its query. Python compiles a module imported from a
zip on every import (a zip keeps no compiled code) and reads the zip's directory again whenever
the import caches are cleared, which each worker does: about half a second of CPU in every such
process, where the installed package, compiled by pip, loads at once. The zip is dropped from the
path only where it is the zip of the very package installed beside it (the same PySpark, file for
file), so what runs is unchanged: the rule of the clock source's launcher
(``sparkstate/engine/spark/python_launch.py``), here for every process. ``tests/conftest.py``
puts this directory on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import os
import sys

# The product's own rule (the clock source's launcher), loaded by its file: importing sparkstate
# here would import its package, and PySpark with it, before the path is right.
_LAUNCH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "src",
    "sparkstate",
    "engine",
    "spark",
    "python_launch.py",
)
_spec = (
    importlib.util.spec_from_file_location("_sparkstate_python_launch", _LAUNCH)
    if os.path.isfile(_LAUNCH)
    else None
)
if _spec is not None and _spec.loader is not None:
    _launch = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_launch)
    sys.path[:] = _launch.installed_zips_dropped(sys.path)

# A test that records what every process does to durable storage (tests/sync_recorder.py).
if os.environ.get("SPARKSTATE_RECORD_SYNCS"):
    from tests.sync_recorder import install

    install(os.environ["SPARKSTATE_RECORD_SYNCS"])
