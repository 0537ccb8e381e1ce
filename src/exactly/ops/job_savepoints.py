"""Savepoints of ``exactly run`` jobs: taking one of a running job, restoring one at start.

The supervisor calls :func:`take_job_savepoint` for ``exactly savepoint`` and ``exactly stop
--savepoint``; the driver calls :func:`restore_job` before the first start of a job run with
``-s PATH``. A driver process that is restarted after a crash finds the restore recorded in
``exactly-job/restore.json`` and does not restore again (the checkpoint has moved on).
"""

from __future__ import annotations

import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.checkpoint import layout
from exactly.checkpoint.location import (
    checkpoint_uri,
    job_dir,
    job_store,
    location_uri,
    open_store,
    same_place,
)
from exactly.checkpoint.status import running_job
from exactly.checkpoint.store import LocalLogStore, is_remote
from exactly.checkpoint.transfer import download_tree
from exactly.errors import SavepointError
from exactly.savepoints.manifest import MANIFEST, Manifest, dispose, read_manifest
from exactly.savepoints.operators import recorded_operators
from exactly.savepoints.places import staging_dir
from exactly.savepoints.restore import (
    RestoreMode,
    plan_restore,
    read_marker,
    restore_into,
)
from exactly.savepoints.sinks import SinkRollback, decide, hand_over, precheck, sink_info
from exactly.savepoints.sources import SourceMap, SourceRef, map_sources, saved_sources
from exactly.savepoints.take import take_savepoint

if TYPE_CHECKING:
    from exactly.config import CheckpointConfig
    from exactly.ops.job import Job
    from exactly.protocol.faults import FaultSpec
    from exactly.savepoints.operators import JobOperator

#: where a restore from a retained checkpoint stages its savepoint (in the new checkpoint's
#: job directory, for a local checkpoint)
RETAINED_DIR = layout.RETAINED_DIR
#: ``-s CHECKPOINT@N``: epoch N of a retained checkpoint
_AT_EPOCH = re.compile(r"^(.+)@(\d+)$")


def default_target(checkpoint: str) -> str:
    """Where savepoints go without a TARGET: ``<checkpoint>.savepoints`` beside the
    checkpoint (not inside it: deleting a checkpoint keeps its savepoints);
    ``s3://bucket/prefix.savepoints`` for a checkpoint ``s3a://bucket/prefix``."""
    uri = checkpoint_uri(checkpoint)
    if is_remote(uri):
        return location_uri(f"{uri.rstrip('/')}.savepoints")
    path = Path(uri)
    return str(path.parent / f"{path.name}.savepoints")


def _job_info(job: Job, checkpoint: str, *, own: bool = True) -> dict[str, Any]:
    """What a manifest records of the job a savepoint is taken from. ``own``: ``job`` is
    the one running on ``checkpoint`` (its sources and their uids are the checkpoint's);
    False for a checkpoint another job version wrote (a retained checkpoint, the running
    job an ``exactly upgrade`` checks): its sources are then the ones the last ``exactly
    run`` on it recorded, or with no record ``job``'s names without uids (matched by
    number)."""
    from exactly.ops.query import source_names
    from exactly.savepoints.operators import job_sources, recorded_sources

    sources = job_sources(job.df) if own else recorded_sources(job_store(checkpoint))
    info: dict[str, Any] = {"checkpoint": checkpoint_uri(checkpoint),
                            "query_name": job.query_name, "sink_format": job.sink_format,
                            "output_mode": job.output_mode,
                            "sources": [name for name, _ in sources] if sources is not None
                            else source_names(job.df)}
    if sources is not None:
        info["source_uids"] = [uid for _, uid in sources]
    return info


def take_job_savepoint(job: Job, target: str | Path, *, trigger: str,
                       operators: list[JobOperator] | None,
                       fault: FaultSpec | None = None) -> Path | str:
    """A savepoint of ``job``'s last completed epoch under ``target`` (a local directory or
    ``s3://``; the job's checkpoint local or on S3); returns where it is (``fault``: a crash
    point of :mod:`exactly.savepoints.take` armed, ``exactly run --fault``)."""
    checkpoint = job.checkpoint.storage
    return take_savepoint(job.df.sparkSession, checkpoint, target, operators=operators,
                          sinks=[sink_info(job, checkpoint)], trigger=trigger,
                          job=_job_info(job, checkpoint), fault=fault)


def retained_epoch(place: str) -> tuple[str, int | None]:
    """``CHECKPOINT@N`` (``exactly run -s``: epoch N of a retained checkpoint) as
    ``(CHECKPOINT, N)``; any other place as ``(place, None)``. A local path that exists as
    written is taken as it is, even if it ends in ``@<digits>``."""
    match = _AT_EPOCH.match(str(place))
    if match is None or (not is_remote(place) and Path(place).exists()):
        return str(place), None
    return match.group(1), int(match.group(2))


def is_checkpoint(path: str | Path) -> bool:
    """True for a Spark checkpoint (``metadata`` and ``offsets/``, no manifest), local or on
    S3: ``-s`` restores a retained checkpoint as well as a savepoint."""
    store = open_store(str(path))
    offsets = ((store.root / "offsets").is_dir() if isinstance(store, LocalLogStore)
               else bool(store.list("offsets")))
    return not store.exists(MANIFEST) and store.exists("metadata") and offsets


def savepoint_of_checkpoint(job: Job, retained: str, checkpoint: str, mode: RestoreMode,
                            staging: Path, fault: FaultSpec | None = None,
                            epoch: int | None = None) -> Path:
    """A savepoint of the retained checkpoint's last completed epoch, or of its retained
    ``epoch`` (``-s CHECKPOINT@N``), local or on S3,
    staged in the local directory ``staging``, which the restore then takes over. The
    retained checkpoint is only read. Its operators get the uids the last ``exactly run`` on
    it recorded (else Spark's numbers map them). Refused: ``claim`` mode, restoring a
    checkpoint into itself, and a checkpoint an ``exactly run`` is still running on."""
    if mode is RestoreMode.CLAIM:
        raise SavepointError(f"--restore-mode claim takes over a savepoint; {retained} is a "
                             "checkpoint, which a restore only reads: restore it without "
                             "claim and delete it once the restored job runs")
    if same_place(retained, checkpoint):
        raise SavepointError(f"{retained} is the job's own checkpoint: restore a retained "
                             "checkpoint into a new checkpoint directory")
    status = running_job(retained)
    if status is not None:
        raise SavepointError(
            f"an `exactly run` is still running on {retained} (run {status.run_id}): its "
            f"checkpoint moves on; stop it first (exactly stop {retained}) or take a "
            f"savepoint of it (exactly savepoint {retained})")
    if staging.exists():
        shutil.rmtree(staging)  # an earlier attempt died before the restore was done
    staged = take_savepoint(job.df.sparkSession, retained, staging,
                            operators=recorded_operators(job_store(retained)),
                            sinks=[sink_info(job, retained)], trigger="checkpoint",
                            job=_job_info(job, retained, own=False),
                            record=False, fault=fault,
                            epoch=epoch)
    assert isinstance(staged, Path)  # a local staging directory
    return staged


def download_savepoint(savepoint: str, directory: Path) -> Path:
    """The savepoint at ``savepoint`` (``s3://``), checked (complete, every file of its
    size) and copied into the local ``directory``; returns the local copy, which
    :func:`read_manifest` then verifies file by file. Raises SavepointError for an
    incomplete or damaged savepoint before anything is copied."""
    read_manifest(savepoint, checksums=False)
    local = directory / savepoint.rstrip("/").rsplit("/", 1)[-1]
    download_tree(open_store(savepoint), local)
    return local


@dataclass(frozen=True)
class RestoreRequest:
    """``exactly run -s PATH`` and its options."""

    savepoint: str
    allow_non_restored_state: bool = False
    mode: RestoreMode = RestoreMode.NO_CLAIM
    parallelism: int | None = None
    sink_rollback: SinkRollback = SinkRollback.REFUSE

    def to_json(self) -> dict[str, Any]:
        return {"savepoint": self.savepoint,
                "allow_non_restored_state": self.allow_non_restored_state,
                "mode": self.mode.value, "parallelism": self.parallelism,
                "sink_rollback": self.sink_rollback.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RestoreRequest:
        return cls(str(data["savepoint"]), bool(data.get("allow_non_restored_state")),
                   RestoreMode(data.get("mode", "no_claim")), data.get("parallelism"),
                   SinkRollback(data.get("sink_rollback", "refuse")))


def restore_job(job: Job, request: RestoreRequest, operators: list[JobOperator],
                fault: FaultSpec | None = None) -> dict | None:
    """Restore ``request.savepoint`` (a savepoint or a retained checkpoint, local or on S3)
    into the job's (new) checkpoint (local or ``s3a://``); None when this checkpoint already
    holds the restore (a restarted driver process). Raises SavepointError before writing
    anything when the savepoint cannot be restored. ``fault`` arms the crash points of the
    restore (and of the savepoint a retained checkpoint is staged as), ``exactly run
    --fault``.

    What is on S3 is staged in a local directory of this host (removed after the restore;
    a killed driver's is removed by the next one): a savepoint is downloaded whole
    and verified there, a retained checkpoint's last completed epoch is copied as a
    savepoint, and a new checkpoint on S3 is written locally and uploaded (see
    :func:`~exactly.savepoints.restore.restore_into` for what a crash leaves)."""
    checkpoint = checkpoint_uri(job.checkpoint.storage)
    previous = read_marker(checkpoint)
    if previous is not None and previous.get("state") == "done":
        if not same_place(previous.get("savepoint", ""), request.savepoint):
            raise SavepointError(
                f"{checkpoint} was restored from {previous.get('savepoint')} already; restore "
                f"{request.savepoint} into a new checkpoint directory")
        return None
    if (previous is not None and previous.get("savepoint")
            and not same_place(previous["savepoint"], request.savepoint)):
        # its query may own the sink's target already: another savepoint must not reuse it
        raise SavepointError(
            f"{checkpoint} holds an interrupted restore of {previous['savepoint']} (its "
            f"query {previous.get('query_id')} may have taken the sink's target over); "
            f"restoring {request.savepoint} there is refused. Finish that restore (run the "
            f"job again with -s {previous['savepoint']}) or restore {request.savepoint} "
            "into a new checkpoint directory")
    query_id = (previous.get("query_id") if previous is not None else None) or \
        str(uuid.uuid4())
    mode = request.mode
    place, epoch = retained_epoch(request.savepoint)
    retained = is_checkpoint(place)
    if epoch is not None and not retained:
        raise SavepointError(f"{request.savepoint}: @{epoch} names an epoch of a retained "
                             f"checkpoint, and {place} is not a checkpoint (a savepoint holds "
                             f"one epoch: give -s {place})")
    with staging_dir(checkpoint, "restore-source") as scratch:
        if retained:
            staging = (scratch / RETAINED_DIR if is_remote(checkpoint)
                       else job_dir(checkpoint) / RETAINED_DIR)
            path = savepoint_of_checkpoint(job, place, checkpoint, mode, staging, fault,
                                           epoch=epoch)
            mode = RestoreMode.CLAIM  # the staged copy is taken over; the checkpoint only read
        elif is_remote(request.savepoint):
            path = download_savepoint(request.savepoint, scratch)
        else:
            path = Path(request.savepoint)
        manifest = read_manifest(path)
        spark = job.df.sparkSession
        plan = plan_restore(manifest, path, operators, partitions=request.parallelism,
                            backend=restore_backend(job.checkpoint, manifest),
                            allow_non_restored_state=request.allow_non_restored_state,
                            spark_version=spark.version)
        plan.sources = _check_sources(manifest, job, request.allow_non_restored_state)
        state = decide(job, manifest, request.sink_rollback, query_id)
        done = restore_into(spark, plan, checkpoint, mode=mode, query_id=query_id,
                            origin=request.savepoint,
                            restored_from="checkpoint" if retained else "savepoint",
                            fault=fault,
                            before_done=lambda: hand_over(job, manifest, state,
                                                          request.sink_rollback, query_id))
        if retained:
            shutil.rmtree(path.parent, ignore_errors=True)  # the staging directory, now empty
        elif mode is RestoreMode.CLAIM and is_remote(request.savepoint):
            dispose(request.savepoint)  # taken over (the local copy went with the restore)
    return done


def check_upgrade(job: Job, request: RestoreRequest,
                  operators: list[JobOperator]) -> dict[str, Any]:
    """Check, before ``exactly upgrade`` touches the running job on ``job``'s checkpoint,
    that the savepoint it is about to take restores into ``job`` (the new job file's) as
    ``request`` says (its savepoint aside): the operators map (uids, schemas, partitions,
    the state backend), the sources are the same, the sink's rule lets the target be
    taken over. The check reads a copy of the checkpoint's last completed epoch (a local
    scratch directory, removed after; the checkpoint is only read, nothing is recorded).
    Returns the restore plan; raises SavepointError as that restore would."""
    import tempfile

    checkpoint = checkpoint_uri(job.checkpoint.storage)
    with tempfile.TemporaryDirectory(prefix="exactly-upgrade-check-") as scratch:
        path = take_savepoint(job.df.sparkSession, checkpoint, scratch,
                              operators=recorded_operators(job_store(checkpoint)),
                              sinks=[sink_info(job, checkpoint)], trigger="upgrade-check",
                              job=_job_info(job, checkpoint, own=False), record=False)
        assert isinstance(path, Path)  # a local scratch directory
        manifest = read_manifest(path, checksums=False)  # copied a moment ago
        plan = plan_restore(manifest, path, operators, partitions=request.parallelism,
                            backend=restore_backend(job.checkpoint, manifest),
                            allow_non_restored_state=request.allow_non_restored_state,
                            spark_version=job.df.sparkSession.version)
        plan.sources = _check_sources(manifest, job, request.allow_non_restored_state)
        precheck(job, manifest, request.sink_rollback)
        return plan.describe()


def restore_backend(config: CheckpointConfig, manifest: Manifest) -> str:
    """The backend a restore writes: the job's, or with none given, the savepoint's own."""
    return config.state_backend.value if config.state_backend else manifest.state_backend


def _check_sources(manifest: Manifest, job: Job,
                   allow_non_restored_state: bool) -> SourceMap:
    """Which savepoint position each of ``job``'s sources resumes from: by source uid,
    unnamed sources by number and format (:func:`~exactly.savepoints.sources.map_sources`).
    A savepoint of another job has other sources: refused (SavepointError), as is a source
    the job dropped unless ``allow_non_restored_state``."""
    from exactly.savepoints.operators import job_sources

    recorded = manifest.job.get("sources")
    saved = saved_sources(manifest.sources, list(recorded) if recorded else None)
    ours = [SourceRef(i, name, uid) for i, (name, uid) in enumerate(job_sources(job.df))]
    try:
        return map_sources(saved, ours, allow_non_restored_state=allow_non_restored_state)
    except SavepointError as e:
        raise SavepointError(f"the savepoint {manifest.savepoint_id} does not resume this "
                             f"job's sources: {e}") from None
