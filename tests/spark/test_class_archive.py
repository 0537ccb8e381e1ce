"""A driver started by spark_session loads Spark's classes from exactly's class archive (JDK
class-data sharing), seen in the JVM's own class-loading log; a driver with the archive
switched off loads them from the jars."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exactly.spark import class_archive

DRIVER = """
import sys
from exactly.spark.session import spark_session
spark = spark_session(conf={"spark.driver.extraJavaOptions":
                            "-Xlog:class+load=info:file=" + sys.argv[1]})
assert spark.range(10).count() == 10
"""


def _sources(log_file) -> dict[str, str]:
    """class name -> where the JVM loaded it from, for Spark's context and session."""
    wanted = ("org.apache.spark.SparkContext ", "org.apache.spark.sql.classic.SparkSession ")
    found = {}
    for line in log_file.read_text().splitlines():
        for name in wanted:
            if name in line:
                found[name.strip()] = line.split("source:", 1)[-1].strip()
    return found


# CI budget: the switch's "off" in the slow lane (the tests' drivers all start with it on)
@pytest.mark.parametrize("switch", ["on", pytest.param("off", marks=pytest.mark.slow)])
def test_the_driver_loads_sparks_classes_from_the_archive_unless_switched_off(tmp_path, switch):
    archive = class_archive.build()  # built by scripts/setup.sh; once here otherwise
    assert archive is not None and archive.is_file()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if switch == "off":
        env[class_archive.ENV] = "off"
    else:
        env.pop(class_archive.ENV, None)
    log_file = tmp_path / "classes.log"
    result = subprocess.run([sys.executable, "-c", DRIVER, str(log_file)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    sources = _sources(log_file)
    assert len(sources) == 2, sources
    for source in sources.values():
        if switch == "on":
            assert source.startswith("shared objects file"), sources
        else:
            assert source.endswith(".jar"), sources
    assert "cds" not in result.stderr.lower()  # the JDK's archive messages stay off
