"""Spark's Kafka connector the Spark way: ``spark_session(kafka=True)`` with an empty Ivy
directory resolves it from Maven Central (``spark.jars.packages``), even with a Maven
repository in the home directory that holds a pom without its jar, and a Kafka-to-Kafka job
(Spark's Kafka source -> exactly's Kafka sink) then moves every record exactly once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

JOB = Path(__file__).parents[1] / "install" / "kafka_to_kafka_job.py"
PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"

pytestmark = pytest.mark.server


def artifact(jar_name: str) -> str:
    """``kafka-clients`` for ``org.apache.kafka_kafka-clients-3.9.2.jar`` (Ivy's retrieve
    name) or ``kafka-clients-3.9.2.jar`` (PySpark's)."""
    group, _, rest = jar_name.partition("_")
    grouped = rest and "." in group and not re.search(r"-\d+\.\d", group)
    name = rest if grouped else jar_name  # Ivy's [organisation]_[artifact]-[revision]
    return re.sub(r"-\d+\.\d.*$", "", name)


def poisoned_home(home: Path) -> Path:
    """A home whose ~/.m2 holds kafka-clients' pom without its jar, as Maven leaves it after
    resolving a project that never needed the jar; Spark's default Ivy settings find the pom
    there and then fail the download."""
    pom_dir = home / ".m2/repository/org/apache/kafka/kafka-clients/3.9.2"
    pom_dir.mkdir(parents=True)
    (pom_dir / "kafka-clients-3.9.2.pom").write_text(
        "<project><modelVersion>4.0.0</modelVersion><groupId>org.apache.kafka</groupId>"
        "<artifactId>kafka-clients</artifactId><version>3.9.2</version></project>")
    return home


def test_kafka_true_resolves_the_connector_from_maven_central_into_an_empty_ivy_dir(
        broker, tmp_path):
    ivy = tmp_path / "ivy"
    home = poisoned_home(tmp_path / "home")
    env = {**os.environ, "JAVA_TOOL_OPTIONS": f"-Duser.home={home}"}
    done = subprocess.run([sys.executable, str(JOB), "--bootstrap", broker.bootstrap,
                           "--workdir", str(tmp_path / "job"), "--records", "40",
                           "--ivy", str(ivy)],
                          env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-4000:]  # the job died before its audit
    report = json.loads(lines[-1])
    # the audit: every input id once in the committed output, nothing else
    assert report["ok"], report
    assert report["found"] == 40 and report["epochs"] >= 2
    resolved = {artifact(p.name) for p in (ivy / "jars").glob("*.jar")}
    assert {"spark-sql-kafka-0-10_2.13", "kafka-clients"} <= resolved
    # and the executors get them too, not only the driver
    assert resolved <= {artifact(name) for name in report["jars"]}
    # nothing PySpark already ships was resolved a second time
    shipped = {artifact(p.name) for p in PYSPARK_JARS.glob("*.jar")}
    assert resolved & shipped == set()
