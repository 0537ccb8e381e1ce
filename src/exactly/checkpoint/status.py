"""``exactly-job/job.json``: the live ``exactly run`` of a checkpoint, its state and heartbeat.

One ``exactly run`` at a time runs a checkpoint: :func:`claim_job` records the run's status
with a compare-and-swap of ``job.json`` (a file lock and a rename on a POSIX directory, a
conditional PUT ``If-Match``/``If-None-Match`` on S3), so two launchers racing for one
checkpoint cannot both win, on one host or on two. A run on another host is alive while its
heartbeat is fresh (:data:`HEARTBEAT_STALE_S`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from exactly.checkpoint import layout
from exactly.checkpoint.location import as_store, job_store
from exactly.checkpoint.restore_marker import upgrade_of
from exactly.checkpoint.space import when_space
from exactly.checkpoint.store import LogStore
from exactly.errors import ConfigError, FencedError
from exactly.fsutil import parse_json
from exactly.procs import ProcessId

#: a job whose heartbeat is older than this (and whose driver is on another host) is dead
HEARTBEAT_STALE_S = 60.0
#: the states of a job that has ended (job.json)
ENDED = ("stopped", "failed", "cancelled")
#: the detail of a ``cancelled`` status written just before the driver deletes the whole
#: checkpoint (``externalized_cleanup: delete_on_cancellation``): nothing may be written
#: into it after that, not even an answer (it would bring a deleted checkpoint back)
DELETING_DETAIL = "deleting the checkpoint (externalized_cleanup: delete_on_cancellation)"

Where = LogStore | str | os.PathLike[str]


def running_job(checkpoint: str | os.PathLike[str]) -> JobStatus | None:
    """The status of the live ``exactly run`` on ``checkpoint``, or None when none is alive."""
    status = JobStatus.read(job_store(checkpoint))
    return status if status is not None and status.alive() else None


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
    job: str = ""  #: the job file's name (``exactly run``): a checkpoint is one job's address
    #: the leader lease term (``exactly run --ha``) whose launcher runs this; None otherwise
    leader: int | None = None
    #: the launcher's warm spare driver (:mod:`exactly.ops.spare`): ``process`` (a
    #: :class:`~exactly.procs.ProcessId` as JSON), ``state`` (starting | ready) and
    #: ``since``; None when it keeps none
    spare: dict[str, Any] | None = None
    #: an ``exactly upgrade`` in progress (:mod:`exactly.ops.upgrade`): what it is doing
    upgrade: str | None = None

    @property
    def in_process(self) -> bool:
        """Whether the job runs inside the process that claimed it (``run_job``,
        ``start_query``): a driver without an ``exactly run`` launcher."""
        return self.driver is not None and (self.driver.host, self.driver.pid) == (
            self.supervisor.host, self.supervisor.pid)

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
                   data.get("strategy"), str(data.get("job") or ""),
                   int(data["leader"]) if data.get("leader") is not None else None,
                   data.get("spare") if isinstance(data.get("spare"), dict) else None,
                   str(data["upgrade"]) if data.get("upgrade") else None)

    @classmethod
    def read(cls, where: Where) -> JobStatus | None:
        """The status in ``where`` (a job store, or a local ``exactly-job`` directory)."""
        found = _read_versioned(as_store(where))
        return found[0] if found else None

    def write(self, where: Where) -> None:
        """Write this status (with a fresh heartbeat) whole."""
        self.heartbeat = time.time()
        store = as_store(where)
        when_space(lambda: store.write(layout.JOB_STATUS, _encode(self)),
                   what="write the job status")

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


def update_status(where: Where, *, run_id: str | None = None, **fields: Any) -> None:
    """Set ``fields`` of the status in ``where`` (with a fresh heartbeat); nothing when
    there is none (a run that was never claimed, or whose checkpoint was deleted), or when
    ``run_id`` is given and the status is another run's (a driver whose HA leader lost its
    lease never overwrites the status of the run that took over). The read and the write
    are one compare-and-swap (tried again when another write came between): a driver
    paused between them and resumed after a takeover finds the new run's status and writes
    nothing."""
    store = as_store(where)
    for _ in range(20):
        status, token = _read_versioned(store) or (None, None)
        if status is None or (run_id is not None and status.run_id != run_id):
            return
        for name, value in fields.items():
            setattr(status, name, value)
        status.heartbeat = time.time()
        encoded = _encode(status)
        if when_space(lambda: store.swap(layout.JOB_STATUS, encoded, token),  # noqa: B023
                      what="write the job status"):
            return


def _encode(status: JobStatus) -> bytes:
    return json.dumps(status.to_json(), indent=2, sort_keys=True).encode()


def _read_versioned(store: LogStore) -> tuple[JobStatus | None, str] | None:
    """``(status, version token)``; ``(None, token)`` for a file that is not a status;
    None when there is no ``job.json``."""
    found = store.read_versioned(layout.JOB_STATUS)
    if found is None:
        return None
    data, token = found
    parsed = parse_json(data, store.describe(layout.JOB_STATUS),
                        "delete it when no `exactly run` of this checkpoint is alive")
    try:
        return JobStatus.from_json(parsed), token
    except (KeyError, TypeError, ValueError, AttributeError):
        return None, token


def refuse_other_job(store: LogStore, current: JobStatus | None, job: str) -> None:
    """Raise ConfigError when ``current`` (the checkpoint's status) is of another job file
    than ``job`` (both known): a checkpoint is one job's address."""
    if current is None or not current.job or not job or current.job == job:
        return
    upgrade = upgrade_of(store)
    if upgrade.get("state") == "in-progress" and job in upgrade["files"]:
        return  # an interrupted `exactly upgrade` (or its rollback): its restore finishes it
    checkpoint = store.describe().removesuffix("/" + layout.JOB_DIR)
    upgraded = (f" (`exactly upgrade` moved it from {job} to {current.job}: start "
                f"{current.job})" if job == upgrade.get("from") else "")
    raise ConfigError(
        f"checkpoint {checkpoint} holds the job {current.job} (run {current.run_id}, "
        f"{current.state}), not {job}{upgraded}: give {job} a checkpoint of its own (if it "
        f"is the same job renamed, delete {store.describe(layout.JOB_STATUS)} once no run "
        "of it is alive). Nothing was started.")


def claim_job(where: Where, status: JobStatus, *, wait_for_orphan_s: float = 0.0,
              say: Callable[[str], None] | None = None,
              leading: bool = False) -> JobStatus | None:
    """Record ``status`` as the checkpoint's running job, or raise FencedError when another
    live ``exactly run`` already has it (read, checked and written as one compare-and-swap).

    A driver whose launcher died stops by itself (its epoch in flight commits first): the
    claim waits up to ``wait_for_orphan_s`` seconds for it (``say`` is told once), then
    raises FencedError naming it. Returns the previous status when it was a run that ended
    without a word (:meth:`JobStatus.lost`), for the caller to record; else None.

    Raises ConfigError when the checkpoint was last run by another job file (both
    ``JobStatus.job`` known and different): a checkpoint is one job's address.

    ``leading``: the caller holds the job's HA leader lease (:mod:`exactly.checkpoint.leader`),
    which decides over the status of an earlier HA run (its leader lost the lease): that run
    is taken over and returned when it had not ended. A live run without the lease (a
    plain ``exactly run``) is still refused.
    """
    store = as_store(where)
    deadline = time.monotonic() + wait_for_orphan_s
    told = False
    while True:
        found = _read_versioned(store)
        current, token = found if found else (None, None)
        refuse_other_job(store, current, status.job)
        mine = current is not None and current.supervisor == status.supervisor
        superseded = (leading and current is not None and current.leader is not None
                      and status.leader is not None and current.leader < status.leader)
        if current is None or mine or superseded or not current.alive():
            status.heartbeat = time.time()
            if not store.swap(layout.JOB_STATUS, _encode(status), token):
                continue  # another claim (or a heartbeat) came between: look again
            # not alive, yet not ended: a run that ended without a word
            lost = current is not None and not mine and current.state not in ENDED
            return current if lost else None
        orphan = current.orphaned()
        if not orphan and not current.alive():
            continue  # it ended between the two looks (an orphan's driver): look again
        if not orphan or time.monotonic() >= deadline:
            raise FencedError(_claimed(store, current, orphan))
        if not told and say is not None and current.driver is not None:
            say(f"the driver pid {current.driver.pid} of run {current.run_id} outlived its "
                f"launcher (pid {current.supervisor.pid}) and is stopping; waiting for it")
            told = True
        time.sleep(0.5)


def _claimed(store: LogStore, current: JobStatus, orphan: bool) -> str:
    checkpoint = store.describe().removesuffix("/" + layout.JOB_DIR)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(current.heartbeat))
    if orphan and current.driver is not None:
        return (f"checkpoint {checkpoint} is still run by the driver pid "
                f"{current.driver.pid} of run {current.run_id}, whose launcher (`exactly run` "
                f"pid {current.supervisor.pid}) died: it stops by itself once its epoch in "
                f"flight commits ({current.state}, heartbeat {since}); wait for it, or end it "
                f"now with `exactly cancel {checkpoint}`. Nothing was started.")
    return (f"checkpoint {checkpoint} is already run by `exactly run` pid "
            f"{current.supervisor.pid} on {current.supervisor.host} (run {current.run_id}, "
            f"{current.state}, heartbeat {since}); stop it first with `exactly stop "
            f"{checkpoint}`, or give this job its own checkpoint. Nothing was started.")
