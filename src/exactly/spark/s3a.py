"""Spark's checkpoint on S3 (``s3a://``): the S3A jars and their settings for a session.

PySpark ships Hadoop's client without S3A. :func:`s3a_conf` asks Spark for it the Spark way:
``hadoop-aws`` at PySpark's Hadoop version with only the AWS SDK v2 modules S3A loads (35
jars, 12 MB, instead of the 659 MB SDK bundle), as exact Maven coordinates for the installed
PySpark (:data:`S3A_PACKAGES`) in ``spark.jars.packages``, resolved from Maven Central and
cached by Spark when the driver starts (:mod:`exactly.maven`); plus the usual ``AWS_*``
environment variables as Spark settings. ``spark_session(s3a=True)`` applies them. For a
cluster without Maven Central, ``EXACTLY_S3A_JARS`` names a directory holding the jars
instead (put on the driver's and executors' class path, nothing resolved; every node needs
them at that path): fill it with ``exactly packages --s3a --download DIR``.

What a checkpoint on S3A relies on: Spark writes each checkpoint file to a temporary name
and renames it, which on S3 is a copy and a delete -- not atomic, but every file is written
once under a name of its own (``offsets/N``, ``commits/N``, state versions), and a reader
either finds the whole file or none, because S3 PUTs are atomic and listings strongly
consistent. An interrupted write leaves a ``.N.<uuid>.tmp`` object behind, which Spark
ignores.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from exactly.errors import ConfigError
from exactly.maven import Packages, for_pyspark, offline_dir, packages_conf
from exactly.objectstore import S3_KEYS, checked_endpoint

JARS_ENV = "EXACTLY_S3A_JARS"
_HADOOP = "spark.hadoop.fs.s3a."
_WHAT = "Spark's S3A jars (hadoop-aws and the AWS SDK modules it needs)"

#: S3A per PySpark version: hadoop-aws at the version of PySpark's hadoop-client, without
#: the AWS SDK bundle (659 MB); instead the SDK modules S3A loads, at the SDK version
#: hadoop-aws declares: s3, s3-transfer-manager (ObjectTransfer; netty-nio-client comes with
#: it, for RocksDB state uploads) and, from hadoop-aws, analyticsaccelerator-s3. Left out:
#: what pyspark/jars already has (netty, httpclient/httpcore, commons-codec, slf4j-api, ...;
#: checked by tests/unit/test_maven_packages.py). Resolved: 35 jars, 12 MB.
S3A_PACKAGES: dict[str, Packages] = {
    "4.3.0": Packages(
        coordinates=("org.apache.hadoop:hadoop-aws:3.5.0",
                     "software.amazon.awssdk:s3:2.35.4",
                     "software.amazon.awssdk:s3-transfer-manager:2.35.4"),
        excludes=("software.amazon.awssdk:bundle",
                  "org.wildfly.openssl:wildfly-openssl",
                  "io.netty:*",
                  "org.apache.httpcomponents:httpclient",
                  "org.apache.httpcomponents:httpcore",
                  "commons-codec:commons-codec",
                  "commons-logging:commons-logging",
                  "org.slf4j:slf4j-api")),
}


def s3a_packages(version: str | None = None) -> Packages:
    """S3A's coordinates for the installed PySpark (or ``version``); raises ConfigError,
    naming ``EXACTLY_S3A_JARS``, for a version exactly does not know."""
    return for_pyspark(S3A_PACKAGES, _WHAT, JARS_ENV, version)


def jars_dir() -> Path:
    """The directory ``EXACTLY_S3A_JARS`` names (the offline override); raises ConfigError
    naming the fix when it is unset or holds no ``hadoop-aws`` jar."""
    return offline_dir(JARS_ENV, _WHAT, "*hadoop-aws-*.jar", "s3a")


def jars_conf() -> dict[str, str]:
    """Spark settings that load S3A when the JVM starts: the directory ``EXACTLY_S3A_JARS``
    names on the driver's and executors' class path when it is set (offline), else
    ``spark.jars.packages`` (:func:`s3a_packages`)."""
    if os.environ.get(JARS_ENV):
        classpath = f"{jars_dir()}/*"
        return {"spark.driver.extraClassPath": classpath,
                "spark.executor.extraClassPath": classpath}
    return packages_conf(s3a_packages())


def s3a_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings for ``s3a://`` paths: the jars on the driver's and executors' class
    path, and ``fs.s3a.*`` from ``AWS_ENDPOINT_URL`` (path-style access, TLS off for an
    ``http://`` endpoint, which needs ``AWS_ALLOW_HTTP=true``), ``AWS_REGION`` and
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``. Without keys S3A
    uses its default credential chain.

    The same ``AWS_*`` variables go to the executors' environment (``spark.executorEnv.*``),
    where exactly's sinks write to S3 from Python (staged files, Delta data files and
    markers); Spark's UI redacts the secret key and token. Raises ConfigError naming the
    fix."""
    env = os.environ if env is None else env
    conf = jars_conf()
    for key in S3_KEYS:
        if env.get(key):
            conf[f"spark.executorEnv.{key}"] = env[key]
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = checked_endpoint(endpoint, env.get("AWS_ALLOW_HTTP"))
        conf[_HADOOP + "endpoint"] = endpoint
        conf[_HADOOP + "path.style.access"] = "true"
        conf[_HADOOP + "connection.ssl.enabled"] = str(parsed.scheme == "https").lower()
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf[_HADOOP + "endpoint.region"] = region
    if env.get("AWS_ACCESS_KEY_ID"):
        conf[_HADOOP + "access.key"] = env["AWS_ACCESS_KEY_ID"]
        conf[_HADOOP + "secret.key"] = env.get("AWS_SECRET_ACCESS_KEY", "")
        if env.get("AWS_SESSION_TOKEN"):
            conf[_HADOOP + "session.token"] = env["AWS_SESSION_TOKEN"]
            provider = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            provider = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        conf[_HADOOP + "aws.credentials.provider"] = provider
    return conf


def require_s3a(spark, location: str) -> None:
    """Fail in one line when ``location`` is on ``s3a://`` and the session cannot open it."""
    if not location.startswith("s3a://"):
        return
    if not has_class(spark, "org.apache.hadoop.fs.s3a.S3AFileSystem"):
        raise ConfigError(
            f"checkpoint {location}: this Spark session has no S3A file system; create it "
            "with exactly.spark.session.spark_session(s3a=True) (Spark resolves the jars "
            "from Maven Central, or takes them from EXACTLY_S3A_JARS; the settings come "
            "from the AWS_* environment variables), or pass the settings of "
            "`exactly packages --s3a` to spark-submit")


def has_class(spark, name: str) -> bool:
    """True when the driver loads class ``name`` the way Spark loads a data source or file
    system: from its class path and from the jars added at start (``spark.jars``,
    ``spark.jars.packages``), which the JVM's system class loader does not see."""
    try:
        spark.sparkContext._jvm.org.apache.spark.util.Utils.classForName(name, True, False)
    except Exception:  # py4j wraps the ClassNotFoundException
        return False
    return True
