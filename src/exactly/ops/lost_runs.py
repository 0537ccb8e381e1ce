"""Runs that ended without a word, and the epochs they left in flight.

A driver process that dies leaves its epoch in flight (offsets logged, no commit): the
``exactly run`` launcher records that epoch as failed when it sees the death. When the whole
job dies at once -- a SIGKILL of the launcher with its driver, of the container, the OOM
killer, the machine -- nobody is left to say so: ``job.json`` still says ``running``. The next
start on the checkpoint notices (:meth:`exactly.checkpoint.control.JobStatus.lost`) and records the
lost run here, in the restart history (a ``failure`` of kind ``lost-run``, under the lost
run's id) and as a failed epoch in the checkpoint's history when one was in flight, so
``exactly checkpoints`` and the dashboard show it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.status import JobStatus
from exactly.logs import log_event

logger = logging.getLogger("exactly.ops.lost_runs")


def record_epoch_lost(checkpoint: str, cause: str, *, failure: str = "process") -> int | None:
    """A job that died with an epoch in flight (offsets logged, no commit) failed that
    epoch: record it in the checkpoint's history. Returns the epoch, None when none was in
    flight."""
    from exactly.checkpoint.history import append_now
    from exactly.checkpoint.spark_files import uncommitted_epoch
    from exactly.monitoring.records import failed_epoch

    epoch = uncommitted_epoch(checkpoint)
    if epoch is not None:
        append_now(checkpoint, failed_epoch(checkpoint, epoch, failure=failure, cause=cause,
                                            at=time.time()))
    return epoch


def record_lost_run(checkpoint: str, lost: JobStatus, *, noticed_by: str) -> dict[str, Any]:
    """Record that the run ``lost`` (the checkpoint's previous ``job.json``) ended without a
    word: when it was last seen, the epoch it had in flight, the last epoch it completed.
    ``noticed_by`` is the run id of the start that found it. Returns the history entry."""
    from exactly.checkpoint.spark_files import last_committed_epoch

    directory = job_store(checkpoint)
    last_seen = lost.heartbeat  # written with every status change and every 2 s while running
    seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last_seen))
    cause = (f"LostRun: run {lost.run_id} (`exactly run` pid {lost.supervisor.pid} on "
             f"{lost.supervisor.host}) ended without a word while {lost.state}, after "
             f"{seen}: its launcher and driver are gone (a kill of the whole job, its "
             "container or its machine)")
    epoch = record_epoch_lost(checkpoint, cause, failure="lost-run")
    if epoch is not None:
        cause += f"; epoch {epoch} was in flight"
    last_epoch = last_committed_epoch(checkpoint)
    entry = RestartHistory(directory, lost.run_id).append(
        "failure", kind="lost-run", cause=cause, action="restart", last_seen_at=last_seen,
        epoch_in_flight=epoch, last_epoch=last_epoch, state=lost.state,
        noticed_by=noticed_by)
    log_event(logger, "lost_run", logging.WARNING, run=lost.run_id, last_seen_at=last_seen,
              epoch_in_flight=epoch, last_epoch=last_epoch, noticed_by=noticed_by)
    return entry
