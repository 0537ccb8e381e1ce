"""The leader lease of ``exactly run --ha``: which launcher runs a job, and who stands by.

Several ``exactly run --ha`` launchers of one job (one per host) share its checkpoint. One of
them is the leader: it holds the newest **term** and runs the driver; the others are
standbys that watch the lease and take a new term once it is free.

Each term is a file of its own, ``exactly-job/ha/terms/<generation>.json``, created only if
absent (a hard link on a POSIX directory, a PUT ``If-None-Match: *`` on S3): of launchers
racing for one term, exactly one creates it, so two standbys never both win -- even on a
store whose ``If-Match`` is a check followed by a write rather than one atomic step (S3Proxy).
Only its leader writes a term's file afterwards (renewals, the end of the job, a release),
and a leader that finds a newer term has lost. ``exactly-job/ha/leader.json`` is a copy of
the newest term that commands and views read.

The lease is free when there is no term, when its job ended (``ended``: a standby then exits
instead of starting the job again), when its leader released it (a graceful handover), when
its leader's process is gone (a holder on this host, checked by pid and start time), or when
its term file was last written ``lease_s`` seconds ago or more (a holder on another host:
dead, paused or partitioned away). The age is measured from the store's own modification
time, never from a time the holder wrote: a holder whose clock runs ahead cannot keep its
lease alive longer. Hosts' clocks must agree with the store's to well within ``lease_s``
(NTP).

Each live launcher, leader or standby, also keeps a member record
(``exactly-job/ha/members/<host>.json``): the standbys a command or the dashboard shows, and
the check that two live launchers never share one host id (:meth:`Members.join`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from exactly.checkpoint.store import LogStore
from exactly.errors import ConfigError, ExactlyError
from exactly.procs import ProcessId

LEADER = "ha/leader.json"
TERMS = "ha/terms"
MEMBERS = "ha/members"
#: term files kept behind the newest (older ones are deleted when a term is taken)
KEEP_TERMS = 5

#: default seconds a leader's lease lasts without a renewal
DEFAULT_LEASE_S = 15.0
#: default seconds between two renewals by the leader
DEFAULT_RENEW_S = 3.0
#: default seconds a leader keeps running without a successful renewal before it kills its
#: driver (below the lease: it has stopped before a standby may take over)
DEFAULT_RENEW_DEADLINE_S = 10.0
#: default seconds between two looks of a standby at the lease
DEFAULT_STANDBY_POLL_S = 3.0


@dataclass(frozen=True)
class LeaderState:
    """``leader.json``: the launcher that runs the job, in which term (``generation``)."""

    host: str
    launcher: ProcessId
    run_id: str
    generation: int
    acquired_at: float
    renewed_at: float
    lease_s: float
    job: str = ""
    #: set when the job ended under this leader: ``{"state", "at", "detail"}``
    ended: dict[str, Any] | None = None
    #: the leader let the lease go without ending the job (SIGTERM: a handover)
    released: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["launcher"] = self.launcher.to_json()
        data["token"] = uuid.uuid4().hex  # every write differs: a swap sees every change
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LeaderState:
        ended = data.get("ended")
        return cls(str(data["host"]), ProcessId.from_json(data["launcher"]),
                   str(data["run_id"]), int(data["generation"]), float(data["acquired_at"]),
                   float(data["renewed_at"]), float(data["lease_s"]), str(data.get("job") or ""),
                   dict(ended) if isinstance(ended, dict) else None,
                   bool(data.get("released")))


@dataclass(frozen=True)
class Takeover:
    """What a launcher found when it took the lease: the term it now holds and the one
    before it (None on a first start), with when that term's lease expired."""

    term: LeaderState
    previous: LeaderState | None
    #: when the previous leader's lease ran out (its last write + lease_s); None when it
    #: ended, released the lease or was seen dead on this host at once
    expired_at: float | None
    #: why the previous term is over: "ended", "released", "dead", "expired" or "" (none)
    why: str = ""


@dataclass(frozen=True)
class Look:
    """The newest term seen by one launcher (:meth:`LeaderLease.look`)."""

    generation: int  #: 0 when there is none
    term: LeaderState | None
    #: when the store last wrote the term (its age is judged from this)
    written: float | None
    #: why ``term`` may be taken ("" when there is none; see :meth:`LeaderLease._free`), or
    #: None while another live launcher holds it
    why: str | None


class LeaderLease:
    """The leader lease of one job (its ``exactly-job`` store).

    ``clock`` tells the time the lease's age is judged by (the store writes its own time:
    a clock ahead of the store's takes over early, one behind waits longer)."""

    def __init__(self, store: LogStore, lease_s: float = DEFAULT_LEASE_S, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.lease_s = lease_s
        self._clock = clock

    def current(self) -> LeaderState | None:
        """The newest term (a term taken, renewed, ended or released); None when there is
        none. Raises ExactlyError naming the file when ``leader.json`` is damaged (delete it
        once no launcher of the job runs)."""
        return self._latest()[1]

    def _latest(self) -> tuple[int, LeaderState | None, float | None]:
        """``(generation, term, when the store last wrote it)`` of the newest term: the one
        ``leader.json`` names, or a newer one whose leader has not written ``leader.json``
        yet (``(0, None, None)`` when there is none)."""
        raw = self.store.read(LEADER)
        if raw is not None:
            generation = self._parse(raw, LEADER).generation
        else:  # a first start, or leader.json deleted by hand: the term files still count
            numbers = [int(n.split(".")[0]) for n in self.store.list(TERMS)
                       if n.endswith(".json") and n.split(".")[0].isdigit()]
            generation = max(numbers, default=0)
        while self.store.exists(_term(generation + 1)):
            generation += 1
        if generation == 0:
            return 0, None, None
        data = self.store.read(_term(generation))
        if data is None:  # a leader.json older than term files (never deleted by exactly)
            return generation, self._parse(raw, LEADER) if raw is not None else None, \
                self.store.modified(LEADER)
        return generation, self._parse(data, _term(generation)), \
            self.store.modified(_term(generation))

    def look(self, launcher: ProcessId) -> Look:
        """The newest term as ``launcher`` sees it: whether it may take the lease, and why."""
        generation, cur, written = self._latest()
        return Look(generation, cur, written, self._free(cur, written, launcher))

    def try_acquire(self, host: str, launcher: ProcessId, run_id: str, job: str = "", *,
                    seen: Look | None = None) -> Takeover | None:
        """Take the lease for a new term when it is free (as ``seen`` by :meth:`look`, or
        looked at now); None while another live launcher holds it, or when another launcher
        took the same term first (each term is a file created only if absent: of launchers
        racing for one term, exactly one creates it). A launcher never takes a lease it
        holds again (a renewal is :meth:`renew`)."""
        seen = seen or self.look(launcher)
        cur, written, why = seen.term, seen.written, seen.why
        if why is None:
            return None
        now = self._clock()
        term = LeaderState(host, launcher, run_id, seen.generation + 1, now, now, self.lease_s,
                           job)
        if not self.store.create(_term(term.generation), _encode(term)):
            return None  # another launcher took this term first
        self.store.write(LEADER, _encode(term))
        self._prune(term.generation)
        expired = (written + cur.lease_s) if (cur and why == "expired"
                                              and written is not None) else None
        return Takeover(term, cur, expired, why if cur else "")

    def _free(self, cur: LeaderState | None, written: float | None,
              launcher: ProcessId) -> str | None:
        """Why the lease ``cur`` may be taken ("" when there is none), or None."""
        if cur is None:
            return ""
        if cur.ended is not None:
            return "ended"
        if cur.released:
            return "released"
        if cur.launcher == launcher:
            return "mine"  # a term of this launcher that it left (it lost and came back)
        alive = cur.launcher.is_alive()
        if alive is False:
            return "dead"
        if alive is True:
            return None
        if written is None or self._clock() - written >= cur.lease_s:
            return "expired"
        return None

    def renew(self, term: LeaderState) -> LeaderState | None:
        """Renew ``term``; the renewed term, or None when the lease is no longer this
        term's (another launcher took a newer term, or it ended). Store errors propagate."""
        return self._update(term, lambda cur, now: replace(cur, renewed_at=now))

    def end(self, term: LeaderState, state: str, detail: str = "") -> bool:
        """Record that the job ended under ``term`` (standbys then exit, a later start
        takes the lease); False when ``term`` no longer holds it."""
        ended = {"state": state, "at": self._clock(), "detail": detail}
        return self._update(term, lambda cur, now: replace(cur, ended=ended)) is not None

    def release(self, term: LeaderState) -> bool:
        """Let the lease go without ending the job (a standby takes it at once)."""
        return self._update(term, lambda cur, now: replace(cur, released=True)) is not None

    def holds(self, term: LeaderState) -> bool:
        """Whether ``term`` is still the newest term (reads, no write)."""
        cur = self.current()
        return cur is not None and _same_term(cur, term)

    def _update(self, term: LeaderState,
                change: Callable[[LeaderState, float], LeaderState]) -> LeaderState | None:
        """Rewrite ``term``'s own file (only its leader writes it) unless a newer term
        exists or it ended; then ``leader.json``, the copy commands and views read."""
        if self.store.exists(_term(term.generation + 1)):
            return None
        data = self.store.read(_term(term.generation))
        if data is None:
            return None
        cur = self._parse(data, _term(term.generation))
        if not _same_term(cur, term) or cur.ended is not None:
            return None
        new = change(cur, self._clock())
        encoded = _encode(new)
        self.store.write(_term(term.generation), encoded)
        self.store.write(LEADER, encoded)
        return new

    def _prune(self, generation: int) -> None:
        """Delete the term files older than the last few (best effort)."""
        try:
            for name in self.store.list(TERMS):
                number = name.split(".")[0]
                if name.endswith(".json") and number.isdigit() and \
                        int(number) < generation - KEEP_TERMS:
                    self.store.delete(f"{TERMS}/{name}")
        except OSError:
            pass

    def _parse(self, data: bytes, name: str) -> LeaderState:
        try:
            return LeaderState.from_json(json.loads(data))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExactlyError(
                f"{self.store.describe(name)} is damaged ({exc!r}): delete it once no "
                "`exactly run --ha` of this job runs (the next launcher takes a fresh "
                "lease)") from None


def _term(generation: int) -> str:
    return f"{TERMS}/{generation:012d}.json"


def _same_term(a: LeaderState, b: LeaderState) -> bool:
    return a.generation == b.generation and a.launcher == b.launcher and a.run_id == b.run_id


def _encode(state: LeaderState) -> bytes:
    return json.dumps(state.to_json(), sort_keys=True, indent=1).encode()


def boot_id() -> str:
    """This machine's boot id (Linux): tells two machines apart that share a host id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass
class Member:
    """``ha/members/<host>.json``: a live launcher of the job, leader or standby."""

    host: str
    launcher: ProcessId
    role: str  # leader | standby
    job: str = ""
    run_id: str = ""
    lease_s: float = DEFAULT_LEASE_S
    boot_id: str = field(default_factory=boot_id)
    heartbeat: float = 0.0
    #: a standby's warm spare driver (``--ha-warm-standby``): starting | ready, "" for none
    spare: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["launcher"] = self.launcher.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        return cls(str(data["host"]), ProcessId.from_json(data["launcher"]), str(data["role"]),
                   str(data.get("job") or ""), str(data.get("run_id") or ""),
                   float(data.get("lease_s") or DEFAULT_LEASE_S), str(data.get("boot_id") or ""),
                   float(data.get("heartbeat") or 0.0), str(data.get("spare") or ""))


class Members:
    """The member records of one job's launchers."""

    def __init__(self, store: LogStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock

    def _name(self, host: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
        return f"{MEMBERS}/{safe}.json"

    def join(self, member: Member) -> None:
        """Register ``member``; raises ConfigError when a live launcher of another process
        already uses its host id (two launchers must never share one: a holder on "this
        host" is judged by its pid) or runs another job file."""
        for other in self.live():
            if other.job and member.job and other.job != member.job:
                raise ConfigError(
                    f"the launcher on host {other.host} (pid {other.launcher.pid}) runs "
                    f"{other.job} on this checkpoint, not {member.job}: a checkpoint is one "
                    "job's address; give this job a checkpoint of its own. Nothing was started.")
            if other.host != member.host or other.launcher == member.launcher:
                continue
            if other.boot_id == member.boot_id and other.launcher.is_alive() is False:
                continue  # a launcher of this machine that is gone (killed, restarted)
            where = ("on this machine" if other.boot_id == member.boot_id
                     else f"on another machine (boot id {other.boot_id or 'unknown'})")
            raise ConfigError(
                f"host id {member.host!r} is already used by a live `exactly run --ha` "
                f"(pid {other.launcher.pid}, {other.role}) {where} for this checkpoint: give "
                "every launcher its own host id (--host-id or EXACTLY_HOST_ID; on Kubernetes "
                "the pod name). Nothing was started.")
        self.beat(member)

    def beat(self, member: Member) -> None:
        """Write ``member``'s record (its heartbeat is the store's write time)."""
        member.heartbeat = self._clock()
        self.store.write(self._name(member.host),
                         json.dumps(member.to_json(), sort_keys=True).encode())

    def leave(self, member: Member) -> None:
        """Remove ``member``'s record when it is still its own."""
        raw = self.store.read(self._name(member.host))
        try:
            mine = raw is not None and Member.from_json(json.loads(raw)).launcher == member.launcher
        except (ValueError, KeyError, TypeError):
            mine = False
        if mine:
            self.store.delete(self._name(member.host))

    def live(self) -> list[Member]:
        """Members whose record was written within their lease (unreadable ones skipped)."""
        found = []
        now = self._clock()
        for name in sorted(self.store.list(MEMBERS)):
            if not name.endswith(".json"):
                continue
            path = f"{MEMBERS}/{name}"
            raw = self.store.read(path)
            written = self.store.modified(path)
            if raw is None or written is None:
                continue
            try:
                member = Member.from_json(json.loads(raw))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if now - written < member.lease_s:
                found.append(member)
        return found


def has_live_launcher(store: LogStore) -> bool:
    """Whether any ``exactly run --ha`` launcher of the job is alive (leader or standby):
    a job between two leaders (a failover in flight) still answers its commands."""
    try:
        return bool(Members(store).live())
    except OSError:
        return False


def host_id_from(option: str | None) -> str | None:
    """A host id given on the command line, checked (non-empty, one line)."""
    if option is None:
        return None
    text = option.strip()
    if not text or any(c in text for c in "\n\r/"):
        raise ConfigError(f"--host-id {option!r}: give a non-empty name without '/' or line "
                          "breaks (e.g. the pod or host name)")
    return text


__all__ = ["DEFAULT_LEASE_S", "DEFAULT_RENEW_DEADLINE_S", "DEFAULT_RENEW_S",
           "DEFAULT_STANDBY_POLL_S", "LEADER", "MEMBERS", "LeaderLease", "LeaderState",
           "Look", "Member", "Members", "Takeover", "boot_id", "has_live_launcher", "host_id_from"]

