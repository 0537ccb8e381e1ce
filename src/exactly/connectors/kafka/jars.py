"""The Kafka jars: Spark's Kafka connector for a session (Maven coordinates, or an offline
directory) and the broker's jars for the test kit.

Spark's Kafka connector (``format("kafka")``, :func:`exactly.connectors.kafka.source.read_kafka`)
is not in PySpark. :func:`connector_conf` asks Spark for it the Spark way: the exact Maven
coordinates for the installed PySpark (:data:`CONNECTOR_PACKAGES`) in ``spark.jars.packages``,
resolved from Maven Central and cached by Spark when the driver starts
(:mod:`exactly.maven`). For a cluster without Maven Central, ``EXACTLY_KAFKA_CONNECTOR_JARS``
names a directory holding the jars instead (``spark.jars``, nothing resolved): fill it once
with ``exactly packages --kafka --download DIR`` on a machine with network, or copy the
``jars`` directory of a warm Ivy cache.

The broker's jars (tests, demo, benchmark only) are in the directory ``EXACTLY_KAFKA_JARS``
names, else ``<cache>/exactly/kafka/broker`` in the per-user cache (``$XDG_CACHE_HOME`` or
``~/.cache``) that ``scripts/install-kafka.sh`` fills.
"""

from __future__ import annotations

import os
from pathlib import Path

from exactly.cache import configured_dir, missing_jars, user_cache
from exactly.errors import ConfigError
from exactly.maven import JARS, Packages, for_pyspark, offline_dir, packages_conf

CONNECTOR_ENV = "EXACTLY_KAFKA_CONNECTOR_JARS"
BROKER_ENV = "EXACTLY_KAFKA_JARS"

#: Spark's Kafka connector per PySpark version. Spark 4.3.0's connector is not on Maven
#: Central; 4.2.0 is the newest there, and tests/kafka check it under PySpark 4.3.0. Left
#: out: its transitive dependencies whose jars PySpark 4.3.0 ships in pyspark/jars (checked
#: by tests/unit/test_maven_packages.py). Resolved: the connector, its token provider,
#: kafka-clients 3.9.2 and commons-pool2 2.13.1 (4 jars, 14 MB).
CONNECTOR_PACKAGES: dict[str, Packages] = {
    "4.3.0": Packages(
        coordinates=("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",),
        excludes=("org.apache.hadoop:hadoop-client-runtime",
                  "org.apache.hadoop:hadoop-client-api",
                  "org.scala-lang.modules:scala-parallel-collections_2.13",
                  "com.google.code.findbugs:jsr305",
                  "at.yawk.lz4:lz4-java",
                  "org.xerial.snappy:snappy-java",
                  "org.slf4j:slf4j-api")),
}
_WHAT = "Spark's Kafka connector (spark-sql-kafka-0-10 and the jars it needs)"


def connector_packages(version: str | None = None) -> Packages:
    """The connector's coordinates for the installed PySpark (or ``version``); raises
    ConfigError, naming ``EXACTLY_KAFKA_CONNECTOR_JARS``, for a version exactly does not
    know."""
    return for_pyspark(CONNECTOR_PACKAGES, _WHAT, CONNECTOR_ENV, version)


def connector_conf() -> dict[str, str]:
    """Spark settings that load the connector when the JVM starts: ``spark.jars`` from the
    directory ``EXACTLY_KAFKA_CONNECTOR_JARS`` names when it is set (offline), else
    ``spark.jars.packages`` (:func:`connector_packages`). Raises ConfigError naming the fix."""
    if os.environ.get(CONNECTOR_ENV):
        return {JARS: ",".join(connector_jars())}
    return packages_conf(connector_packages())


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/exactly/kafka`` (``~/.cache/exactly/kafka`` when that is unset or
    not absolute): where ``scripts/install-kafka.sh`` puts the broker's jars."""
    return user_cache("kafka")


def jars_dir(kind: str, env: str) -> Path:
    """The directory of the ``kind`` jars (``connector`` | ``broker``): ``$env`` if set,
    else the per-user cache. Not checked here."""
    return configured_dir(env, cache_dir() / kind)


def missing(what: str, directory: Path, env: str) -> ConfigError:
    """The error for broker jars that are not in ``directory``, naming both fixes."""
    return missing_jars(what, directory, env, "kafka", cache_dir())


def connector_jars() -> list[str]:
    """Paths of the connector's jars in the directory ``EXACTLY_KAFKA_CONNECTOR_JARS`` names
    (the offline override); raises ConfigError naming the fix when it is unset or holds no
    ``spark-sql-kafka`` jar."""
    directory = offline_dir(CONNECTOR_ENV, _WHAT, "*spark-sql-kafka*.jar", "kafka")
    return sorted(str(p) for p in directory.glob("*.jar"))
