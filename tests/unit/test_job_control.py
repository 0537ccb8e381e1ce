"""The job contract, the control channel, the job lock and the restart history (no Spark)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exactly.checkpoint.control import ControlChannel, NoRunningJob
from exactly.checkpoint.location import job_dir
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.status import JobStatus, claim_job
from exactly.errors import ConfigError, FencedError
from exactly.ops.job import load_job_file
from exactly.ops.supervisor import is_fatal
from exactly.procs import ProcessId, current_process


def _dead_process() -> ProcessId:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    me = current_process()
    return ProcessId(me.host, child.pid, 1)


def test_a_command_to_a_checkpoint_without_a_live_job_is_refused_and_sends_nothing(tmp_path):
    channel = ControlChannel(tmp_path / "ck")
    with pytest.raises(NoRunningJob, match="no running job on checkpoint"):
        channel.send("stop")
    claim_job(job_dir(tmp_path / "ck"), JobStatus("r1", _dead_process(), "running"))
    with pytest.raises(NoRunningJob):
        channel.send("stop")
    assert channel.store.list("control/requests") == []


def test_requests_are_answered_once_oldest_first(tmp_path):
    claim_job(job_dir(tmp_path), JobStatus("r1", current_process(), "running"))
    channel = ControlChannel(tmp_path)
    first = channel.send("stop", drain=True)
    second = channel.send("cancel")
    assert [r.id for r in channel.pending()] == [first.id, second.id]
    assert channel.pending()[0].params == {"drain": True}
    channel.answer(first, "done", "stopped after epoch 4", last_epoch=4)
    assert [r.id for r in channel.pending()] == [second.id]
    answer = channel.wait_answer(first, timeout=1)
    assert answer is not None and answer["last_epoch"] == 4


def test_an_unknown_action_is_refused(tmp_path):
    claim_job(job_dir(tmp_path), JobStatus("r1", current_process(), "running"))
    with pytest.raises(ConfigError, match="unknown control action"):
        ControlChannel(tmp_path).send("pause")


def test_a_second_launcher_on_a_live_job_is_fenced_but_a_dead_ones_job_is_taken_over(
        tmp_path):
    directory = job_dir(tmp_path)
    other_live = ProcessId(current_process().host, os.getppid(), _start_ticks(os.getppid()))
    claim_job(directory, JobStatus("r1", other_live, "running"))
    with pytest.raises(FencedError, match="already run by `exactly run`"):
        claim_job(directory, JobStatus("r2", current_process(), "starting"))
    JobStatus("r3", _dead_process(), "running").write(directory)  # a launcher that died
    claim_job(directory, JobStatus("r4", current_process(), "starting"))  # takes over
    assert JobStatus.read(directory).run_id == "r4"


def _start_ticks(pid: int) -> int:
    from exactly.procs import _stat

    stat = _stat(pid)
    assert stat is not None
    return stat[2]


def test_history_feeds_only_this_runs_counted_failures_to_the_strategy(tmp_path):
    old = RestartHistory(tmp_path, "old-run")
    old.append("failure", kind="query", cause="x", action="restart")
    history = RestartHistory(tmp_path, "run")
    history.append("failure", kind="checkpoint-timeout", cause="t", action="tolerated")
    history.append("failure", kind="query", cause="q", action="restart")
    history.append("recovered", recovery_s=1.0)
    with open(history.path, "a") as f:
        f.write('{"event": "failure", "run": "run", "at": 1')  # torn by a crash
    assert len(history.counted_failure_times()) == 1
    assert history.restarts() == 2


def test_a_job_file_without_build_names_the_fix(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"defines no build\(spark\) function"):
        load_job_file(job)
    job.write_text("import nonexistent_module_xyz\n")
    with pytest.raises(ConfigError, match="failed to import: ModuleNotFoundError"):
        load_job_file(job)
    with pytest.raises(ConfigError, match="does not exist"):
        load_job_file(tmp_path / "missing.py")


@pytest.mark.parametrize(("text", "fatal"), [
    ("Traceback (most recent call last):\nexactly.errors.FencedError: fenced off", True),
    ("exactly.errors.ConfigError: exactly.files sink: set option path", True),
    ("Traceback (most recent call last):\nRuntimeError: injected UDF failure", False),
    ("psycopg.OperationalError: connection refused", False),
])
def test_only_failures_a_restart_cannot_fix_are_fatal(text, fatal):
    assert is_fatal(text) is fatal


def test_requests_answered_without_a_driver_are_all_answered_and_the_oldest_decides(tmp_path):
    """Between restarts, or by a new HA leader before its driver starts: every pending stop
    and cancel gets its answer (none waits in vain or stays queued for a later run); a
    savepoint pending leaves them all to the next driver, which answers them in order."""
    from exactly.ops.launcher import answer_without_driver

    channel = ControlChannel(tmp_path)
    stop = channel.post("stop", drain=False)
    cancel = channel.post("cancel")
    assert answer_without_driver(channel, "no driver was running") == "stopped"
    assert channel.wait_answer(stop, 1)["detail"] == (
        "stop: no driver was running; nothing was in flight")
    assert "the job had already stopped" in channel.wait_answer(cancel, 1)["detail"]
    assert channel.pending() == []
    savepoint = channel.post("savepoint")
    late_stop = channel.post("stop", drain=False)
    assert answer_without_driver(channel, "no driver was running") is None
    assert [r.id for r in channel.pending()] == [savepoint.id, late_stop.id]


def test_a_drain_sent_while_no_driver_runs_waits_for_the_next_driver(tmp_path):
    """``exactly stop --drain`` during a restart's wait or an HA failover is not answered
    as a plain stop (which would end the job with its input undrained): a drain needs a
    driver to run the input through the job, so it and every request after it stay
    pending for the next driver."""
    from exactly.ops.launcher import answer_without_driver

    channel = ControlChannel(tmp_path)
    drain = channel.post("stop", drain=True)
    cancel = channel.post("cancel")
    assert answer_without_driver(channel, "no driver was running") is None
    assert [r.id for r in channel.pending()] == [drain.id, cancel.id]


def test_a_stop_read_only_after_its_run_ended_is_answered_for_that_run_not_left_queued(tmp_path):
    """A stop sent while its run stops by itself (its launcher died) can land after the run's
    last look at its requests: the command answers it for the ended run, with its last
    epoch, instead of timing out and leaving it queued for a later run. A request sent to no
    run in particular still stays queued for the next one."""
    from exactly.checkpoint.status import update_status

    directory = job_dir(tmp_path)
    claim_job(directory, JobStatus("r1", current_process(), "stopping", last_epoch=7))
    channel = ControlChannel(tmp_path)
    stop = channel.send("stop")
    savepoint = channel.send("savepoint")
    assert stop.to_run == "r1"
    update_status(directory, state="stopped")  # the run ended without reading them
    answer = channel.wait_answer(stop, timeout=5)
    assert answer is not None and answer["status"] == "done", answer
    assert answer["detail"] == "the job had already stopped (after epoch 7); nothing was in flight"
    assert answer["last_epoch"] == 7 and answer["answered_by"] == "command"
    refused = channel.wait_answer(savepoint, timeout=5)
    assert refused is not None and refused["status"] == "refused", refused
    assert "before it could take the savepoint" in refused["detail"]
    assert channel.pending() == []
    queued = channel.post("stop")  # sent to no run (a driver's own request)
    assert channel.wait_answer(queued, timeout=1) is None
    assert [r.id for r in channel.pending()] == [queued.id]


def test_a_command_waiting_while_a_cancel_deletes_the_checkpoint_writes_nothing_into_it(
        tmp_path):
    """A cancel with delete_on_cancellation: the driver answers, marks its status, then
    deletes the whole checkpoint, answers included. A command still waiting for its answer
    (it looked just before the answer was written) reads the status before the checkpoint is
    gone: it must not answer for the ended run, which would bring a deleted checkpoint back
    (an ``answers`` directory), but report the checkpoint deleted."""
    import shutil
    import threading

    from exactly.checkpoint.status import DELETING_DETAIL, update_status

    ck = tmp_path / "ck"
    directory = job_dir(ck)
    claim_job(directory, JobStatus("r1", current_process(), "running", last_epoch=1))
    channel = ControlChannel(ck)
    cancel = channel.send("cancel")
    # the driver's end, with its answer already deleted and the rest still going
    update_status(directory, state="cancelled", detail=DELETING_DETAIL)
    deleted = threading.Timer(0.5, shutil.rmtree, args=(ck,))
    deleted.start()
    try:
        assert channel.wait_answer(cancel, timeout=10, poll=0.05) is None
    finally:
        deleted.join()
    assert not ck.exists() and not channel.exists()


@pytest.mark.parametrize("ha", [False, True])
def test_a_new_run_answers_a_stop_sent_to_the_ended_run_before_it_and_goes_on(tmp_path, ha):
    """The run that ended did not read the stop, and a new ``exactly run`` took the job
    before the command noticed: the new driver answers it for the ended run and is not
    stopped by it. An HA leader acts on it instead: the previous leader's run did not end,
    it failed over, and a stop sent during a failover is meant for the new leader."""
    from exactly.config import CheckpointConfig
    from exactly.ops.job import Job
    from exactly.ops.supervisor import Supervisor

    directory = job_dir(tmp_path)
    claim_job(directory, JobStatus("r1", current_process(), "stopping", last_epoch=3))
    channel = ControlChannel(tmp_path)
    old = channel.send("stop")
    claim_job(directory, JobStatus("r2", current_process(), "starting"))  # mine: taken over
    mine = channel.send("savepoint")
    job = Job(None, "exactly.files", path=str(tmp_path / "out"),  # type: ignore[arg-type]
              checkpoint=CheckpointConfig(storage=str(tmp_path)))
    supervisor = Supervisor(job, run_id="r2", ha=ha)
    if ha:
        assert [r.id for r in supervisor._open_requests()] == [old.id, mine.id]
        return
    assert [r.id for r in supervisor._open_requests()] == [mine.id]
    answer = channel.wait_answer(old, timeout=1)
    assert answer is not None and answer["status"] == "done", answer
    assert "sent to run r1; run r2 goes on" in answer["detail"], answer["detail"]
