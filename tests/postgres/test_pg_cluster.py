"""The 2PC pipeline on a Spark standalone cluster: a master and two workers on 127.0.0.1,
started from the pip-installed PySpark (``sbin/spark-daemon.sh``); one executor process is
killed with SIGKILL in the middle of the run. Audit: every id once, no prepared transaction.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pyspark
import pytest

from exactly.audit import audit_ids, pg_table_ids
from exactly.connectors.postgres.two_phase import prepared_count
from exactly.demos.postgres_job import DSN_ENV, command
from exactly.procs import _stat
from exactly.testing.pgcluster import free_port

pytestmark = [
    pytest.mark.chaos, pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("EXACTLY_SLOW") != "1",
                       reason="long variant (a Spark cluster): set EXACTLY_SLOW=1"),
]
SPARK_HOME = Path(pyspark.__file__).parent


class StandaloneCluster:
    """``spark-daemon.sh`` master + workers with their own log, pid and work directories."""

    def __init__(self, root: Path, workers: int = 2) -> None:
        self.root = root
        self.port = free_port()
        self.ident = f"exactly-{uuid.uuid4().hex[:8]}"
        self.workers = workers
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME),
                    "SPARK_LOG_DIR": str(root / "logs"), "SPARK_PID_DIR": str(root / "pids"),
                    "SPARK_IDENT_STRING": self.ident, "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_WORKER_DIR": str(root / "work"), "PYSPARK_PYTHON": sys.executable}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _daemon(self, action: str, cls: str, instance: int, *args: str) -> None:
        subprocess.run(["bash", str(SPARK_HOME / "sbin" / "spark-daemon.sh"), action, cls,
                        str(instance), *args], env=self.env, check=True, capture_output=True,
                       timeout=120)

    def start(self) -> None:
        self._daemon("start", "org.apache.spark.deploy.master.Master", 1, "--host",
                     "127.0.0.1", "--port", str(self.port), "--webui-port", str(free_port()))
        for i in range(1, self.workers + 1):
            self._daemon("start", "org.apache.spark.deploy.worker.Worker", i, "--host",
                         "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
                         str(free_port()), self.url)

    def stop(self) -> None:
        for i in range(1, self.workers + 1):
            self._daemon("stop", "org.apache.spark.deploy.worker.Worker", i)
        self._daemon("stop", "org.apache.spark.deploy.master.Master", 1)

    def executor_pids(self) -> list[int]:
        """Executor JVMs launched by this cluster's workers (their work dir is ours)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            try:
                cwd = str((entry / "cwd").resolve())
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmdline and cwd.startswith(str(self.root)):
                pids.append(int(entry.name))
        return pids


@pytest.fixture
def cluster(tmp_path):
    c = StandaloneCluster(tmp_path / "spark")
    c.start()
    yield c
    c.stop()


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
