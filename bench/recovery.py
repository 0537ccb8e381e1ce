"""Benchmark: kill -> first committed epoch of ``exactly run``, with the warm spare driver,
without it, and after a query failure.

What is measured
----------------
Two supervised jobs run side by side for the whole benchmark, both ``exactly run
tests/ops/jobs/datagen_job.py`` (``exactly.datagen`` at ``--rate`` rows/s -> a pandas UDF ->
the ``exactly.files`` sink, 1 s interval), with the same restart strategy (fixed-delay, a
``--restart-delay`` wait before every restart, 1 s by default: Flink's fixed-delay default):

``spare``  the job of the default ``exactly run`` (``--spare-driver auto``: a warm spare
           driver beside the active one);
``cold``   the same job with ``--spare-driver off``: every restart starts a driver process
           from scratch (Python, the JVM, the session, the job's build, the query).

After a warm-up (``--warmup`` epochs of each job, and the spare warm), ``--repeat`` rounds
of, in alternating order (``harness.schedule``):

``spare``  SIGKILL of the spare job's active driver tree (Python driver, JVM, PySpark's
           daemons), its spare warm;
``cold``   SIGKILL of the cold job's driver tree;
``query``  (``--query``) a Python exception in the spare job's UDF (``JOB_FAIL_FILE``): the
           query restarts inside the driver process, the floor a process restart can reach.

Before every fault the bench waits for a steady state: the job it hits completed 3 epochs
after its last recovery, the other job too, and the spare job's spare is ``ready`` in
job.json (no driver of either job is starting in the background: a fault measures its own
recovery, not the one before it).

Figures per fault: ``total`` is the fault's wall-clock time -> the ``recovered`` entry of the
restart history (the supervisor saw the first epoch of the new driver complete; one machine,
one clock), ``recovery_s`` the job's own figure (from the launcher noticing the death), and
the strategy's wait. Ratios spare/cold are per repetition pair (median, range). The outputs
are audited by id at the end (every id from 0 to the highest once, in each job); a lost or
duplicated id fails the benchmark (exit 1).

Run from the repository root (about 15 minutes with the defaults on 2 cores)::

    .venv/bin/python bench/recovery.py [--repeat 10] [--rate 500] [--query] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import harness
import psutil
from supervised_jobs import JOBS, BenchJob, audited, bench_dir, finish, running

from exactly.procs import JOB_TOKEN_ENV, kill_job

JOB = JOBS / "datagen_job.py"


class Job(BenchJob):
    """One ``exactly run`` of the benchmark."""

    def __init__(self, name: str, work: Path, rate: int, delay: str, *flags: str) -> None:
        self.fail_file = work / f"{name}-fail-now"
        super().__init__(name, work, rate, JOB_FAIL_FILE=str(self.fail_file))
        self.start(JOB, work / f"{name}-ck", "--restart-strategy", "fixed-delay",
                   "--restart-option", "attempts=100000", "--restart-option",
                   f"delay={delay}", *flags, log=work / f"{name}.log")

    def recoveries(self) -> list[dict]:
        return [e for e in self.history() if e["event"] == "recovered"]

    def settle(self, *, spare: bool) -> None:
        """3 epochs after the last recovery (or the start), and the spare ready."""
        start = self.committed()
        self.wait_for(lambda: self.committed() >= start + 3, "3 epochs")
        if spare:
            self.wait_for(self.spare_ready, "a ready spare")

    def fault(self, kind: str) -> float:
        """Inject ``kind``; returns its wall-clock time."""
        if kind == "query":
            at = time.time()
            self.fail_file.write_text("fail once")
            return at
        status = self.status()
        assert status is not None and status.driver is not None
        driver = psutil.Process(status.driver.pid)
        token = driver.environ().get(JOB_TOKEN_ENV)
        at = time.time()
        kill_job(token, driver, what="the driver")
        return at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rate", type=int, default=500, help="rows per second, per job")
    parser.add_argument("--restart-delay", default="1s", help="fixed-delay's wait")
    parser.add_argument("--warmup", type=int, default=5, help="epochs before the first fault")
    parser.add_argument("--query", action="store_true",
                        help="also fail the query in its driver (the in-process floor)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = bench_dir(args.workdir, "recovery")
    jobs = {"spare": Job("spare", work, args.rate, args.restart_delay),
            "cold": Job("cold", work, args.rate, args.restart_delay, "--spare-driver", "off")}
    variants = ["spare", "cold", *(["query"] if args.query else [])]
    runs: list[harness.Run] = []
    with running(jobs.values(), args.warmup):
        jobs["spare"].wait_for(jobs["spare"].spare_ready, "the first ready spare")
        for rep, kind in harness.schedule(variants, args.repeat):
            job = jobs["cold" if kind == "cold" else "spare"]
            job.settle(spare=kind == "spare")
            # no driver start of the other job in the background: its spare is warm
            jobs["spare"].wait_for(jobs["spare"].spare_ready, "the spare job's spare, ready")
            if kind != "cold":
                jobs["cold"].settle(spare=False)
            before = len(job.recoveries())
            load = os.getloadavg()[0]
            at = job.fault(kind)
            job.wait_for(lambda j=job, b=before: len(j.recoveries()) > b,
                         f"recovery from a {kind} fault")
            failure = [e for e in job.history() if e["event"] == "failure"][-1]
            recovered = job.recoveries()[-1]
            total = float(recovered["at"]) - at
            wait = float(failure.get("delay") or 0)
            runs.append(harness.Run(rep, kind, {"total_s": round(total, 3),
                                                "recovery_s": recovered["recovery_s"],
                                                "wait_s": wait, "load": load}, []))
            print(f"rep {rep:2} {kind:6} kill -> first epoch {total:6.2f} s (job's own "
                  f"{recovered['recovery_s']:6.2f} s, strategy wait {wait:.2f} s, "
                  f"{failure['kind']} failure), load {load:.2f}", flush=True)
    errors = audited(jobs.values())
    for kind in variants:
        totals = harness.per_rep(runs, "total_s", kind)
        print(f"{kind:6} n={len(totals)} kill -> first committed epoch, s: "
              f"{harness.spread(totals)}")
    print("spare / cold per repetition pair: "
          f"{harness.spread(harness.paired(runs, 'total_s', 'spare', 'cold'))}x")
    return finish(work, runs, errors)

if __name__ == "__main__":
    sys.exit(main())
