"""Spark Connect sessions: telling them apart, opening one, and refusing what they cannot do.

A Spark Connect client (``SparkSession.builder.remote("sc://host:15002")``, or any session
while ``SPARK_REMOTE`` is set) talks gRPC to a server that owns the driver JVM. exactly's
sources and sinks run there as on a classic session: the sinks' tasks in the server's
executors' Python workers, their commit in the Python process the server starts beside
itself for ``foreachBatch``. What needs the driver JVM in this process (Py4J) is done without
it on Connect, or refused before anything starts with :func:`refuse`, which names why and
what to do instead.

The client retries a call the server cannot take (a restarting server) for
:data:`RETRY_SECONDS`, then raises: a supervised job (``exactly run --remote``) then
restarts its driver process, which reconnects and resumes from the checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from exactly.errors import ConfigError

#: the environment variable PySpark itself reads: every session is a Connect session
REMOTE_ENV = "SPARK_REMOTE"
#: seconds the client keeps retrying a call the server does not answer (a restart)
RETRY_SECONDS = 30.0


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (or a DataFrame / query of one)."""
    module = type(spark).__module__
    return module.startswith("pyspark.sql.connect")


def remote_url(remote: str | None = None) -> str | None:
    """The Connect URL to use: ``remote`` when given, else ``SPARK_REMOTE``, else None (a
    classic session). Raises ConfigError for a URL that is not ``sc://``."""
    url = remote or os.environ.get(REMOTE_ENV) or None
    if url is not None and not url.startswith("sc://"):
        raise ConfigError(f"Spark Connect URL {url!r} does not start with sc:// (e.g. "
                          "sc://127.0.0.1:15002); fix --remote or SPARK_REMOTE")
    return url


def refuse(what: str, why: str, instead: str) -> ConfigError:
    """The error for something a Connect session cannot do: ``what`` does not work on a
    Spark Connect session because ``why``; ``instead`` names the way out."""
    return ConfigError(f"{what} does not work on a Spark Connect session: {why}. {instead}")


def retry_policy(seconds: float = RETRY_SECONDS) -> Any:
    """PySpark's default retry policy bounded to about ``seconds`` of waiting (its own
    default waits at least 10 minutes for a server that went away)."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    initial, multiplier, cap = 200, 2.0, 5000
    waited, backoff, retries = 0.0, float(initial), 0
    while waited < seconds * 1000:
        waited += min(backoff, cap)
        backoff *= multiplier
        retries += 1
    return DefaultPolicy(max_retries=retries, initial_backoff=initial,
                         backoff_multiplier=multiplier, max_backoff=cap)


def connect_session(url: str, app_name: str, sql_conf: Mapping[str, str],
                    conf: Mapping[str, str]) -> Any:
    """A Connect session to ``url`` with ``sql_conf`` (exactly's defaults: applied where the
    server lets a session change them) and ``conf`` (the caller's: a setting the server fixed
    at its start to another value is refused with ConfigError, naming it)."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).appName(app_name).getOrCreate()
    spark.client.set_retry_policies([retry_policy()])
    for key, value in sql_conf.items():
        if key not in conf and spark.conf.isModifiable(key):
            spark.conf.set(key, value)
    for key, value in conf.items():
        _set(spark, key, value)
    return spark


def _set(spark: Any, key: str, value: str) -> None:
    """Set ``key`` for the session; a setting Spark does not know (exactly's own) is taken
    per session too. Refused when the server fixed it at its start to another value."""
    from pyspark.errors import PySparkException

    try:
        spark.conf.set(key, value)
        return
    except PySparkException:
        current = spark.conf.get(key, None)
    if current != value:
        raise refuse(f"setting {key}={value}",
                     f"the server fixed it when it started (it is {current!r} there)",
                     f"Start the Spark Connect server with --conf {key}={value}, or drop "
                     "the setting from the job")


def streaming_sources(df: Any) -> list[tuple[str, dict[str, str]]]:
    """``(format, options)`` of every streaming source a Connect DataFrame reads, from the
    plan the client sends (a Connect client has no analyzed plan of its own)."""
    from google.protobuf.message import Message  # type: ignore[import-untyped]

    found: list[tuple[str, dict[str, str]]] = []

    def walk(message: Message) -> None:
        if message.DESCRIPTOR.name == "Read" and getattr(message, "is_streaming", False) \
                and message.HasField("data_source"):
            source = message.data_source
            found.append((source.format, dict(source.options)))
        for _, value in message.ListFields():
            if isinstance(value, Message):
                walk(value)
            elif isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
                for item in value:  # repeated fields (maps hold no relations)
                    if isinstance(item, Message):
                        walk(item)

    walk(df._plan.to_proto(df.sparkSession.client))
    return found
