"""``exactly run --ha``: standby launchers on other hosts take a job over when its host dies.

Run the same ``exactly run JOB --checkpoint CK --ha`` on two or three hosts (each with its own
host id: ``--host-id`` or ``$EXACTLY_HOST_ID``). They share the job's leader lease in the
checkpoint store (:mod:`exactly.checkpoint.leader`):

* the launcher that takes the lease is the **leader**: it claims ``job.json``, records the
  failover when it took the job from another host, and runs the driver exactly as
  ``exactly run`` does (process restarts, restart strategy, control commands). A thread renews
  the lease every ``renew_s``;
* the others are **standbys**: they look at the lease every ``standby_poll_s`` and take it
  once it is free -- its leader's host died, paused or was partitioned away for
  ``lease_s``, its leader released it (SIGTERM: a handover), or its leader's process is gone
  on this host;
* a leader that has not renewed for ``renew_deadline_s`` (below ``lease_s``, so before a
  standby may take over; a watchdog thread checks it, whatever a hanging call to the store
  does), or finds the lease taken, **SIGKILLs its driver's whole tree** at once -- a
  graceful stop would let the epoch in flight commit -- records the lost leadership, and
  becomes a standby. The driver's sinks fence it as well: in HA their lease
  (``exactly.leaseStaleAfterSeconds``) defaults to ``lease_s``, so the new leader's driver
  takes each sink's lease and a driver of the old leader that still tries to commit fails
  with FencedError and commits nothing;
* when the job ends (``exactly stop`` / ``cancel``, a bounded input finished, the restart
  strategy gave up), the leader marks the lease ended: the standbys exit too.

``exactly stop | cancel | savepoint`` reach whichever host leads: the control channel lives
in the checkpoint store; during a failover (no leader yet) requests stay queued and the new
leader answers them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from exactly.checkpoint.cas_check import check_compare_and_swap
from exactly.checkpoint.control import ControlChannel
from exactly.checkpoint.leader import (
    DEFAULT_LEASE_S,
    DEFAULT_RENEW_DEADLINE_S,
    DEFAULT_RENEW_S,
    DEFAULT_STANDBY_POLL_S,
    LeaderLease,
    LeaderState,
    Member,
    Members,
    Takeover,
)
from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory, new_run_id
from exactly.checkpoint.status import (
    ENDED,
    JobStatus,
    claim_job,
    refuse_other_job,
    update_status,
)
from exactly.checkpoint.store import LogStore
from exactly.errors import ConfigError, ExactlyError
from exactly.logs import log_event
from exactly.ops.driver import JOB_FAILED, DriverSpec
from exactly.ops.launcher import (
    Fence,
    RunEnd,
    answer_without_driver,
    checkpoint_of,
    driver_env,
    prepared,
    run_drivers,
)
from exactly.ops.lost_runs import record_epoch_lost, record_lost_run
from exactly.ops.spare import SpareDriver, file_digest, respawn_delay
from exactly.options import SESSION_LEASE_STALE_AFTER
from exactly.procs import HOST_ID_ENV, become_subreaper, current_process, host_identity

logger = logging.getLogger("exactly.ops.ha")


@dataclass(frozen=True)
class HaSettings:
    """The settings of ``exactly run --ha`` (every launcher of a job should use the same)."""

    #: seconds a leader's lease lasts without a renewal: how long a standby waits for a
    #: leader that stopped renewing (host dead, paused, partitioned)
    lease_s: float = DEFAULT_LEASE_S
    #: seconds between two renewals by the leader
    renew_s: float = DEFAULT_RENEW_S
    #: a leader that could not renew for this long kills its driver (< ``lease_s``)
    renew_deadline_s: float = DEFAULT_RENEW_DEADLINE_S
    #: seconds between two looks of a standby at the lease
    standby_poll_s: float = DEFAULT_STANDBY_POLL_S
    #: this launcher's host id (default ``$EXACTLY_HOST_ID``, else the host name)
    host_id: str | None = None
    #: ``--ha-warm-standby``: a standby keeps a warm spare driver, which runs the job's
    #: first driver when this launcher takes the lease over (:class:`StandbySpare`)
    warm_standby: bool = False

    def check(self) -> None:
        """Raise ConfigError unless 0 < renew interval < renew deadline < lease duration."""
        if not 0 < self.renew_s < self.renew_deadline_s < self.lease_s:
            raise ConfigError(
                f"--ha-renew-interval ({self.renew_s:g}s) < --ha-renew-deadline "
                f"({self.renew_deadline_s:g}s) < --ha-lease-duration ({self.lease_s:g}s) must "
                "hold: the leader renews several times within its deadline and stops its "
                "driver before a standby may take the lease over")
        if self.standby_poll_s <= 0:
            raise ConfigError(f"--ha-standby-poll ({self.standby_poll_s:g}s) must be > 0")

    @property
    def host(self) -> str:
        return self.host_id or host_identity()


def launch_ha(spec: DriverSpec, ha: HaSettings, *, out=sys.stderr) -> int:
    """Run as one of the job's HA launchers until the job ends (or this launcher is
    stopped by a signal); returns the exit code of ``exactly run``."""
    spec.restart_strategy()  # a bad strategy fails here, before anything starts
    ha.check()
    checkpoint = checkpoint_of(spec)
    spec = replace(spec, checkpoint=checkpoint)
    host = ha.host
    os.environ[HOST_ID_ENV] = host  # the drivers and the liveness checks use the same id
    directory = job_store(checkpoint)
    check_compare_and_swap(directory, purpose="exactly run --ha (its leader lease)")
    job = os.path.basename(spec.job_file)
    refuse_other_job(directory, JobStatus.read(directory), job)
    me = current_process()
    member = Member(host, me, "standby", job, "", ha.lease_s)
    members = Members(directory)
    members.join(member)
    lease = LeaderLease(directory, ha.lease_s)
    become_subreaper()

    def say(text: str) -> None:
        print(f"exactly run --ha [{host}]: {text}", file=out, flush=True)

    signalled: list[int] = []

    def on_signal(signum, frame) -> None:
        signalled.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    at_start = lease.current()
    ended_at_start = at_start.generation if at_start and at_start.ended else None
    told_standby = False
    last_beat = 0.0
    standby_spare = StandbySpare(spec, ha, say) if ha.warm_standby else None
    try:
        while True:
            if standby_spare is not None:
                standby_spare.keep(told_standby)
            if signalled:
                say("stopped as a standby (the job runs on)")
                return 0
            try:
                seen = lease.look(me)
                cur = seen.term
                took = None if cur is not None and cur.ended is not None and \
                    cur.generation != ended_at_start else lease.try_acquire(
                        host, me, new_run_id(), job, seen=seen)
            except ExactlyError:
                raise  # a damaged lease: its message names the repair
            except Exception as exc:  # the store unreachable: a standby waits it out
                log_event(logger, "standby_store_error", logging.WARNING, host=host,
                          error=repr(exc))
                _sleep(ha.standby_poll_s, signalled)
                continue
            if cur is not None and cur.ended is not None and cur.generation != ended_at_start:
                state = str(cur.ended.get("state") or "stopped")
                say(f"the job ended on host {cur.host} ({state}); this standby exits")
                return JOB_FAILED if state == "failed" else 0
            if took is None:
                if not told_standby and cur is not None:
                    say(f"standby: host {cur.host} leads (term {cur.generation})")
                    told_standby = True
                if time.monotonic() - last_beat >= min(ha.renew_s, ha.lease_s / 3):
                    spare_state = standby_spare.state if standby_spare else ""
                    with contextlib.suppress(Exception):  # a record for display and checks
                        members.beat(replace(member, role="standby", spare=spare_state))
                    last_beat = time.monotonic()
                _sleep(ha.standby_poll_s, signalled)
                continue
            code, handed_over = _lead(spec, ha, took, lease, members, member, say, signalled,
                                      standby_spare.take() if standby_spare else None)
            if code is not None:
                return code
            if handed_over:
                return 0
            told_standby = False
    finally:
        if standby_spare is not None:
            standby_spare.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with contextlib.suppress(Exception):  # a stale record ages out by itself
            members.leave(member)


def _driver_spec(spec: DriverSpec, ha: HaSettings, checkpoint: str, run_id: str) -> DriverSpec:
    """The spec of a leader's drivers (and of a standby's spare: the same session)."""
    return replace(prepared(spec, checkpoint, run_id), ha=True, default_conf={
        SESSION_LEASE_STALE_AFTER: f"{ha.lease_s:g}", **spec.default_conf})


class StandbySpare:
    """The warm spare of a standby launcher (``--ha-warm-standby``): started once the
    launcher knows it stands by, kept while it does (a spare that dies is started again,
    later each time), handed to the launcher's first driver when it takes the lease over.
    It claims nothing and holds no lease: the leader's fencing is unchanged."""

    def __init__(self, spec: DriverSpec, ha: HaSettings, say) -> None:
        self.spec, self.ha, self.say = spec, ha, say
        self.spare: SpareDriver | None = None
        self._deaths = 0
        self._not_before = 0.0
        self._ready_said = False

    def keep(self, standing_by: bool) -> None:
        if self.spare is not None:
            state = self.spare.poll()
            if state == "ready" and not self._ready_said:
                self.say(f"standby: warm spare driver ready (pid {self.spare.pid})")
                self._ready_said = True
            if state != "dead":
                return
            spare, self.spare = self.spare, None
            self.say(f"standby: the warm spare driver (pid {spare.pid}) ended: "
                     f"{spare.failure}")
            spare.discard("it ended")
            self._deaths += 1
            self._not_before = time.monotonic() + respawn_delay(self._deaths)
        if standing_by and time.monotonic() >= self._not_before:
            checkpoint = str(self.spec.checkpoint)
            spec = _driver_spec(self.spec, self.ha, checkpoint, "standby-spare")
            self.spare = SpareDriver(spec.to_json(), driver_env(checkpoint))
            self._ready_said = False

    @property
    def state(self) -> str:
        """``starting``, ``ready`` or "" (none now), for the standby's member record."""
        if self.spare is None:
            return ""
        state = self.spare.poll()
        return "" if state == "dead" else state

    def take(self) -> SpareDriver | None:
        """The spare for the new leader's first driver; None when it died or the job file
        changed since the spare imported it."""
        spare, self.spare = self.spare, None
        if spare is not None and (spare.poll() == "dead" or file_digest(spare.job_file)
                                  != spare.job_file_digest):
            spare.discard("it ended, or the job file changed")
            return None
        return spare

    def close(self) -> None:
        if self.spare is not None:
            self.spare.discard("the standby ended", quiet=True)
            self.spare = None


def _lead(spec: DriverSpec, ha: HaSettings, took: Takeover, lease: LeaderLease,
          members: Members, member: Member, say, signalled: list[int],
          spare: SpareDriver | None = None) -> tuple[int | None, bool]:
    """Run the job as leader of ``took.term`` (``spare``: the standby's warm spare, which
    runs the first driver); ``(exit code, False)`` when the job ended, ``(0, True)`` after a
    handover (SIGTERM), ``(None, False)`` when the lease was lost."""
    term = took.term
    checkpoint = str(spec.checkpoint)
    directory = job_store(checkpoint)
    run_id = term.run_id
    members.beat(replace(member, role="leader", run_id=run_id))
    say(f"leader (term {term.generation}, run {run_id})")
    log_event(logger, "leader_elected", host=term.host, generation=term.generation,
              run=run_id, previous=took.previous.host if took.previous else None,
              why=took.why or "first")
    fence = Fence()
    keeper = LeaseRenewer(lease, term, ha, fence, members, replace(member, role="leader",
                                                                  run_id=run_id))
    keeper.start()
    try:
        try:
            lost = claim_job(directory, JobStatus(run_id, current_process(), "starting",
                                                  job=member.job, leader=term.generation),
                             leading=True)
        except BaseException:
            lease.release(keeper.term)  # a standby may try; this launcher ends on the error
            raise
        _record_takeover(checkpoint, took, lost, run_id, say)
        answered = _answer_stop_before_driver(checkpoint, directory, run_id, term)
        if answered is not None:
            lease.end(keeper.term, answered, f"{answered} by a request during a failover")
            return 0, False
        if signalled:  # stopped by a signal before its driver started: hand over
            end = RunEnd(0, signalled=True)
        else:
            if spare is not None:
                say(f"the warm spare driver (pid {spare.pid}) takes the job over")
            end = run_drivers(_driver_spec(spec, ha, checkpoint, run_id), fence=fence,
                              spare=spare)
            spare = None
    finally:
        keeper.stop()
        if spare is not None:  # not handed to a run
            spare.discard("the leader did not start a driver")
    if not end.fenced and not end.signalled and end.code != 0 and not _still_leads(lease,
                                                                                 keeper):
        # the driver ended on its own (e.g. fenced by a sink) just as the lease was lost
        fence.lose(f"LeadershipLost: the leader on host {term.host} lost its lease (term "
                   f"{term.generation}) while its driver ended ({end.code}); it stands by")
        end = RunEnd(end.code, fenced=True)
    if end.fenced:
        if keeper.taken_by is None:  # fenced by its deadline: who leads now, if anyone
            with contextlib.suppress(Exception):
                cur = lease.current()
                if cur is not None and cur.generation > term.generation:
                    keeper.taken_by = cur.host
        RestartHistory(directory, run_id).append(
            "failure", kind="leadership", action="standby", host=term.host,
            taken_by=keeper.taken_by, cause=fence.cause)
        log_event(logger, "leadership_lost", logging.WARNING, host=term.host,
                  generation=term.generation, taken_by=keeper.taken_by, cause=fence.cause)
        members.beat(replace(member, role="standby"))
        return None, False
    if end.signalled and end.code == 0:
        lease.release(keeper.term)
        update_status(directory, run_id=run_id, state="stopped",
                      detail=f"handed over: its leader on host {term.host} was stopped by a "
                             "signal; a standby takes the job over")
        say("stopped by a signal: the lease is released, a standby takes the job over")
        return 0, True
    status = JobStatus.read(directory)
    state = status.state if status is not None and status.state in ENDED else (
        "failed" if end.code == JOB_FAILED else "stopped")
    lease.end(keeper.term, state, status.detail if status is not None else "")
    return end.code, False


class LeaseRenewer(threading.Thread):
    """Renews the leader's term every ``renew_s``; loses the ``fence`` (which kills the
    driver) when the lease was taken, or once ``renew_deadline_s`` passed since the last
    successful renewal started (a watchdog thread: a renewal hanging in the store cannot
    delay it)."""

    def __init__(self, lease: LeaderLease, term: LeaderState, ha: HaSettings, fence: Fence,
                 members: Members, member: Member) -> None:
        super().__init__(name="exactly-leader-lease", daemon=True)
        self.lease = lease
        self.term = term
        self.ha = ha
        self.fence = fence
        self.members = members
        self.member = member
        self.taken_by: str | None = None
        #: monotonic time the last successful renewal started
        self.last_ok = time.monotonic()
        #: the error of the last renewal when it failed (for the deadline's cause)
        self.last_error: str | None = None
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=30)

    def run(self) -> None:
        self.last_ok = time.monotonic()
        threading.Thread(target=self._watch_deadline, name="exactly-leader-deadline",
                         daemon=True).start()
        while not self._stopped.wait(self.ha.renew_s):
            if self.fence.lost.is_set():
                return
            started = time.monotonic()
            try:
                renewed = self.lease.renew(self.term)
            except Exception as exc:  # the store is unreachable: the watchdog bounds it
                self.last_error = repr(exc)
                log_event(logger, "leader_renewal_failed", logging.WARNING,
                          host=self.term.host, error=repr(exc))
                continue
            if renewed is None:
                cur = self._current()
                self.taken_by = cur.host if cur is not None else None
                by = f"host {cur.host} took it (term {cur.generation})" if cur else \
                    "the lease was removed"
                self._lose(f"LeadershipLost: the leader on host {self.term.host} lost its "
                           f"lease (term {self.term.generation}): {by}; it killed its driver "
                           "so that it commits nothing more")
                return
            if self.fence.lost.is_set():
                return  # the deadline passed while this renewal was under way
            self.term = renewed
            self.last_ok = started
            self.last_error = None
            try:
                self.members.beat(self.member)
            except Exception as exc:  # a member record is for display: never fatal
                log_event(logger, "member_beat_failed", logging.DEBUG, error=repr(exc))

    def _watch_deadline(self) -> None:
        """Lose the fence once no renewal succeeded for ``renew_deadline_s``, whatever the
        renewal thread is doing (a call to the store can hang far longer: retries, TCP
        timeouts), so the driver is dead before a standby may take the lease."""
        step = min(0.5, self.ha.renew_s / 2)
        while not self._stopped.wait(step):
            late = time.monotonic() - self.last_ok
            if late >= self.ha.renew_deadline_s:
                self._lose(f"LeadershipLost: the leader on host {self.term.host} renewed its "
                           f"lease last {late:.1f}s ago (deadline "
                           f"{self.ha.renew_deadline_s:g}s: the store was unreachable or this "
                           f"host paused{self._last_error()}); it killed its driver before a "
                           "standby may take over")
                return

    def _last_error(self) -> str:
        error = self.last_error
        return f"; last renewal error: {error}" if error else ""

    def _current(self) -> LeaderState | None:
        try:
            return self.lease.current()
        except Exception:
            return None

    def _lose(self, cause: str) -> None:
        log_event(logger, "leader_fenced", logging.WARNING, host=self.term.host,
                  generation=self.term.generation, cause=cause)
        self.fence.lose(cause)


def _still_leads(lease: LeaderLease, keeper: LeaseRenewer) -> bool:
    """Whether the renewer's term is still the newest (a store error counts as leading:
    the job's own end is then reported as it was)."""
    try:
        return lease.holds(keeper.term)
    except Exception:
        return True


def _record_takeover(checkpoint: str, took: Takeover, lost: JobStatus | None, run_id: str,
                     say) -> None:
    """Write the failover (the previous leader's term was not ended) or the lost run (a
    plain ``exactly run`` before) into the restart history."""
    directory = job_store(checkpoint)
    previous = took.previous
    if previous is None or took.why in ("ended", ""):
        if lost is not None and lost.leader is None:
            record_lost_run(checkpoint, lost, noticed_by=run_id)
        return
    now = time.time()
    since = took.expired_at if took.expired_at is not None else now
    if took.why == "released":
        cause = (f"Handover: the leader on host {previous.host} released its lease (it was "
                 f"stopped by a signal); host {took.term.host} took the job over")
    elif took.why == "dead":
        cause = (f"Failover: the leader on host {previous.host} (`exactly run` pid "
                 f"{previous.launcher.pid}) is gone; host {took.term.host} took the job over")
    elif took.why == "mine":
        cause = (f"Failover: this launcher on host {took.term.host} lost its own earlier term "
                 f"{previous.generation} and took the job again")
    else:
        renewed = time.strftime("%H:%M:%S", time.localtime(since - previous.lease_s))
        cause = (f"Failover: the leader on host {previous.host} stopped renewing its lease "
                 f"(last renewal {renewed}; killed, paused or partitioned away) and it expired "
                 f"after {previous.lease_s:g}s; host {took.term.host} took the job over")
    epoch = record_epoch_lost(checkpoint, cause, failure="failover")
    if epoch is not None:
        cause += f"; epoch {epoch} was in flight"
    RestartHistory(directory, run_id).append(
        "failure", kind="failover", action="failover", cause=cause, since=since,
        from_host=previous.host, to_host=took.term.host, from_run=previous.run_id,
        generation=took.term.generation, why=took.why, epoch_in_flight=epoch)
    log_event(logger, "failover", logging.WARNING, from_host=previous.host,
              to_host=took.term.host, generation=took.term.generation, why=took.why,
              waited_s=round(now - since, 3), epoch_in_flight=epoch)
    say(cause)


def _answer_stop_before_driver(checkpoint: str, directory: LogStore, run_id: str,
                               term: LeaderState) -> str | None:
    """A stop or cancel sent while no leader ran (a failover in flight) is answered by the
    new leader before it starts a driver: nothing is in flight. The oldest request decides
    how the job ends; every other one pending is answered too (no command waits in vain,
    none stays queued for a later run). The job's end state (stopped, cancelled), or None
    when there was nothing to answer."""
    state = answer_without_driver(ControlChannel(checkpoint),
                                  f"answered by the new leader on host {term.host} after a "
                                  "failover, before it started a driver")
    if state is not None:
        update_status(directory, run_id=run_id, detail="", state=state)
    return state


def _sleep(seconds: float, signalled: list[int]) -> None:
    until = time.monotonic() + seconds
    while not signalled and time.monotonic() < until:
        time.sleep(min(0.2, max(0.0, until - time.monotonic())))
