"""How Spark's Python workers of an exactly session reach their JVM. Real Spark, local[2]."""

from __future__ import annotations

import pyarrow as pa


def test_a_python_task_of_spark_session_talks_to_its_jvm_over_a_unix_domain_socket(spark):
    """spark_session turns on Spark's Unix domain sockets for Python workers (loopback TCP
    stalled every Python task ~40 ms here): a task's worker was started in that mode."""
    assert spark.sparkContext.getConf().get("spark.python.unix.domain.socket.enabled") == "true"

    def mode(batches):
        import os

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(
            {"uds": [os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "unset")]})

    seen = spark.range(0, 10, 1, 2).mapInArrow(mode, "uds string").collect()
    assert [r["uds"].lower() for r in seen] == ["true", "true"]
