"""What a new HA leader may overwrite and what it records: the job status of an earlier term
is taken over, a plain run's is not; a driver of a term that lost never overwrites the new
term's status; failovers do not count against the restart strategy and their recovery runs
from the lease's expiry; a new leader's query waits for a sink lease of the previous leader's
driver to go stale; a FencedError is restarted in a leader's driver only."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from exactly.checkpoint.location import job_dir
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.status import JobStatus, claim_job, update_status
from exactly.errors import FencedError
from exactly.ops.restart import FixedDelay
from exactly.procs import ProcessId, current_process
from exactly.protocol.lease import Lease
from exactly.testing.nemesis.clock import JumpingClock


def _live_other() -> ProcessId:
    from exactly.procs import _stat

    stat = _stat(os.getppid())
    assert stat is not None
    return ProcessId(current_process().host, os.getppid(), stat[2])


def test_a_new_leader_takes_over_the_status_of_an_earlier_term_but_never_a_plain_live_run(
        tmp_path):
    directory = job_dir(tmp_path)
    # a live launcher of term 1 (its host still looks alive: a fresh heartbeat, or a pid)
    claim_job(directory, JobStatus("term-1", _live_other(), "running", leader=1))
    with pytest.raises(FencedError):  # without the lease, nobody takes it
        claim_job(directory, JobStatus("x", current_process(), "starting"))
    with pytest.raises(FencedError):  # a lease of an older term does not either
        claim_job(directory, JobStatus("x", current_process(), "starting", leader=1),
                  leading=True)
    previous = claim_job(directory, JobStatus("term-2", current_process(), "starting",
                                              leader=2), leading=True)
    assert previous is not None and previous.run_id == "term-1"  # for the failover record
    assert JobStatus.read(directory).run_id == "term-2"
    # a live plain `exactly run` is never taken by an HA leader
    JobStatus("plain", _live_other(), "running").write(directory)
    with pytest.raises(FencedError):
        claim_job(directory, JobStatus("term-3", current_process(), "starting", leader=3),
                  leading=True)


def test_a_driver_of_a_term_that_lost_never_overwrites_the_new_terms_status(tmp_path):
    directory = job_dir(tmp_path)
    claim_job(directory, JobStatus("term-2", current_process(), "running", leader=2))
    update_status(directory, run_id="term-1", state="failed", detail="FencedError")
    assert JobStatus.read(directory).state == "running"
    update_status(directory, run_id="term-2", state="stopping")
    assert JobStatus.read(directory).state == "stopping"


def test_a_failover_does_not_count_against_the_strategy_and_recovery_runs_from_the_expiry(
        tmp_path):
    history = RestartHistory(tmp_path, "term-2")
    history.append("failure", kind="failover", action="failover", cause="Failover: ...",
                   since=time.time() - 20)
    history.append("failure", kind="process", action="restart", cause="ProcessFailure: x")
    assert len(history.counted_failure_times()) == 1
    assert history.restarts() == 1
    RestartHistory(tmp_path, "term-1").append("failure", kind="leadership",
                                              action="standby", cause="LeadershipLost: ...")
    assert RestartHistory(tmp_path, "term-1").counted_failure_times() == []


def test_the_first_epoch_after_a_failover_measures_recovery_from_the_lease_expiry(tmp_path):
    from exactly.ops.supervisor import Supervisor

    since = time.time() - 30
    history = RestartHistory(tmp_path / "exactly-job", "term-2")
    history.append("failure", kind="failover", action="failover", cause="Failover", since=since)
    supervisor = Supervisor.__new__(Supervisor)  # only the history is read
    supervisor.history = history
    assert supervisor._unrecovered_failure() == pytest.approx(since)


def test_a_new_leaders_query_waits_for_the_previous_drivers_sink_lease_to_go_stale(tmp_path):
    clock = JumpingClock()
    old = ProcessId("host-a", 42, 7)
    Lease(tmp_path, stale_after=15, clock=clock).acquire("old-run", old)
    lease = Lease(tmp_path, stale_after=15, clock=clock)
    me = ProcessId("host-b", 43, 8)
    assert lease.wait_free(me, timeout=0.3, poll=0.05) is False  # fresh: still held
    threading.Timer(0.2, clock.jump, args=(16,)).start()  # its lease goes stale meanwhile
    started = time.monotonic()
    assert lease.wait_free(me, timeout=10, poll=0.05) is True
    assert time.monotonic() - started < 5
    assert lease.acquire("new-run", me) is True


@pytest.mark.parametrize("ha", [False, True])
def test_a_fenced_query_fails_the_job_except_in_a_leaders_driver(tmp_path, ha):
    from exactly.ops.supervisor import JobFailedError, Supervisor

    supervisor = Supervisor.__new__(Supervisor)
    supervisor.ha = ha
    supervisor.history = RestartHistory(tmp_path, "run")
    supervisor._pending_failure_at = None
    supervisor.config = type("Config", (), {"tolerable_failed_checkpoints": 0})()
    supervisor._status = lambda state, detail="": None
    supervisor.strategy = FixedDelay(attempts=3, delay=0.0)
    supervisor.consecutive_failed = 0
    supervisor.rng = random.Random(1)
    supervisor._sleep = lambda s: None
    supervisor.poll_s = 0.01
    supervisor._peek_request = lambda: False
    cause = "FencedError: this instance (run r) is fenced off: run q holds it"
    if ha:
        supervisor._failure("query", cause, epoch_in_flight=False)
        [entry] = supervisor.history.entries()
        assert entry["action"] == "restart"
    else:
        with pytest.raises(JobFailedError, match="not restarted"):
            supervisor._failure("query", cause, epoch_in_flight=False)


def test_a_status_write_whose_run_was_taken_over_between_its_read_and_write_writes_nothing(
        tmp_path):
    """A driver paused after it read job.json and resumed after a new leader claimed it:
    its write is a compare-and-swap against what it read, so it finds the new run's status
    and leaves it alone (found by bench/failover.py's pause runs)."""
    from exactly.checkpoint.store import LocalLogStore

    class TakenOverMidway(LocalLogStore):
        taken = False

        def read_versioned(self, name):
            found = super().read_versioned(name)
            if name == "job.json" and not self.taken:  # the new leader claims right after
                self.taken = True
                JobStatus("term-2", current_process(), "running", leader=2).write(
                    LocalLogStore(self.root))
            return found

    directory = job_dir(tmp_path)
    JobStatus("term-1", current_process(), "running", leader=1).write(directory)
    update_status(TakenOverMidway(directory), run_id="term-1", state="failed")
    status = JobStatus.read(directory)
    assert (status.run_id, status.state) == ("term-2", "running")
