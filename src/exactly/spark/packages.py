"""What to give ``spark-submit`` or a notebook's session builder for Spark's Kafka connector
and S3A, the jars PySpark lacks (``exactly packages`` prints the same).

``spark_session(kafka=True, s3a=True)`` applies these settings itself. A session built some
other way takes them as they are::

    from pyspark.sql import SparkSession
    from exactly.spark.packages import packages_conf

    spark = (SparkSession.builder.config(map=packages_conf(kafka=True)).getOrCreate())

or on the command line (``exactly packages --kafka --submit`` prints it)::

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        --exclude-packages org.apache.hadoop:hadoop-client-runtime,... \\
        --conf spark.jars.ivySettings=~/.cache/exactly/ivy/ivysettings.xml job.py

The coordinates are exact for the installed PySpark (:data:`exactly.connectors.kafka.jars.
CONNECTOR_PACKAGES`, :data:`exactly.spark.s3a.S3A_PACKAGES`); Spark resolves them from Maven
Central and caches them (:mod:`exactly.maven`). ``EXACTLY_KAFKA_CONNECTOR_JARS`` /
``EXACTLY_S3A_JARS`` name directories of jars instead, for clusters without Maven Central;
:func:`download` fills such a directory.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from exactly import maven
from exactly.connectors.kafka.jars import connector_conf, connector_packages
from exactly.maven import EXCLUDES, PACKAGES, Packages, merged_conf
from exactly.spark import s3a as _s3a


def kafka_packages() -> list[str]:
    """Maven coordinates of Spark's Kafka connector for the installed PySpark (what
    ``spark-submit --packages`` takes). Raises ConfigError for an unknown PySpark."""
    return list(connector_packages().coordinates)


def s3a_packages() -> list[str]:
    """Maven coordinates of S3A (hadoop-aws and the AWS SDK modules it loads) for the
    installed PySpark. Raises ConfigError for an unknown PySpark."""
    return list(_s3a.s3a_packages().coordinates)


def packages(*, kafka: bool = False, s3a: bool = False) -> Packages:
    """The coordinates and exclusions for the parts asked for, together."""
    found = Packages(())
    if kafka:
        found = found + connector_packages()
    if s3a:
        found = found + _s3a.s3a_packages()
    return found


def packages_conf(*, kafka: bool = False, s3a: bool = False) -> dict[str, str]:
    """Spark settings that load the parts asked for when the JVM starts: ``spark.jars.
    packages``, ``spark.jars.excludes`` and ``spark.jars.ivySettings``, or the offline
    directories' jars when ``EXACTLY_KAFKA_CONNECTOR_JARS`` / ``EXACTLY_S3A_JARS`` are set.
    S3A's ``fs.s3a.*`` settings are not included (:func:`exactly.spark.s3a.s3a_conf`)."""
    conf: dict[str, str] = {}
    if kafka:
        conf = merged_conf(conf, connector_conf())
    if s3a:
        conf = merged_conf(conf, _s3a.jars_conf())
    return conf


def submit_args(*, kafka: bool = False, s3a: bool = False) -> list[str]:
    """``spark-submit`` arguments for :func:`packages_conf` (``--packages``,
    ``--exclude-packages``, ``--conf key=value`` for the rest)."""
    conf = packages_conf(kafka=kafka, s3a=s3a)
    args: list[str] = []
    if PACKAGES in conf:
        args += ["--packages", conf.pop(PACKAGES)]
    if EXCLUDES in conf:
        args += ["--exclude-packages", conf.pop(EXCLUDES)]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def download(directory: Path, *, kafka: bool = False, s3a: bool = False) -> list[Path]:
    """Resolve the parts asked for from Maven Central (a short-lived local Spark driver in a
    fresh Ivy directory) and copy their jars into ``directory``: the offline directory for
    ``EXACTLY_KAFKA_CONNECTOR_JARS`` / ``EXACTLY_S3A_JARS`` on a cluster without Maven
    Central. Returns the jars copied. Fails with Spark's error when resolution fails."""
    wanted = packages(kafka=kafka, s3a=s3a)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="exactly-ivy-") as ivy:
        from exactly.spark.session import spark_session

        conf = {**maven.packages_conf(wanted), "spark.jars.ivy": ivy}
        spark = spark_session(master="local[1]", app_name="exactly-packages", conf=conf)
        spark.stop()
        copied = []
        for jar in sorted((Path(ivy) / "jars").glob("*.jar")):
            target = directory / jar.name
            shutil.copyfile(jar, target)
            copied.append(target)
    return copied

