"""The leader lease of ``exactly run --ha`` on S3 (S3Proxy): two standbys racing for one
lease, each through its own S3 client, never both win.

Every term is taken by creating its own file with ``If-None-Match: *``, which S3Proxy 4
decides atomically (its ``If-Match`` is a check then a write, :mod:`exactly.testing.s3_server`:
a lease taken by ``If-Match`` on a shared object let both standbys win an expired lease in
41 of 50 races, measured before terms became files of their own). Clocks are injected; S3's
LastModified is whole seconds, which the margins allow for."""

from __future__ import annotations

import pytest

from exactly.checkpoint.leader import TERMS, LeaderLease
from exactly.checkpoint.store import S3LogStore
from exactly.procs import ProcessId
from exactly.testing.lease_race import LeaseRace
from exactly.testing.nemesis.clock import JumpingClock

pytestmark = pytest.mark.server

#: races per test: the issue asks for at least 50
RACES = 50


@pytest.mark.parametrize("lease", ["first", "expired"])
def test_two_standbys_racing_for_one_free_lease_on_s3_exactly_one_wins_every_time(
        s3_bucket, lease):
    """As tests/unit/test_leader_lease.py's race, with S3's conditional PUT
    (``If-None-Match: *`` on the next term's file) deciding, for a first lease and for
    host-old's expired one."""
    clock = JumpingClock(5.0)
    for n in range(RACES):
        uri = f"s3://{s3_bucket}/race-{n}/exactly-job"
        store = S3LogStore(uri)
        old = None
        if lease == "expired":
            old = LeaderLease(store, 1.0).try_acquire("host-old", ProcessId("host-old", 7, 1),
                                                      "run-old", "job.py")
        term_file = f"{TERMS}/{(1 if old is None else 2):012d}.json"
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
            [(winner, term_file, True), (1 - winner, term_file, False)]), f"race {n}"
