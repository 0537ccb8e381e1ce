"""The leader lease of ``exactly run --ha``: which launcher runs a job, and who stands by.

Several ``exactly run --ha`` launchers of one job (one per host) share its checkpoint. One of
them is the leader: it holds ``exactly-job/ha/leader.json`` and runs the driver; the others
are standbys that watch the lease and take it once it is free. Every change of the lease is a
compare-and-swap of that one object (:meth:`LogStore.swap`: ``flock`` and a rename on a POSIX
directory, a conditional PUT on S3), so two standbys racing for a free lease never both win.

The lease is free when it is absent, when its job ended (``ended``: a standby then exits
instead of starting the job again), when its leader released it (a graceful handover), when
its leader's process is gone (a holder on this host, checked by pid and start time), or when
it was last written ``lease_s`` seconds ago or more (a holder on another host: dead,
paused or partitioned away). The age is measured from the store's own modification time of
``leader.json``, never from a time the holder wrote: a holder whose clock runs ahead cannot
keep its lease alive longer. Hosts' clocks must agree with the store's to well within
``lease_s`` (NTP).

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
MEMBERS = "ha/members"

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
        """The lease as written; None when there is none. Raises ExactlyError naming the
        file when it is damaged (delete it once no launcher of the job runs)."""
        found = self.store.read_versioned(LEADER)
        return None if found is None else self._parse(found[0])

    def age(self) -> float | None:
        """Seconds since the store last wrote the lease; None when there is none."""
        written = self.store.modified(LEADER)
        return None if written is None else self._clock() - written

    def expired_at(self) -> float | None:
        """When the current lease runs out unless renewed (store time + its lease_s)."""
        written = self.store.modified(LEADER)
        cur = self.current()
        return None if written is None or cur is None else written + cur.lease_s

    def try_acquire(self, host: str, launcher: ProcessId, run_id: str,
                    job: str = "") -> Takeover | None:
        """Take the lease for a new term when it is free; None while another live launcher
        holds it. A launcher never takes a lease it holds again (a renewal is :meth:`renew`).
        """
        for _ in range(50):
            found = self.store.read_versioned(LEADER)
            cur = None if found is None else self._parse(found[0])
            written = self.store.modified(LEADER) if found is not None else None
            why = self._free(cur, written, launcher)
            if why is None:
                return None
            now = self._clock()
            term = LeaderState(host, launcher, run_id, (cur.generation + 1) if cur else 1,
                               now, now, self.lease_s, job)
            if self.store.swap(LEADER, _encode(term), None if found is None else found[1]):
                expired = (written + cur.lease_s) if (cur and why == "expired"
                                                      and written is not None) else None
                return Takeover(term, cur, expired, why if cur else "")
        raise ExactlyError(f"{self.store.describe(LEADER)}: the leader lease kept changing "
                           "under 50 attempts to take it")

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
        term's (another launcher took it, or it was removed). Store errors propagate."""
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
        """Whether ``term`` is still the lease's term (a read, no write)."""
        cur = self.current()
        return cur is not None and _same_term(cur, term)

    def _update(self, term: LeaderState,
                change: Callable[[LeaderState, float], LeaderState]) -> LeaderState | None:
        for _ in range(50):
            found = self.store.read_versioned(LEADER)
            if found is None:
                return None
            cur = self._parse(found[0])
            if not _same_term(cur, term) or cur.ended is not None:
                return None
            new = change(cur, self._clock())
            if self.store.swap(LEADER, _encode(new), found[1]):
                return new
        raise ExactlyError(f"{self.store.describe(LEADER)}: the leader lease kept changing "
                           "under 50 attempts to update it")

    def _parse(self, data: bytes) -> LeaderState:
        try:
            return LeaderState.from_json(json.loads(data))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExactlyError(
                f"{self.store.describe(LEADER)} is damaged ({exc!r}): delete it once no "
                "`exactly run --ha` of this job runs (the next launcher takes a fresh "
                "lease)") from None


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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["launcher"] = self.launcher.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        return cls(str(data["host"]), ProcessId.from_json(data["launcher"]), str(data["role"]),
                   str(data.get("job") or ""), str(data.get("run_id") or ""),
                   float(data.get("lease_s") or DEFAULT_LEASE_S), str(data.get("boot_id") or ""),
                   float(data.get("heartbeat") or 0.0))


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
           "Member", "Members", "Takeover", "boot_id", "has_live_launcher", "host_id_from"]

