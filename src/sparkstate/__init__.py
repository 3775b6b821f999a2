"""sparkstate: stateful stream processing for PySpark with state in the Python worker."""

from __future__ import annotations

__version__ = "0.1.0.dev0"

__all__ = ["__version__"]
