"""The 2PC pipeline on a Spark standalone cluster: a master and two workers on 127.0.0.1,
started from the pip-installed PySpark (:class:`exactly.testing.spark_cluster.StandaloneCluster`);
one executor process is killed with SIGKILL in the middle of the run. Audit: every id once, no
prepared transaction.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import numpy as np
import pytest

from exactly.audit import audit_ids, pg_table_ids
from exactly.connectors.postgres.two_phase import prepared_count
from exactly.demos.postgres_job import DSN_ENV, command
from exactly.procs import _stat
from exactly.testing.spark_cluster import StandaloneCluster

pytestmark = [pytest.mark.chaos, pytest.mark.slow]  # slow: a Spark cluster


@pytest.fixture
def cluster(tmp_path):
    with StandaloneCluster(tmp_path / "spark") as c:
        yield c


def test_2pc_on_a_standalone_cluster_survives_an_executor_kill(pg, conn, tmp_path, cluster):
    table = f"ev_{uuid.uuid4().hex[:8]}"
    rows = 40_000
    env = {**os.environ, DSN_ENV: pg.dsn}
    proc = subprocess.Popen(
        command("--sink", "2pc", "--table", table, "--checkpoint", str(tmp_path / "ck"),
                "--rows", str(rows), "--rows-per-epoch", "4000", "--master", cluster.url),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"epoch": 1,' in line and killed is None:  # epoch 2 is starting: kill one
                deadline = time.monotonic() + 60
                while not cluster.executor_pids() and time.monotonic() < deadline:
                    time.sleep(0.1)
                victim = cluster.executor_pids()[0]
                assert _stat(victim) is not None
                os.kill(victim, signal.SIGKILL)
                killed = victim
        proc.wait(timeout=600)
        assert proc.returncode == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed is not None, "no executor was killed"
    report = audit_ids(pg_table_ids(conn, table), np.arange(rows))
    assert report.ok, report.to_json()
    assert prepared_count(conn) == 0
