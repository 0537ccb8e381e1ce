"""Spark's checkpoint on S3 (``s3a://``): the S3A jars and their settings for a session.

PySpark ships Hadoop's client without S3A. ``scripts/install-objectstore.sh`` fetches
``hadoop-aws`` at PySpark's Hadoop version with only the AWS SDK v2 modules S3A loads
(35 jars, 12 MB, instead of the 659 MB SDK bundle) into ``~/.cache/exactly/s3a/jars``
(``EXACTLY_S3A_JARS`` names another directory). :func:`s3a_conf` turns them and the usual
``AWS_*`` environment variables into Spark settings; ``spark_session(s3a=True)`` applies
them. On a cluster, every node needs the jars at the same path (or pass them with
``--jars``).

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

from exactly.cache import configured_dir, missing_jars, user_cache
from exactly.errors import ConfigError
from exactly.objectstore import S3_KEYS, checked_endpoint

JARS_ENV = "EXACTLY_S3A_JARS"
_HADOOP = "spark.hadoop.fs.s3a."


def jars_dir() -> Path:
    """The directory of the S3A jars; raises ConfigError naming both fixes if missing."""
    directory = configured_dir(JARS_ENV, user_cache("s3a") / "jars")
    if any(directory.glob("hadoop-aws-*.jar")):
        return directory
    raise missing_jars("Spark's S3A jars (hadoop-aws and the AWS SDK modules it needs)",
                       directory, JARS_ENV, "scripts/install-objectstore.sh",
                       user_cache("s3a") / "jars")


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
    classpath = f"{jars_dir()}/*"
    conf = {"spark.driver.extraClassPath": classpath,
            "spark.executor.extraClassPath": classpath}
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
    try:
        spark.sparkContext._jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem")
    except Exception:  # py4j wraps the ClassNotFoundException
        raise ConfigError(
            f"checkpoint {location}: this Spark session has no S3A file system; create it "
            "with exactly.spark.session.spark_session(s3a=True) (the jars come from "
            "scripts/install-objectstore.sh, the settings from the AWS_* environment "
            "variables)") from None
