"""One ``exactly run`` job of a benchmark (bench/recovery.py, bench/upgrade.py): the job
file tests/ops/jobs/datagen_job.py (``exactly.datagen`` at a rate -> a pandas UDF -> the
``exactly.files`` sink, 1 s interval) with an input that never runs out, its runs (one, or
one per checkpoint), what job.json says, waits that fail as soon as the run ended, and the
audit of its output by id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from exactly.audit import audit_ids, file_ids
from exactly.checkpoint.location import job_dir
from exactly.checkpoint.status import JobStatus
from exactly.procs import JOB_TOKEN_ENV, kill_job, new_job_token

JOBS = Path(__file__).resolve().parent.parent / "tests" / "ops" / "jobs"
EXACTLY = [sys.executable, "-m", "exactly.cli"]


class BenchJob:
    """A job named ``name`` writing to ``<work>/<name>-out`` at ``rate`` rows/s; ``env``:
    more of the job file's settings. :meth:`start` starts a run on a checkpoint."""

    def __init__(self, name: str, work: Path, rate: int, **env: str) -> None:
        self.name, self.work = name, work
        self.out = work / f"{name}-out"
        self.token = new_job_token()
        self.env = {**os.environ, "PYSPARK_PYTHON": sys.executable, JOB_TOKEN_ENV: self.token,
                    "JOB_OUT": str(self.out), "JOB_ROWS": "1000000000",
                    "JOB_RATE": str(rate), "JOB_INTERVAL": "1s", **env}
        self.procs: list[subprocess.Popen] = []
        self.ck = work / f"{name}-ck"

    def start(self, job: Path, ck: Path, *flags: str, log: Path) -> None:
        """``exactly run job --checkpoint ck flags``, its output into ``log``."""
        self.ck = ck
        with open(log, "ab") as out:
            self.procs.append(subprocess.Popen(
                [*EXACTLY, "run", str(job), "--checkpoint", str(ck), *flags], env=self.env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    @property
    def proc(self) -> subprocess.Popen:
        return self.procs[-1]

    def committed(self) -> int:
        """The newest committed epoch + 1 (Spark keeps only the last 100 commit files, so
        this is not a count of them)."""
        commits = self.ck / "commits"
        found = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] \
            if commits.is_dir() else []
        return max(found) + 1 if found else 0

    def status(self) -> JobStatus | None:
        return JobStatus.read(job_dir(self.ck))

    def spare_ready(self) -> bool:
        status = self.status()
        return bool(status and status.spare and status.spare.get("state") == "ready")

    def wait_for(self, condition, what: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name}: exactly run ended ({self.proc.returncode}) "
                                 f"waiting for {what}")
            time.sleep(0.1)
        raise SystemExit(f"{self.name}: timed out waiting for {what}")

    def stop(self) -> None:
        subprocess.run([*EXACTLY, "stop", str(self.ck)], env=self.env, capture_output=True,
                       timeout=600)
        self.proc.wait(timeout=300)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        kill_job(self.token, None, what=f"the benchmark job {self.name}")

    def audit(self) -> str | None:
        """Every id from 0 to the highest once (the generator's ids, in order); None when
        so, else what is wrong."""
        ids, _ = file_ids(self.out)
        report = audit_ids(ids, np.arange(int(ids.max()) + 1, dtype=np.int64))
        print(f"audit {self.name}: {len(ids):,} rows, ids 0..{int(ids.max()):,}: "
              f"{'exactly once' if report.ok else report.rows()}")
        return None if report.ok else f"{self.name}: {report.rows()}"
