"""Run ``exactly run`` as a user would, in a subprocess, and look at what it leaves behind
(the end-to-end tests of tests/ops and tests/savepoints)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.spark_files import batch_numbers
from exactly.checkpoint.status import JobStatus
from exactly.procs import JOB_TOKEN_ENV, kill_job, new_job_token

EXACTLY = [sys.executable, "-m", "exactly.cli"]


class SupervisedRun:
    """One ``exactly run JOB --checkpoint CK`` in the background (``job``: a job file);
    ``name_checkpoint=False`` leaves ``--checkpoint`` out (the job names ``checkpoint``);
    ``wrap`` goes before the command (``unshare --pid --fork ...``: a container's PID 1)."""

    def __init__(self, job: str | Path, checkpoint: Path | str, env: dict[str, str], *args: str,
                 log: Path, name_checkpoint: bool = True, wrap: Sequence[str] = ()) -> None:
        self.checkpoint = checkpoint
        self.token = new_job_token()
        self.log = log
        full_env = {**os.environ, "PYSPARK_PYTHON": sys.executable, JOB_TOKEN_ENV: self.token,
                    "EXACTLY_LOG_LEVEL": "INFO", **env}
        self._log_file = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*wrap, *EXACTLY, "run", str(job),
             *(["--checkpoint", str(checkpoint)] if name_checkpoint else []), *args],
            env=full_env, stdout=self._log_file, stderr=subprocess.STDOUT,
            start_new_session=True)

    # -- looking ------------------------------------------------------------------------
    def status(self) -> JobStatus | None:
        return JobStatus.read(job_store(self.checkpoint))

    def spare_ready(self) -> bool:
        """Whether job.json shows a warm spare driver, ready to take over."""
        status = self.status()
        return bool(status and status.spare and status.spare.get("state") == "ready")

    def history(self) -> list[dict[str, Any]]:
        """The restart log, every run's entries (a local checkpoint or one on S3)."""
        return RestartHistory(job_store(self.checkpoint), "").entries(this_run_only=False)

    def committed_epochs(self) -> list[int]:
        return batch_numbers(str(self.checkpoint), "commits")

    def pause_gaps(self) -> list[float]:
        """Per pair of consecutive committed epochs: seconds from ``commits/N`` (epoch N
        complete) to ``offsets/N+1`` (epoch N+1's input fixed, when it started)."""
        assert isinstance(self.checkpoint, Path), "a local checkpoint"
        epochs = self.committed_epochs()
        return [(self.checkpoint / "offsets" / str(n + 1)).stat().st_mtime
                - (self.checkpoint / "commits" / str(n)).stat().st_mtime
                for n in epochs[:-1] if (self.checkpoint / "offsets" / str(n + 1)).exists()]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exactly run ended ({self.proc.returncode}) while "
                                     f"waiting for {what}:\n{self.output()[-3000:]}")
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output()[-3000:]}")

    # -- acting -------------------------------------------------------------------------
    def command(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([*EXACTLY, *args], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYSPARK_PYTHON": sys.executable})

    def kill_driver_tree(self) -> int:
        """SIGKILL the driver process and everything under it; returns its pid."""
        status = self.status()
        assert status is not None and status.driver is not None
        driver = psutil.Process(status.driver.pid)
        kill_job(None, driver, what="the driver")  # raises if anything survives
        return status.driver.pid

    def signal(self, signum: int = signal.SIGINT) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Kill whatever is left (nothing, after a clean end) and check nothing survives."""
        root = psutil.Process(self.proc.pid) if self.proc.poll() is None else None
        kill_job(self.token, root, what="exactly run")
        self.proc.wait(timeout=30)
        self._log_file.close()
