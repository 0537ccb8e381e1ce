"""A SparkSession with exactly's data sources registered and sane local defaults."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from exactly.spark.formats import register


def spark_session(master: str = "local[2]", app_name: str = "exactly",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """Get or create a session bound to 127.0.0.1, with exactly's sources registered.

    Python workers run the interpreter of this process (``PYSPARK_PYTHON``), so they see
    the same installed packages, exactly included.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("EXACTLY_SPARK_LOG_LEVEL", "ERROR"))
    register(spark)
    return spark
