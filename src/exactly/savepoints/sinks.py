"""What a restore does to the job's sink target: the rule, the same for every sink.

A restored job is a new query (a new id, as a restored Flink job gets a new job id) that
continues the savepoint's epoch numbers at N+1. Before anything runs, the sink's target is
asked through the target-state part of the sink contract
(:mod:`exactly.protocol.target_state`): who owns it, the owner's lineage (the queries it was
restored from, and at which epochs) and how far that line got there (its progress M). Then,
for a savepoint of query Q at epoch N:

* no output of Q's line (a fresh target): a **fork**; the new query writes from N+1 on
  (the hand-over records its lineage there, superseding no query);
* the owner is Q or descends from Q (Q is in its lineage). If the line left Q at epoch e
  (Q's child was restored from Q's savepoint at e) and N > e, the savepoint holds epochs
  e+1..N this line of the target never kept: refused, naming both (a branch);
* M <= N: the target holds the savepoint's output; the new query takes it over and goes on
  from N+1: an **upgrade**;
* M > N: the savepoint is older than the target, a **rollback** (for instance A ran to 10, B
  restored from A@10 ran to 15, and A's savepoint at 5 is restored: epochs 6..15 are ahead).
  The restored job would write them again. ``--sink-rollback refuse`` (the default) refuses,
  naming the choices this sink offers; ``retract`` takes the line's epochs N+1..M back first,
  where the target can (:meth:`~exactly.protocol.contract.TwoPhaseCommitSink.rollback_support`);
  ``keep`` leaves them (what that means differs per sink: duplicates for an appending sink,
  converging values for an upserting one);
* the owner is a query outside Q's lineage: refused, it is not this job's output.

A restore into a target the savepoint's line holds is refused, before anything is written,
while the savepoint's own job still runs on its checkpoint: two live queries must not share
a target -- unless the restore is into that checkpoint itself (``exactly upgrade``: the live
job is the one the restore replaces, stopped before the restore writes). Every per-target
step lives in the sink's connector; this module holds no knowledge of any target.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from exactly import options as opt
from exactly.checkpoint.location import same_place
from exactly.errors import SavepointError
from exactly.logs import log_event
from exactly.protocol.contract import TwoPhaseCommitSink
from exactly.protocol.target_state import SinkRollback, TargetState
from exactly.savepoints.manifest import Manifest, SinkInfo

if TYPE_CHECKING:
    from exactly.config import CheckpointConfig


class Job(Protocol):
    """What the hand-over needs of a job (:class:`exactly.ops.job.Job` has it)."""

    sink_format: str
    path: str | None
    options: dict[str, str]
    checkpoint: CheckpointConfig

__all__ = [
    "SavepointRef",
    "SinkRollback",
    "check_target",
    "decide",
    "hand_over",
    "sink_info",
    "take_over",
]

logger = logging.getLogger("exactly.savepoints")


@dataclass(frozen=True)
class SavepointRef:
    """What the rule needs of a savepoint: its query, its epoch, the checkpoint it was taken
    from (None: unknown)."""

    query_id: str
    epoch: int
    checkpoint: str | None = None

    @classmethod
    def of(cls, manifest: Manifest) -> SavepointRef:
        checkpoint = manifest.job.get("checkpoint")
        return cls(manifest.query_id, manifest.epoch, str(checkpoint) if checkpoint else None)


def _options(job: Job, checkpoint: str | None) -> dict[str, str]:
    from exactly.checkpoint.layout import with_sink_log_dir

    options = dict(job.options)
    if job.path:
        options[opt.PATH] = job.path
    return with_sink_log_dir(checkpoint, options) if checkpoint else options


def _sink(job: Job, checkpoint: str | None = None) -> TwoPhaseCommitSink | None:
    """The job's exactly sink built from its options (None for a sink that is not exactly's).
    Builds only: connects to nothing."""
    from exactly.spark.formats import SINK_BUILDERS, sink_for

    if job.sink_format.lower() not in SINK_BUILDERS:
        return None
    if checkpoint is None and not job.checkpoint.is_memory_storage:
        checkpoint = job.checkpoint.storage
    return sink_for(job.sink_format, _options(job, checkpoint)).sink


def sink_info(job: Job, checkpoint: str) -> SinkInfo:
    """The job's sink for a savepoint's manifest: format, target, last completed epoch."""
    from exactly.protocol.commitlog import CommitLog

    epoch = None
    target = job.path
    sink = None
    try:
        sink = _sink(job, checkpoint)
    except Exception as exc:  # the manifest says "unknown" rather than failing
        log_event(logger, "sink_progress_unknown", logging.WARNING, error=repr(exc))
    if sink is not None:
        target = sink.describe_target()
        try:
            done = CommitLog(sink.log_directory).completed_epochs()
            epoch = done[-1] if done else None
        except Exception as exc:
            log_event(logger, "sink_progress_unknown", logging.WARNING, error=repr(exc))
    return SinkInfo(format=job.sink_format, target=target, committed_epoch=epoch)


# -- the rule, on a sink --------------------------------------------------------------------
def check_target(sink: TwoPhaseCommitSink | None, savepoint: SavepointRef,
                 policy: SinkRollback, new_query_id: str,
                 target: str | None = None, *, into: str | None = None) -> TargetState:
    """Check the target against the savepoint (module docstring); raises SavepointError when
    the restore must not go on, naming the choices. Writes nothing. ``sink`` None: a sink
    that is not exactly's (``target`` names it). ``into``: the checkpoint the restore
    writes (the savepoint's own: an upgrade, whose live job is the one it replaces)."""
    state = (sink.target_state(savepoint.query_id) if sink is not None
             else TargetState.unknown(target or "target"))
    where = f"the {state.target}"
    query, epoch = savepoint.query_id, savepoint.epoch
    if not state.known:
        _require_known(state, policy)
        return state
    if state.fresh or state.owner == new_query_id:
        return state  # a fork, or this restore's own hand-over (a driver restarted)
    if state.owner is not None and not state.holds(query):
        branch = state.branch_point(query)
        if branch is not None:
            went_on = state.left_at(branch.query_id)
            raise SavepointError(
                f"{where} went on from query {branch.query_id} on another branch: "
                f"{state.describe_line(branch.query_id)} replaced the line of query {query} "
                f"(restored from {branch.query_id} at epoch {branch.epoch}) by a later "
                f"restore, so the target no longer holds what this savepoint of {query} "
                f"continues. Restore a savepoint of {state.owner}"
                + (f", one of {branch.query_id} at epoch {went_on} or older"
                   if went_on is not None else "") + ", or into a fresh target")
        raise SavepointError(
            f"{where} holds the output of query {state.owner}, not of the savepoint's "
            f"query {query} or a query restored from it: it is not this job's output. "
            "Restore into a fresh target (another path, table or topic)")
    left = state.left_at(query)
    if left is not None and epoch > left:
        raise SavepointError(
            f"{where} continues query {query} from its epoch {left} ({state.owner} descends "
            f"from a savepoint of {query} at epoch {left}), but this savepoint of {query} is "
            f"at epoch {epoch}: its epochs {left + 1}..{epoch} are not part of what the "
            f"target holds (another branch of {query}). Restore a savepoint of {query} at "
            f"epoch {left} or older, a savepoint of {state.owner}, or into a fresh target")
    if _source_job_alive(savepoint) and not (
            into is not None and savepoint.checkpoint is not None
            and same_place(into, savepoint.checkpoint)):
        raise SavepointError(
            f"the job the savepoint was taken from still runs on {savepoint.checkpoint} and "
            f"writes to the {state.target}: two live queries must not share it. Stop it "
            f"first (exactly stop {savepoint.checkpoint}) or restore into a fresh target")
    if state.progress is None or state.progress <= epoch:
        return state
    assert sink is not None  # only a sink's target state is known
    support = sink.rollback_support(state, epoch)
    ahead = (f"{where} already holds epochs {epoch + 1}..{state.progress} of "
             f"{state.describe_line(query)}, newer than the savepoint (epoch {epoch} of query "
             f"{query}): the restored job would write them again")
    keep = f"--sink-rollback keep ({support.keep})"
    if policy is SinkRollback.REFUSE:
        retract = ("--sink-rollback retract (take them back first), "
                   if support.can_retract else "")
        cannot = ("" if support.can_retract
                  else f" (--sink-rollback retract is not possible: {support.retract})")
        raise SavepointError(f"{ahead}. Choose {retract}{keep}, or restore into a fresh "
                             f"target{cannot}")
    if policy is SinkRollback.RETRACT and not support.can_retract:
        raise SavepointError(f"--sink-rollback retract: {ahead}, and they cannot be taken "
                             f"back: {support.retract}. Choose {keep}, or restore into a "
                             "fresh target")
    return state


def _require_known(state: TargetState, policy: SinkRollback) -> None:
    if not state.known and policy is not SinkRollback.KEEP:
        raise SavepointError(
            f"the {state.target} cannot tell how far the savepoint's query wrote, so a "
            "restore could write epochs after the savepoint a second time. Restore into a "
            "fresh target, or accept that with --sink-rollback keep")


def _source_job_alive(savepoint: SavepointRef) -> bool:
    from exactly.checkpoint.status import running_job

    return bool(savepoint.checkpoint) and running_job(str(savepoint.checkpoint)) is not None


def take_over(sink: TwoPhaseCommitSink | None, state: TargetState, savepoint: SavepointRef,
              policy: SinkRollback, new_query_id: str) -> dict[str, Any]:
    """Make the target the restored query's, after :func:`check_target` passed: retract the
    line's epochs after the savepoint (``policy`` retract, target ahead), then hand it over,
    a fresh target too (a fork records its lineage, so a later restore of an older
    savepoint of the line into it meets the rollback rule). Idempotent. Returns what was
    done, for the restore record."""
    if sink is None or not state.known:
        return {"sink": "not recorded (the target cannot tell)"}
    if state.owner == new_query_id:
        return {"sink": "already taken over"}
    done: dict[str, Any] = {}
    if (policy is SinkRollback.RETRACT and state.progress is not None
            and state.progress > savepoint.epoch):
        done.update(sink.retract_after(state, savepoint.epoch))
    lineage = state.continued(savepoint.query_id, savepoint.epoch)
    done.update(sink.hand_over(state, new_query_id, lineage))
    log_event(logger, "sink_taken_over", sink_name=sink.name, target=state.target,
              from_query=savepoint.query_id, from_epoch=savepoint.epoch,
              previous_owner=state.owner, to_query=new_query_id, **done)
    return done


# -- the rule, for a job and a manifest -------------------------------------------------------
def decide(job: Job, manifest: Manifest, policy: SinkRollback,
           new_query_id: str) -> TargetState:
    """:func:`check_target` for ``job``'s sink and ``manifest``'s savepoint, restored into
    ``job``'s checkpoint."""
    return check_target(_sink(job), SavepointRef.of(manifest), policy, new_query_id,
                        target=job.path, into=_checkpoint(job))


def precheck(job: Job, manifest: Manifest, policy: SinkRollback) -> TargetState:
    """:func:`decide` for a savepoint the running job ``job`` replaces is about to take
    (``exactly upgrade``, before it stops the job): ``manifest`` is of an epoch of that job
    taken a moment before, so the epochs it commits meanwhile are its own, not ahead of the
    savepoint the upgrade restores. Raises SavepointError as the restore would."""
    state = check_target(_sink(job), SavepointRef.of(manifest), SinkRollback.KEEP,
                         new_query_id="", target=job.path, into=_checkpoint(job))
    _require_known(state, policy)
    return state


def _checkpoint(job: Job) -> str | None:
    return None if job.checkpoint.is_memory_storage else job.checkpoint.storage


def hand_over(job: Job, manifest: Manifest, state: TargetState, policy: SinkRollback,
              new_query_id: str) -> dict[str, Any]:
    """:func:`take_over` for ``job``'s sink and ``manifest``'s savepoint."""
    return take_over(_sink(job), state, SavepointRef.of(manifest), policy, new_query_id)
