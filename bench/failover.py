"""Benchmark: failover time of ``exactly run --ha`` against its lease, beside a process restart.

What is measured
----------------
Two jobs run side by side for the whole benchmark, both ``tests/ops/jobs/datagen_job.py``
(``exactly.datagen`` at a steady ``--rate`` rows/s -> a pandas UDF -> the ``exactly.files``
sink, 1 s checkpoint interval, restart strategy fixed-delay with ``--restart-delay``, 0 s by
default: a restart waits for nothing but itself, as a failover does):

``ha``     two ``exactly run --ha`` launchers on one checkpoint, as two "hosts" (distinct
           ``--host-id``: a standby judges a leader of another host id only by the age of
           its lease, as across machines), with ``--lease``, ``--renew``, ``--deadline``
           and ``--poll``;
``plain``  one plain ``exactly run`` on a checkpoint of its own (a plain run refuses a
           checkpoint that HA launchers run).

After a warm-up round of the three (not counted), ``--reps`` repetitions of, in alternating
order (``harness.schedule``):

``kill``     the HA leader's whole process tree (launcher, Python driver, JVM, PySpark
             workers) SIGKILLed at once, mid-stream: a host that dies;
``pause``    that whole tree SIGSTOPped (a paused VM), SIGCONTed once the new leader has
             completed its first epoch (so the resumed processes take no CPU from the
             startup being measured). Then the old driver must die (its launcher finds the
             lease taken and kills it), the history must show the old run's ``leadership``
             entry, nothing of the old host but its launcher (a standby now) may live, and
             no intent or completion of the sink written after the SIGCONT may carry the
             sink run id of a driver from before the pause: it committed nothing;
``process``  the plain job's driver tree SIGKILLed (not its launcher): the launcher starts
             a new driver process on the same host.

Figures per fault, from the wall-clock time of the fault and the restart history
(``exactly-job/restarts.jsonl``; one machine, one clock):

* ``total``: the fault -> the first epoch completed by the new driver;
* HA: ``lease wait`` (fault -> ``since`` of the ``failover`` entry: the old leader's last
  renewal + the lease, so between lease - renew and lease), ``detection`` (fault -> ``at``
  of the ``failover`` entry: the standby took the lease, at most one poll after the expiry)
  and ``startup`` (``at`` -> first epoch: a driver process, Spark, the sink's recovery, one
  epoch); the ``recovery_s`` the job recorded (``since`` -> first epoch) beside them;
* process: ``detection`` (kill -> the launcher's ``failure``/``process`` entry) and
  ``startup`` (that entry -> first epoch: its ``recovery_s``).

The ratios kill/process and pause/process are taken per repetition pair (median, range).

Why one HA job whose launchers roll, not fresh launchers per repetition
-----------------------------------------------------------------------
A failover involves exactly two launchers every time: the leader that fails and one standby.
After a kill, a fresh launcher starts with the dead host's id and joins as the standby (as
a rebooted host or a restarted pod does); after a pause, the old leader turns standby by
itself. Before every fault the bench waits for the same steady state: the leader completed
>= 3 epochs after its own first one and the other launcher is a live standby (fresh member
record, role standby). What a failover costs -- the lease running out, one standby poll, a
new driver and its recovery from the checkpoint -- does not depend on how many failovers
the job had before, so fresh launchers per repetition would only add a whole job start (a
JVM, the first epochs, the stop) to each repetition -- and its noise -- without measuring
anything more, and the default run would no longer fit well under 30 minutes.

The plain job runs beside the HA job the whole time, so each fault hits one job while the
other runs at the same steady rate: both kinds of fault see the same machine, which keeps
the paired ratio fair, and nothing is started or stopped between faults but what the fault
itself causes.

Outputs
-------
At the end both jobs are stopped (``exactly stop``) and their outputs audited by id
(``exactly.audit``): ids 0 .. n-1 exactly once, n being the rows of the source's offsets of
the last committed epoch (Spark's ``offsets/``: what the job consumed, not what the sink
wrote). A lost or duplicated id, or a failed check of a pause, fails the benchmark (exit
status 1, ``FAILED`` lines). ``WORKDIR/results.json`` holds every fault's figures,
``WORKDIR/headlines.json`` the headline numbers, ``WORKDIR/*.log`` the launchers' output.

Run from the repository root (about 15 minutes with the defaults on 2 cores)::

    .venv/bin/python bench/failover.py [--lease 15s --renew 3s --deadline 10s --poll 3s]
        [--reps 5] [--rate 1000] [--restart-delay 0s] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

from exactly.audit import audit_ids, file_ids
from exactly.checkpoint.leader import (
    DEFAULT_LEASE_S,
    DEFAULT_RENEW_DEADLINE_S,
    DEFAULT_RENEW_S,
    DEFAULT_STANDBY_POLL_S,
    LeaderLease,
    LeaderState,
    Members,
)
from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.spark_files import batch_numbers, read_offsets
from exactly.checkpoint.status import JobStatus
from exactly.config import parse_duration
from exactly.ops.ha import HaSettings
from exactly.procs import HOST_ID_ENV, is_alive, processes_with_env
from exactly.testing.nemesis.processes import locks_held, paused, tree_pids, tree_processes

JOB = Path(__file__).resolve().parent.parent / "tests" / "ops" / "jobs" / "datagen_job.py"
EXACTLY = [sys.executable, "-m", "exactly.cli"]
VARIANTS = ("kill", "pause", "process")
#: epochs a job completes after its first one before the next fault (its steady state)
STEADY_EPOCHS = 3
#: seconds a new driver may take from the fault to its first epoch, beyond the lease
STARTUP_LIMIT_S = 300.0
STARTED = time.monotonic()


class BenchError(Exception):
    """The benchmark could not measure (a process ended, a wait timed out, a check failed)."""


def say(text: str) -> None:
    minutes = (time.monotonic() - STARTED) / 60
    print(f"[{minutes:5.1f} min] {text}", flush=True)


def sigkill(victims: Iterable[psutil.Process]) -> None:
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()


class Job:
    """One checkpoint and output, and the ``exactly run`` launchers of it, by host id."""

    def __init__(self, name: str, work: Path, env: dict[str, str], args: list[str],
                 ha: HaSettings | None) -> None:
        self.name = name
        self.work = work
        self.ck = work / f"{name}-ck"
        self.out = work / f"{name}-out"
        self.store = job_store(str(self.ck))
        self.env = {**env, "JOB_OUT": str(self.out)}
        self.args = args
        self.ha = ha
        self.launchers: dict[str, subprocess.Popen] = {}  # host id -> its live launcher
        self.started: list[tuple[str, subprocess.Popen, IO[bytes]]] = []
        #: epochs this job must have committed before its next fault
        self.steady_at = 0
        #: ``--warm-standby``: its HA launchers keep a warm spare as standbys
        self.warm_standby = False

    def start(self, host: str) -> subprocess.Popen:
        log = open(self.work / f"{host}-{len(self.started)}.log", "wb")  # noqa: SIM115
        ha_args = [] if self.ha is None else [
            "--ha", "--host-id", host, "--ha-lease-duration", f"{self.ha.lease_s:g}s",
            "--ha-renew-interval", f"{self.ha.renew_s:g}s",
            "--ha-renew-deadline", f"{self.ha.renew_deadline_s:g}s",
            "--ha-standby-poll", f"{self.ha.standby_poll_s:g}s",
            *(["--ha-warm-standby"] if self.warm_standby else [])]
        proc = subprocess.Popen([*EXACTLY, "run", str(JOB), "--checkpoint", str(self.ck),
                                 *self.args, *ha_args], env={**self.env, HOST_ID_ENV: host},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.launchers[host] = proc
        self.started.append((host, proc, log))
        return proc

    # -- looking ------------------------------------------------------------------------
    def history(self) -> list[dict[str, Any]]:
        return RestartHistory(self.store, "").entries(this_run_only=False)

    def epochs(self) -> int:
        """The newest committed epoch + 1 (0 before the first)."""
        found = batch_numbers(str(self.ck), "commits") if self.ck.exists() else []
        return found[-1] + 1 if found else 0

    def status(self) -> JobStatus | None:
        return JobStatus.read(self.store)

    def lease(self) -> LeaderState | None:
        return LeaderLease(self.store).current()

    def log_tail(self, host: str) -> str:
        logs = [p for p in sorted(self.work.glob(f"{host}-*.log"), key=lambda p: p.stat().st_mtime)]
        return logs[-1].read_text(errors="replace")[-3000:] if logs else ""

    def check_alive(self) -> None:
        for host, proc in self.launchers.items():
            if proc.poll() is not None:
                raise BenchError(f"{self.name}: the launcher of host {host} ended "
                                 f"({proc.returncode}):\n{self.log_tail(host)}")

    def entry(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        found = [e for e in self.history() if match(e)]
        return found[0] if found else None


def wait_for(condition: Callable[[], Any], what: str, timeout: float,
             jobs: Iterable[Job] = (), every: float = 0.2) -> Any:
    """``condition()``'s first truthy value; BenchError after ``timeout`` s or when a
    launcher of ``jobs`` ended meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for job in jobs:
            job.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


# -- steady state --------------------------------------------------------------------------
def leader_of(job: Job) -> tuple[str, LeaderState] | None:
    """The leader's host and term when it is one of the bench's live launchers and job.json
    names its run with a driver."""
    cur = job.lease()
    if cur is None or cur.ended is not None or cur.released:
        return None
    proc = job.launchers.get(cur.host)
    status = job.status()
    if proc is None or proc.pid != cur.launcher.pid or status is None or (
            status.run_id != cur.run_id or status.driver is None):
        return None
    return cur.host, cur


def standby_ready(job: Job, leader: str) -> bool:
    """Every launcher but the leader's is live as a standby (fresh member record), with its
    warm spare ready under ``--warm-standby``."""
    live = {m.host: m for m in Members(job.store).live()}
    for host, proc in job.launchers.items():
        if host == leader:
            continue
        member = live.get(host)
        if member is None or member.role != "standby" or member.launcher.pid != proc.pid:
            return False
        if job.warm_standby and member.spare != "ready":
            return False
    return True


def steady(job: Job, jobs: list[Job]) -> None:
    """Wait until ``job`` committed ``job.steady_at`` epochs (and, in HA, its standby is
    live)."""
    wait_for(lambda: job.epochs() >= job.steady_at,
             f"{job.name}: {job.steady_at} committed epochs", STARTUP_LIMIT_S, jobs)
    if job.ha is not None:
        wait_for(lambda: (found := leader_of(job)) and standby_ready(job, found[0]),
                 f"{job.name}: a leader and a live standby", STARTUP_LIMIT_S, jobs)


def settled(job: Job) -> None:
    """After a recovery: the next fault waits for STEADY_EPOCHS more epochs."""
    job.steady_at = job.epochs() + STEADY_EPOCHS


# -- faults --------------------------------------------------------------------------------
def failover_figures(job: Job, host: str, t0: float, jobs: list[Job]) -> dict[str, Any]:
    """Wait for the failover away from ``host`` after a fault at ``t0`` and the new driver's
    first epoch; the figures of that failover."""
    assert job.ha is not None
    limit = job.ha.lease_s + job.ha.standby_poll_s + STARTUP_LIMIT_S
    failover = wait_for(lambda: job.entry(
        lambda e: e.get("event") == "failure" and e.get("kind") == "failover"
        and float(e["at"]) > t0 and e.get("from_host") == host),
        f"the failover from {host}", limit, jobs)
    recovered = wait_for(lambda: job.entry(
        lambda e: e.get("event") == "recovered" and e.get("run") == failover["run"]),
        "the new leader's first epoch", limit, jobs)
    since, at = float(failover["since"]), float(failover["at"])
    first = since + float(recovered["recovery_s"])
    return {"total": first - t0, "lease_wait": since - t0, "detection": at - t0,
            "startup": first - at, "recovery_s": float(recovered["recovery_s"]),
            "why": failover.get("why"), "to_host": failover.get("to_host"),
            "run": failover["run"],
            "epoch_in_flight": failover.get("epoch_in_flight")}


def kill_leader(job: Job, jobs: list[Job]) -> dict[str, Any]:
    """SIGKILL the HA leader's whole tree; the failover's figures. A new launcher of the
    dead host joins as the standby afterwards."""
    found = leader_of(job)
    if found is None:
        raise BenchError("no leader to kill")
    host, _ = found
    proc = job.launchers.pop(host)
    victims = tree_processes(proc.pid)
    t0 = time.time()
    sigkill(victims)
    wait_for(lambda: not (left := processes_with_env(HOST_ID_ENV, host)) or sigkill(left),
             f"every process of host {host} dead", 60)
    proc.wait(timeout=30)
    figures = failover_figures(job, host, t0, jobs)
    settled(job)
    job.start(host)  # the host comes back: a standby again
    return figures


def sink_records(out: Path) -> list[tuple[Path, float, str]]:
    """(file, mtime, sink run id) of every intent and completion of the files sink."""
    found = []
    for folder in ("intents", "complete"):
        for path in (out / "_exactly" / folder).glob("*.json"):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                mtime = path.stat().st_mtime
                found.append((path, mtime, str(json.loads(path.read_text()).get("run_id"))))
    return found


def _wait_stopped(pids: Iterable[int], timeout: float = 2.0) -> None:
    """Until each of ``pids`` is stopped or gone (SIGSTOP takes effect asynchronously)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            while proc.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE) and (
                    time.monotonic() < deadline):
                time.sleep(0.01)


def pause_leader(job: Job, jobs: list[Job]) -> dict[str, Any]:
    """SIGSTOP the HA leader's whole tree until the new leader completed its first epoch,
    then SIGCONT it and check its driver dies having committed nothing."""
    assert job.ha is not None
    found = leader_of(job)
    status = job.status()
    if found is None or status is None or status.driver is None:
        raise BenchError("no leader to pause")
    host, term = found
    proc = job.launchers[host]
    driver = psutil.Process(status.driver.pid)
    with contextlib.ExitStack() as stack:
        for _ in range(50):  # never inside a flock of the local store (it would block all)
            attempt = contextlib.ExitStack()
            stopped: set[int] = set()
            for _ in range(5):  # again for a process forked while the tree was being stopped
                new = [pid for pid in tree_pids(proc.pid) if pid not in stopped]
                if not new:
                    break
                stopped.update(attempt.enter_context(paused(new, target=f"host {host}")))
            _wait_stopped(stopped)
            if not locks_held(stopped, job.work):
                stack.push(attempt)
                break
            attempt.close()  # resumed: pause again a moment later
            time.sleep(0.1)
        else:
            raise BenchError(f"host {host}'s tree held a store lock at 50 pauses")
        t0 = time.time()
        figures = failover_figures(job, host, t0, jobs)
        before = {run for _, mtime, run in sink_records(job.out) if mtime < t0}
        t_cont = time.time()
    # resumed: the old launcher finds its lease taken and kills its driver; job.json stays
    # the new leader's
    wait_for(lambda: not is_alive(driver), f"the old driver (pid {driver.pid}) dead",
             job.ha.renew_s + 60, every=0.05)
    figures["old_driver_dead_s"] = time.time() - t_cont
    leadership = wait_for(lambda: job.entry(
        lambda e: e.get("event") == "failure" and e.get("kind") == "leadership"
        and e.get("run") == term.run_id), "the old leader's `leadership` entry", 60)
    figures["leadership_entry_s"] = float(leadership["at"]) - t_cont
    wait_for(lambda: not [p for p in processes_with_env(HOST_ID_ENV, host)
                          if p.pid != proc.pid],
             f"nothing of host {host} alive but its launcher", 60)
    if proc.poll() is not None:
        raise BenchError(f"the old leader's launcher ended ({proc.returncode}) instead of "
                         f"standing by:\n{job.log_tail(host)}")
    late = [(path.name, run) for path, mtime, run in sink_records(job.out)
            if mtime >= t_cont and run in before]
    if late:
        raise BenchError(f"the paused driver committed after it was resumed: {late[:5]}")
    status = job.status()
    if status is None or status.run_id != figures["run"]:
        raise BenchError(f"job.json names run {status.run_id if status else None} after the "
                         f"old leader resumed, not the new leader's run {figures['run']}")
    figures["old_sink_runs"] = len(before)
    settled(job)
    return figures


def kill_driver(job: Job, jobs: list[Job]) -> dict[str, Any]:
    """SIGKILL the plain job's driver tree (its launcher restarts it); the figures."""
    status = job.status()
    if status is None or status.driver is None:
        raise BenchError("no driver to kill")
    victims = tree_processes(status.driver.pid)
    t0 = time.time()
    sigkill(victims)
    wait_for(lambda: not [p for p in victims if is_alive(p)] or sigkill(victims),
             "the driver's tree dead", 60, every=0.05)
    failure = wait_for(lambda: job.entry(
        lambda e: e.get("event") == "failure" and e.get("kind") == "process"
        and float(e["at"]) > t0), "the launcher's process failure", STARTUP_LIMIT_S, jobs)
    recovered = wait_for(lambda: job.entry(
        lambda e: e.get("event") == "recovered" and e.get("run") == failure["run"]
        and float(e["at"]) >= float(failure["at"])),
        "the new driver's first epoch", STARTUP_LIMIT_S, jobs)
    at = float(failure["at"])
    first = at + float(recovered["recovery_s"])
    settled(job)
    return {"total": first - t0, "detection": at - t0, "startup": first - at,
            "recovery_s": float(recovered["recovery_s"]), "delay": failure.get("delay")}


def describe(variant: str, values: dict[str, Any]) -> str:
    if variant == "process":
        return (f"total {values['total']:6.2f} s = detection {values['detection']:5.2f} "
                f"+ startup {values['startup']:6.2f}")
    text = (f"total {values['total']:6.2f} s = lease wait {values['lease_wait']:5.2f} + poll "
            f"{values['detection'] - values['lease_wait']:4.2f} + startup "
            f"{values['startup']:6.2f} (recorded recovery_s {values['recovery_s']:.2f}; "
            f"{values['why']}, epoch in flight {values['epoch_in_flight']})")
    if variant == "pause":
        text += (f"; after SIGCONT: old driver dead in {values['old_driver_dead_s']:.2f} s, "
                 f"leadership entry in {values['leadership_entry_s']:.2f} s, nothing "
                 "committed")
    return text


# -- the end -------------------------------------------------------------------------------
def stop_all(jobs: list[Job]) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    stops = [subprocess.Popen([*EXACTLY, "stop", str(job.ck), "--timeout", "5min"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for job in jobs]
    for job, stop in zip(jobs, stops, strict=True):
        out, _ = stop.communicate(timeout=400)
        if stop.returncode != 0:
            raise BenchError(f"exactly stop {job.name}: {out.decode(errors='replace')}")
    for job in jobs:
        for host, proc in job.launchers.items():
            code = proc.wait(timeout=300)
            if code != 0:
                raise BenchError(f"{job.name}: the launcher of {host} exited {code}:\n"
                                 f"{job.log_tail(host)}")


def audit(job: Job) -> tuple[bool, str]:
    """Audit ``job``'s output by id against the rows its last committed epoch consumed."""
    last = job.epochs() - 1
    entry = read_offsets(str(job.ck), last) if last >= 0 else None
    if entry is None:
        return False, f"{job.name}: no committed epoch"
    rows = int(json.loads(entry.text.split("\n")[2])["rows"])
    ids, unreadable = file_ids(job.out)
    report = audit_ids(ids, np.arange(rows, dtype=np.int64), malformed_input_rows=unreadable)
    verdict = "exactly once" if report.ok and not unreadable else "; ".join(
        f"{k} {v}" for k, v in report.rows())
    return report.ok and not unreadable, (
        f"{job.name}: {len(ids):,} rows checked against ids 0..{rows - 1:,} (the source's "
        f"offsets of epoch {last}): {verdict}")


def cleanup(jobs: list[Job]) -> None:
    """SIGKILL whatever the bench started and is still alive; close the logs."""
    for job in jobs:
        for host, proc, log in job.started:
            if proc.poll() is None:
                sigkill(tree_processes(proc.pid))
            sigkill(processes_with_env(HOST_ID_ENV, host))
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            log.close()


def summary(runs: list[h.Run], ha: HaSettings) -> tuple[list[str], list[h.Headline]]:
    lines = []
    rows = []
    for variant in VARIANTS:
        mine = [r.values for r in runs if r.variant == variant]
        cells = [h.spread([v[k] for v in mine]) if mine and k in mine[0] else "-"
                 for k in ("total", "lease_wait", "detection", "startup", "recovery_s")]
        rows.append([variant, len(mine), *cells])
    lines.append(h.table(["variant", "n", "total s", "lease wait s", "detection s",
                          "startup s", "recorded recovery_s"], rows))
    ratio_rows = []
    headlines = []
    for failover in ("kill", "pause"):
        ratios = h.paired(runs, "total", failover, "process")
        ratio_rows.append([f"{failover} / process (total)", h.spread(ratios)])
        mine = [r.values["total"] for r in runs if r.variant == failover]
        headlines.append(h.Headline("failover", f"{failover} failover s (lease {ha.lease_s:g}s)",
                                    h.spread(mine)))
        headlines.append(h.Headline("failover", f"{failover} failover / process restart",
                                    h.spread(ratios)))
    for failover in ("kill", "pause"):
        lease = [r.values["total"] / ha.lease_s for r in runs if r.variant == failover]
        ratio_rows.append([f"{failover} total / lease duration", h.spread(lease)])
    restart = [r.values["total"] for r in runs if r.variant == "process"]
    headlines.append(h.Headline("failover", "process restart s", h.spread(restart)))
    lines.append(h.table(["per repetition pair", "median (range)"], ratio_rows))
    return lines, headlines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--lease", default=f"{DEFAULT_LEASE_S:g}s", help="--ha-lease-duration")
    p.add_argument("--renew", default=f"{DEFAULT_RENEW_S:g}s", help="--ha-renew-interval")
    p.add_argument("--deadline", default=f"{DEFAULT_RENEW_DEADLINE_S:g}s",
                   help="--ha-renew-deadline")
    p.add_argument("--poll", default=f"{DEFAULT_STANDBY_POLL_S:g}s", help="--ha-standby-poll")
    p.add_argument("--reps", type=int, default=5, help="repetitions of each fault (>= 5)")
    p.add_argument("--rate", type=int, default=1000, help="rows per second of each job")
    p.add_argument("--restart-delay", default="0s",
                   help="the restart strategy's delay (fixed-delay) of both jobs")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up round")
    p.add_argument("--warm-standby", action="store_true",
                   help="the HA launchers run with --ha-warm-standby (a fault waits for the "
                        "standby's spare to be ready)")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    ha = HaSettings(lease_s=parse_duration(args.lease, name="--lease"),
                    renew_s=parse_duration(args.renew, name="--renew"),
                    renew_deadline_s=parse_duration(args.deadline, name="--deadline"),
                    standby_poll_s=parse_duration(args.poll, name="--poll"))
    ha.check()
    delay = parse_duration(args.restart_delay, name="--restart-delay")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-failover-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(h.machine(), flush=True)
    print(f"HA settings: lease {ha.lease_s:g}s, renew every {ha.renew_s:g}s, renew deadline "
          f"{ha.renew_deadline_s:g}s, standby poll {ha.standby_poll_s:g}s (product defaults "
          f"{DEFAULT_LEASE_S:g}/{DEFAULT_RENEW_S:g}/{DEFAULT_RENEW_DEADLINE_S:g}/"
          f"{DEFAULT_STANDBY_POLL_S:g}s); {args.reps} repetitions of {', '.join(VARIANTS)}; "
          f"{args.rate} rows/s per job, 1 s checkpoint interval, restart delay {delay:g}s; "
          f"HA standbys {'with' if args.warm_standby else 'without'} a warm spare "
          f"(--ha-warm-standby), the plain job with its default spare driver; work {work}",
          flush=True)
    if args.reps < 5:
        print(f"NOT A MEASUREMENT ({args.reps} repetitions < 5)", flush=True)
    prefix = f"bench{os.getpid()}"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "JOB_ROWS": "1000000000000",
           "JOB_RATE": str(args.rate), "JOB_INTERVAL": "1s"}
    strategy = ["--restart-strategy", "fixed-delay", "--restart-option", "attempts=100000",
                "--restart-option", f"delay={delay:g}s"]
    ha_job = Job("ha", work, env, strategy, ha)
    ha_job.warm_standby = args.warm_standby
    plain = Job("plain", work, env, strategy, None)
    jobs = [ha_job, plain]
    runs: list[h.Run] = []
    errors: list[str] = []
    try:
        say("starting: the HA leader, the plain job, then the standby")
        ha_job.start(f"{prefix}-a")
        plain.start(f"{prefix}-plain")
        wait_for(lambda: leader_of(ha_job), "the first leader", STARTUP_LIMIT_S, jobs)
        ha_job.start(f"{prefix}-b")
        for job in jobs:
            job.steady_at = 1 + STEADY_EPOCHS
        faults = {"kill": (ha_job, kill_leader), "pause": (ha_job, pause_leader),
                  "process": (plain, kill_driver)}
        order = [(-1, v) for v in ([] if args.no_warmup else VARIANTS)]
        for rep, variant in [*order, *h.schedule(VARIANTS, args.reps)]:
            job, fault = faults[variant]
            steady(job, jobs)
            label = "warm-up" if rep < 0 else f"rep {rep}"
            values = fault(job, jobs)
            print(f"{label:8} {variant:8} {describe(variant, values)}  {h.load()}", flush=True)
            if rep >= 0:
                runs.append(h.Run(rep, variant, values, []))
        say("stopping both jobs")
        stop_all(jobs)
        for job in jobs:
            ok, line = audit(job)
            print(line, flush=True)
            if not ok:
                errors.append(line)
    except BenchError as exc:
        errors.append(str(exc))
    finally:
        cleanup(jobs)
    (work / "results.json").write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    if runs:
        print()
        lines, headlines = summary(runs, ha)
        print("\n\n".join(lines))
        h.write_headlines(work, headlines, {"lease_s": ha.lease_s, "renew_s": ha.renew_s,
                                            "renew_deadline_s": ha.renew_deadline_s,
                                            "standby_poll_s": ha.standby_poll_s})
    print(f"\n{h.machine()}")
    for error in errors:
        print(f"FAILED: {error}", file=sys.stderr, flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup() on a kill too
    sys.exit(main())
