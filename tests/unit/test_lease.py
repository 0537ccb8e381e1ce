import os
import socket

import pytest

from exactly.errors import FencedError
from exactly.procs import ProcessId, driver_identity
from exactly.protocol.lease import Lease


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_run_keeps_its_lease_and_a_new_run_of_the_same_driver_takes_it_over(tmp_path):
    me = driver_identity()
    lease = Lease(tmp_path)
    assert lease.acquire("run-1", me) is True
    assert lease.acquire("run-1", me) is False
    assert lease.acquire("run-2", me) is True  # query restarted inside one application
    assert lease.current().generation == 2
    assert lease.verify("run-2") == 2
    with pytest.raises(FencedError):
        lease.verify("run-1")


def test_a_holder_on_another_host_counts_as_alive_until_the_lease_goes_stale(tmp_path):
    clock = Clock()
    lease = Lease(tmp_path, stale_after=60, clock=clock)
    lease.acquire("run-a", ProcessId("other-host", 42, 7))
    clock.now += 59
    with pytest.raises(FencedError, match="run-a holds it"):
        lease.acquire("run-b", ProcessId(socket.gethostname(), os.getpid(), 1))
    clock.now += 2
    assert lease.acquire("run-b", ProcessId(socket.gethostname(), os.getpid(), 1)) is True


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path):
    lease = Lease(tmp_path)
    lease.acquire("run-a", ProcessId(socket.gethostname(), 4_000_000, 1))
    assert lease.acquire("run-b", driver_identity()) is True
