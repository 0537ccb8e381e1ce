import os
import socket

import pytest

from exactly.errors import FencedError
from exactly.procs import ProcessId, driver_identity
from exactly.protocol.lease import Lease
from exactly.testing.nemesis.clock import JumpingClock


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
    clock = JumpingClock()  # the age runs from the store's write time: real time plus jumps
    lease = Lease(tmp_path, stale_after=60, clock=clock)
    lease.acquire("run-a", ProcessId("other-host", 42, 7))
    clock.jump(58)
    with pytest.raises(FencedError, match="run-a holds it"):
        lease.acquire("run-b", ProcessId(socket.gethostname(), os.getpid(), 1))
    clock.jump(3)
    assert lease.acquire("run-b", ProcessId(socket.gethostname(), os.getpid(), 1)) is True


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path):
    lease = Lease(tmp_path)
    lease.acquire("run-a", ProcessId(socket.gethostname(), 4_000_000, 1))
    assert lease.acquire("run-b", driver_identity()) is True


def test_a_heartbeat_keeps_a_lease_on_another_host_alive_and_stops_once_it_is_lost(tmp_path):
    """The holder's heartbeat renews the lease while its process runs, so a driver on
    another host is refused for as long as that lasts; once another run holds the lease the
    heartbeat stops renewing."""
    import time as _time

    from exactly.protocol import lease

    holder = Lease(tmp_path, stale_after=1.5)  # a heartbeat every 0.5 s
    holder.acquire("run-a", ProcessId("host-a", 42, 7))
    holder.keep("run-a")
    _time.sleep(2.0)  # longer than stale_after: only the heartbeat keeps it fresh
    with pytest.raises(FencedError, match="run-a holds it"):
        Lease(tmp_path, stale_after=1.5).acquire("run-b", ProcessId("host-b", 43, 8))
    tmp_path.joinpath("lease.json").unlink()  # an operator removes it: the next start takes it
    assert Lease(tmp_path, stale_after=1.5).acquire("run-b", ProcessId("host-b", 43, 8))
    keeper = lease._KEEPERS[(str(holder.path), "run-a")]
    keeper.join(10.0)  # its next heartbeat finds run-b's lease: it renews nothing and ends
    assert not keeper.is_alive()
    assert holder.current().run_id == "run-b"
    assert holder.renew("run-a") is False


def test_an_intent_is_created_once_and_a_second_run_writing_it_is_fenced(tmp_path):
    from exactly.protocol.commitlog import CommitLog

    log = CommitLog(tmp_path)
    log.write_intent(3, "run-b", [])
    assert log.write_intent(3, "run-b", []).run_id == "run-b"  # its own: a retried call
    with pytest.raises(FencedError, match="the intent of epoch 3 was written by run run-b"):
        log.write_intent(3, "run-a", [])
    assert log.read_intent(3).run_id == "run-b"


def test_the_host_identity_can_be_named_so_two_drivers_on_one_machine_act_as_two_hosts(
        monkeypatch):
    from exactly.procs import HOST_ID_ENV, host_identity

    monkeypatch.setenv(HOST_ID_ENV, "host-b")
    assert host_identity() == "host-b"
    assert driver_identity().host == "host-b"
    assert ProcessId("host-a", os.getpid(), 1).is_alive() is None  # judged by lease age only


# -- a run that ends: its heartbeat stops and its lease is released ----------------------------
def _wait_until(condition, what: str, timeout: float = 10.0) -> None:
    import time as _time

    deadline = _time.monotonic() + timeout
    while not condition():
        assert _time.monotonic() < deadline, f"timed out waiting for {what}"
        _time.sleep(0.02)


def test_a_released_lease_is_free_for_the_next_run_and_fences_the_run_that_released_it(
        tmp_path):
    """Releasing is giving up, not deleting: the next run -- even of another live driver on
    this host, which a held lease would refuse -- takes it at once with the next generation
    and the admitted intent kept; the released run can neither renew, pass its intent check
    nor take the lease back."""
    me = driver_identity()
    from exactly.procs import process_id

    other = process_id(os.getppid())  # a live driver on this host, not this process
    lease = Lease(tmp_path)
    lease.acquire("run-a", other)
    lease.verify("run-a", {"epoch": 3, "handles": []})
    with pytest.raises(FencedError, match="run-a holds it"):
        lease.acquire("run-b", me)
    assert lease.release("run-b") is False  # not its lease: nothing written
    assert lease.current().released_at is None
    assert lease.release("run-a") is True
    assert lease.release("run-a") is False  # once
    assert lease.renew("run-a") is False
    with pytest.raises(FencedError, match=r"run run-a\) is fenced off: the run ended and released"):
        lease.verify("run-a", {"epoch": 4, "handles": []})
    with pytest.raises(FencedError, match="released"):
        lease.acquire("run-a", other)
    assert lease.live_holder(me) is None
    lease.refuse_if_held(me)  # a start is not refused
    assert lease.wait_free(me, timeout=0)
    assert lease.acquire("run-b", me) is True
    state = lease.current()
    assert (state.run_id, state.generation, state.released_at) == ("run-b", 2, None)
    assert state.pending == {"epoch": 3, "handles": []}  # for run-b's recovery


def test_ending_a_run_stops_its_heartbeat_before_returning_and_releases_its_lease(tmp_path):
    from exactly.protocol.lease import end_run, keepers

    lease = Lease(tmp_path, stale_after=2.0)  # a beat every 0.5 s
    lease.acquire("run-a", driver_identity())
    assert lease.keep("run-a") is True
    assert lease.keep("run-a") is False  # one heartbeat per lease and run
    [keeper] = keepers("run-a")
    _wait_until(lambda: lease.current().renewed_at > lease.current().acquired_at,
                "a heartbeat")
    assert end_run("run-a") == [str(tmp_path)]
    assert not keeper.is_alive() and keepers("run-a") == []
    released = lease.path.stat().st_mtime_ns
    import time as _time

    _time.sleep(1.2)  # more than two beats
    assert lease.path.stat().st_mtime_ns == released
    assert lease.current().released_at is not None
    assert end_run("run-a") == []  # again: nothing left to do


def test_a_heartbeat_in_another_process_ends_quietly_once_its_run_released_the_lease(
        tmp_path, caplog):
    """The heartbeat of a process that is never told the run ended (a sink-runner worker of
    Spark's) finds its lease released at its next beat: it writes nothing and ends, without
    the warning of a lost lease."""
    from exactly.protocol.lease import keepers

    lease = Lease(tmp_path, stale_after=2.0)
    lease.acquire("run-a", driver_identity())
    lease.keep("run-a")
    [keeper] = keepers("run-a")
    assert Lease(tmp_path).release("run-a")  # the driver, through its own Lease
    released = lease.path.stat().st_mtime_ns
    with caplog.at_level("INFO", logger="exactly.lease"):
        _wait_until(lambda: not keeper.is_alive(), "the heartbeat to end", timeout=5)
    assert lease.path.stat().st_mtime_ns == released
    assert "lease_heartbeat_ended" in caplog.text and "lease_lost" not in caplog.text
