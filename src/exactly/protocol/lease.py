"""Fencing: at most one live instance of a query may commit to a sink.

The lease is a small JSON file beside the sink's commit log (a directory or an ``s3://``
prefix), changed only by compare-and-swap (``flock`` on a directory, ``If-Match`` on S3).
It names the run (Spark's ``runId``, new at every start) and the
driver process that holds it. A run takes the lease on its first commit when the lease
is free, held by a dead driver, expired, or held by its own driver (a restart inside one
Spark application). A run whose driver finds the lease held by another *live* driver gets
:class:`~exactly.errors.FencedError` and never commits.

Liveness of a holder on this host is exact (pid plus kernel start time). A holder on
another host (see :func:`exactly.procs.host_identity`) is alive while its lease is younger
than ``stale_after`` seconds (option ``exactly.leaseStaleAfterSeconds``): the holder renews
it at every commit, at its intent check (step 2b), and from a heartbeat thread
(:class:`LeaseKeeper`, every ``stale_after / 4``) while its driver process runs. A driver
that stops renewing -- killed, partitioned away, a paused VM -- loses the lease to the next
driver ``stale_after`` seconds after its last renewal, and when it comes back it is fenced
at its next commit or intent: it commits nothing after the takeover. Two guards close the
remaining windows: a renewal or intent check finds another run's lease and fails, and
each epoch's intent is created only if absent (:meth:`CommitLog.write_intent`), so a
resumed zombie cannot replace the intent of the driver that took over.

The intent check (step 2b) and the intent are one decision: :meth:`Lease.verify` writes the
intent it admits into the lease (``pending``) by the same compare-and-swap that checks the
holder, and the intent file is written after. A run that takes the lease over finds there the
last intent its predecessor was admitted to write, and recovery writes that intent file if the
predecessor did not get to it (:meth:`Lease.pending_intent`), before it aborts orphans. So a
holder paused (or whose lease expired early) between its check and its intent file can never
decide an epoch whose pre-commits the new holder already aborted.

A run that ends -- its query stopped, failed or finished -- stops its heartbeats and releases
its lease (:func:`end_run`, :meth:`Lease.release`): the lease then records that the run gave
it up (``released_at``), so the next run of the query takes it at once, from any driver and
any host, instead of waiting until it goes stale or its driver process exits. A released
lease fences its run like a lost one: its renewals write nothing, and its intent check and
any later attempt of that run to take the lease again raise FencedError. Nothing else
changes: the generation and the admitted intent (``pending``) stay for the next holder.

Clocks: the age of a lease is measured from when the store last wrote ``lease.json`` (the
file's modification time; S3's ``LastModified``), never from a time the holder wrote into it,
so a holder's clock that jumps forward cannot keep its lease alive past ``stale_after`` and one
that jumps back cannot age it early. The clock of the driver judging the lease (``clock``)
counts: one ahead takes over early -- safe, the holder is fenced at its next check -- and one
behind waits that much longer. Hosts' clocks must agree with the store's to well within
``stale_after`` (NTP).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from exactly.checkpoint.store import is_remote, open_log_store
from exactly.errors import CorruptFileError, ExactlyError, FencedError
from exactly.fsutil import parse_json, require_fields
from exactly.logs import log_event
from exactly.procs import ProcessId

logger = logging.getLogger("exactly.lease")

DEFAULT_STALE_AFTER_S = 600.0
LEASE_FILE = "lease.json"
T = TypeVar("T")

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
    #: the last intent a holder was admitted to write (a commit-log intent record), kept
    #: across takeovers until the next admitted intent replaces it
    pending: dict | None = None
    #: when the run gave the lease up (its query ended, :meth:`Lease.release`); None while
    #: it holds it. A released lease is free for the next run and fences its own.
    released_at: float | None = None

    @property
    def released(self) -> bool:
        return self.released_at is not None

    @classmethod
    def from_json(cls, data: dict) -> LeaseState:
        pending = data.get("pending")
        if pending is not None and not isinstance(pending, dict):
            raise TypeError(f"pending is {type(pending).__name__}, not an intent record")
        released = data.get("released_at")
        return cls(data["run_id"], int(data["generation"]), ProcessId.from_json(data["holder"]),
                   float(data["acquired_at"]), float(data["renewed_at"]), pending,
                   None if released is None else float(released))

    def to_json(self) -> dict:
        value = {"run_id": self.run_id, "generation": self.generation,
                 "holder": self.holder.to_json(), "acquired_at": self.acquired_at,
                 "renewed_at": self.renewed_at, "token": uuid.uuid4().hex}
        if self.pending is not None:
            value["pending"] = self.pending
        if self.released_at is not None:
            value["released_at"] = self.released_at
        return value


def _encode(state: LeaseState) -> bytes:
    return json.dumps(state.to_json(), sort_keys=True, indent=1).encode()


class Lease:
    """The lease file of one sink commit log (a directory or an ``s3://`` prefix).

    Every change is a compare-and-swap of ``lease.json`` (:meth:`LogStore.swap`: ``flock``
    on a directory, ``If-Match`` on S3), retried when another writer changed it meanwhile,
    so two drivers deciding at once never both hold it."""

    def __init__(self, directory: str | Path, *, stale_after: float = DEFAULT_STALE_AFTER_S,
                 clock=time.time) -> None:
        self.store = open_log_store(directory)
        self.directory: Path | str = directory if is_remote(directory) else Path(directory)
        self.stale_after = stale_after
        self._clock = clock

    @property
    def path(self) -> Path | str:
        """``lease.json``: a Path in a directory, a URI on object storage."""
        where = self.store.describe(LEASE_FILE)
        return where if is_remote(where) else Path(where)

    def current(self) -> LeaseState | None:
        """The lease as written, or ``None`` when nobody holds it.

        Raises
        ------
        CorruptFileError
            When ``lease.json`` is damaged (names it and the repair: delete it).
        """
        found = self.store.read_versioned(LEASE_FILE)
        return None if found is None else self._parse(found[0])

    def _parse(self, data: bytes) -> LeaseState:
        where = self.store.describe(LEASE_FILE)
        value = parse_json(data, where, LEASE_REPAIR)
        require_fields(value, where, ("run_id", "generation", "holder", "acquired_at",
                                      "renewed_at"), LEASE_REPAIR)
        try:
            return LeaseState.from_json(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(where, f"has a malformed field ({exc!r})",
                                   LEASE_REPAIR) from None

    def _change(self, decide: Callable[[LeaseState | None, float], tuple[T, LeaseState | None]],
                ) -> T:
        """Read the lease, ``decide`` (the result and the new state, None: leave it), and
        swap the new state in unless someone changed the lease since; then decide again."""
        for _ in range(50):
            found = self.store.read_versioned(LEASE_FILE)
            cur = None if found is None else self._parse(found[0])
            result, new = decide(cur, self._clock())
            if new is None or self.store.swap(LEASE_FILE, _encode(new),
                                              None if found is None else found[1]):
                return result
        raise ExactlyError(f"{self.path}: the lease kept changing under 50 attempts to update "
                           "it; several drivers of one query are starting at once: stop all "
                           "but one")

    def acquire(self, run_id: str, me: ProcessId) -> bool:
        """Take or renew the lease for ``run_id``; True when this call took it (a new run).

        Raises
        ------
        FencedError
            When another live driver holds the lease for a different run.
        """
        def decide(cur: LeaseState | None, now: float) -> tuple[bool, LeaseState | None]:
            if cur is not None and cur.run_id == run_id:
                if cur.released:  # the run ended: it never commits again
                    raise self._fenced(run_id, cur)
                return False, self._renewed(cur, now)
            if cur is not None and cur.holder != me and self._alive(cur, now):
                raise self._fenced(run_id, cur)
            generation = cur.generation + 1 if cur else 1
            # the predecessor's admitted intent stays: recovery writes it if it is missing
            return True, LeaseState(run_id, generation, me, now, now,
                                    cur.pending if cur else None)

        return self._change(decide)

    def live_holder(self, me: ProcessId) -> LeaseState | None:
        """The lease when another live driver than ``me`` holds it (not released, not stale
        on another host, its process alive on this one); else None."""
        cur = self.current()
        if cur is not None and cur.holder != me and self._alive(cur, self._clock()):
            return cur
        return None

    def refuse_if_held(self, me: ProcessId) -> None:
        """Before a start: raise FencedError when another live driver holds the lease, so a
        second instance fails on fencing first, not on what its (older) checkpoint lacks."""
        cur = self.live_holder(me)
        if cur is not None:
            raise self._fenced("not started yet", cur)

    def wait_free(self, me: ProcessId, timeout: float, *, poll: float = 0.5) -> bool:
        """Wait up to ``timeout`` seconds until no other live driver holds the lease (its
        holder dies or its lease goes stale); True when free. For a driver that takes over
        from another host (``exactly run --ha``): the previous leader's driver may have
        renewed its sink lease shortly before it was stopped."""
        deadline = time.monotonic() + timeout
        told = False
        while True:
            cur = self.current()
            if cur is None or cur.holder == me or not self._alive(cur, self._clock()):
                return True
            if time.monotonic() >= deadline:
                return False
            if not told:
                log_event(logger, "lease_wait", logging.WARNING, lease=str(self.path),
                          holder_run=cur.run_id, holder_host=cur.holder.host,
                          stale_after_s=self.stale_after,
                          detail="another driver holds this sink's lease; waiting until it "
                                 "goes stale (a failover from another host)")
                told = True
            time.sleep(poll)

    def verify(self, run_id: str, intent: dict | None = None) -> int:
        """Check that ``run_id`` still holds the lease (step 2b), renewing it when it is
        older than ``stale_after / 10``; returns the generation. Raises FencedError when
        another run holds it or nobody does.

        With ``intent`` (the intent record about to be written), the check also records it
        in the lease, in the same compare-and-swap: a run that takes the lease over later
        finds it (:meth:`pending_intent`) even if this holder never writes the intent file.
        """
        def decide(cur: LeaseState | None, now: float) -> tuple[int, LeaseState | None]:
            if cur is None or cur.run_id != run_id or cur.released:
                raise self._fenced(run_id, cur)
            if intent is not None:
                return cur.generation, replace(cur, renewed_at=now, pending=intent)
            return cur.generation, self._renewed(cur, now)

        return self._change(decide)

    def pending_intent(self) -> dict | None:
        """The last intent record a holder of this lease was admitted to write (see
        :meth:`verify`), or None. Its file may be missing when that holder stopped (or was
        fenced) between its check and writing it: recovery writes it then."""
        cur = self.current()
        return None if cur is None else cur.pending

    def renew(self, run_id: str) -> bool:
        """Heartbeat: renew the lease if ``run_id`` still holds it; False when it does not
        (another run took it over, the run released it, or the file was removed)."""
        return self._heartbeat(run_id) == "renewed"

    def _heartbeat(self, run_id: str) -> str:
        """:meth:`renew`, saying why not: ``renewed``, ``released`` (the run gave the lease
        up: nothing is written) or ``lost`` (another run holds it, or nobody does)."""
        def decide(cur: LeaseState | None, now: float) -> tuple[str, LeaseState | None]:
            if cur is None or cur.run_id != run_id:
                return "lost", None  # never recreate a removed lease (or its directory)
            if cur.released:
                return "released", None
            return "renewed", replace(cur, renewed_at=now)

        return self._change(decide)

    def release(self, run_id: str) -> bool:
        """Give the lease up for ``run_id``, whose query ended: the next run takes it at once
        (from any driver, on any host), and ``run_id`` is fenced from now on -- its renewals
        write nothing, its intent check and any attempt to take the lease again raise
        FencedError. True when this call released it; False (and nothing written) when
        another run holds it, nobody does, or it was released already."""
        def decide(cur: LeaseState | None, now: float) -> tuple[bool, LeaseState | None]:
            if cur is None or cur.run_id != run_id or cur.released:
                return False, None
            return True, replace(cur, released_at=now)

        return self._change(decide)

    def _renewed(self, cur: LeaseState, now: float) -> LeaseState | None:
        """``cur`` renewed at ``now`` when it was renewed more than ``stale_after / 10`` ago
        (rarely a write), or ``now`` is before its renewal (this clock jumped back: the lease
        would otherwise go unrenewed for as long as the jump), else None."""
        if abs(now - cur.renewed_at) > self.stale_after / 10:
            return replace(cur, renewed_at=now)
        return None

    def _alive(self, state: LeaseState, now: float) -> bool:
        if state.released:  # its run ended and gave it up
            return False
        alive = state.holder.is_alive()
        if alive is None:  # another host: trust the lease until it goes stale
            return not self.is_stale(now)
        return alive

    def is_stale(self, now: float | None = None) -> bool:
        """True when ``lease.json`` was last written ``stale_after`` seconds or more before
        ``now`` (default: this lease's clock), or is gone. The store's write time is used,
        not the holder's ``renewed_at``: a holder's clock has no say in its lease's age."""
        written = self.store.modified(LEASE_FILE)
        if written is None:
            return True
        return (self._clock() if now is None else now) - written >= self.stale_after

    def keep(self, run_id: str) -> bool:
        """Renew the lease of ``run_id`` from a heartbeat thread of this process until the
        run ends (:func:`end_run`), releases or loses the lease, or the process ends (one
        thread per lease and run). True when this call started the thread."""
        key = (str(self.path), run_id)
        with _KEEPERS_LOCK:
            for gone in [k for k, kept in _KEEPERS.items() if not kept.is_alive()]:
                del _KEEPERS[gone]
            if key in _KEEPERS:
                return False
            _KEEPERS[key] = keeper = LeaseKeeper(self, run_id)
            keeper.start()
            return True

    @staticmethod
    def _fenced(run_id: str, holder: LeaseState | None) -> FencedError:
        if holder is None:
            who = "nobody holds it any more (the lease file was removed)"
        elif holder.released and holder.run_id == run_id:
            ended = time.strftime("%Y-%m-%d %H:%M:%S",
                                  time.localtime(holder.released_at or 0.0))
            return FencedError(
                f"this instance (run {run_id}) is fenced off: the run ended and released the "
                f"sink's lease at {ended} (its query was stopped or terminated); a run that "
                "ended never commits again. Start the query again: the new run takes the "
                "lease. This instance committed nothing after releasing it.")
        else:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.acquired_at))
            who = (f"run {holder.run_id} holds it (generation {holder.generation}, driver pid "
                   f"{holder.holder.pid} on {holder.holder.host}, since {started})")
        me = run_id if " " in run_id else f"run {run_id}"
        return FencedError(
            f"this instance ({me}) is fenced off: {who}. Another instance of the same "
            "query is live; stop it before starting this one, or give this query its own "
            "checkpoint location and sink path. (A driver that could not renew its lease for "
            "exactly.leaseStaleAfterSeconds -- paused, partitioned away -- loses it to the "
            "next one and ends here.) This instance committed nothing after losing the lease."
        )


#: (lease file, run) -> the heartbeat thread renewing it in this process
_KEEPERS: dict[tuple[str, str], LeaseKeeper] = {}
_KEEPERS_LOCK = threading.Lock()

#: how long :func:`end_run` waits for a heartbeat busy with a renewal (a slow store)
STOP_TIMEOUT_S = 30.0


def keepers(run_id: str | None = None) -> list[LeaseKeeper]:
    """The live heartbeat threads of this process (of ``run_id`` only, when given)."""
    with _KEEPERS_LOCK:
        return [k for (_, run), k in _KEEPERS.items()
                if k.is_alive() and (run_id is None or run == run_id)]


def end_run(run_id: str, *, release: bool = True) -> list[str]:
    """The run ``run_id`` ended (its query stopped, failed or finished): stop this process's
    heartbeats of its leases, wait until none is renewing any more, and (``release``) give
    those leases up (:meth:`Lease.release`), so the next run takes them at once. Returns the
    leases this call released (their directories or prefixes). Safe to call more than once,
    and for a run with no heartbeat here.

    A release that fails (storage unreachable) is logged: that lease then goes stale as if
    its driver had died. Fencing holds either way -- the run never commits again."""
    with _KEEPERS_LOCK:
        mine = [(key, k) for key, k in _KEEPERS.items() if key[1] == run_id]
    for _, keeper in mine:  # every caller waits (the query's stop and the listener race)
        keeper.stop()
    with _KEEPERS_LOCK:
        for key, keeper in mine:
            if _KEEPERS.get(key) is keeper:
                del _KEEPERS[key]
    released = []
    if release:
        for _, keeper in mine:
            if release_quietly(keeper.lease, run_id):
                released.append(str(keeper.lease.directory))
    return released


def release_quietly(lease: Lease, run_id: str) -> bool:
    """:meth:`Lease.release`, logging (WARNING) instead of raising when it fails."""
    try:
        done = lease.release(run_id)
    except Exception as exc:  # the lease goes stale instead: logged, never raised
        log_event(logger, "lease_release_failed", logging.WARNING, run_id=run_id,
                  lease=str(lease.path), error=repr(exc),
                  detail="the lease goes stale after exactly.leaseStaleAfterSeconds instead")
        return False
    if done:
        log_event(logger, "lease_released", run_id=run_id, lease=str(lease.path))
    return done


class LeaseKeeper(threading.Thread):
    """Renews one run's lease every ``stale_after / 4`` seconds (at least every 30 s, at most
    every 0.5 s) until the run ends (:meth:`stop`), its lease is released (by whichever
    process learnt that the run ended) or lost; a daemon thread, so it ends with its
    process. A failed renewal (a full disk, a storage outage) is logged and tried again."""

    def __init__(self, lease: Lease, run_id: str) -> None:
        super().__init__(name=f"exactly-lease-{run_id[:8]}", daemon=True)
        self.lease = lease
        self.run_id = run_id
        self.interval = min(30.0, max(0.5, lease.stale_after / 4))
        self.stopped = threading.Event()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Renew no more: returns once the thread ended (True), or after ``timeout`` seconds
        while a renewal it began still waits on the store (False; it renews nothing after)."""
        self.stopped.set()
        if self is not threading.current_thread() and self.ident is not None:
            self.join(timeout)
        return not self.is_alive()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                outcome = self.lease._heartbeat(self.run_id)
            except Exception as exc:  # keep trying: the lease goes stale only if this persists
                if not self.stopped.is_set():
                    log_event(logger, "lease_renewal_failed", logging.WARNING,
                              run_id=self.run_id, lease=str(self.lease.path), error=repr(exc))
                continue
            if outcome == "lost":
                log_event(logger, "lease_lost", logging.WARNING, run_id=self.run_id,
                          lease=str(self.lease.path),
                          detail="another run holds the lease: this run is fenced off "
                                 "and will commit nothing")
                return
            if outcome == "released":  # the run ended, told by another process
                log_event(logger, "lease_heartbeat_ended", run_id=self.run_id,
                          lease=str(self.lease.path))
                return


def stop_heartbeats(timeout: float = 10.0, *, keep: Collection[LeaseKeeper] = ()) -> int:
    """Stop every lease heartbeat thread of this process (:meth:`Lease.keep`) but those in
    ``keep``, and wait for them to end, without releasing the leases; returns how many there
    were. For a process that drives committers directly, with no query whose end would stop
    their heartbeats (the protocol's tests, :class:`exactly.testing.harness.ProtocolHarness`):
    they would otherwise go on renewing leases nobody uses any more for as long as the
    process lives."""
    with _KEEPERS_LOCK:
        keepers = [k for k in _KEEPERS.values() if k not in keep]
        for key in [key for key, k in _KEEPERS.items() if k not in keep]:
            del _KEEPERS[key]
    for keeper in keepers:
        keeper.stopped.set()
    for keeper in keepers:
        keeper.join(timeout)
    return len(keepers)
