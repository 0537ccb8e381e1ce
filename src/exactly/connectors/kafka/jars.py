"""Where the Kafka jars are: Spark's Kafka connector (``spark.jars``) and the broker's.

For each kind the rule is the same, and never depends on where exactly is installed from:

1. the directory named by its environment variable, when set:
   ``EXACTLY_KAFKA_CONNECTOR_JARS`` (connector) or ``EXACTLY_KAFKA_JARS`` (broker);
2. else ``<cache>/exactly/kafka/<kind>`` in the per-user cache, ``$XDG_CACHE_HOME`` or
   ``~/.cache`` -- the directories ``scripts/install-kafka.sh`` (run by
   ``scripts/setup.sh``) fills from Maven Central.

A missing jar is a :class:`~exactly.errors.ConfigError` naming the directory looked in and
both fixes.
"""

from __future__ import annotations

from pathlib import Path

from exactly.cache import configured_dir, missing_jars, user_cache
from exactly.errors import ConfigError

CONNECTOR_ENV = "EXACTLY_KAFKA_CONNECTOR_JARS"
BROKER_ENV = "EXACTLY_KAFKA_JARS"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/exactly/kafka`` (``~/.cache/exactly/kafka`` when that is unset or
    not absolute): where ``scripts/install-kafka.sh`` puts the jars."""
    return user_cache("kafka")


def jars_dir(kind: str, env: str) -> Path:
    """The directory of the ``kind`` jars (``connector`` | ``broker``): ``$env`` if set,
    else the per-user cache. Not checked here."""
    return configured_dir(env, cache_dir() / kind)


def missing(what: str, directory: Path, env: str) -> ConfigError:
    """The error for jars that are not in ``directory``, naming both fixes."""
    return missing_jars(what, directory, env, "scripts/install-kafka.sh", cache_dir())


def connector_jars() -> list[str]:
    """Paths of Spark's Kafka connector and the jars it needs (for ``spark.jars``)."""
    directory = jars_dir("connector", CONNECTOR_ENV)
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    if not any("spark-sql-kafka" in Path(j).name for j in jars):
        raise missing("Spark's Kafka connector jars (spark-sql-kafka-0-10 and its "
                      "dependencies)", directory, CONNECTOR_ENV)
    return jars
