"""Benchmark: recovery time of ``exactly run`` after a query failure vs a driver process death.

What is measured
----------------
One supervised job (``exactly run tests/ops/jobs/datagen_job.py``: ``exactly.datagen`` at
``--rate`` rows/s -> a pandas UDF -> the ``exactly.files`` sink, 1 s interval, restart
strategy fixed-delay with a 1 s delay for both kinds of restart) runs for the whole
benchmark. After a warm-up of
``--warmup`` epochs it suffers, ``--repeat`` times and in alternating order,

``query``    a Python exception in the UDF (the job's ``JOB_FAIL_FILE`` is created; the first
             task that sees it renames it away and raises): the query fails and the
             supervisor restarts it in the same driver process (same JVM);
``process``  SIGKILL of the driver's whole process tree (Python driver, JVM, PySpark worker
             daemons): the launcher starts a new driver process.

Recovery time is what the job records in ``<checkpoint>/exactly-job/restarts.jsonl``: from
the failure (the supervisor noticing the failed query, or the launcher seeing its driver
die) to the first epoch completed after it, including the strategy's 1 s wait (printed
beside it). Ratios ``process / query`` are taken per repetition pair. After the
job is stopped the output is audited: every id from 0 to the highest one exactly once.

Run from the repository root::

    .venv/bin/python bench/recovery.py [--repeat 3] [--rate 2000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from exactly.audit import audit_ids, file_ids
from exactly.checkpoint.location import job_dir
from exactly.checkpoint.status import JobStatus
from exactly.procs import JOB_TOKEN_ENV, kill_job, new_job_token

JOB = Path(__file__).resolve().parent.parent / "tests" / "ops" / "jobs" / "datagen_job.py"


def history(ck: Path) -> list[dict]:
    path = job_dir(ck) / "restarts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def committed(ck: Path) -> int:
    commits = ck / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.is_dir() else 0


def wait_for(condition, what: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise SystemExit(f"exactly run ended ({proc.returncode}) waiting for {what}")
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def inject(kind: str, ck: Path, fail_file: Path) -> None:
    if kind == "query":
        fail_file.write_text("fail once")
        return
    status = JobStatus.read(job_dir(ck))
    assert status is not None and status.driver is not None
    kill_job(None, psutil.Process(status.driver.pid), what="the driver")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2000, help="rows per second")
    parser.add_argument("--warmup", type=int, default=3, help="epochs before the first fault")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-recovery-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ck, out, fail_file = work / "ck", work / "out", work / "fail-now"
    token = new_job_token()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, JOB_TOKEN_ENV: token,
           "JOB_OUT": str(out), "JOB_ROWS": "1000000000", "JOB_RATE": str(args.rate),
           "JOB_FAIL_FILE": str(fail_file), "JOB_INTERVAL": "1s"}
    log = open(work / "run.log", "wb")  # noqa: SIM115 - closed below
    # the same constant strategy wait (1 s) before either kind of restart
    proc = subprocess.Popen([sys.executable, "-m", "exactly.cli", "run", str(JOB),
                             "--checkpoint", str(ck), "--restart-strategy", "fixed-delay",
                             "--restart-option", "attempts=1000",
                             "--restart-option", "delay=1s"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    results: list[dict] = []
    try:
        wait_for(lambda: committed(ck) >= args.warmup, "the warm-up epochs", proc)
        for rep in range(args.repeat):
            order = ("query", "process") if rep % 2 == 0 else ("process", "query")
            for kind in order:
                before = len([e for e in history(ck) if e["event"] == "recovered"])
                inject(kind, ck, fail_file)
                wait_for(lambda b=before: len([e for e in history(ck)
                                               if e["event"] == "recovered"]) > b,
                         f"recovery from a {kind} failure", proc)
                events = history(ck)
                failure = [e for e in events if e["event"] == "failure"][-1]
                recovered = [e for e in events if e["event"] == "recovered"][-1]
                results.append({"rep": rep, "kind": kind, "recovery_s": recovered["recovery_s"],
                                "wait_s": failure.get("delay"), "failure_kind": failure["kind"]})
                print(f"rep {rep} {kind:8} recovery {recovered['recovery_s']:6.2f} s "
                      f"(strategy wait {failure.get('delay') or 0:.2f} s)", flush=True)
                done = committed(ck)
                wait_for(lambda d=done: committed(ck) >= d + 2, "two more epochs", proc)
        subprocess.run([sys.executable, "-m", "exactly.cli", "stop", str(ck)], check=True,
                       env=env, capture_output=True)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        kill_job(token, None, what="the benchmark job")
        log.close()
    ids, _ = file_ids(out)
    report = audit_ids(ids, np.arange(int(ids.max()) + 1, dtype=np.int64))
    print(f"\naudit: {len(ids)} rows, ids 0..{int(ids.max())}: "
          f"{'exactly once' if report.ok else report.rows()}")
    print(f"load average (1, 5, 15 min): {os.getloadavg()}")
    for kind in ("query", "process"):
        values = [r["recovery_s"] for r in results if r["kind"] == kind]
        print(f"{kind:8} n={len(values)} median {statistics.median(values):.2f} s "
              f"range {min(values):.2f}-{max(values):.2f} s")
    ratios = [next(r["recovery_s"] for r in results if r["rep"] == rep and r["kind"] == "process")
              / next(r["recovery_s"] for r in results if r["rep"] == rep and r["kind"] == "query")
              for rep in range(args.repeat)]
    print(f"process / query recovery per repetition: median {statistics.median(ratios):.2f}x "
          f"range {min(ratios):.2f}-{max(ratios):.2f}x")
    (work / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
