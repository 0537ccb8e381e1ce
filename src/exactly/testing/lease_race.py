"""Standbys racing for one leader lease (:mod:`exactly.checkpoint.leader`), on any LogStore.

A race left to the scheduler is mostly no race: one thread reads, swaps and is done before
the other reads, and the compare-and-swap is never put to the test. :class:`LeaseRace`
makes every race a real one: each racer's store is its LogStore class with a meeting
point before the creation of a term file (``ha/terms/<generation>.json``), so every racer
has read the same lease and judged it free before any of them writes. The store's
create-if-absent alone then decides who wins (a hard link on a directory, a PUT
``If-None-Match: *`` on S3); the losers' creates are refused.

::

    race = LeaseRace(racers=2)
    outcome = race.run([LeaderLease(race.store(LocalLogStore, directory), 15.0, clock=clock)
                        for _ in range(2)])
    assert len(outcome.winners()) == 1
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from exactly.checkpoint.leader import TERMS, LeaderLease, Takeover
from exactly.checkpoint.store import LogStore
from exactly.procs import ProcessId

S = TypeVar("S", bound=LogStore)


@dataclass
class SwapSeen:
    """One creation of a term file in a race: by which racer, which file, won."""

    racer: int
    token: str | None
    won: bool


@dataclass
class RaceOutcome:
    """What each racer's ``try_acquire`` returned (by racer index) and every swap."""

    takeovers: list[Takeover | None]
    swaps: list[SwapSeen] = field(default_factory=list)

    def winners(self) -> list[int]:
        """The racers that got a term."""
        return [i for i, took in enumerate(self.takeovers) if took is not None]


class LeaseRace:
    """A race of ``racers`` threads, each taking the lease through its own store; each
    racer's first swap of the lease waits (up to ``timeout`` seconds) for every other's."""

    def __init__(self, racers: int = 2, *, timeout: float = 30.0) -> None:
        self.racers = racers
        self.timeout = timeout
        self._barrier = threading.Barrier(racers)
        self._lock = threading.Lock()
        self._met: set[int] = set()
        self._racer = threading.local()
        self._swaps: list[SwapSeen] = []

    def store(self, cls: type[S], *args: Any, **kwargs: Any) -> S:
        """An instance of a subclass of ``cls`` (built with ``args``) whose swaps of the
        lease meet the other racers' first."""
        race = self

        class Racing(cls):  # type: ignore[valid-type,misc]
            def create(self, name: str, data: bytes) -> bool:
                if not name.startswith(TERMS + "/"):
                    return bool(super().create(name, data))
                race._meet()
                won = bool(super().create(name, data))
                race._seen(name, won)
                return won

        Racing.__name__ = f"Racing{cls.__name__}"
        return cast(S, Racing(*args, **kwargs))

    def run(self, leases: Sequence[LeaderLease], job: str = "job.py") -> RaceOutcome:
        """Start one thread per lease at once; racer ``i`` is host ``host-<i>`` (a launcher
        on another host than this one) taking the lease for run ``run-<i>``. An error of a
        racer is raised here once every thread ended."""
        if len(leases) != self.racers:
            raise ValueError(f"{len(leases)} leases for {self.racers} racers")
        takeovers: list[Takeover | None] = [None] * self.racers
        errors: list[BaseException] = []

        def racer(i: int) -> None:
            self._racer.index = i
            try:
                takeovers[i] = leases[i].try_acquire(
                    f"host-{i}", ProcessId(f"host-{i}", 1000 + i, 1), f"run-{i}", job)
            except BaseException as exc:
                errors.append(exc)
                self._barrier.abort()  # the others do not wait for a racer that failed

        threads = [threading.Thread(target=racer, args=(i,), name=f"lease-racer-{i}")
                   for i in range(self.racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(self.timeout * 2)
        if errors:
            raise errors[0]
        if any(thread.is_alive() for thread in threads):
            raise TimeoutError(f"a lease racer still ran after {self.timeout * 2:g}s")
        return RaceOutcome(takeovers, list(self._swaps))

    def _meet(self) -> None:
        me = threading.get_ident()
        with self._lock:
            first = me not in self._met
            self._met.add(me)
        if first:
            self._barrier.wait(self.timeout)

    def _seen(self, token: str | None, won: bool) -> None:
        with self._lock:
            self._swaps.append(SwapSeen(getattr(self._racer, "index", -1), token, won))


__all__ = ["LeaseRace", "RaceOutcome", "SwapSeen"]
