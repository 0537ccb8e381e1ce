"""``exactly run`` where it really runs: as a container's PID 1, after the death of the
launcher alone, after the death of the whole job, and against an error in the job file."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from supervised import SupervisedRun, audit_rows, ids_in

from exactly.checkpoint.spark_files import batch_numbers
from exactly.procs import JOB_TOKEN_ENV, job_processes, kill_job

PID_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc"]
#: SIGKILLs of the driver's tree under PID 1: the second one hits a driver the launcher
#: restarted after the first (its orphans reaped, not fenced by the dead one); a third would
#: repeat the second (CI budget)
DRIVER_TREE_KILLS = 2


def _pid_namespaces_allowed() -> str | None:
    """Why a test cannot start a PID namespace here, or None when it can."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    try:
        tried = subprocess.run([*PID_NAMESPACE, "true"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if tried.returncode != 0:
        return (f"this user may not create a PID namespace (unshare: "
                f"{tried.stderr.strip() or tried.returncode}); run the test as root")
    return None


def _in_flight(ck: Path) -> bool:
    """An epoch is in flight: its offsets are logged, its commit is not."""
    offsets, commits = batch_numbers(str(ck), "offsets"), batch_numbers(str(ck), "commits")
    return bool(offsets) and (not commits or offsets[-1] > commits[-1])


def _history(ck: Path) -> list[dict]:
    path = ck / "exactly-job" / "restarts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _driver_of(launcher: psutil.Process) -> psutil.Process | None:
    for child in launcher.children():
        try:
            if "exactly.ops.driver" in " ".join(child.cmdline()) and (
                    child.status() != psutil.STATUS_ZOMBIE):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def _zombie_children(process: psutil.Process) -> list[int]:
    found = []
    for child in process.children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def _kill_driver_tree(launcher: psutil.Process) -> int:
    """SIGKILL the driver under ``launcher`` and everything of its job (found by the token
    the launcher gave it: PySpark's worker daemons leave the driver's process group)."""
    driver = _driver_of(launcher)
    assert driver is not None, "no driver under the launcher"
    token = driver.environ()[JOB_TOKEN_ENV]
    kill_job(token, driver, what="the driver's tree")
    assert job_processes(token) == []
    return driver.pid


def _wait(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.chaos
def test_as_pid_1_of_a_pid_namespace_the_launcher_survives_repeated_driver_tree_kills_and_a_kill_of_the_whole_job_is_recorded_by_the_next_start(  # noqa: E501
        tmp_path):
    """What a container does: ``exactly run`` is PID 1 of its PID namespace. Two SIGKILLs
    of the driver's tree from outside: each time the killed processes fall to the launcher,
    which reaps them (no zombie stays), and the new driver is not fenced by a dead one. Then
    the whole namespace is killed (PID 1 first: the kernel kills the rest); the next start
    (PID 1 of a new namespace) records the lost run with its epoch in flight, `exactly
    checkpoints` shows it, SIGTERM (``docker stop``) ends the job with exit 0, and every id is
    in the output once.

    The next start also names no ``--checkpoint`` (its job names it) and carries the old test
    switches in its environment: they arm nothing (no failure after the lost run)."""
    reason = _pid_namespaces_allowed()
    if reason:
        pytest.skip(reason)
    rows, ck, out = 3000, tmp_path / "ck", tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "0", "JOB_MAX_ROWS": "100",
           "JOB_INTERVAL": "500ms", "JOB_CHECKPOINT_STORAGE": str(ck)}
    run = SupervisedRun("datagen_job.py", ck, env, "--restart-strategy", "fixed-delay",
                        "--restart-option", "attempts=5", "--restart-option", "delay=0s",
                        log=tmp_path / "run1.log", wrap=PID_NAMESPACE)
    try:
        _wait(lambda: psutil.Process(run.proc.pid).children(), "unshare's child", 30)
        launcher = psutil.Process(run.proc.pid).children()[0]  # PID 1 inside
        assert Path(f"/proc/{launcher.pid}/status").read_text().count("NSpid:\t") == 1
        assert "\t1\n" in next(line + "\n" for line in Path(
            f"/proc/{launcher.pid}/status").read_text().splitlines() if line.startswith("NSpid"))
        killed: list[int] = []
        for kill in range(DRIVER_TREE_KILLS):
            done = len(run.committed_epochs())
            run.wait_for(lambda d=done: len(run.committed_epochs()) > d
                         and _driver_of(launcher) is not None, f"an epoch before kill {kill}")
            killed.append(_kill_driver_tree(launcher))
            _wait(lambda: not _zombie_children(launcher), "the launcher to reap its orphans",
                  timeout=30)
        done = len(run.committed_epochs())
        run.wait_for(lambda: len(run.committed_epochs()) > done, "an epoch after the kills")
        _wait(lambda: not _zombie_children(launcher), "no zombie", timeout=30)
        # seen from outside its namespace, the job runs (its pids are looked up in it)
        seen = json.loads(run.command("checkpoints", str(ck), "--json").stdout)
        assert seen["status"] == "running", seen["status"]
        token = _driver_of(launcher).environ()[JOB_TOKEN_ENV]
        launcher.kill()  # the whole job: PID 1 dies, the kernel kills its namespace
        assert run.proc.wait(timeout=60) != 0
        _wait(lambda: not job_processes(token), "the namespace's processes to end", 30)
        # read once nothing of the job is alive: an epoch may commit until the kill lands
        epochs_before = run.committed_epochs()
    finally:
        run.close()
    assert len(set(killed)) == DRIVER_TREE_KILLS
    failures = [e for e in _history(ck) if e["event"] == "failure"]
    assert [(e["kind"], e["action"]) for e in failures] == [("process", "restart")] * (
        DRIVER_TREE_KILLS)
    assert not any("FencedError" in e["cause"] for e in failures)

    marker = tmp_path / "fired.json"
    switches = {  # what once armed a SIGKILL of the driver's tree and switched the commit path
        "EXACTLY_FAULT": "after_intent", "EXACTLY_FAULT_MARKER": str(marker),
        "EXACTLY_FAULT_ACTION": "kill", "EXACTLY_COMMIT_PATH": "sink-runner"}
    again = SupervisedRun("datagen_job.py", ck, {**env, "JOB_MAX_ROWS": "1000", **switches},
                          log=tmp_path / "run2.log", wrap=PID_NAMESPACE, name_checkpoint=False)
    try:
        again.wait_for(lambda: ids_in(out) >= rows, "every row in the output")
        pid_1 = psutil.Process(again.proc.pid).children()[0]
        pid_1.send_signal(signal.SIGTERM)  # `docker stop`: a graceful stop, exit 0
        assert again.wait(timeout=180) == 0, again.output()[-3000:]
    finally:
        again.close()
    assert again.status().state == "stopped"
    assert not marker.exists(), marker.read_text()
    assert _history(ck)[-1]["kind"] == "lost-run"  # nothing failed after it
    assert "LostRun" in again.output() and "recorded in the restart history" in again.output()
    lost = [e for e in _history(ck) if e.get("kind") == "lost-run"]
    assert len(lost) == 1, _history(ck)
    assert lost[0]["run"] == failures[0]["run"]  # the run that was lost, not the new one
    assert lost[0]["last_epoch"] == epochs_before[-1]
    in_flight = lost[0]["epoch_in_flight"]
    assert in_flight is None or in_flight == epochs_before[-1] + 1
    view = json.loads(again.command("checkpoints", str(ck), "--json").stdout)
    assert view["counts"]["restarts"] == DRIVER_TREE_KILLS + 1  # and the lost run
    assert [e["kind"] for e in view["restarts"] if e["event"] == "failure"] == [
        *["process"] * DRIVER_TREE_KILLS, "lost-run"]
    assert view["status"] == "stopped"
    audit_rows(out, rows)


def test_killing_only_the_launcher_stops_its_driver_commands_reach_the_driver_meanwhile_and_a_new_run_waits_for_it(  # noqa: E501
        tmp_path):
    """The launcher alone is SIGKILLed (its terminal closed, a bad ``kill``): its driver
    notices within half a second, records it, and stops as ``exactly stop`` would (the busy
    epoch in flight commits, no later one starts), taking its Spark processes with it.
    Meanwhile the job is still the driver's: ``cancel`` and ``stop`` reach it, and a second
    ``exactly run`` waits for it instead of being fenced by it, continues from the stopped
    epoch and drains. Every id is in the output once."""
    rows, ck, out = 3000, tmp_path / "ck", tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "0", "JOB_MAX_ROWS": "150",
           "JOB_SLOW_MS": "3000", "JOB_INTERVAL": "500ms"}

    # 1. the launcher dies; `exactly cancel` reaches its driver, which ends with its tree
    # epochs of 6 s or more: the cancel arrives while the driver still stops gracefully
    first = SupervisedRun("datagen_job.py", ck, {**env, "JOB_SLOW_MS": "6000"},
                          log=tmp_path / "run1.log")
    try:
        first.wait_for(lambda: len(first.committed_epochs()) >= 1, "a first epoch")
        first.wait_for(lambda: _in_flight(ck), "the next epoch in flight")
        driver = psutil.Process(first.status().driver.pid)
        token = driver.environ()[JOB_TOKEN_ENV]
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=30)
        cancelled = first.command("cancel", str(ck), "--timeout", "2min")
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert "cancel: done: cancelled" in cancelled.stdout
        driver.wait(timeout=60)
        _wait(lambda: not job_processes(token), "the driver's processes to end", 30)
    finally:
        first.close()
    assert first.status().state == "cancelled"
    assert [e["kind"] for e in _history(ck)] == ["launcher"]

    # 2. a launcher dies with an epoch in flight; `exactly stop` reaches the orphan, a new
    # `exactly run` waits for it to stop, then resumes and drains
    second = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run2.log")
    third = None
    try:
        before = len(second.committed_epochs())  # the epoch the cancel aborted is replayed
        second.wait_for(lambda: len(second.committed_epochs()) > before, "an epoch committed")
        second.wait_for(lambda: _in_flight(ck), "the next epoch in flight")
        orphan = psutil.Process(second.status().driver.pid)
        in_flight = max(batch_numbers(str(ck), "offsets"))
        os.kill(second.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        second.proc.wait(timeout=30)
        # fast epochs of up to 1000 rows: the drain takes the rest in a few
        third = SupervisedRun("datagen_job.py", ck, {**env, "JOB_SLOW_MS": "0",
                                                     "JOB_MAX_ROWS": "1000"},
                              log=tmp_path / "run3.log")
        stopped = second.command("stop", str(ck), "--timeout", "2min")
        orphan.wait(timeout=120)
        print(f"the orphaned driver ended {time.monotonic() - killed_at:.1f} s after its "
              "launcher")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        # the busy epoch committed, no later one started: a graceful stop
        assert batch_numbers(str(ck), "offsets")[-1] == in_flight
        assert batch_numbers(str(ck), "commits")[-1] == in_flight
        named = re.search(r"after epoch (\w+)", stopped.stdout)
        assert named is not None and named.group(1) == str(in_flight), stopped.stdout
        last = in_flight
        third.wait_for(lambda: len(third.committed_epochs()) > last + 1, "the new run's epoch")
        drained = third.command("stop", "--drain", str(ck))
        assert drained.returncode == 0, drained.stderr
        assert third.wait(timeout=180) == 0, third.output()[-3000:]
    finally:
        second.close()
        if third is not None:
            third.close()
    assert "outlived its launcher" in third.output() and "waiting for it" in third.output()
    assert [e["kind"] for e in _history(ck)] == ["launcher", "launcher"]
    audit_rows(out, rows)


def test_an_error_in_build_fails_the_job_at_once_with_its_root_cause_unless_marked_transient(
        tmp_path):
    """``build(spark)`` raises ``exactly.TransientError`` once: the launcher restarts the
    driver and records the cause. Then it raises a Spark analysis error (a column that does
    not exist): not restarted, exit 3, the root cause and the line of the job file as the
    last line, in the restart history and in job.json."""
    ck = tmp_path / "ck"
    env = {"JOB_OUT": str(tmp_path / "out"),
           "JOB_TRANSIENT_MARKER": str(tmp_path / "transient-raised")}
    run = SupervisedRun("build_fails_job.py", ck, env, "--restart-strategy", "fixed-delay",
                        "--restart-option", "attempts=3", "--restart-option", "delay=0s",
                        log=tmp_path / "run.log")
    assert run.wait(timeout=240) == 3, run.output()[-3000:]
    last = run.output().strip().splitlines()[-1]
    assert last.startswith("exactly run: job failed: JobBuildError: build(spark) of "), last
    assert "SQLSTATE" not in last, last
    assert "no_such_column" in last and "build_fails_job.py:" in last, last
    assert "not restarted" in last, last
    transient, fatal = [e for e in run.history() if e["event"] == "failure"]
    assert (transient["kind"], transient["action"]) == ("process", "restart")
    assert "TransientError: the reference service is not up yet" in transient["cause"]
    assert (fatal["kind"], fatal["action"], fatal["fatal"]) == ("build", "give-up", True)
    assert "no_such_column" in fatal["cause"]
    assert run.status().state == "failed" and "no_such_column" in run.status().detail
