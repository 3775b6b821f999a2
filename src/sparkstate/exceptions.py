"""The exceptions sparkstate raises.

Every error is one of ours and also the builtin a caller would catch anyway::

    SparkstateError
    ├── ConfigurationError (ValueError)          bad option, unknown provider, unsupported query
    ├── StateStoreError
    │   ├── StateFileError (OSError)              a durable file cannot be used
    │   │   ├── CorruptStateFileError             checksum, truncation, bad header
    │   │   └── MissingVersionError (FileNotFoundError)
    │   ├── SchemaMismatchError (ValueError)      key/value schema or partition layout changed
    │   ├── ProviderMismatchError (ValueError)    checkpoint written by another provider
    │   ├── StoreLockedError (TimeoutError)       another live writer holds the partition
    │   └── StoreClosedError (RuntimeError)       store used after commit/abort/close
    └── QueryError (RuntimeError)                 a streaming query failed or cannot start
        ├── CheckpointInUseError                  a second query on the same checkpoint
        ├── StateHomeError                        the process holding an executor's state ended
        └── UserFunctionError                     a function of the user's raised

Messages name the store, the version and the file involved, so that an operator of a production
pipeline can act on the message alone. A query that fails raises, from ``awaitTermination()``,
the sparkstate error that failed it (one of these classes, also PySpark's
``StreamingQueryException`` with the condition and parameters of Spark's for the failed query,
``STREAM_FAILED``). A restart whose state schema Spark refuses fails its first batch, as Spark's
does, with a ``SchemaMismatchError`` that names Spark's condition of the refusal
(``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE``, ...). A query that ``start()`` refuses as Spark's
analyzer refuses it (an output mode its sink or its operations do not take) raises a
``ConfigurationError`` that is also PySpark's ``AnalysisException``, with Spark's error
condition (``sparkstate.engine.spark.errors``).
"""

from __future__ import annotations

__all__ = [
    "CheckpointInUseError",
    "ConfigurationError",
    "CorruptStateFileError",
    "MissingVersionError",
    "ProviderMismatchError",
    "QueryError",
    "SchemaMismatchError",
    "SparkstateError",
    "StateFileError",
    "StateHomeError",
    "StateStoreError",
    "StoreClosedError",
    "StoreLockedError",
    "UserFunctionError",
]


class SparkstateError(Exception):
    """Base class of every error raised by sparkstate."""


class ConfigurationError(SparkstateError, ValueError):
    """An option, provider name or query shape that sparkstate cannot run."""


class StateStoreError(SparkstateError):
    """A state store could not do what was asked."""


class StateFileError(StateStoreError, OSError):
    """A durable state file is missing, unreadable or damaged."""


class CorruptStateFileError(StateFileError):
    """A durable file failed its checksum, is truncated or has a bad header."""


class MissingVersionError(StateFileError, FileNotFoundError):
    """The files needed to load a version do not exist."""


class SchemaMismatchError(StateStoreError, ValueError):
    """The key/value schema or partition layout differs from the one on the checkpoint.

    ``condition`` is Spark's error condition of the same refusal
    (``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE``, ``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``,
    ...), None where Spark has none; the message then starts with ``[condition]``, as Spark's
    do."""

    def __init__(self, message: str, condition: str | None = None) -> None:
        if condition is not None and not message.startswith(f"[{condition}]"):
            message = f"[{condition}] {message}"
        super().__init__(message)
        self.condition = condition


class ProviderMismatchError(StateStoreError, ValueError):
    """The checkpoint was written by a different state store provider."""


class StoreLockedError(StateStoreError, TimeoutError):
    """Another live process holds the lock on a store's local directory."""


class StoreClosedError(StateStoreError, RuntimeError):
    """A store was used after it committed, aborted or was closed."""


class QueryError(SparkstateError, RuntimeError):
    """A streaming query failed, or cannot start as configured."""


class CheckpointInUseError(QueryError):
    """Another running query already uses this checkpoint location."""


class StateHomeError(QueryError):
    """The state home running a task (the executor's process that holds its partitions' state)
    ended or could not start; Spark retries the task, and a new home restores the state."""


class UserFunctionError(QueryError):
    """A function of the user's raised (the ``applyInPandasWithState`` function, a
    ``StatefulProcessor`` method, a ``foreachBatch`` function). The message is its traceback,
    the user's frames only; the cause is the original exception where it could be brought
    back from the Python worker."""
