"""Run the stateful test job on the PySpark of the interpreter that runs this file (the older
Spark of the engine-upgrade test: ``.venv-spark-old``, exactly from ``src`` on PYTHONPATH),
up to ``JOB_ROWS`` rows (availableNow), then take a savepoint.

Usage: ``python old_spark_savepoint.py CHECKPOINT TARGET``; prints the savepoint's path.
The job's switches come from the environment (``JOB_*``, see stateful_job.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from savepoint_jobs import StatefulJob


def main(checkpoint: str, target: str) -> None:
    """Process the input, take the savepoint, print where it is."""
    from exactly.spark.session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session(app_name="exactly-old-spark")
    try:
        job = StatefulJob(spark, Path(checkpoint))
        rows = int(os.environ["JOB_ROWS"])
        job.run(rows)
        print(job.savepoint(Path(target), rows))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
