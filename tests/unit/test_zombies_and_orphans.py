"""Zombies, orphans and lost runs, without Spark: a zombie is never a live holder, a
launcher reaps what it inherits, a driver that outlived its launcher still answers for the
job, and a run that ended without a word is recorded by the next start."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from exactly.checkpoint.control import ControlChannel
from exactly.checkpoint.location import job_dir
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.status import JobStatus, claim_job
from exactly.errors import FencedError
from exactly.ops.doctor import lease_holder
from exactly.ops.lost_runs import record_lost_run
from exactly.procs import ProcessId, _stat, current_process, process_id
from exactly.protocol.lease import Lease


def _zombie() -> subprocess.Popen:
    """A child that has exited and is not reaped yet (state Z)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while (_stat(child.pid) or ("", 0, 0, "?"))[3] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    return child


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_zombie_is_dead_to_the_identity_check_the_lease_the_doctor_and_the_job_lock(
        tmp_path):
    child = _zombie()
    try:
        zombie = process_id(child.pid)
        assert zombie.start_ticks > 0  # the pid and its start time are still there
        assert zombie.is_alive() is False
        log = tmp_path / "log"
        log.mkdir()
        (log / "lease.json").write_text(json.dumps({
            "run_id": "killed-run", "generation": 3, "holder": zombie.to_json(),
            "acquired_at": time.time(), "renewed_at": time.time()}))
        assert lease_holder(log)[1] is False  # doctor: "that driver is gone"
        assert Lease(log).acquire("next-run", current_process()) is True  # not fenced
        directory = job_dir(tmp_path / "ck")
        JobStatus("killed-run", zombie, "running", driver=zombie).write(directory)
        assert not JobStatus.read(directory).alive()
        lost = claim_job(directory, JobStatus("next-run", current_process(), "starting"))
        assert lost is not None and lost.run_id == "killed-run"
    finally:
        child.wait()


def test_reaping_collects_every_ended_child_and_the_drivers_exit_code():
    script = """
import subprocess, sys, time
from exactly.procs import _stat, reap_children
def ended(code):
    child = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    while _stat(child.pid)[3] != "Z":
        time.sleep(0.01)
    return child
driver, others = ended(7), [ended(0) for _ in range(3)]
assert reap_children(driver) == 4
assert driver.returncode == 7 and driver.poll() == 7
assert all(_stat(p.pid) is None for p in [driver, *others])  # no zombie left
assert reap_children() == 0
print("reaped")
"""
    # in a process of its own: reaping in the test runner would take other tests' children
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "reaped"


def test_a_subreaper_adopts_the_orphans_of_its_tree_and_reaps_them():
    script = """
import os, signal, subprocess, sys, time
from exactly.procs import become_subreaper, reap_children, _stat
assert become_subreaper()
middle = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(30)']); print(p.pid, flush=True)"], stdout=subprocess.PIPE)
orphan = int(middle.stdout.readline())
middle.wait()
deadline = time.monotonic() + 20
while _stat(orphan) is not None and _stat(orphan)[1] != os.getpid():
    assert time.monotonic() < deadline
    time.sleep(0.01)
parent = _stat(orphan)[1] if _stat(orphan) else None
os.kill(orphan, signal.SIGKILL)  # it ends now (not after its sleep): a zombie to reap here
while _stat(orphan) is not None:
    reap_children()
    assert time.monotonic() < deadline, _stat(orphan)
    time.sleep(0.05)
print("adopted" if parent == os.getpid() else f"parent {parent}")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "adopted"


def test_a_driver_that_outlived_its_launcher_gets_commands_and_holds_the_job_until_it_ends(
        tmp_path):
    launcher = _zombie()
    driver = _sleeper()
    try:
        directory = job_dir(tmp_path)
        status = JobStatus("r1", process_id(launcher.pid), "running",
                           driver=process_id(driver.pid))
        status.write(directory)
        launcher.wait()  # the launcher is gone for good
        assert status.orphaned() and status.alive() and not status.lost()
        request = ControlChannel(tmp_path).send("cancel")  # reaches the orphan's channel
        assert [r.id for r in ControlChannel(tmp_path).pending()] == [request.id]
        with pytest.raises(FencedError, match=r"whose launcher .* died"):
            claim_job(directory, JobStatus("r2", current_process(), "starting"))
        said: list[str] = []

        def told(text: str) -> None:
            # the claim found the orphan running and waits for it: now it ends, between two
            # looks of the claim (a timer could end it anywhere: see the next test)
            said.append(text)
            driver.kill()

        lost = claim_job(directory, JobStatus("r2", current_process(), "starting"),
                         wait_for_orphan_s=30, say=told)
        assert JobStatus.read(directory).run_id == "r2"
        assert len(said) == 1 and f"driver pid {driver.pid}" in said[0]
        assert lost is not None and lost.run_id == "r1"  # it died without ending the job
    finally:
        driver.kill()
        driver.wait()


def test_an_orphans_driver_that_ends_while_the_claim_looks_at_it_is_taken_over(tmp_path,
                                                                             monkeypatch):
    """The claim saw the run alive (its driver), and the driver ended before the claim
    asked whether it was an orphan: the claim looks again and takes the job over, instead
    of refusing it as a live run (found by a fast lane on a busy machine)."""
    launcher = _zombie()
    driver = _sleeper()
    try:
        directory = job_dir(tmp_path)
        JobStatus("r1", process_id(launcher.pid), "running",
                  driver=process_id(driver.pid)).write(directory)
        launcher.wait()
        orphaned = JobStatus.orphaned

        def ends_first(self: JobStatus) -> bool:
            driver.kill()
            driver.wait()
            return orphaned(self)

        monkeypatch.setattr(JobStatus, "orphaned", ends_first)
        lost = claim_job(directory, JobStatus("r2", current_process(), "starting"),
                         wait_for_orphan_s=30)
        assert lost is not None and lost.run_id == "r1"
        assert JobStatus.read(directory).run_id == "r2"
    finally:
        driver.kill()
        driver.wait()


def test_a_lost_run_is_recorded_with_its_epoch_in_flight_and_shown_as_lost(tmp_path):
    from exactly.monitoring import overview

    ck = tmp_path / "ck"
    for log, epochs in (("offsets", (0, 1, 2)), ("commits", (0, 1))):
        (ck / log).mkdir(parents=True)
        for epoch in epochs:
            (ck / log / str(epoch)).write_text("v1\n{}\n")
    gone = _zombie()
    gone.wait()
    dead = process_id(gone.pid)
    JobStatus("lost-run", dead, "running", driver=dead, last_epoch=1).write(job_dir(ck))
    view = overview.load(str(ck)).overview
    assert view.status == "lost" and "ended without a word" in view.status_detail
    previous = claim_job(job_dir(ck), JobStatus("next", current_process(), "starting"))
    assert previous is not None
    record_lost_run(str(ck), previous, noticed_by="next")
    [entry] = RestartHistory(job_dir(ck), "lost-run").entries()
    assert (entry["kind"], entry["action"], entry["epoch_in_flight"]) == ("lost-run",
                                                                          "restart", 2)
    assert entry["last_epoch"] == 1 and entry["noticed_by"] == "next"
    view = overview.load(str(ck)).overview
    assert view.counts["restarts"] == 1 and view.counts["failed"] == 1
    assert view.latest["failed"]["epoch"] == 2
    assert view.latest["failed"]["failure"] == "lost-run"


def test_a_process_recorded_without_its_pid_namespace_is_taken_as_one_of_this_namespace():
    me = current_process()
    assert me.pidns.startswith("pid:[")
    assert ProcessId.from_json({"host": me.host, "pid": me.pid,
                                "start_ticks": me.start_ticks}).is_alive() is True
    # a namespace that is not visible from here: judged by pid and start time here
    assert ProcessId(me.host, me.pid, me.start_ticks, "pid:[1]").is_alive() is True
    assert ProcessId(me.host, me.pid, me.start_ticks + 1, "pid:[1]").is_alive() is False


def test_a_process_of_a_pid_namespace_is_looked_up_in_it_from_outside_and_dead_once_it_ends():
    """From the host, a process of a container (a PID namespace) is found by its pid in the
    container, not by the same number here; once the namespace is gone it is dead."""
    import shutil

    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"],
            capture_output=True).returncode != 0:
        pytest.skip("this user may not create a PID namespace (unshare); run as root")
    inside = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
         "import json, sys, time\nfrom exactly.procs import current_process\n"
         "print(json.dumps(current_process().to_json()), flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        seen = ProcessId.from_json(json.loads(inside.stdout.readline()))
        assert seen.pid == 1 and seen.pidns != current_process().pidns
        assert _stat(1)[2] != seen.start_ticks  # pid 1 here is another process
        assert seen.is_alive() is True
    finally:
        for child in psutil.Process(inside.pid).children():
            child.kill()  # PID 1 inside: the namespace ends with it
        inside.kill()
        inside.wait()
    deadline = time.monotonic() + 30
    while seen.is_alive():
        assert time.monotonic() < deadline, "the namespace's PID 1 still counts as alive"
        time.sleep(0.05)
