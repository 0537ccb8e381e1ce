"""The control channel of a running job: requests and answers as files in its checkpoint.

Every file lives under ``<checkpoint>/exactly-job/`` (a POSIX directory or an S3 prefix),
so a command works from any host that reaches the checkpoint's storage (no socket, no
port)::

    control/requests/<id>.json   written by ``exactly stop|cancel|savepoint`` (whole)
    control/answers/<id>.json    written by the driver when the request is done or refused

A request names an ``action`` (``stop``, ``cancel``, ``savepoint``; ``upgrade``, which the
launcher carries out) and its parameters (``drain``, ``target``, ...), and the run it was
sent to (``to_run``: the live run the command found).
The driver polls for requests between and during epochs, handles the oldest first,
and answers each exactly once. A request that reaches nobody because the run it was sent to
ended first (a stop sent while that run was stopping by itself) is answered for it: by the
command when the run's end is the checkpoint's last word, else by the next plain run's
driver, which does not act on it -- a stop never outlives its run to stop a later one.
The job's status is :mod:`exactly.checkpoint.status`. A job run with ``exactly run --ha``
is reached whichever host leads it; a request sent during a failover waits for the new
leader, which answers it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from exactly.checkpoint import layout
from exactly.checkpoint.leader import has_live_launcher
from exactly.checkpoint.location import checkpoint_exists, checkpoint_uri, job_store
from exactly.checkpoint.status import DELETING_DETAIL, ENDED, JobStatus, running_job
from exactly.checkpoint.store import is_remote
from exactly.errors import ConfigError, ExactlyError

ACTIONS = ("stop", "cancel", "savepoint", "checkpoint", "upgrade")
#: actions the launcher carries out, not the driver (:mod:`exactly.ops.upgrade`): a driver
#: neither acts on them nor answers them
LAUNCHER_ACTIONS = ("upgrade",)
#: seconds between two listings of the requests of a job whose checkpoint is on S3
REMOTE_POLL_S = 1.0


@dataclass(frozen=True)
class Request:
    """One command sent to a running job."""

    id: str
    action: str
    params: dict[str, Any] = field(default_factory=dict)
    requested_at: float = 0.0
    #: the run the command found live when it sent this (None: the next run that polls)
    to_run: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Request:
        to_run = data.get("to_run")
        return cls(str(data["id"]), str(data["action"]), dict(data.get("params") or {}),
                   float(data.get("requested_at") or 0.0),
                   str(to_run) if to_run is not None else None)

    @property
    def wants_savepoint(self) -> bool:
        """A savepoint, or a stop that takes one first: only a live driver can do it."""
        return self.action == "savepoint" or self.params.get("savepoint") is not None

    @property
    def needs_driver(self) -> bool:
        """A request only a live driver can carry out: a savepoint (or a stop with one) and
        a drain (the input present now runs through the job before it stops)."""
        return self.wants_savepoint or self.action == "checkpoint" or (
            self.action == "stop" and bool(self.params.get("drain")))


def late_answer(request: Request, outcome: str, last_epoch: int | None) -> tuple[str, str]:
    """``(status, detail)`` for a request read only after its run ended as ``outcome``
    (``stopped``, ``cancelled``, ``failed``): a stop or cancel is done (nothing is in
    flight), a savepoint is refused (nothing was written)."""
    after = f"after epoch {last_epoch}" if last_epoch is not None else "before its first epoch"
    if request.action in LAUNCHER_ACTIONS:
        return "refused", f"the job {outcome} ({after}) before the {request.action} began"
    if request.action == "checkpoint":
        return "refused", (f"the job {outcome} ({after}) before a manual checkpoint could "
                           "start; nothing new was checkpointed")
    if request.wants_savepoint:
        return "refused", (f"the job {outcome} ({after}) before it could take the savepoint; "
                           "nothing was written")
    return "done", f"the job had already {outcome} ({after}); nothing was in flight"


class NoRunningJob(ExactlyError):
    """A command names a checkpoint no live ``exactly run`` serves."""


class ControlChannel:
    """Both ends of one job's control channel."""

    def __init__(self, checkpoint: str | os.PathLike[str]) -> None:
        self.checkpoint = checkpoint_uri(checkpoint)
        self.store = job_store(self.checkpoint)
        #: the driver lists requests at most this often (a LIST is a billed request on S3)
        self.poll_interval_s = REMOTE_POLL_S if is_remote(self.checkpoint) else 0.0
        self._listed_at = float("-inf")

    # -- the command's end ---------------------------------------------------------------
    def send(self, action: str, **params: Any) -> Request:
        """Write a request for the job's driver; raises NoRunningJob when none is alive."""
        if action not in ACTIONS:
            raise ConfigError(f"unknown control action {action!r}; one of {', '.join(ACTIONS)}")
        live = running_job(self.checkpoint)
        if live is None and not has_live_launcher(self.store):
            where = self.checkpoint
            raise NoRunningJob(f"no running job on checkpoint {where} (no live `exactly run` "
                               "has it); start it with `exactly run JOB --checkpoint "
                               f"{where}`, nothing was sent")
        return self._write(action, params, live.run_id if live is not None else None)

    def post(self, action: str, **params: Any) -> Request:
        """Queue a request without looking for a live job (the driver's own requests)."""
        return self._write(action, params, None)

    def _write(self, action: str, params: dict[str, Any], to_run: str | None) -> Request:
        request = Request(f"{time.time_ns()}-{uuid.uuid4().hex[:8]}", action, params,
                          time.time(), to_run)
        self.store.write(f"{layout.REQUESTS}/{request.id}.json",
                         json.dumps(asdict(request), sort_keys=True).encode())
        return request

    def wait_answer(self, request: Request, timeout: float,
                    poll: float = 0.2) -> dict[str, Any] | None:
        """The driver's answer, or ``None`` when ``timeout`` passes or the checkpoint is
        deleted (a cancel with ``delete_on_cancellation``: check with :meth:`exists`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self._answer(request)
            if answer is not None:
                return answer
            if not self.exists():
                return None
            status = JobStatus.read(self.store)
            if status is not None and status.detail == DELETING_DETAIL:
                # cancelled, the checkpoint going away with its answers: whatever was asked
                # is done once it is gone; writing an answer now would bring it back
                answer = self._answer(request)
                if answer is not None:
                    return answer
                time.sleep(poll)
                continue
            if status is not None and not status.alive() and not self._failing_over(status) \
                    and not self._launcher_at_work(request, status):
                # it may have answered just before it ended; else the request came too late
                return self._answer(request) or self._answer_for_ended(request, status)
            time.sleep(poll)
        return None

    def _answer_for_ended(self, request: Request, status: JobStatus) -> dict[str, Any] | None:
        """Answer ``request`` for the run it was sent to, which ended before it read it (the
        status is that run's last word: no later run claimed the job). A request sent to no
        run in particular, or a run that did not end (lost: the next run recovers it), stays
        queued and None is returned."""
        if request.to_run is None or request.to_run != status.run_id or status.state not in ENDED:
            return None
        return self.answer(request, *late_answer(request, status.state, status.last_epoch),
                           last_epoch=status.last_epoch, answered_by="command")

    @staticmethod
    def _launcher_at_work(request: Request, status: JobStatus) -> bool:
        """True for a launcher's request (an upgrade) while its launcher lives: the job
        looks ended between the old job's stop and the new one's start."""
        return request.action in LAUNCHER_ACTIONS and not status.in_process and \
            status.supervisor.is_alive() is not False

    def _failing_over(self, status: JobStatus) -> bool:
        """True while an ``exactly run --ha`` job is between two leaders: its run looks
        dead (its host stopped renewing) yet a launcher of it lives and will answer."""
        return status.state not in ENDED and has_live_launcher(self.store)

    def answer_of(self, request: Request) -> dict[str, Any] | None:
        """The answer to ``request`` so far (None: not answered yet)."""
        return self._answer(request)

    def _answer(self, request: Request) -> dict[str, Any] | None:
        data = self.store.read(f"{layout.ANSWERS}/{request.id}.json")
        try:
            answer = json.loads(data) if data is not None else None
        except ValueError:
            return None  # a torn answer of a crashed driver: read as none
        return answer if isinstance(answer, dict) else None

    def exists(self) -> bool:
        return checkpoint_exists(self.checkpoint)

    # -- the driver's end ----------------------------------------------------------------
    def pending(self, *, launcher: bool = False) -> list[Request]:
        """Unanswered requests for the driver, oldest first (unreadable ones are answered
        as refused); ``launcher``: those for the launcher (:data:`LAUNCHER_ACTIONS`)
        instead. On S3 the requests are listed at most every :data:`REMOTE_POLL_S`
        seconds: a command is answered within that much more."""
        now = time.monotonic()
        if now - self._listed_at < self.poll_interval_s:
            return []
        self._listed_at = now
        try:
            names = sorted(n for n in self.store.list(layout.REQUESTS) if n.endswith(".json"))
        except OSError:
            return []
        if not names:
            return []
        answered = set(self.store.list(layout.ANSWERS))
        found = []
        for name in names:
            rid = name.removesuffix(".json")
            if name in answered:
                continue
            try:
                data = self.store.read(f"{layout.REQUESTS}/{name}")
                if data is None:
                    continue
                request = Request.from_json(json.loads(data))
                if (request.action in LAUNCHER_ACTIONS) == launcher:
                    found.append(request)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.answer(Request(rid, "?"), "refused", f"unreadable request: {exc}")
        return found

    def answer(self, request: Request, status: str, detail: str = "",
               **extra: Any) -> dict[str, Any]:
        """Record the outcome of ``request`` (``done``, ``refused`` or ``failed``); returns
        the answer as written."""
        answer = {"id": request.id, "action": request.action, "status": status,
                  "detail": detail, "answered_at": time.time(), **extra}
        self.store.write(f"{layout.ANSWERS}/{request.id}.json",
                         json.dumps(answer, sort_keys=True, default=str).encode())
        with contextlib.suppress(OSError):
            self.store.delete(f"{layout.REQUESTS}/{request.id}.json")
        return answer
