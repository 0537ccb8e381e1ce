"""Fencing across hosts: a driver that stops renewing its lease (a paused VM, a network
partition) loses it after ``exactly.leaseStaleAfterSeconds``; the driver that takes over
commits, and the first one, when it comes back, commits nothing more.

Two drivers of one query run on this machine as two hosts: each has its own host identity
(``EXACTLY_HOST_ID``), so neither can check the other's pid and each judges the other by
the age of its lease only, as on two machines. Driver A is paused with SIGSTOP (its whole
process tree: Python driver, JVM, Python workers), the way a VM pause or a partition
freezes it; B starts from a copy of A's checkpoint taken at the pause (the checkpoint as a
replica on another host would have it) and writes to the same output directory (lease and
commit log shared), then A is resumed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.procs import HOST_ID_ENV, JOB_TOKEN_ENV, job_processes, kill_job, new_job_token
from exactly.protocol.commitlog import CommitLog
from exactly.testing.chaos import continuous_files_job

pytestmark = pytest.mark.chaos
STALE_AFTER_S = 6.0


def start(out: Path, ck: Path, host: str, token: str, log: Path) -> subprocess.Popen:
    command = continuous_files_job(out, ck, {"exactly.leaseStaleAfterSeconds": str(STALE_AFTER_S)})
    return subprocess.Popen(command, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), start_new_session=True,
                            env={**os.environ, JOB_TOKEN_ENV: token, HOST_ID_ENV: host})


def wait_for(predicate, timeout: float = 120, running: tuple = ()) -> None:
    """Wait until ``predicate()``; fail at once when a job of ``running`` (a (process, log)
    pair) exits, showing its log's end."""
    deadline = time.monotonic() + timeout
    while not predicate():
        for proc, log in running:
            if proc.poll() is not None:
                raise AssertionError(f"the job exited ({proc.returncode}): "
                                     f"{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


def lease(out: Path) -> dict:
    return json.loads((out / "_exactly" / "lease.json").read_text())


def freeze(token: str) -> list[psutil.Process]:
    """SIGSTOP every process of the job ``token``; scans repeat until one finds no process
    that is not stopped yet (one forked between a scan and its stop is caught by the next),
    and a process that exited between a scan and its stop is passed over."""
    stopped: dict[int, psutil.Process] = {}
    while True:
        fresh = [p for p in job_processes(token) if p.pid not in stopped]
        if not fresh:
            return list(stopped.values())
        for proc in fresh:
            try:
                proc.suspend()
            except psutil.NoSuchProcess:
                continue
            stopped[proc.pid] = proc


def thaw(processes: list[psutil.Process]) -> None:
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.resume()


def completions(log: CommitLog) -> dict[int, str]:
    return {e: (log.completion(e) or {}).get("run_id", "") for e in log.completed_epochs()}


@pytest.mark.slow  # CI budget (issue 28): a holder paused past its lease and
# taken over is proven in process with the real file sink (tests/unit/test_lease_clock_jumps.py);
# the nemesis runs pause drivers under load
def test_a_paused_driver_loses_its_lease_to_another_host_and_commits_nothing_after(tmp_path):
    out, ck_a, ck_b = tmp_path / "out", tmp_path / "ck-a", tmp_path / "ck-b"
    log = CommitLog(out / "_exactly")
    token_a, token_b = new_job_token(), new_job_token()
    a = start(out, ck_a, "host-a", token_a, tmp_path / "a.log")
    b = None
    try:
        wait_for(lambda: len(log.completed_epochs()) >= 3, running=((a, tmp_path / "a.log"),))
        paused = freeze(token_a)
        held = lease(out)
        run_a = held["run_id"]
        shutil.copytree(ck_a, ck_b)  # the checkpoint as the other host sees it
        done_by_a = {e for e, run in completions(log).items() if run == run_a}
        # B starts once A's lease has expired (a B started earlier is refused: A counts as
        # live until then -- tests/unit/test_lease.py); A is frozen, so nothing renews it
        time.sleep(max(0.0, held["renewed_at"] + STALE_AFTER_S + 0.5 - time.time()))

        b = start(out, ck_b, "host-b", token_b, tmp_path / "b.log")
        running_b = ((b, tmp_path / "b.log"),)
        wait_for(lambda: lease(out)["run_id"] != run_a, timeout=180, running=running_b)
        taken = lease(out)
        assert taken["holder"]["host"] == "host-b"
        # taken over only once A's lease had expired: never two holders at once
        assert taken["acquired_at"] >= held["renewed_at"] + STALE_AFTER_S
        wait_for(lambda: sum(run == taken["run_id"] for run in completions(log).values()) >= 2,
                 running=running_b)

        thaw(paused)
        assert a.wait(timeout=120) != 0  # A fails on fencing: its run lost the lease
        stderr_a = (tmp_path / "a.log").read_text()
        assert "fenced off" in stderr_a, stderr_a[-3000:]

        after = completions(log)
        by_a_after = {e for e, run in after.items() if run == run_a} - done_by_a
        # at most the one epoch whose intent A wrote before the pause, finished by B's
        # recovery (same handles, same run id in its record); nothing A started later
        assert len(by_a_after) <= 1 and all(e == max(done_by_a) + 1 for e in by_a_after)
        more = len(after)
        wait_for(lambda: len(log.completed_epochs()) > more, running=running_b)  # B goes on
        assert lease(out)["run_id"] == taken["run_id"]
    finally:
        for token, proc in ((token_a, a), (token_b, b)):
            if proc is not None:  # SIGKILL ends a stopped process too
                kill_job(token, psutil.Process(proc.pid) if proc.poll() is None else None)
                proc.wait()
    ids = sorted(i for f in data_files(out)
                 for i in ds.dataset(str(f), format="parquet").to_table()["id"].to_pylist())
    assert ids == list(range(len(ids)))  # no id lost or duplicated
