"""Benchmark: the gap of an upgrade -- the old job's last committed epoch -> the new job's
first -- with ``exactly upgrade`` and by hand.

What is measured
----------------
Two supervised jobs run side by side for the whole benchmark, each ``exactly.datagen`` at
``--rate`` rows/s -> a pandas UDF -> the ``exactly.files`` sink (1 s interval), and each is
upgraded ``--repeat`` times, alternating between two job files (tests/ops/jobs/
``datagen_job.py`` and ``upgraded_job.py``, which adds a column), in alternating order
(``harness.schedule``):

``upgrade``  ``exactly upgrade CK NEXT_JOB.py`` on one ``exactly run``: the new job's driver
             starts warm beside the running one and checks the restore, then the old job
             stops with a savepoint that the warm driver restores into the same checkpoint;
``by_hand``  what a user does without it (Flink's stop-with-savepoint, then a new job from
             it): ``exactly stop CK --savepoint``, then ``exactly run NEXT_JOB.py -s
             SAVEPOINT --checkpoint CK'`` (a new checkpoint each time), whose driver starts
             from scratch.

Before every upgrade both jobs committed 3 epochs since their last upgrade and the
``upgrade`` job's spare driver is ``ready`` (no driver of either job starts in the
background). The gap is read from the checkpoints' histories: the end of the savepoint's
epoch N (the old job's last) -> the end of epoch N+1 (the new job's first), one clock.
Ratios upgrade/by_hand are per repetition pair. Both outputs are audited by id at the end
(every id from 0 to the highest once); a lost or duplicated id fails the benchmark (exit 1).

Run from the repository root (about 8 minutes with the defaults on 2 cores)::

    .venv/bin/python bench/upgrade.py [--repeat 5] [--rate 500] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import harness
from supervised_jobs import JOBS, BenchJob, audited, bench_dir, finish, running

from exactly.checkpoint.history import open_history

VERSIONS = (JOBS / "datagen_job.py", JOBS / "upgraded_job.py")


def _epoch_ends(ck: Path) -> dict[int, float]:
    """Epoch -> the end of its first completion in ``ck``'s history."""
    ends: dict[int, float] = {}
    for record in open_history(str(ck)).read().records:
        if record.get("kind") == "epoch" and isinstance(record.get("epoch"), int):
            ends.setdefault(record["epoch"], float(record.get("end_at") or record["at"]))
    return ends


class Job(BenchJob):
    """One job of the benchmark: its current ``exactly run`` and checkpoint."""

    def __init__(self, name: str, work: Path, rate: int) -> None:
        super().__init__(name, work, rate)
        self.generation = 0
        self.version = 0
        self._start(VERSIONS[0])

    def _start(self, job: Path, *flags: str) -> None:
        self.start(job, self.work / f"{self.name}-ck-{self.generation}", *flags,
                   log=self.work / f"{self.name}-{self.generation}.log")

    def settle(self) -> None:
        start = self.committed()
        self.wait_for(lambda: self.committed() >= start + 3, "3 epochs")

    def upgrade(self, kind: str) -> tuple[float, int]:
        """Upgrade to the other job file; returns (gap in seconds, the savepoint's epoch)."""
        self.version = 1 - self.version
        nxt = VERSIONS[self.version]
        if kind == "upgrade":
            said = self.command("upgrade", str(self.ck), str(nxt))
            epoch = int(re.search(r"\(epoch (\d+)\)", said).group(1))  # type: ignore[union-attr]
            ends = _epoch_ends(self.ck)
            return ends[epoch + 1] - ends[epoch], epoch
        said = self.command("stop", str(self.ck), "--savepoint")
        found = re.search(r"savepoint (\S+)\s*$", said.strip())
        if found is None:
            raise SystemExit(f"stop --savepoint named no savepoint: {said}")
        savepoint = found.group(1)
        self.run.proc.wait(timeout=300)
        old = self.ck
        epoch = int(re.search(r"savepoint-(\d+)-", savepoint).group(1))  # type: ignore[union-attr]
        self.generation += 1
        self._start(nxt, "-s", savepoint)
        self.wait_for(lambda: epoch + 1 in _epoch_ends(self.ck), "the new job's first epoch")
        return _epoch_ends(self.ck)[epoch + 1] - _epoch_ends(old)[epoch], epoch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rate", type=int, default=500, help="rows per second, per job")
    parser.add_argument("--warmup", type=int, default=5, help="epochs before the first one")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = bench_dir(args.workdir, "upgrade")
    jobs = {"upgrade": Job("upgrade", work, args.rate), "by_hand": Job("by_hand", work,
                                                                      args.rate)}
    runs: list[harness.Run] = []
    with running(jobs.values(), args.warmup):
        for rep, kind in harness.schedule(list(jobs), args.repeat):
            for job in jobs.values():
                job.settle()
            jobs["upgrade"].wait_for(jobs["upgrade"].spare_ready, "the upgrade job's spare")
            load = os.getloadavg()[0]
            gap, epoch = jobs[kind].upgrade(kind)
            runs.append(harness.Run(rep, kind, {"gap_s": gap, "epoch": epoch, "load": load},
                                    []))
            print(f"rep {rep:2} {kind:8} last old epoch {epoch} -> first new epoch "
                  f"{gap:6.2f} s, load {load:.2f}", flush=True)
    errors = audited(jobs.values())
    for kind in jobs:
        gaps = harness.per_rep(runs, "gap_s", kind)
        print(f"{kind:8} n={len(gaps)} last old epoch -> first new epoch, s: "
              f"{harness.spread(gaps)}")
    print("upgrade / by_hand per repetition pair: "
          f"{harness.spread(harness.paired(runs, 'gap_s', 'upgrade', 'by_hand'))}x")
    return finish(work, runs, errors)


if __name__ == "__main__":
    sys.exit(main())
