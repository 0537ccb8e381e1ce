"""``exactly upgrade``: a running job moves to a new job file through a savepoint in a warm
driver, a new job failing in its first epochs rolls back to the old one from the same
savepoint, a restore the new job cannot take is refused before the running job is touched,
and later restarts run the new file -- every id exactly once in the output."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from supervised import EXACTLY, JOBS, SupervisedRun, audit_rows, ids_in

from exactly.audit import data_files, file_ids


def _versions_since(out: Path, since: float) -> set[object]:
    """The ``version`` values of the output files written after ``since`` (None: a file of
    the old job, without the column)."""
    found: set[object] = set()
    for path in data_files(out):
        if path.stat().st_mtime <= since:
            continue
        table = pq.read_table(path)
        if "version" not in table.column_names:
            found.add(None)
        else:
            found.update(table.column("version").to_pylist())
    return found


def _every_row_then_stop(run: SupervisedRun, out: Path, rows: int) -> None:
    """Wait for all ``rows`` in ``out``, then ``exactly stop``: the run ends with 0."""
    run.wait_for(lambda: ids_in(out) >= rows, "every row in the output", timeout=240)
    stopped = run.command("stop", str(run.checkpoint))
    status = Path(run.checkpoint) / "exactly-job" / "job.json"
    assert stopped.returncode == 0, (  # with what the run said and its job.json, to explain
        f"{stopped.stderr}\n--- job.json:\n"
        f"{status.read_text() if status.exists() else '(none)'}\n--- the run's output:\n"
        f"{run.output()[-4000:]}")
    assert run.wait() == 0, run.output()[-3000:]


@pytest.mark.chaos
def test_an_upgrade_rolls_back_a_failing_job_then_moves_to_a_working_one_that_restarts_as_itself(
        tmp_path):
    """One run: (1) an upgrade to a job that fails at its first epoch is rolled back: the
    old job runs again from the upgrade's savepoint (exit 3, "rolled back"); (2) an upgrade
    to a working job is done (exit 0): its rows carry its column, job.json names it; (3) its
    driver tree SIGKILLed, the restart runs the new job file. Every id once (the input
    outlasts the test, however slow the machine: an idle input confirms no upgrade)."""
    out = tmp_path / "out"
    broken = tmp_path / "broken-release"
    env = {"JOB_OUT": str(out), "JOB_ROWS": "10000000", "JOB_RATE": "300",
           "JOB_INTERVAL": "1s", "JOB_UPGRADE_FAIL_FILE": str(broken)}
    checkpoint = tmp_path / "ck"
    run = SupervisedRun("datagen_job.py", checkpoint, env, "--restart-strategy",
                        "fixed-delay", "--restart-option", "attempts=3",
                        "--restart-option", "delay=1s", log=tmp_path / "run.log")
    new_job = str(JOBS / "upgraded_job.py")
    try:
        run.wait_for(run.spare_ready, "the old job's warm spare", timeout=150)

        # (1) a broken release: rolled back to the old job file from the same savepoint
        broken.touch()
        rolled = run.command("upgrade", str(checkpoint), new_job)
        assert rolled.returncode == 3, rolled.stdout + rolled.stderr
        assert "rolled back" in rolled.stdout and "injected failure" in rolled.stdout, \
            rolled.stdout
        failures = [e for e in run.history() if e["event"] == "failure"]
        assert [(e["kind"], e["action"]) for e in failures][-1] == ("upgrade", "rollback"), \
            failures
        after_rollback = time.time()
        before = ids_in(out)
        run.wait_for(lambda: ids_in(out) > before + 300, "epochs of the rolled-back job")
        assert run.status().job == "datagen_job.py"
        assert _versions_since(out, after_rollback) == {None}  # the old job's rows

        # (2) the fixed release: upgraded
        broken.unlink()
        upgraded = run.command("upgrade", str(checkpoint), new_job)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert "upgraded to" in upgraded.stdout, upgraded.stdout
        assert run.status().job == "upgraded_job.py"
        report = run.command("checkpoints", str(checkpoint))
        assert "upgraded_job.py" in report.stdout, report.stdout

        # (3) a crash after the upgrade: the restart runs the new job file
        run.wait_for(lambda: run.status().state == "running", "the new job running")
        killed = run.kill_driver_tree()
        run.wait_for(lambda: run.status().driver is not None
                     and run.status().driver.pid != killed
                     and run.status().state == "running", "the restarted driver")
        after_kill = time.time()
        before = ids_in(out)
        run.wait_for(lambda: ids_in(out) > before + 600, "epochs of the restarted driver")
        stopped = run.command("stop", str(checkpoint))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0, run.output()[-3000:]
        assert _versions_since(out, after_kill) == {2}
    finally:
        run.close()
    ids = file_ids(out)[0]  # the generator's ids 0.. in order: every one up to the last, once
    audit_rows(out, int(ids.max()) + 1)
    kinds = [e["kind"] for e in run.history() if e["event"] == "failure"]
    assert kinds == ["query", "upgrade", "process"], run.history()


@pytest.mark.slow  # CI budget: the upgrade's path and its rollback are in the test above;
# this one proves the check before the stop
def test_an_upgrade_whose_restore_would_be_refused_leaves_the_running_job_untouched(tmp_path):
    """A new job reading two sources cannot resume the savepoint's one: the upgrade is
    refused by the check in the new job's driver, before the running job is stopped (the
    same driver, the same query, epochs going on); a job file that does not exist is a
    usage error of the command."""
    out = tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": "100000", "JOB_RATE": "300", "JOB_INTERVAL": "1s"}
    checkpoint = tmp_path / "ck"
    run = SupervisedRun("datagen_job.py", checkpoint, env, "--spare-driver", "off",
                        log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: run.status() is not None and run.status().state == "running"
                     and ids_in(out) > 0, "a committed epoch", timeout=150)
        driver = run.status().driver.pid
        query = (checkpoint / "metadata").read_text()
        refused = run.command("upgrade", str(checkpoint), str(JOBS / "two_sources_job.py"))
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "refused" in refused.stdout and "source" in refused.stdout, refused.stdout
        assert "not touched" in refused.stdout
        epochs = len(run.committed_epochs())
        run.wait_for(lambda: len(run.committed_epochs()) > epochs + 2, "epochs going on")
        assert run.status().driver.pid == driver and run.status().state == "running"
        assert (checkpoint / "metadata").read_text() == query
        missing = run.command("upgrade", str(checkpoint), str(tmp_path / "nope.py"))
        assert missing.returncode == 2 and "nope.py" in missing.stderr
        stopped = run.command("stop", str(checkpoint))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0
    finally:
        run.close()


@pytest.mark.slow  # CI budget: the rollback's path is in the default test; this one proves
# the crash points of the restore inside an upgrade
@pytest.mark.chaos
def test_a_new_driver_killed_in_its_restore_rolls_back_over_the_half_written_checkpoint(
        tmp_path):
    """The new job's driver tree is SIGKILLed at ``restore.state`` (the savepoint's state
    written into the checkpoint, the restore not recorded): the launcher rolls back, the
    old job restores the same savepoint over what the killed one left. Every id once."""
    rows = 9_000
    out = tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "300",
           "JOB_INTERVAL": "1s"}
    checkpoint = tmp_path / "ck"
    run = SupervisedRun("datagen_job.py", checkpoint, env, "--fault", "restore.state",
                        log=tmp_path / "run.log")
    try:
        run.wait_for(run.spare_ready, "the old job's warm spare", timeout=150)
        rolled = run.command("upgrade", str(checkpoint), str(JOBS / "upgraded_job.py"))
        assert rolled.returncode == 3 and "rolled back" in rolled.stdout, \
            rolled.stdout + rolled.stderr
        assert "killed by SIGKILL" in rolled.stdout, rolled.stdout
        assert run.status().job == "datagen_job.py"
        _every_row_then_stop(run, out, rows)
    finally:
        run.close()
    audit_rows(out, rows)


@pytest.mark.slow  # as above
@pytest.mark.chaos
def test_a_launcher_killed_in_an_upgrade_leaves_a_checkpoint_only_its_restore_starts_on(
        tmp_path):
    """The whole ``exactly run`` tree (launcher, drivers, spares) is SIGKILLed while the new
    job's driver stands at ``restore.state``: a plain ``exactly run`` on the checkpoint
    refuses to start on the half-replaced checkpoint and names the savepoint; ``exactly run
    NEW_JOB -s SAVEPOINT`` finishes the restore and the job goes on. Every id once."""
    rows = 9_000
    out = tmp_path / "out"
    hold = tmp_path / "hold-the-restore"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "300",
           "JOB_INTERVAL": "1s"}
    checkpoint = tmp_path / "ck"
    new_job = str(JOBS / "upgraded_job.py")
    run = SupervisedRun("datagen_job.py", checkpoint, env, "--fault", "restore.state",
                        "--fault-action", f"pause:{hold}", log=tmp_path / "run.log")
    hold.touch()
    try:
        run.wait_for(lambda: run.status() is not None and run.status().state == "running"
                     and ids_in(out) > 0, "a committed epoch", timeout=150)
        upgrade = subprocess.Popen([*EXACTLY, "upgrade", str(checkpoint), new_job],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        run.wait_for(lambda: Path(f"{hold}.waiting").exists(), "the new driver at "
                     "restore.state", timeout=150)
    finally:
        run.close()  # SIGKILLs the launcher's whole tree; checks nothing survives
    upgrade.kill()
    upgrade.wait()
    hold.unlink()
    marker = json.loads((checkpoint / "exactly-job" / "restore.json").read_text())
    assert marker["state"] == "in-progress", marker
    savepoint = marker["savepoint"]

    plain = SupervisedRun("datagen_job.py", checkpoint, env, log=tmp_path / "plain.log")
    try:
        assert plain.wait(timeout=180) == 3, plain.output()[-3000:]
    finally:
        plain.close()
    assert "unfinished restore" in plain.output() and f"-s {savepoint}" in plain.output()

    finish = SupervisedRun("upgraded_job.py", checkpoint, env, "-s", savepoint,
                           log=tmp_path / "finish.log")
    try:
        _every_row_then_stop(finish, out, rows)
    finally:
        finish.close()
    audit_rows(out, rows)
