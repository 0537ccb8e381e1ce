"""The control channel of a running job: requests and answers as files in its checkpoint.

Every file lives under ``<checkpoint>/exactly-job/``, so a command works from any host that
sees the checkpoint storage (no socket, no port)::

    control/requests/<id>.json   written by ``exactly stop|cancel`` (atomically)
    control/answers/<id>.json    written by the driver when the request is done or refused
    job.json                     who runs the job, its state, and a heartbeat

A request names an ``action`` (``stop``, ``cancel``; the savepoint issue adds
``savepoint``) and its parameters (``drain``). The driver polls for requests between and
during epochs, handles the oldest first, and answers each exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exactly.errors import ConfigError, ExactlyError, FencedError
from exactly.fsutil import atomic_write_json, file_lock, read_json
from exactly.procs import ProcessId

JOB_DIR_NAME = "exactly-job"
ACTIONS = ("stop", "cancel", "savepoint")
#: a job whose heartbeat is older than this (and whose driver is on another host) is dead
HEARTBEAT_STALE_S = 60.0
#: the states of a job that has ended (job.json)
ENDED = ("stopped", "failed", "cancelled")


def job_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """``<checkpoint>/exactly-job``: where exactly keeps a job's control files."""
    return Path(str(checkpoint).removeprefix("file://")).absolute() / JOB_DIR_NAME


@dataclass(frozen=True)
class Request:
    """One command sent to a running job."""

    id: str
    action: str
    params: dict[str, Any] = field(default_factory=dict)
    requested_at: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Request:
        return cls(str(data["id"]), str(data["action"]), dict(data.get("params") or {}),
                   float(data.get("requested_at") or 0.0))


class NoRunningJob(ExactlyError):
    """A command names a checkpoint no live ``exactly run`` serves."""


def running_job(checkpoint: str | os.PathLike[str]) -> JobStatus | None:
    """The status of the live ``exactly run`` on ``checkpoint``, or None when none is alive."""
    status = JobStatus.read(job_dir(checkpoint))
    return status if status is not None and status.alive() else None


class ControlChannel:
    """Both ends of one job's control channel."""

    def __init__(self, checkpoint: str | os.PathLike[str]) -> None:
        self.directory = job_dir(checkpoint)
        self.requests = self.directory / "control" / "requests"
        self.answers = self.directory / "control" / "answers"

    # -- the command's end ---------------------------------------------------------------
    def send(self, action: str, **params: Any) -> Request:
        """Write a request for the job's driver; raises NoRunningJob when none is alive."""
        if action not in ACTIONS:
            raise ConfigError(f"unknown control action {action!r}; one of {', '.join(ACTIONS)}")
        if running_job(self.directory.parent) is None:
            where = self.directory.parent
            raise NoRunningJob(f"no running job on checkpoint {where} (no live `exactly run` "
                               "has it); start it with `exactly run JOB --checkpoint "
                               f"{where}`, nothing was sent")
        return self.post(action, **params)

    def post(self, action: str, **params: Any) -> Request:
        """Queue a request without looking for a live job (the driver's own requests)."""
        request = Request(f"{time.time_ns()}-{uuid.uuid4().hex[:8]}", action, params,
                          time.time())
        self.requests.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.requests / f"{request.id}.json", asdict(request))
        return request

    def wait_answer(self, request: Request, timeout: float,
                    poll: float = 0.2) -> dict[str, Any] | None:
        """The driver's answer, or ``None`` when ``timeout`` passes or the checkpoint is
        deleted (a cancel with ``delete_on_cancellation``: check with :meth:`exists`)."""
        deadline = time.monotonic() + timeout
        path = self.answers / f"{request.id}.json"
        while time.monotonic() < deadline:
            answer = read_json(path)
            if isinstance(answer, dict):
                return answer
            if not self.directory.parent.exists():
                return None
            status = JobStatus.read(self.directory)
            if status is not None and not status.alive():
                answer = read_json(path)  # it may have answered just before it ended
                return answer if isinstance(answer, dict) else None
            time.sleep(poll)
        return None

    def exists(self) -> bool:
        return self.directory.parent.exists()

    # -- the driver's end ----------------------------------------------------------------
    def pending(self) -> list[Request]:
        """Unanswered requests, oldest first (unreadable ones are answered as refused)."""
        try:
            names = sorted(p.name for p in self.requests.iterdir() if p.suffix == ".json")
        except OSError:
            return []
        found = []
        for name in names:
            rid = name.removesuffix(".json")
            if (self.answers / name).exists():
                continue
            try:
                found.append(Request.from_json(json.loads((self.requests / name).read_text())))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.answer(Request(rid, "?"), "refused", f"unreadable request: {exc}")
        return found

    def answer(self, request: Request, status: str, detail: str = "", **extra: Any) -> None:
        """Record the outcome of ``request`` (``done``, ``refused`` or ``failed``)."""
        self.answers.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.answers / f"{request.id}.json",
                          {"id": request.id, "action": request.action, "status": status,
                           "detail": detail, "answered_at": time.time(), **extra})
        with contextlib.suppress(OSError):
            (self.requests / f"{request.id}.json").unlink()


@dataclass
class JobStatus:
    """``job.json``: the live ``exactly run`` of a checkpoint and what it is doing."""

    run_id: str
    supervisor: ProcessId
    state: str  # starting | running | restarting | stopping | stopped | failed | cancelled
    driver: ProcessId | None = None
    heartbeat: float = 0.0
    restarts: int = 0
    last_epoch: int | None = None
    detail: str = ""
    strategy: dict[str, Any] | None = None  #: the restart strategy the driver uses

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["supervisor"] = self.supervisor.to_json()
        data["driver"] = self.driver.to_json() if self.driver else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobStatus:
        driver = data.get("driver")
        return cls(str(data["run_id"]), ProcessId.from_json(data["supervisor"]),
                   str(data["state"]), ProcessId.from_json(driver) if driver else None,
                   float(data.get("heartbeat") or 0.0), int(data.get("restarts") or 0),
                   data.get("last_epoch"), str(data.get("detail") or ""),
                   data.get("strategy"))

    @classmethod
    def read(cls, directory: Path) -> JobStatus | None:
        data = read_json(directory / "job.json", repair="delete it when no `exactly run` "
                         "of this checkpoint is alive")
        if not isinstance(data, dict):
            return None
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError):
            return None

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.heartbeat = time.time()
        atomic_write_json(directory / "job.json", self.to_json())

    def alive(self) -> bool:
        """Whether the ``exactly run`` that wrote this is still running: its launcher, or
        its driver when the launcher died (an orphaned driver stops by itself; until it
        has, the control commands reach it and no other run may start)."""
        if self.state in ENDED:
            return False
        alive = self.supervisor.is_alive()
        if alive is None:  # another host: trust a fresh heartbeat
            return time.time() - self.heartbeat < HEARTBEAT_STALE_S
        return alive or self._driver_runs()

    def orphaned(self) -> bool:
        """True while the driver runs on after its launcher died (on this host)."""
        return (self.state not in ENDED and self.supervisor.is_alive() is False
                and self._driver_runs())

    def _driver_runs(self) -> bool:
        """The driver, when it is a process of its own (``exactly run``), is alive."""
        return (self.driver is not None and self.driver != self.supervisor
                and self.driver.is_alive() is True)

    def lost(self) -> bool:
        """True when this says the job runs but nothing of it does: the launcher and the
        driver ended without a word (SIGKILL of the whole job, its container or machine)."""
        return self.state not in ENDED and not self.alive()


def claim_job(directory: Path, status: JobStatus, *, wait_for_orphan_s: float = 0.0,
              say: Callable[[str], None] | None = None) -> JobStatus | None:
    """Record ``status`` as the checkpoint's running job, or raise FencedError when another
    live ``exactly run`` already has it (checked and written under a file lock).

    A driver whose launcher died stops by itself (its epoch in flight commits first): the
    claim waits up to ``wait_for_orphan_s`` seconds for it (``say`` is told once), then
    raises FencedError naming it. Returns the previous status when it was a run that ended
    without a word (:meth:`JobStatus.lost`), for the caller to record; else None.
    """
    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_for_orphan_s
    told = False
    while True:
        with file_lock(directory / "job.lock"):
            current = JobStatus.read(directory)
            mine = current is not None and current.supervisor == status.supervisor
            if current is None or mine or not current.alive():
                status.write(directory)
                # not alive, yet not ended: a run that ended without a word
                lost = current is not None and not mine and current.state not in ENDED
                return current if lost else None
            orphan = current.orphaned()
            if not orphan or time.monotonic() >= deadline:
                raise FencedError(_claimed(directory, current, orphan))
        if not told and say is not None and current.driver is not None:
            say(f"the driver pid {current.driver.pid} of run {current.run_id} outlived its "
                f"launcher (pid {current.supervisor.pid}) and is stopping; waiting for it")
            told = True
        time.sleep(0.5)


def _claimed(directory: Path, current: JobStatus, orphan: bool) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(current.heartbeat))
    if orphan and current.driver is not None:
        return (f"checkpoint {directory.parent} is still run by the driver pid "
                f"{current.driver.pid} of run {current.run_id}, whose launcher (`exactly run` "
                f"pid {current.supervisor.pid}) died: it stops by itself once its epoch in "
                f"flight commits ({current.state}, heartbeat {since}); wait for it, or end it "
                f"now with `exactly cancel {directory.parent}`. Nothing was started.")
    return (f"checkpoint {directory.parent} is already run by `exactly run` pid "
            f"{current.supervisor.pid} on {current.supervisor.host} (run {current.run_id}, "
            f"{current.state}, heartbeat {since}); stop it first with `exactly stop "
            f"{directory.parent}`, or give this job its own checkpoint. Nothing was started.")
