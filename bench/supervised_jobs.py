"""One ``exactly run`` job of a benchmark (bench/recovery.py, bench/upgrade.py): the job
file tests/ops/jobs/datagen_job.py (``exactly.datagen`` at a rate -> a pandas UDF -> the
``exactly.files`` sink, 1 s interval) with an input that never runs out, its runs (one, or
one per checkpoint: :class:`exactly.testing.supervised.SupervisedRun`, as the tests start
them), what job.json says, waits that fail as soon as the run ended, the audit of its
output by id, and the start and end every such benchmark shares."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import harness
import numpy as np

from exactly.audit import audit_ids, file_ids
from exactly.checkpoint.status import JobStatus
from exactly.testing.supervised import EXACTLY, SupervisedRun

JOBS = Path(__file__).resolve().parent.parent / "tests" / "ops" / "jobs"

__all__ = ["EXACTLY", "JOBS", "BenchJob", "audited", "bench_dir", "finish", "running"]


class BenchJob:
    """A job named ``name`` writing to ``<work>/<name>-out`` at ``rate`` rows/s; ``env``:
    more of the job file's settings. :meth:`start` starts a run on a checkpoint."""

    def __init__(self, name: str, work: Path, rate: int, **env: str) -> None:
        self.name, self.work = name, work
        self.out = work / f"{name}-out"
        # exactly's own log level as the user's (a test run's INFO would cost the job CPU)
        self.env = {"JOB_OUT": str(self.out), "JOB_ROWS": "1000000000",
                    "JOB_RATE": str(rate), "JOB_INTERVAL": "1s",
                    "EXACTLY_LOG_LEVEL": os.environ.get("EXACTLY_LOG_LEVEL", "WARNING"),
                    **env}
        self.runs: list[SupervisedRun] = []

    def start(self, job: Path, ck: Path, *flags: str, log: Path) -> None:
        """``exactly run job --checkpoint ck flags``, its output into ``log``."""
        self.runs.append(SupervisedRun(job, ck, self.env, *flags, log=log))

    @property
    def run(self) -> SupervisedRun:
        return self.runs[-1]

    @property
    def ck(self) -> Path:
        return Path(self.run.checkpoint)

    def committed(self) -> int:
        """The newest committed epoch + 1 (Spark keeps only the last 100 commit files, so
        this is not a count of them)."""
        epochs = self.run.committed_epochs()
        return max(epochs) + 1 if epochs else 0

    def status(self) -> JobStatus | None:
        return self.run.status()

    def history(self) -> list[dict[str, Any]]:
        """The restart history of the checkpoint, every run's entries."""
        return self.run.history()

    def spare_ready(self) -> bool:
        return self.run.spare_ready()

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
        """Until ``condition()``; AssertionError when the run ended or ``timeout`` passed."""
        self.run.wait_for(condition, f"{what} ({self.name})", timeout)

    def command(self, *args: str, timeout: float = 900) -> str:
        """``exactly args``' stdout; SystemExit with its output when it failed."""
        done = self.run.command(*args, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"{self.name}: exactly {' '.join(args)} failed "
                             f"({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def stop(self) -> None:
        self.run.command("stop", str(self.ck), timeout=600)
        self.run.proc.wait(timeout=300)

    def close(self) -> None:
        """Kill whatever is left of every run (nothing, after a stop)."""
        for run in self.runs:
            run.close()

    def audit(self) -> str | None:
        """Every id from 0 to the highest once (the generator's ids, in order); None when
        so, else what is wrong."""
        ids, _ = file_ids(self.out)
        report = audit_ids(ids, np.arange(int(ids.max()) + 1, dtype=np.int64))
        print(f"audit {self.name}: {len(ids):,} rows, ids 0..{int(ids.max()):,}: "
              f"{'exactly once' if report.ok else report.rows()}")
        return None if report.ok else f"{self.name}: {report.rows()}"


def bench_dir(given: Path | None, name: str) -> Path:
    """``given`` emptied, or a new temporary directory; the machine's line printed."""
    work = given or Path(tempfile.mkdtemp(prefix=f"exactly-bench-{name}-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(harness.machine(), flush=True)
    return work


@contextlib.contextmanager
def running(jobs: Iterable[BenchJob], warmup: int) -> Iterator[None]:
    """The benchmark's body, once every job committed ``warmup`` epochs: the jobs are
    stopped when it ends, and whatever is left of them is killed however it ended."""
    jobs = list(jobs)
    try:
        for job in jobs:
            job.wait_for(lambda j=job: j.committed() >= warmup, "the warm-up epochs")
        yield
        for job in jobs:
            job.stop()
    finally:
        for job in jobs:
            job.close()


def audited(jobs: Iterable[BenchJob]) -> list[str]:
    """Every job's output audited by id (:meth:`BenchJob.audit`), and the load printed;
    what is wrong."""
    errors = [e for e in (job.audit() for job in jobs) if e]
    print(f"load average (1, 5, 15 min): {os.getloadavg()}")
    return errors


def finish(work: Path, runs: list[harness.Run], errors: list[str]) -> int:
    """``runs`` into ``work/results.json``, ``errors`` printed; the exit code (1: an audit
    failed)."""
    (work / "results.json").write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    for error in errors:
        print(f"FAILED {error}")
    return 1 if errors else 0
