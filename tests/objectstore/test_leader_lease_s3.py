"""The leader lease of ``exactly run --ha`` on S3 (S3Proxy): two standbys racing for one
lease, each through its own S3 client, never both win -- where S3Proxy can tell.

S3Proxy 4.0.0 makes ``If-None-Match: *`` atomic but not ``If-Match`` (a check, then a
write: :mod:`exactly.testing.s3_server`), so only the race for a first lease (a create) is
decided by the server as AWS S3 decides it; the race for an expired lease (a swap naming
the version both standbys read) lets both through on S3Proxy -- 41 of 50 races, measured --
and is kept as an expected failure that says so. Clocks are injected; S3's LastModified is
whole seconds, which the margins allow for."""

from __future__ import annotations

import pytest

from exactly.checkpoint.leader import LEADER, LeaderLease
from exactly.checkpoint.store import S3LogStore
from exactly.procs import ProcessId
from exactly.testing.lease_race import LeaseRace
from exactly.testing.nemesis.clock import JumpingClock

pytestmark = pytest.mark.server

#: races per test: the issue asks for at least 50
RACES = 50

S3PROXY_IF_MATCH = pytest.mark.xfail(
    strict=True, reason="S3Proxy's If-Match is a check then a write, not a compare-and-swap "
    "(exactly.testing.s3_server): both standbys win an expired lease on it; AWS S3 decides "
    "If-Match atomically")


@pytest.mark.parametrize("lease", ["first", pytest.param("expired", marks=S3PROXY_IF_MATCH)])
def test_two_standbys_racing_for_one_free_lease_on_s3_exactly_one_wins_every_time(
        s3_bucket, lease):
    """As tests/unit/test_leader_lease.py's race, with S3's conditional PUT deciding:
    ``If-None-Match: *`` for a first lease, ``If-Match`` on the version both standbys read
    for host-old's expired one."""
    clock = JumpingClock(5.0)
    for n in range(RACES):
        uri = f"s3://{s3_bucket}/race-{n}/exactly-job"
        store = S3LogStore(uri)
        old = None
        if lease == "expired":
            old = LeaderLease(store, 1.0).try_acquire("host-old", ProcessId("host-old", 7, 1),
                                                      "run-old", "job.py")
        found = store.read_versioned(LEADER)
        version = found[1] if found else None
        race = LeaseRace(racers=2)
        outcome = race.run([LeaderLease(race.store(S3LogStore, uri), 15.0, clock=clock)
                            for _ in range(2)])
        assert len(outcome.winners()) == 1, f"race {n}: {outcome.takeovers}"
        [winner] = outcome.winners()
        took = outcome.takeovers[winner]
        if old is None:
            assert took.why == "" and took.term.generation == 1
        else:
            assert took.why == "expired" and took.previous == old.term
            assert took.term.generation == 2
        assert took.term.host == f"host-{winner}"
        assert LeaderLease(store).current() == took.term, f"race {n}: not the winner's term"
        assert sorted((s.racer, s.token, s.won) for s in outcome.swaps) == sorted(
            [(winner, version, True), (1 - winner, version, False)]), f"race {n}"
