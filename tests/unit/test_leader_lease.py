"""The leader lease of ``exactly run --ha`` (exactly.checkpoint.leader) on a directory: who
may take it and when, that two standbys racing for it never both win, that a term which lost
it never writes it again; and the member records that keep two live launchers from sharing a
host id. Clocks are injected: nothing here waits for a lease to expire."""

from __future__ import annotations

import subprocess

import pytest

from exactly.checkpoint.leader import LEADER, TERMS, LeaderLease, Member, Members, boot_id
from exactly.checkpoint.store import LocalLogStore
from exactly.errors import ConfigError, ExactlyError
from exactly.procs import HOST_ID_ENV, ProcessId, current_process, host_identity, process_id
from exactly.testing.lease_race import LeaseRace
from exactly.testing.nemesis.clock import JumpingClock

#: races per test: the issue asks for at least 50
RACES = 60


def other_host(name: str, pid: int = 7) -> ProcessId:
    """A launcher on another host: its liveness is unknown here (judged by the lease's age)."""
    return ProcessId(name, pid, 1)


@pytest.mark.parametrize("lease", ["first", "expired"])
def test_two_standbys_racing_for_one_free_lease_exactly_one_wins_every_time(tmp_path, lease):
    """Each race: both standbys read the lease -- none yet (``first``), or host-old's 1 s
    lease last written 5 s ago by the standbys' clock (``expired``) -- judge it free, and
    create the same next term's file at once. Create-if-absent lets exactly one through;
    the other gets None. The lease holds the winner's term."""
    clock = JumpingClock(5.0)
    for n in range(RACES):
        store = LocalLogStore(tmp_path / f"race-{n}")
        old = None
        if lease == "expired":
            old = LeaderLease(store, 1.0).try_acquire("host-old", other_host("host-old"),
                                                      "run-old", "job.py")
        term_file = f"{TERMS}/{(1 if old is None else 2):012d}.json"
        written = store.modified(f"{TERMS}/{1:012d}.json")
        race = LeaseRace(racers=2)
        outcome = race.run([LeaderLease(race.store(LocalLogStore, store.root), 15.0,
                                        clock=clock) for _ in range(2)])
        assert len(outcome.winners()) == 1, f"race {n}: {outcome.takeovers}"
        [winner] = outcome.winners()
        loser = 1 - winner
        took = outcome.takeovers[winner]
        assert outcome.takeovers[loser] is None
        if old is None:
            assert took.why == "" and took.previous is None and took.term.generation == 1
        else:
            assert took.why == "expired" and took.previous == old.term
            assert took.expired_at == written + 1.0 and took.term.generation == 2
        assert (took.term.host, took.term.run_id) == (f"host-{winner}", f"run-{winner}")
        assert LeaderLease(store).current() == took.term, f"race {n}: not the winner's term"
        # both created the same term's file: the store's create-if-absent decided
        assert sorted((s.racer, s.token, s.won) for s in outcome.swaps) == sorted(
            [(winner, term_file, True), (loser, term_file, False)]), f"race {n}"


def test_a_live_leader_on_this_host_is_never_taken_however_old_its_lease(tmp_path):
    store = LocalLogStore(tmp_path)
    holder = subprocess.Popen(["sleep", "60"])
    try:
        first = LeaderLease(store, 15.0).try_acquire(host_identity(), process_id(holder.pid),
                                                     "run-a", "job.py")
        assert first is not None
        an_hour_later = LeaderLease(store, 15.0, clock=JumpingClock(3600.0))
        assert an_hour_later.try_acquire(host_identity(), current_process(), "run-b",
                                         "job.py") is None
        assert an_hour_later.current() == first.term
    finally:
        holder.kill()
        holder.wait()


def test_a_leader_on_this_host_whose_process_exited_is_taken_at_once_as_dead(tmp_path):
    store = LocalLogStore(tmp_path)
    holder = subprocess.Popen(["sleep", "60"])
    gone = process_id(holder.pid)
    first = LeaderLease(store, 15.0).try_acquire(host_identity(), gone, "run-a", "job.py")
    holder.kill()
    holder.wait()
    took = LeaderLease(store, 15.0).try_acquire(host_identity(), current_process(), "run-b",
                                                "job.py")  # the lease is fresh: no wait
    assert took is not None and took.why == "dead" and took.expired_at is None
    assert took.previous == first.term and took.term.generation == 2


@pytest.mark.parametrize("holder_clock", [-3600.0, 3600.0], ids=["behind", "ahead"])
def test_a_leader_on_another_host_is_taken_only_once_the_stores_write_time_is_lease_s_old(
        tmp_path, holder_clock):
    """The age runs from the store's write time of the term's file, never from the times
    the holder wrote into it (its clock an hour behind or ahead changes nothing)."""
    store = LocalLogStore(tmp_path)
    first = LeaderLease(store, 15.0, clock=JumpingClock(holder_clock)).try_acquire(
        "host-a", other_host("host-a"), "run-a", "job.py")
    written = store.modified(f"{TERMS}/{1:012d}.json")
    now = [written]
    standby = LeaderLease(store, 15.0, clock=lambda: now[0])
    for age in (0.0, 7.5, 14.999):
        now[0] = written + age
        assert standby.try_acquire("host-b", other_host("host-b"), "run-b", "job.py") is None
        assert standby.current() == first.term
    now[0] = written + 15.0
    took = standby.try_acquire("host-b", other_host("host-b"), "run-b", "job.py")
    assert took is not None and took.why == "expired" and took.previous == first.term
    assert took.expired_at == written + 15.0
    assert took.term.generation == 2 and took.term.acquired_at == written + 15.0


@pytest.mark.parametrize("how", ["ended", "released"])
def test_an_ended_or_released_lease_is_free_at_once_while_its_leader_lives(tmp_path, how):
    store = LocalLogStore(tmp_path)
    lease = LeaderLease(store, 15.0)
    first = lease.try_acquire(host_identity(), current_process(), "run-a", "job.py")
    assert (lease.end(first.term, "stopped", "exactly stop") if how == "ended"
            else lease.release(first.term)) is True
    took = LeaderLease(store, 15.0).try_acquire("host-b", other_host("host-b"), "run-b",
                                                "job.py")
    assert took is not None and took.why == how and took.expired_at is None
    assert took.term.generation == 2 and took.previous.run_id == "run-a"
    if how == "ended":
        assert took.previous.ended["state"] == "stopped"


def test_a_term_that_lost_the_lease_cannot_renew_end_or_release_it_nor_overwrite_the_new_one(
        tmp_path):
    store = LocalLogStore(tmp_path)
    old = LeaderLease(store, 15.0)
    first = old.try_acquire("host-a", other_host("host-a"), "run-a", "job.py").term
    assert old.renew(first) is not None  # while it holds the lease
    new = LeaderLease(store, 15.0, clock=JumpingClock(20.0))
    second = new.try_acquire("host-b", other_host("host-b"), "run-b", "job.py").term
    before = store.read(LEADER)  # every write holds a new random token: any write shows
    assert old.renew(first) is None
    assert old.end(first, "failed", "too late") is False
    assert old.release(first) is False
    assert not old.holds(first) and old.holds(second)
    assert store.read(LEADER) == before
    assert new.current() == second
    ended = new.renew(second)
    assert ended is not None and new.end(ended, "stopped") is True
    assert new.renew(ended) is None  # an ended term is renewed no more
    assert new.current().ended["state"] == "stopped"


@pytest.mark.parametrize("damage", [b"{not json", b"[]", b'{"host": "host-a"}'],
                         ids=["not-json", "not-an-object", "fields-missing"])
def test_a_damaged_lease_is_an_error_naming_the_file_and_its_repair_never_a_free_lease(
        tmp_path, damage):
    store = LocalLogStore(tmp_path)
    store.write(LEADER, damage)
    lease = LeaderLease(store, 15.0)
    for call in (lease.current,
                 lambda: lease.try_acquire("host-b", other_host("host-b"), "run-b", "job.py")):
        with pytest.raises(ExactlyError) as damaged:
            call()
        message = str(damaged.value)
        assert message.startswith(f"{tmp_path / 'ha' / 'leader.json'} is damaged")
        assert "delete it once no `exactly run --ha` of this job runs" in message
    assert store.read(LEADER) == damage


# -- members --------------------------------------------------------------------------------

def test_join_refuses_a_host_id_used_by_a_live_launcher_on_this_machine_and_takes_a_dead_ones(
        tmp_path, monkeypatch):
    monkeypatch.setenv(HOST_ID_ENV, "host-a")  # the test process and its sleep are host-a
    members = Members(LocalLogStore(tmp_path))
    other = subprocess.Popen(["sleep", "60"])
    try:
        members.beat(Member("host-a", process_id(other.pid), "leader", "job.py"))
        me = Member("host-a", current_process(), "standby", "job.py")
        with pytest.raises(ConfigError) as refused:
            members.join(me)
        message = str(refused.value)
        assert f"host id 'host-a' is already used by a live `exactly run --ha` (pid " \
               f"{other.pid}, leader) on this machine" in message
        assert "--host-id or EXACTLY_HOST_ID" in message
    finally:
        other.kill()
        other.wait()
    members.join(me)  # its process exited: the host id is free again
    assert [m.launcher for m in members.live()] == [me.launcher]


def test_join_refuses_a_host_id_of_a_fresh_launcher_on_another_machine_until_its_record_is_stale(
        tmp_path, monkeypatch):
    """Another machine (another boot id) with the same host id: its pid means nothing
    here (4,000,000 is no process on this machine), its fresh record is what counts."""
    monkeypatch.setenv(HOST_ID_ENV, "host-a")
    store = LocalLogStore(tmp_path)
    Members(store).beat(Member("host-a", ProcessId("host-a", 4_000_000, 1), "standby",
                               "job.py", lease_s=15.0, boot_id="another-boot"))
    written = store.modified("ha/members/host-a.json")
    now = [written + 14.9]
    members = Members(store, clock=lambda: now[0])
    me = Member("host-a", current_process(), "standby", "job.py")
    with pytest.raises(ConfigError, match=r"host id 'host-a' is already used by a live "
                       r"`exactly run --ha` \(pid 4000000, standby\) on another machine "
                       r"\(boot id another-boot\)"):
        members.join(me)
    now[0] = written + 15.0
    members.join(me)
    [record] = members.live()
    assert record.launcher == me.launcher and record.boot_id == boot_id()


def test_join_refuses_a_launcher_of_another_job_file_on_the_same_checkpoint(tmp_path):
    members = Members(LocalLogStore(tmp_path))
    members.beat(Member("host-a", other_host("host-a"), "leader", "orders_job.py"))
    with pytest.raises(ConfigError) as refused:
        members.join(Member("host-b", other_host("host-b"), "standby", "billing_job.py"))
    assert "the launcher on host host-a (pid 7) runs orders_job.py on this checkpoint, not " \
           "billing_job.py" in str(refused.value)
    assert [m.host for m in members.live()] == ["host-a"]


def test_live_members_are_those_written_within_their_own_lease_and_damaged_ones_are_skipped(
        tmp_path):
    store = LocalLogStore(tmp_path)
    Members(store).beat(Member("host-a", other_host("host-a"), "leader", lease_s=15.0))
    Members(store).beat(Member("host-b", other_host("host-b"), "standby", lease_s=60.0))
    store.write("ha/members/host-c.json", b"{torn")
    newest = max(store.modified(f"ha/members/{h}.json") for h in ("host-a", "host-b"))
    now = [newest]
    members = Members(store, clock=lambda: now[0])
    assert [m.host for m in members.live()] == ["host-a", "host-b"]
    now[0] = newest + 15.0
    assert [m.host for m in members.live()] == ["host-b"]
    now[0] = newest + 60.0
    assert members.live() == []


def test_leave_removes_only_the_record_of_its_own_launcher(tmp_path):
    store = LocalLogStore(tmp_path)
    members = Members(store)
    mine = Member("host-a", other_host("host-a", 1), "standby")
    members.beat(Member("host-a", other_host("host-a", 2), "standby"))  # took the id since
    members.leave(mine)
    assert [m.launcher.pid for m in members.live()] == [2]
    members.beat(mine)
    members.leave(mine)
    assert members.live() == []
