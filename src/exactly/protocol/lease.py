"""Fencing: at most one live instance of a query may commit to a sink.

The lease is a small JSON file beside the sink's commit log, changed only under an
exclusive ``flock``. It names the run (Spark's ``runId``, new at every start) and the
driver process that holds it. A run takes the lease on its first commit when the lease
is free, held by a dead driver, or held by its own driver (a restart inside one Spark
application). A run whose driver finds the lease held by another *live* driver gets
:class:`~exactly.errors.FencedError` and never commits. Liveness of a holder on this
host is exact (pid plus kernel start time); a holder on another host counts as alive
until ``stale_after`` seconds pass without a commit renewing the lease.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from exactly.errors import CorruptFileError, FencedError
from exactly.fsutil import atomic_write_json, file_lock, read_json, require_fields
from exactly.procs import ProcessId

DEFAULT_STALE_AFTER_S = 600.0

#: the safe repair of a damaged lease.json
LEASE_REPAIR = ("delete it once no driver of this query runs (the holder's pid, if still "
                "readable, is in the file): the next start takes a fresh lease. Deleting it "
                "cannot let two drivers commit: a driver whose lease vanished is fenced off at "
                "its next commit and commits nothing")


@dataclass(frozen=True)
class LeaseState:
    run_id: str
    generation: int
    holder: ProcessId
    acquired_at: float
    renewed_at: float

    @classmethod
    def from_json(cls, data: dict) -> LeaseState:
        return cls(data["run_id"], int(data["generation"]), ProcessId.from_json(data["holder"]),
                   float(data["acquired_at"]), float(data["renewed_at"]))

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "generation": self.generation,
                "holder": self.holder.to_json(), "acquired_at": self.acquired_at,
                "renewed_at": self.renewed_at, "token": uuid.uuid4().hex}


class Lease:
    """The lease file of one sink commit log directory."""

    def __init__(self, directory: str | Path, *, stale_after: float = DEFAULT_STALE_AFTER_S,
                 clock=time.time) -> None:
        self.directory = Path(directory)
        self.stale_after = stale_after
        self._clock = clock

    @property
    def path(self) -> Path:
        return self.directory / "lease.json"

    def current(self) -> LeaseState | None:
        """The lease as written, or ``None`` when nobody holds it.

        Raises
        ------
        CorruptFileError
            When ``lease.json`` is damaged (names it and the repair: delete it).
        """
        data = read_json(self.path, repair=LEASE_REPAIR)
        if data is None:
            return None
        require_fields(data, self.path, ("run_id", "generation", "holder", "acquired_at",
                                         "renewed_at"), LEASE_REPAIR)
        try:
            return LeaseState.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(str(self.path), f"has a malformed field ({exc!r})",
                                   LEASE_REPAIR) from None

    def acquire(self, run_id: str, me: ProcessId) -> bool:
        """Take or renew the lease for ``run_id``; True when this call took it (a new run).

        Raises
        ------
        FencedError
            When another live driver holds the lease for a different run.
        """
        with file_lock(self.directory / "lease.lock"):
            now = self._clock()
            cur = self.current()
            if cur is not None and cur.run_id == run_id:
                if now - cur.renewed_at > self.stale_after / 10:
                    self._write(LeaseState(run_id, cur.generation, cur.holder, cur.acquired_at,
                                           now))
                return False
            if cur is not None and cur.holder != me and self._alive(cur, now):
                raise self._fenced(run_id, cur)
            generation = cur.generation + 1 if cur else 1
            self._write(LeaseState(run_id, generation, me, now, now))
            return True

    def refuse_if_held(self, me: ProcessId) -> None:
        """Before a start: raise FencedError when another live driver holds the lease, so a
        second instance fails on fencing first, not on what its (older) checkpoint lacks."""
        with file_lock(self.directory / "lease.lock"):
            cur = self.current()
            if cur is not None and cur.holder != me and self._alive(cur, self._clock()):
                raise self._fenced("not started yet", cur)

    def verify(self, run_id: str) -> int:
        """Check that ``run_id`` still holds the lease (step 2b); returns the generation."""
        with file_lock(self.directory / "lease.lock"):
            cur = self.current()
            if cur is None or cur.run_id != run_id:
                raise self._fenced(run_id, cur)
            return cur.generation

    def _alive(self, state: LeaseState, now: float) -> bool:
        alive = state.holder.is_alive()
        if alive is None:  # another host: trust the lease until it goes stale
            return now - state.renewed_at < self.stale_after
        return alive

    def _write(self, state: LeaseState) -> None:
        atomic_write_json(self.path, state.to_json())

    @staticmethod
    def _fenced(run_id: str, holder: LeaseState | None) -> FencedError:
        if holder is None:
            who = "nobody holds it any more (the lease file was removed)"
        else:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.acquired_at))
            who = (f"run {holder.run_id} holds it (generation {holder.generation}, driver pid "
                   f"{holder.holder.pid} on {holder.holder.host}, since {started})")
        me = run_id if " " in run_id else f"run {run_id}"
        return FencedError(
            f"this instance ({me}) is fenced off: {who}. Another instance of the same "
            "query is live; stop it before starting this one, or give this query its own "
            "checkpoint location and sink path. This instance committed nothing."
        )
