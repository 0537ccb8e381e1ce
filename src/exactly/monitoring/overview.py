"""What a job's checkpoints look like now: Flink's checkpoint tab, computed from the history.

:func:`load` reads a checkpoint directory -- the history
(:mod:`exactly.checkpoint.history`), the restart history of ``exactly run``
(:mod:`exactly.checkpoint.restarts`), Spark's offset and commit logs (an epoch in progress)
and the job's control status (running or not) -- and returns an :class:`Overview`: counts
(triggered, in progress, completed, failed, restored), the latest completed and failed
checkpoint, savepoint and restore, the recent history, a min/avg/max summary, the
configuration, restarts with their causes, and the damaged history lines it skipped; for a
job run with ``--ha``, its leader, live standbys and failovers
(:mod:`exactly.checkpoint.ha_view`). The CLI (``exactly checkpoints``), the REST API and the
dashboard all show this one object.

Raises :class:`~exactly.errors.ConfigError` for a directory that is not a checkpoint.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from exactly.checkpoint import layout
from exactly.checkpoint.ha_view import failovers, leader_view
from exactly.checkpoint.history import open_history
from exactly.checkpoint.location import (
    checkpoint_exists,
    checkpoint_uri,
    job_store,
    local_checkpoint,
    open_store,
)
from exactly.errors import ConfigError

#: epochs the history table shows by default (Flink shows 10; the dashboard pages)
HISTORY_ROWS = 1000


@dataclass
class EpochRow:
    """One line of the checkpoint history table."""

    epoch: int
    status: str  # completed | failed | in_progress
    trigger_at: float | None = None
    end_at: float | None = None
    duration_ms: float | None = None
    new_bytes: int | None = None
    full_bytes: int | None = None
    rows_in: int | None = None
    rows_out: int | None = None
    cause: str | None = None
    failure: str | None = None  # query | checkpoint-timeout | process
    restored: bool = False  # the first epoch after a restore or a restart
    #: ``periodic`` (Spark's trigger) or ``manual`` (``exactly checkpoint``: the epoch that
    #: answered it, from its ``manual_checkpoint`` record)
    trigger: str = "periodic"


@dataclass
class Overview:
    """Everything the views show about one job (JSON: :meth:`to_json`)."""

    job_id: str
    checkpoint: str
    name: str | None
    status: str
    #: why the job is failed or restarting (its last cause), else ""
    status_detail: str
    counts: dict[str, int]
    latest: dict[str, Any]
    summary: dict[str, dict[str, float | None]]
    history: list[EpochRow]
    config: dict[str, Any]
    restarts: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    updated_at: float = 0.0
    #: an ``exactly run --ha`` job's leader and live standbys (exactly.checkpoint.ha_view),
    #: else None
    leader: dict[str, Any] | None = None
    #: its failovers with their causes and durations, oldest first
    failovers: list[dict[str, Any]] = field(default_factory=list)
    #: the warm spare driver of a live ``exactly run`` (:func:`spare_view`), else None
    spare: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["history"] = [asdict(row) for row in self.history]
        return data


def is_checkpoint(checkpoint: str) -> bool:
    """A Spark checkpoint has ``metadata`` or ``offsets/``; exactly's history counts too, and
    so does the status of an ``exactly run`` (a run that failed before its query started,
    e.g. a refused restore, leaves only that)."""
    store = open_store(checkpoint)
    return (store.exists("metadata") or bool(store.list("offsets"))
            or bool(store.list(f"{layout.JOB_DIR}/{layout.HISTORY_DIR}"))
            or store.exists(f"{layout.JOB_DIR}/{layout.JOB_STATUS}"))


def _require_checkpoint(checkpoint: str) -> None:
    if not checkpoint_exists(checkpoint):
        raise ConfigError(f"{checkpoint} does not exist; give the checkpoint of a job "
                          "(CheckpointConfig(storage=...) or `exactly run --checkpoint`)")
    local = local_checkpoint(checkpoint)
    if (local is not None and not local.is_dir()) or not is_checkpoint(checkpoint):
        raise ConfigError(f"{checkpoint} is not a Spark checkpoint (no metadata, offsets/, "
                          "exactly-job/history or exactly-job/job.json in it); give the "
                          "directory a job was started with as its checkpoint")


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "avg": None, "max": None, "count": 0}
    return {"min": min(values), "avg": round(statistics.fmean(values), 3), "max": max(values),
            "count": len(values)}


@dataclass
class Loaded:
    """An :class:`Overview` and the records it was computed from."""

    overview: Overview
    records: list[dict[str, Any]]

    def details(self, epoch: int) -> dict[str, Any] | None:
        """Everything recorded about ``epoch``: its last record (a replay after a failure
        completes the epoch the failure interrupted) and the failed attempts before it."""
        attempts = [r for r in self.records if r.get("epoch") == epoch
                    and r.get("kind") in ("epoch", "epoch_failed")]
        if not attempts:
            row = next((r for r in self.overview.history if r.epoch == epoch), None)
            return {"epoch": epoch, "status": row.status, "record": asdict(row)} if row else None
        final = attempts[-1]
        manual = any(r.get("kind") == "manual_checkpoint" and r.get("epoch") == epoch
                     for r in self.records)
        return {"epoch": epoch, "status": final.get("status", "failed"), "record": final,
                "trigger": "manual" if manual else "periodic",
                "failed_attempts": [r for r in attempts[:-1] if r["kind"] == "epoch_failed"]}


def load(checkpoint: str | os.PathLike[str], *, history_rows: int = HISTORY_ROWS) -> Loaded:
    """Read ``checkpoint`` and compute its overview (see the module's docstring)."""
    from exactly.checkpoint.restarts import RestartHistory
    from exactly.checkpoint.spark_files import offsets_logged_at, uncommitted_epoch
    from exactly.checkpoint.status import JobStatus

    directory = checkpoint_uri(checkpoint)
    _require_checkpoint(directory)
    read = open_history(directory).read()
    records = read.records
    warnings = [f"skipped a damaged history line: {s.describe()}" for s in read.skipped]

    rows: dict[int, EpochRow] = {}
    failed_rows: list[EpochRow] = []
    runs = [r for r in records if r["kind"] == "run"]
    savepoints = [r for r in records if r["kind"] == "savepoint"]
    restores = [r for r in records if r["kind"] == "restore"]
    restored_after: set[int] = set()
    last_failure: dict[str, Any] | None = None
    restore_events: list[dict[str, Any]] = []
    prepared = False  # a restore was recorded: the next start is that restore's start
    for r in records:
        kind = r["kind"]
        if kind == "epoch" and isinstance(r.get("epoch"), int):
            prepared = False
            ck = r.get("checkpoint") or {}
            rows[r["epoch"]] = EpochRow(
                r["epoch"], "completed", r.get("trigger_at"), r.get("end_at"),
                r.get("duration_ms"), ck.get("new_bytes"), ck.get("full_bytes"),
                r.get("rows_in"), r.get("rows_out"),
                restored=r["epoch"] in restored_after)
        elif kind == "epoch_failed" and isinstance(r.get("epoch"), int):
            row = EpochRow(r["epoch"], "failed", r.get("trigger_at"), r["at"],
                           cause=r.get("cause"), failure=r.get("failure"))
            failed_rows.append(row)
            last_failure = r
        elif kind == "run" and r.get("resumed_after_epoch") is not None:
            restored_after.add(int(r["resumed_after_epoch"]) + 1)
            if prepared:
                prepared = False  # the start of the restore recorded just before
                continue
            restore_events.append({"at": r["at"], "source": "checkpoint",
                                   "epoch": r["resumed_after_epoch"],
                                   "after_failure": (last_failure or {}).get("cause"),
                                   "path": str(directory)})
            last_failure = None
        elif kind == "restore":
            prepared = True
            restore_events.append({"at": r["at"], "source": r.get("source", "savepoint"),
                                   "epoch": r.get("epoch"), "path": r.get("path"),
                                   "after_failure": None})

    manual = {r["epoch"] for r in records
              if r["kind"] == "manual_checkpoint" and isinstance(r.get("epoch"), int)}
    for epoch in manual & rows.keys():
        rows[epoch].trigger = "manual"
    in_progress = None
    job = JobStatus.read(job_store(directory))
    status = _status(directory, records, job)
    uncommitted = uncommitted_epoch(str(directory))
    if status in ("running", "restarting", "stopping") and uncommitted is not None:
        in_progress = EpochRow(uncommitted, "in_progress",
                               offsets_logged_at(str(directory), uncommitted))

    history = sorted([*rows.values(), *failed_rows],
                     key=lambda row: (row.end_at or 0.0, row.epoch))
    if in_progress is not None:
        history.append(in_progress)
    history = list(reversed(history))[:history_rows]  # newest first

    completed = [rows[e] for e in sorted(rows)]
    latest_completed = max(rows.values(), key=lambda row: row.end_at or 0.0, default=None)
    latest_failed = failed_rows[-1] if failed_rows else None
    config = dict(runs[-1].get("config") or {}) if runs else {}
    if runs:
        for key in ("sink", "shuffle_partitions", "versions"):
            config[key] = runs[-1].get(key)
    restarts = RestartHistory(job_store(directory), "").entries(this_run_only=False)
    leader = leader_view(job_store(directory))
    warnings += [f"unreadable HA record {line}" for line in (leader or {}).get("unreadable", [])]
    overview = Overview(
        job_id=str(runs[-1]["query_id"]) if runs else directory.rstrip("/").rsplit("/", 1)[-1],
        checkpoint=str(directory),
        name=runs[-1].get("name") if runs else None,
        status=status,
        status_detail=_status_detail(job, status),
        counts={"triggered": len(rows) + len(failed_rows) + (in_progress is not None),
                "in_progress": int(in_progress is not None), "completed": len(rows),
                "failed": len(failed_rows), "restored": len(restore_events),
                "restarts": sum(1 for e in restarts if e.get("event") == "failure"
                                and e.get("action") in ("restart", "tolerated")),
                "savepoints": len(savepoints),
                "manual": len(manual & rows.keys())},
        latest={"completed": asdict(latest_completed) if latest_completed else None,
                "failed": asdict(latest_failed) if latest_failed else None,
                "savepoint": savepoints[-1] if savepoints else None,
                "restore": restore_events[-1] if restore_events else None},
        summary={"duration_ms": _stats([r.duration_ms for r in completed
                                        if r.duration_ms is not None]),
                 "new_bytes": _stats([r.new_bytes for r in completed
                                      if r.new_bytes is not None]),
                 "full_bytes": _stats([r.full_bytes for r in completed
                                       if r.full_bytes is not None]),
                 "rows_in": _stats([r.rows_in for r in completed if r.rows_in is not None])},
        history=history, config=config,
        restarts=[e for e in restarts if e.get("event") in ("failure", "recovered")],
        warnings=warnings, updated_at=time.time(), leader=leader,
        failovers=failovers(restarts, job_state=status),
        spare=spare_view(job, status))
    if restores:
        overview.latest["savepoint_restore"] = restores[-1]
    upgrades = [r for r in records if r["kind"] == "upgrade"]
    if upgrades:
        overview.latest["upgrade"] = upgrades[-1]
    return Loaded(overview, records)


def spare_view(job: Any, status: str) -> dict[str, Any] | None:
    """The spare driver of a job that runs: ``state`` (``ready``: it takes the job over at
    the next restart, without a driver start; ``starting``; ``none``: the launcher keeps
    none now -- off, on Spark Connect, or not started yet), its ``pid`` and ``since`` (when it
    got to that state). None for a job that does not run (ended, or no ``exactly run``)."""
    if job is None or status not in ("running", "restarting", "stopping"):
        return None
    spare = job.spare or {}
    process = spare.get("process") or {}
    state = str(spare.get("state") or "none")
    return {"state": state, "pid": process.get("pid"), "since": spare.get("since")}


def _status_detail(job: Any, status: str) -> str:
    if job is None:
        return ""
    if status == "lost":
        seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.heartbeat))
        return (f"run {job.run_id} ended without a word while {job.state}, after {seen}: "
                f"its launcher (pid {job.supervisor.pid}) and driver are gone; the next "
                "`exactly run` records it and resumes from the last completed epoch")
    detail = job.detail if status in ("failed", "restarting", "stopping", "stopped") else ""
    if job.upgrade and status not in ("failed", "cancelled", "lost"):  # exactly upgrade
        detail = "; ".join(part for part in (detail, job.upgrade) if part)
    return detail


def _status(directory: str, records: list[dict[str, Any]], job: Any) -> str:
    """``running`` / ``restarting`` / ``stopping`` / ``stopped`` / ``failed`` /
    ``cancelled`` from ``exactly run``'s status file when one exists (``lost`` when it says
    the job runs but neither its launcher nor its driver is alive), else from the
    history's last run (``unknown`` for a run with no end and no recent record: a driver
    that was killed)."""
    if job is not None:
        if job.state in ("stopped", "failed", "cancelled"):
            return str(job.state)
        return str(job.state) if job.alive() else "lost"
    ends = [r for r in records if r["kind"] in ("run", "run_end")]
    if not ends:
        return "stopped" if open_store(directory).list("commits") else "unknown"
    last = ends[-1]
    if last["kind"] == "run_end":
        return "failed" if last.get("outcome") == "failed" else "stopped"
    newest = max(r["at"] for r in records)
    interval = float((last.get("config") or {}).get("interval_s") or 1.0)
    return "running" if time.time() - newest < max(60.0, 10 * interval) else "unknown"
