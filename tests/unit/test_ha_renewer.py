"""The leader side of ``exactly run --ha`` (exactly.ops.ha.LeaseRenewer and the launcher's
Fence) on a directory: a leader loses its fence -- which SIGKILLs its driver's processes
and keeps a new driver from starting -- when another launcher takes its lease, or when it
cannot renew for its renew deadline (renewals that fail, or hang); renewals that fail for
less than the deadline cost nothing. Short intervals (renewal every 0.05 s)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time

import psutil
import pytest

from exactly.checkpoint.leader import TERMS, LeaderLease, LeaderState, Member, Members
from exactly.checkpoint.store import LocalLogStore
from exactly.errors import ConfigError
from exactly.ops.ha import HaSettings, LeaseRenewer
from exactly.ops.launcher import Fence
from exactly.procs import JOB_TOKEN_ENV, ProcessId, new_job_token
from exactly.testing.nemesis.clock import JumpingClock

#: seconds any wait for something the renewer does may take before the test fails
PATIENCE = 20.0


class UnreliableStore(LocalLogStore):
    """A directory whose writes of the leader's term fail (OSError, as an unreachable store)
    while ``failures_left`` > 0, or hang while ``hang`` is set; counts what they did."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.failures_left = 0.0
        self.failed = 0
        self.renewed_after_failing = 0
        self.hang = threading.Event()
        self.released = threading.Event()
        self._lock = threading.Lock()

    def write(self, name: str, data: bytes) -> None:
        renewal = name.startswith(TERMS + "/")  # a renewal rewrites its term's file
        if renewal:
            if self.hang.is_set():
                self.released.wait(PATIENCE * 2)
            with self._lock:
                if self.failures_left > 0:
                    self.failures_left -= 1
                    self.failed += 1
                    raise OSError(errno.EHOSTUNREACH, "store unreachable")
        super().write(name, data)
        if renewal and self.failed:
            with self._lock:
                self.renewed_after_failing += 1


def leader(store: LocalLogStore, ha: HaSettings) -> tuple[LeaderLease, LeaderState]:
    lease = LeaderLease(store, ha.lease_s)
    took = lease.try_acquire("host-a", ProcessId("host-a", 7, 1), "run-a", "job.py")
    assert took is not None
    return lease, took.term


def renewer(store: LocalLogStore, ha: HaSettings, fence: Fence) -> LeaseRenewer:
    lease, term = leader(store, ha)
    member = Member("host-a", term.launcher, "leader", "job.py", "run-a", ha.lease_s)
    keeper = LeaseRenewer(lease, term, ha, fence, Members(store), member)
    keeper.start()
    return keeper


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def driver(token: str) -> subprocess.Popen:
    """A stand-in for a driver process: carries ``token`` as exactly.procs marks a job's."""
    return subprocess.Popen(["sleep", "60"], env={**os.environ, JOB_TOKEN_ENV: token},
                            start_new_session=True)


def started_driver(fence: Fence) -> subprocess.Popen:
    """A stand-in driver started under ``fence`` (a new token, accepted by the fence)."""
    token = new_job_token()
    assert fence.starting(token)
    return driver(token)


def test_the_fence_is_lost_and_the_driver_killed_when_another_launcher_takes_the_lease(
        tmp_path):
    store = LocalLogStore(tmp_path)
    ha = HaSettings(lease_s=1.0, renew_s=0.05, renew_deadline_s=0.5)
    fence = Fence()
    running = started_driver(fence)
    keeper = renewer(store, ha, fence)
    try:
        first = keeper.term
        wait_until(lambda: keeper.term.renewed_at > first.renewed_at, "a renewal")
        # host-b's clock is a minute ahead: host-a's lease looks expired to it
        took = LeaderLease(store, 1.0, clock=JumpingClock(60.0)).try_acquire(
            "host-b", ProcessId("host-b", 8, 1), "run-b", "job.py")
        assert took is not None and took.term.generation == 2
        assert fence.lost.wait(PATIENCE)
        keeper.join(PATIENCE)
        assert not keeper.is_alive()  # it renews no more
    finally:
        keeper.stop()
        running.kill()
    assert running.wait(PATIENCE) == -signal.SIGKILL
    assert keeper.taken_by == "host-b"
    assert fence.cause == ("LeadershipLost: the leader on host host-a lost its lease (term "
                           "1): host host-b took it (term 2); it killed its driver so that it "
                           "commits nothing more")
    assert LeaderLease(store).current() == took.term  # never written by host-a again
    assert fence.starting(new_job_token()) is False


def test_the_fence_is_lost_with_the_cause_when_renewals_fail_for_longer_than_the_deadline(
        tmp_path):
    store = UnreliableStore(tmp_path)
    ha = HaSettings(lease_s=1.0, renew_s=0.05, renew_deadline_s=0.3)
    fence = Fence()
    keeper = renewer(store, ha, fence)
    try:
        store.failures_left = float("inf")
        assert fence.lost.wait(PATIENCE)
    finally:
        keeper.stop()
    assert store.failed >= 1
    assert fence.cause.startswith("LeadershipLost: the leader on host host-a renewed its lease "
                                  "last ")
    assert "deadline 0.3s" in fence.cause
    assert "last renewal error: OSError(113, 'store unreachable')" in fence.cause
    assert keeper.taken_by is None
    assert LeaderLease(store).current().generation == 1  # nobody took it: only unreachable


def test_renewals_that_fail_for_less_than_the_deadline_keep_the_fence(tmp_path):
    store = UnreliableStore(tmp_path)
    ha = HaSettings(lease_s=5.0, renew_s=0.05, renew_deadline_s=4.0)
    fence = Fence()
    keeper = renewer(store, ha, fence)
    try:
        store.failures_left = 3  # about 0.15 s without a renewal, far below 4 s
        wait_until(lambda: store.failed == 3 and store.renewed_after_failing >= 2,
                   "3 failed renewals, then 2 successful ones")
        assert not fence.lost.is_set(), fence.cause
        assert keeper.is_alive()
        assert LeaderLease(store).holds(keeper.term)
    finally:
        keeper.stop()
    assert not fence.lost.is_set()


def test_the_fence_is_lost_at_the_deadline_while_a_renewal_hangs(tmp_path):
    """A renewal that does not answer (a partitioned store: TCP timeouts, S3 retries) must
    not hold the driver past the deadline: by the time it answered, a standby may have
    taken the lease over and started its own driver."""
    store = UnreliableStore(tmp_path)
    ha = HaSettings(lease_s=1.0, renew_s=0.05, renew_deadline_s=0.3)
    fence = Fence()
    running = started_driver(fence)
    keeper = renewer(store, ha, fence)
    try:
        store.hang.set()  # every renewal from now on waits for `released` (40 s)
        lost = fence.lost.wait(PATIENCE)
        store.released.set()
        assert lost, "the fence was kept while the renewal hung"
    finally:
        store.released.set()
        keeper.stop()
        running.kill()
    assert running.wait(PATIENCE) == -signal.SIGKILL
    assert fence.cause.startswith("LeadershipLost: the leader on host host-a renewed its lease "
                                  "last ")
    assert "deadline 0.3s" in fence.cause and "last renewal error" not in fence.cause


def test_losing_the_fence_kills_every_process_with_the_driver_token_and_refuses_a_new_driver():
    fence = Fence()
    token = new_job_token()
    assert fence.starting(token)
    # a driver, and one that forked a child of its own (which inherits the token)
    drivers = [driver(token), subprocess.Popen(
        ["sh", "-c", "sleep 60 & exec sleep 60"], env={**os.environ, JOB_TOKEN_ENV: token},
        start_new_session=True)]
    bystander = subprocess.Popen(["sleep", "60"])  # another token-less process: spared
    try:
        wait_until(lambda: psutil.Process(drivers[1].pid).children(), "the forked child")
        [child] = psutil.Process(drivers[1].pid).children()
        fence.lose("LeadershipLost: host host-b took the lease")
        assert [p.wait(PATIENCE) for p in drivers] == [-signal.SIGKILL] * 2
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        for p in drivers:
            p.kill()
    assert fence.lost.is_set() and fence.cause == "LeadershipLost: host host-b took the lease"
    assert fence.starting(new_job_token()) is False
    fence.lose("a second cause")  # the first cause stays
    assert fence.cause == "LeadershipLost: host host-b took the lease"


@pytest.mark.parametrize(("renew", "deadline", "lease"), [(3, 10, 10), (3, 3, 15), (0, 1, 2)])
def test_settings_where_the_deadline_is_not_between_renewal_and_lease_are_refused(
        renew, deadline, lease):
    with pytest.raises(ConfigError, match="must hold"):
        HaSettings(lease_s=lease, renew_s=renew, renew_deadline_s=deadline).check()
