"""What a restore does to the job's sink target: the rule per sink, safe by default.

A restored job is a new query (a new id, as a restored Flink job gets a new job id) that
continues the savepoint's epoch numbers at N+1. Before anything runs, the sink target is
asked how far the *savepoint's* query got there (its last visible epoch M):

* no output of that query (a fresh target): the new query writes from epoch N+1 on;
* M <= N: the target holds exactly the savepoint's output; the new query takes the target
  over (the sink's owner record moves to the new query id) and goes on from N+1: an upgrade;
* M > N: the savepoint is older than the target (a rollback). Epochs N+1..M are in the
  target and the restored job would write them again. The default refuses and names the
  choices: ``retract`` removes the output of epochs N+1..M first (the file sink, whose
  epochs are directories, and the PostgreSQL sink in append mode, whose rows carry their
  epoch); ``keep`` leaves it (duplicates for an appending sink; harmless for a sink that
  upserts by key, whose rows converge to the replayed values).

A target whose owner is another query than the savepoint's is refused (it is not this job's
output). The take-over also refuses while the savepoint's own job is still running on its
checkpoint: two live queries must not share a target.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly import options as opt
from exactly.errors import SavepointError
from exactly.fsutil import atomic_write_json, fsync_dir, read_json
from exactly.logs import log_event
from exactly.savepoints.manifest import Manifest, SinkInfo

if TYPE_CHECKING:
    from exactly.ops.job import Job

logger = logging.getLogger("exactly.savepoints")
#: sinks that can take back the output of epochs newer than a savepoint (--sink-rollback retract)
RETRACTABLE = ("exactly.files", "exactly.postgres")


class SinkRollback(str, Enum):
    """What a restore does when the target is ahead of the savepoint (``--sink-rollback``)."""

    REFUSE = "refuse"
    RETRACT = "retract"
    KEEP = "keep"


@dataclass(frozen=True)
class SinkState:
    """The target as a restore finds it."""

    format: str
    target: str | None
    owner: str | None  # the query the target belongs to, when the sink records one
    progress: int | None  # the savepoint query's last epoch visible in the target
    known: bool = True  # False: this sink cannot tell (not an exactly sink)


def _options(job: Job, checkpoint: str | None) -> dict[str, str]:
    from exactly.spark.runner import with_sink_log_dir

    options = dict(job.options)
    if job.path:
        options[opt.PATH] = job.path
    return with_sink_log_dir(checkpoint, options) if checkpoint else options


def _built(job: Job, checkpoint: str | None = None) -> Any:
    from exactly.spark.formats import sink_for

    if checkpoint is None and not job.checkpoint.is_memory_storage:
        checkpoint = job.checkpoint.storage
    return sink_for(job.sink_format, _options(job, checkpoint))


def target_of(job: Job) -> str | None:
    """The sink's target, without secrets: a path, a table or a topic."""
    fmt = job.sink_format.lower()
    options = {k.lower(): v for k, v in job.options.items()}
    if fmt == "exactly.files":
        return job.path or options.get(opt.PATH)
    if fmt in ("exactly.postgres", "exactly.upsert", "exactly.wal"):
        return options.get(opt.TABLE.lower())
    if fmt == "exactly.kafka":
        return options.get(opt.TOPIC.lower())
    return job.path


def sink_info(job: Job, checkpoint: str) -> SinkInfo:
    """The job's sink for a savepoint's manifest: format, target, last completed epoch."""
    from exactly.protocol.commitlog import CommitLog

    epoch = None
    if job.sink_format.lower().startswith("exactly."):
        try:
            done = CommitLog(_built(job, checkpoint).sink.log_directory).completed_epochs()
            epoch = done[-1] if done else None
        except Exception as exc:  # the manifest says "unknown" rather than failing
            log_event(logger, "sink_progress_unknown", logging.WARNING, error=repr(exc))
    return SinkInfo(format=job.sink_format, target=target_of(job), committed_epoch=epoch)


# -- reading the target ---------------------------------------------------------------------
def inspect_target(job: Job, manifest: Manifest) -> SinkState:
    fmt = job.sink_format.lower()
    target = target_of(job)
    if fmt == "exactly.files":
        return _files_state(job, manifest, target)
    if fmt == "exactly.postgres":
        return _postgres_state(job, manifest, target)
    if fmt == "exactly.kafka":
        return _kafka_state(job, manifest, target)
    if fmt == "exactly.upsert":
        return _upsert_state(job, target)
    if fmt == "exactly.wal":
        return _wal_state(job, manifest, target)
    return SinkState(job.sink_format, target, None, None, known=False)


def _files_log(job: Job) -> Path:
    from exactly.spark.runner import sink_log_directory

    log = sink_log_directory("exactly.files", job.path, _options(job, None))
    assert isinstance(log, Path)  # the file sink's log is <output>/_exactly
    return log


def _files_state(job: Job, manifest: Manifest, target: str | None) -> SinkState:
    from exactly.protocol.commitlog import CommitLog

    log = _files_log(job)
    owner = read_json(log / "query.json")
    owner_id = owner.get("query_id") if isinstance(owner, dict) else None
    progress = None
    if owner_id == manifest.query_id:
        done = CommitLog(log).completed_epochs()
        progress = done[-1] if done else None
    return SinkState("exactly.files", target, owner_id, progress)


def _postgres_state(job: Job, manifest: Manifest, target: str | None) -> SinkState:
    from psycopg import sql

    from exactly.connectors.sql import pg_connect

    sink = _built(job).sink
    with pg_connect(sink.dsn, application="exactly-restore", autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s), to_regclass(%s)",
                              (sink.table.sql().as_string(conn),
                               sink.epochs.sql().as_string(conn))).fetchone()
        if exists is None or exists[0] is None or exists[1] is None:
            return SinkState("exactly.postgres", target, None, None)
        row = conn.execute(sql.SQL("SELECT query_id, epoch FROM {} WHERE relid = {}::regclass")
                           .format(sink.epochs.sql(),
                                   sql.Literal(sink.table.sql().as_string(conn)))).fetchone()
    if row is None:
        return SinkState("exactly.postgres", target, None, None)
    progress = int(row[1]) if row[0] == manifest.query_id else None
    return SinkState("exactly.postgres", target, str(row[0]), progress)


def _upsert_state(job: Job, target: str | None) -> SinkState:
    """The upsert sink keeps the epoch that wrote each row: the newest one is its progress
    (the sink has no owner; its epoch guard makes a replay rewrite the same values)."""
    from psycopg import sql

    from exactly.connectors.sql import pg_connect

    sink = _built(job).sink
    with pg_connect(sink.dsn, application="exactly-restore", autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)",
                              (sink.table.sql().as_string(conn),)).fetchone()
        if exists is None or exists[0] is None:
            return SinkState("exactly.upsert", target, None, None)
        row = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(
            sql.Identifier(sink.epoch_column), sink.table.sql())).fetchone()
    newest = row[0] if row else None
    return SinkState("exactly.upsert", target, None, None if newest is None else int(newest))


def _wal_state(job: Job, manifest: Manifest, target: str | None) -> SinkState:
    """The write-ahead sink marks every loaded epoch per query: whether the savepoint's
    query loaded the epoch after the savepoint tells a rollback."""
    sink = _built(job).sink
    epoch = manifest.epoch
    if sink.target.has_marker(manifest.query_id, epoch + 1):
        progress: int | None = epoch + 1
    elif sink.target.has_marker(manifest.query_id, epoch):
        progress = epoch
    else:
        progress = None
    return SinkState("exactly.wal", target, None, progress)


def _kafka_state(job: Job, manifest: Manifest, target: str | None) -> SinkState:
    from exactly.connectors.kafka.publisher import read_marker

    sink = _built(job).sink
    after = read_marker(sink.options, manifest.query_id)
    return SinkState("exactly.kafka", target, None, after - 1 if after > 0 else None)


# -- the rule -------------------------------------------------------------------------------
def decide(job: Job, manifest: Manifest, policy: SinkRollback, new_query_id: str) -> SinkState:
    """Check the target against the savepoint (module docstring); raises SavepointError when
    the restore must not go on, naming the choices. Writes nothing."""
    state = inspect_target(job, manifest)
    where = f"{state.format} target {state.target}"
    if not state.known:
        if policy is not SinkRollback.KEEP:
            raise SavepointError(
                f"the {where} cannot tell how far the savepoint's query wrote, so a restore "
                "could write epochs after the savepoint a second time. Restore into a fresh "
                "target, or accept that with --sink-rollback keep")
        return state
    if state.owner not in (None, manifest.query_id, new_query_id):
        raise SavepointError(
            f"the {where} holds the output of query {state.owner}, not of the savepoint's "
            f"query {manifest.query_id}: it is not this job's output. Restore into a fresh "
            "target (another path, table or topic)")
    if state.progress is not None and state.progress > manifest.epoch:
        if policy is SinkRollback.REFUSE:
            retract = state.format in RETRACTABLE
            raise SavepointError(
                f"the {where} already holds epochs {manifest.epoch + 1}..{state.progress} of "
                f"the savepoint's query, newer than the savepoint (epoch {manifest.epoch}): "
                "the restored job would write them again. Choose: "
                + ("--sink-rollback retract (remove their output first), " if retract else "")
                + "--sink-rollback keep (leave it; an appending sink then holds those epochs "
                "twice), or restore into a fresh target")
        if policy is SinkRollback.RETRACT and state.format not in RETRACTABLE:
            raise SavepointError(f"--sink-rollback retract: the {where} cannot take back "
                                 "committed output; choose keep or a fresh target")
    return state


def _source_job_alive(manifest: Manifest) -> bool:
    from exactly.ops.control import running_job

    checkpoint = manifest.job.get("checkpoint")
    return bool(checkpoint) and running_job(str(checkpoint)) is not None


def hand_over(job: Job, manifest: Manifest, state: SinkState, policy: SinkRollback,
              new_query_id: str) -> dict[str, Any]:
    """Make the target the restored query's (idempotent; see the module docstring).
    Returns what was done, for the restore record."""
    if not state.known or (state.owner is None and state.progress is None
                           and state.format != "exactly.kafka"):
        return {"sink": "fresh target"}
    if state.progress is None and state.format == "exactly.kafka":
        return {"sink": "fresh target"}
    if state.format in ("exactly.upsert", "exactly.wal"):
        return {"sink": "nothing to take over (epochs of each query are marked apart)"}
    if state.owner == new_query_id:
        return {"sink": "already taken over"}
    if _source_job_alive(manifest):
        raise SavepointError(
            f"the job the savepoint was taken from still runs on {manifest.job['checkpoint']} "
            f"and writes to the {state.format} target {state.target}: stop it first "
            f"(exactly stop {manifest.job['checkpoint']}) or restore into a fresh target")
    retract = (policy is SinkRollback.RETRACT and state.progress is not None
               and state.progress > manifest.epoch)
    if state.format == "exactly.files":
        done = _files_hand_over(job, manifest, new_query_id, retract)
    elif state.format == "exactly.postgres":
        done = _postgres_hand_over(job, manifest, new_query_id, retract)
    else:
        done = _kafka_hand_over(job, manifest)
    log_event(logger, "sink_taken_over", sink=state.format, target=state.target,
              from_query=manifest.query_id, to_query=new_query_id, **done)
    return done


def _files_hand_over(job: Job, manifest: Manifest, new_query_id: str,
                     retract: bool) -> dict[str, Any]:
    from exactly.protocol.commitlog import CommitLog

    log = _files_log(job)
    root = log.parent
    removed = []
    if retract:
        commit_log = CommitLog(log)
        for epoch in commit_log.completed_epochs():
            if epoch <= manifest.epoch:
                continue
            directory = root / f"epoch-{epoch:012d}"
            if directory.exists():
                shutil.rmtree(directory)
            removed.append(epoch)
        for folder in (log / "complete", log / "intents"):
            for path in folder.glob("*.json") if folder.is_dir() else []:
                if path.stem.isdigit() and int(path.stem) > manifest.epoch:
                    path.unlink()
        fsync_dir(root)
    owner = read_json(log / "query.json") or {}
    atomic_write_json(log / "query.json", {**owner, "query_id": new_query_id,
                                           "restored_from": {"query_id": manifest.query_id,
                                                             "epoch": manifest.epoch}})
    return {"retracted_epochs": removed}


def _postgres_hand_over(job: Job, manifest: Manifest, new_query_id: str,
                        retract: bool) -> dict[str, Any]:
    from psycopg import sql

    from exactly.connectors.sql import pg_connect

    sink = _built(job).sink
    aborted = 0
    for handle in sink.list_pre_commits(manifest.query_id):
        sink.abort(handle)  # the old query's leftovers would hold row locks for ever
        aborted += 1
    deleted = 0
    with pg_connect(sink.dsn, application="exactly-restore") as conn:
        name = sql.Literal(sink.table.sql().as_string(conn))
        if retract:
            if sink.write_mode != "append":
                raise SavepointError("--sink-rollback retract: the PostgreSQL sink in upsert "
                                     "mode overwrote rows in place and cannot restore them; "
                                     "choose keep (the rows converge) or a fresh table")
            deleted = conn.execute(sql.SQL("DELETE FROM {} WHERE {} > %s").format(
                sink.table.sql(), sql.Identifier(sink.epoch_column)),
                (manifest.epoch,)).rowcount
            conn.execute(sql.SQL("UPDATE {} SET epoch = %s WHERE relid = {}::regclass").format(
                sink.epochs.sql(), name), (manifest.epoch,))
        conn.execute(sql.SQL("UPDATE {} SET query_id = %s WHERE relid = {}::regclass "
                             "AND query_id = %s").format(sink.epochs.sql(), name),
                     (new_query_id, manifest.query_id))
        conn.commit()
    return {"aborted_pre_commits": aborted, "retracted_rows": deleted}


def _kafka_hand_over(job: Job, manifest: Manifest) -> dict[str, Any]:
    """Fence the savepoint query's producer and abort a transaction it left open (a crashed
    driver's), so read_committed readers are not held back until it times out."""
    from confluent_kafka import Producer

    sink = _built(job).sink
    producer = Producer({**sink.options.client_conf(),
                         "transactional.id": sink.options.transactional_id(manifest.query_id)})
    producer.init_transactions(30)
    producer.flush(5)
    return {"fenced_transactional_id": sink.options.transactional_id(manifest.query_id)}

