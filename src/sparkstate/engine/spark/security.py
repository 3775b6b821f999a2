"""What the state homes' TCP connections take from the session's security settings, and the
application's secret for a process that is neither a worker nor a home (the driver, a
notebook).

- ``spark.authenticate``: a home takes a TCP connection only from a process that proves it
  knows the application's secret (:mod:`sparkstate.runtime.home_channel`), where otherwise the
  token of its address, which the checkpoint records, is enough.
- ``spark.network.crypto.enabled`` or ``spark.ssl.enabled``, with ``spark.authenticate``: the
  frames are encrypted too. Without ``spark.authenticate`` there is no secret to derive a key
  from (Spark also requires it for its network encryption): the homes' traffic stays in the
  clear, and the query's start says so in the log.

On the driver of a classic session the secret is Spark's own (its ``SecurityManager``'s, which
also reads ``spark.authenticate.secret.file``), else ``spark.authenticate.secret``. A query's
start installs it for this process, and with a local master leaves it for this machine's Python
workers, which have no other way to learn it (:func:`sparkstate.runtime.home_secret.
share_secret`); it is never written into Spark's properties, the event log or the checkpoint.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime import home_client, home_secret
from sparkstate.runtime.home_channel import NO_CREDENTIALS, Credentials
from sparkstate.runtime.process_ref import ProcessRef
from sparkstate.store.conf import StoreConf

__all__ = ["AUTHENTICATE", "credentials_for", "home_security", "prepare_homes"]

log = logging.getLogger("sparkstate.engine")

AUTHENTICATE = "spark.authenticate"
SECRET = "spark.authenticate.secret"
CRYPTO = "spark.network.crypto.enabled"
SSL = "spark.ssl.enabled"
#: A master whose Python workers are children of the driver's JVM.
_LOCAL = re.compile(r"local(\[.*\])?")


def home_security(spark: Any) -> tuple[bool, bool]:
    """Whether the homes authenticate (``spark.authenticate``) and encrypt (Spark's network
    encryption, which needs authentication) their TCP connections."""
    auth = _flag(spark, AUTHENTICATE)
    crypto = _flag(spark, CRYPTO) or _flag(spark, SSL)
    if crypto and not auth:
        log.warning(
            "%s or %s is on but %s is off: the state homes' TCP connections are not "
            "encrypted (their key comes from the application's secret)",
            CRYPTO,
            SSL,
            AUTHENTICATE,
        )
    return auth, auth and crypto


def credentials_for(spark: Any, secret: str | bytes | None = None) -> Credentials:
    """What a process with ``spark``, the session, shows the state homes of its queries over
    TCP: the application's secret (``secret``, else the session's) when ``spark.authenticate``
    is on, and whether to encrypt. A :class:`~sparkstate.exceptions.ConfigurationError` if auth
    is on and the secret cannot be read (a Spark Connect client: pass ``secret``)."""
    auth, encrypt = home_security(spark)
    if not auth:
        return NO_CREDENTIALS
    found = secret if secret is not None else _secret_of(spark)
    if not found:
        msg = (
            f"{AUTHENTICATE} is on, and the application's secret cannot be read from this "
            f"session (neither Spark's security manager nor {SECRET}); the state homes take "
            "no connection without it"
        )
        raise ConfigurationError(msg)
    return Credentials(found.encode() if isinstance(found, str) else found, encrypt)


def with_home_security(spark: Any, conf: StoreConf) -> StoreConf:
    """``conf`` with the session's :func:`home_security`."""
    import dataclasses

    auth, encrypt = home_security(spark)
    return dataclasses.replace(conf, home_auth=auth, home_encrypt=encrypt)


def prepare_homes(spark: Any, conf: StoreConf) -> None:
    """At a query's start, on the driver of a classic session: the secret installed for this
    process (which reaches the homes from the driver), and, with a local master, left for this
    machine's workers and the homes they start."""
    if not (conf.state_home and conf.home_auth):
        return
    credentials = credentials_for(spark)
    home_secret.install_secret(credentials.secret)
    if not _LOCAL.fullmatch(_get(spark, "spark.master") or ""):
        return  # a cluster's executors have the secret in their environment
    jvm = ProcessRef.of(int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()))
    if jvm is None:
        msg = "the driver's JVM is not a process of this machine: its workers get no secret"
        raise ConfigurationError(msg)
    assert credentials.secret is not None
    home_secret.share_secret(home_client.private_home_dir(), jvm, credentials.secret)


def _secret_of(spark: Any) -> str | None:
    context = getattr(spark, "_sc", None)
    if context is not None:
        try:
            key = context._jsc.sc().env().securityManager().getSecretKey()
        except Exception:  # noqa: BLE001 - an older Spark, a stopped context: the setting
            key = None
        if key:
            return str(key)
    return _get(spark, SECRET)


def _flag(spark: Any, name: str) -> bool:
    return str(_get(spark, name) or "false").strip().lower() == "true"


def _get(spark: Any, name: str) -> str | None:
    """The application's setting ``name``: a classic session's ``SparkConf`` (where Spark's
    own security settings are), else the session's settings (Spark Connect)."""
    context = getattr(spark, "_sc", None)
    if context is not None:
        value = context.getConf().get(name, None)
        if value is not None:
            return str(value)
    try:
        value = spark.conf.get(name, None)
    except Exception:  # noqa: BLE001 - a setting Spark Connect does not show
        return None
    return None if value is None else str(value)
