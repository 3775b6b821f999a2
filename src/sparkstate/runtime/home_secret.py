"""Where a process finds the application's secret when ``spark.authenticate`` is on, to show a
state home over TCP (:mod:`.home_channel`).

- A process that read it from its Spark session (the driver, a notebook: ``credentials_for``
  in :mod:`sparkstate.engine.spark.security`) installs it (:func:`install_secret`).
- On a cluster (standalone, YARN, Kubernetes) Spark puts it into each executor's environment as
  ``_SPARK_AUTH_SECRET``; the Python workers the executor starts, and the homes they start,
  inherit that environment.
- With a local master the workers are children of the driver's JVM, which has no such
  variable: the driver writes the secret for them into the homes' directory (mode 0700), in a
  file of mode 0600 named by that JVM's pid and start time (:func:`share_secret`), which only
  this user can read and which ends with the JVM (the next driver to share one removes those
  of JVMs that ended).

The secret never goes into anything Spark may log or keep (job or local properties, the event
log), nor into a job, a task's report or the checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import stat

from sparkstate.exceptions import ConfigurationError
from sparkstate.files.private import FILE_MODE, private_dir, write_private
from sparkstate.runtime.home_channel import NO_CREDENTIALS, Credentials
from sparkstate.runtime.process_ref import ProcessRef

__all__ = [
    "SECRET_ENV",
    "credentials",
    "install_secret",
    "secret_file",
    "share_secret",
]

#: Where Spark gives an executor the application's secret.
SECRET_ENV = "_SPARK_AUTH_SECRET"
_SUFFIX = ".secret"
_installed: bytes | None = None


def install_secret(secret: str | bytes | None) -> None:
    """The secret this process shows homes from now on, before any other (None: forget it)."""
    global _installed
    _installed = secret.encode() if isinstance(secret, str) else secret


def secret_file(directory: str, executor: ProcessRef) -> str:
    """The file of the homes' ``directory`` in which the driver leaves the secret for the
    workers of the JVM ``executor`` (a local master's)."""
    return os.path.join(directory, f"{executor.pid}-{executor.start}{_SUFFIX}")


def share_secret(directory: str, executor: ProcessRef, secret: str | bytes) -> str:
    """Leave ``secret`` for the workers of ``executor`` (this machine's JVM, a local master's
    driver), readable by this user only; removes those left for JVMs that ended. Returns the
    file."""
    private_dir(directory)
    for name in os.listdir(directory):
        if not name.endswith(_SUFFIX):
            continue
        with contextlib.suppress(ValueError, OSError):
            ref = ProcessRef.parse(name.removesuffix(_SUFFIX).replace("-", ":", 1))
            if not ref.alive():
                os.unlink(os.path.join(directory, name))
    text = secret.decode() if isinstance(secret, bytes) else secret
    path = secret_file(directory, executor)
    write_private(path, text)
    return path


def credentials(
    auth: bool, encrypt: bool, directory: str, executor: ProcessRef | None
) -> Credentials:
    """What this process (a worker, a home, the driver) shows a home: no secret when ``auth``
    (``spark.authenticate``) is off; else the secret installed, in ``_SPARK_AUTH_SECRET`` or
    left for ``executor``'s workers in ``directory``, in that order. A
    :class:`~sparkstate.exceptions.ConfigurationError` that names the setting if there is none."""
    if not auth:
        return NO_CREDENTIALS
    secret = _installed or os.environ.get(SECRET_ENV, "").encode() or None
    where = "installed by the driver, in " + SECRET_ENV
    if secret is None and executor is not None:
        path = secret_file(directory, executor)
        secret = _read_secret(path)
        where += f" or in {path}"
    if not secret:
        msg = (
            "spark.authenticate is on, so a state home takes only connections that prove the "
            f"application's secret, and this process found none ({where}). On a cluster Spark "
            f"gives executors the secret in {SECRET_ENV}; with a local master the driver writes "
            "it for its workers when a query starts (a classic session's driver: a Spark "
            "Connect client cannot read it)"
        )
        raise ConfigurationError(msg)
    return Credentials(secret, encrypt)


def _read_secret(path: str) -> bytes | None:
    """The secret in ``path`` if this user wrote it for this user alone; None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & ~FILE_MODE:
            msg = (
                f"{path} holds the application's secret but is not this user's alone "
                f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); it is not used"
            )
            raise ConfigurationError(msg)
        return f.read().strip() or None
