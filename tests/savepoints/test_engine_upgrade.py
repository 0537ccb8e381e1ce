"""Engine upgrade through a savepoint: the transformWithStateInPandas test job runs on an
older PySpark 4.x (``.venv-spark-old``, made by ``scripts/setup.sh tests``) in a subprocess
and takes a savepoint; this venv's Spark restores it and goes on with more input. Every id
is written once and each key's running totals carry across the version change (audited
against a batch computation of all input). Real Spark, real files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from savepoint_jobs import KEYS, StatefulJob, expected_totals

from exactly.audit import audit_ids, data_files, file_ids
from exactly.savepoints.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
OLD_PYTHON = ROOT / ".venv-spark-old" / "bin" / "python"
SCRIPT = Path(__file__).parent / "jobs" / "old_spark_savepoint.py"
STEP = 1000
ENV = {"JOB_KIND": "tws", "JOB_BACKEND": "rocksdb"}

pytestmark = pytest.mark.skipif(
    not OLD_PYTHON.is_file() and not os.environ.get("EXACTLY_TEST_KIT"),
    reason=f"no older PySpark at {OLD_PYTHON}: run scripts/setup.sh tests (scripts/test does)")


def old_savepoint(checkpoint: Path, target: Path, out: Path) -> Path:
    """Run the job on the older Spark up to STEP rows and take a savepoint; its path."""
    env = {**os.environ, **ENV, "JOB_OUT": str(out), "JOB_ROWS": str(STEP),
           "JOB_KEYS": str(KEYS), "JOB_MAX_ROWS": "500", "PYTHONPATH": str(ROOT / "src"),
           "PYSPARK_PYTHON": str(OLD_PYTHON)}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run([str(OLD_PYTHON), str(SCRIPT), str(checkpoint), str(target)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.strip().splitlines()[-1])


def assert_exactly_once(out: Path, rows: int) -> None:
    """Every id 0..rows-1 once, and each key's last running totals equal the batch result."""
    found, _ = file_ids(out)
    report = audit_ids(found, np.arange(rows))
    assert report.ok, report.to_json()
    frame = pd.concat([pd.read_parquet(f) for f in data_files(out)], ignore_index=True)
    last = frame.sort_values("n").groupby("key").tail(1).set_index("key").sort_index()
    expected = expected_totals(rows)
    assert len(last) == KEYS
    assert last["n"].tolist() == expected["n"].tolist()
    assert np.allclose(last["total"].to_numpy(), expected["total"].to_numpy(), rtol=1e-9)


def test_a_savepoint_of_an_older_spark_restores_and_carries_the_state(spark, tmp_path):
    out = tmp_path / "out"
    path = old_savepoint(tmp_path / "ck-old", tmp_path / "savepoints", out)
    old = read_manifest(path).spark_version
    assert old != spark.version and old.split(".")[0] == spark.version.split(".")[0]
    job = StatefulJob(spark, tmp_path / "ck-new", **ENV, JOB_OUT=str(out))
    done = job.restore(path, 2 * STEP)
    assert f"Spark {old} -> {spark.version}" in str(done)
    job.run(2 * STEP)
    assert_exactly_once(out, 2 * STEP)
