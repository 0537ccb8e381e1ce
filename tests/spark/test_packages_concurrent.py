"""Drivers that start at once on a fresh machine share one Ivy cache: three sessions asking
for the Kafka connector and S3A through ``spark.jars.packages`` into one empty Ivy directory
all start. Spark's default Ivy settings do not lock the cache; without exactly's lock
strategy (measured: ``artifact-lock-nio`` removed) all three failed, each with ``impossible to
put metadata file in cache`` or ``download failed``."""

from __future__ import annotations

import subprocess
import sys

import pytest

SESSION = """
import sys
from exactly.spark.session import spark_session
spark = spark_session(master="local[1]", kafka=True, s3a=True,
                      conf={"spark.jars.ivy": sys.argv[1]})
jars = spark.sparkContext._jsc.sc().listJars()
print("jars", jars.size())
spark.stop()
"""


@pytest.mark.slow  # three cold resolutions from Maven Central side by side: 35-40 s
def test_three_drivers_resolving_packages_into_one_empty_ivy_cache_at_once_all_start(
        tmp_path):
    ivy = tmp_path / "ivy"
    starts = [subprocess.Popen([sys.executable, "-c", SESSION, str(ivy)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(3)]
    ended = [(p.wait(timeout=300), *p.communicate()) for p in starts]
    for code, out, err in ended:
        assert code == 0, err[-3000:]
        assert "jars" in out
    assert any(p.name.startswith("org.apache.spark_spark-sql-kafka")
               for p in (ivy / "jars").glob("*.jar"))
