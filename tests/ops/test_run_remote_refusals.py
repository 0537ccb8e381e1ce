"""``exactly run --remote`` (or ``SPARK_REMOTE``) refuses, before anything starts, what a
Spark Connect client cannot have: the error names why and what to do instead, and no
checkpoint is written (no server is needed: nothing is contacted)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from supervised import EXACTLY, JOBS

URL = "sc://127.0.0.1:9"  # nothing listens: a refusal must come before any connection


def run(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return subprocess.run([*EXACTLY, "run", str(JOBS / "datagen_job.py"), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**full_env, "PYSPARK_PYTHON": sys.executable, **(env or {})})


@pytest.mark.parametrize(("args", "refused"), [
    (["--master", "local[1]"], "--master local[1] does not work on a Spark Connect session"),
    (["--spark-ui"], "--spark-ui does not work on a Spark Connect session"),
    (["--ha"], "--ha does not work on a Spark Connect session"),
])
def test_what_a_connect_client_cannot_have_is_refused_before_anything_starts(
        tmp_path, args, refused):
    checkpoint = ["--checkpoint", str(tmp_path / "ck")]
    for how, env in ((["--remote", URL], None), ([], {"SPARK_REMOTE": URL})):
        done = run(tmp_path, *how, *checkpoint, *args, env=env)
        assert done.returncode != 0
        last = done.stderr.strip().splitlines()[-1]
        assert refused in last and "Drop" in last, done.stderr
        assert not (tmp_path / "ck").exists()


def test_a_remote_url_that_is_not_spark_connect_is_refused(tmp_path):
    done = run(tmp_path, "--remote", "http://127.0.0.1:15002", "--checkpoint",
               str(tmp_path / "ck"))
    assert done.returncode != 0
    assert "does not start with sc://" in done.stderr.strip().splitlines()[-1], done.stderr
    assert not (tmp_path / "ck").exists()


@pytest.mark.server
def test_a_checkpoint_on_object_storage_is_refused_on_connect(tmp_path, s3_bucket):
    from exactly.checkpoint.location import job_store

    checkpoint = f"s3://{s3_bucket}/ck"
    done = run(tmp_path, "--remote", URL, "--checkpoint", checkpoint)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "/ck does not work on a Spark Connect session" in last and "S3A" in last, last
    assert job_store(checkpoint).read("job.json") is None  # nothing was claimed
