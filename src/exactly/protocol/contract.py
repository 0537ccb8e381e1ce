"""The two-phase-commit sink contract (Flink's ``TwoPhaseCommitSinkFunction`` on Spark).

A sink implements only its target-specific steps; the protocol around them (intent log,
recovery, orphan clean-up, fencing) lives once in :class:`exactly.protocol.committer.Committer`.

Executor side, once per task of epoch n:
    ``begin_transaction`` -> ``write`` (per Arrow batch) -> ``pre_commit`` -> a :class:`Handle`.
    On any failure before the handle is returned, ``abort_transaction``.
Driver side, once per epoch:
    ``commit_handle`` for every handle of the epoch's intent, then ``publish_epoch``.
    Both must be idempotent: called again after a crash they finish the work, and they
    recognise work already done. ``abort`` drops a pre-commit. ``list_pre_commits`` finds the
    pre-commits a query left in the target, so recovery can abort the orphans.
Target state, for restores (:mod:`exactly.protocol.target_state`):
    ``target_state`` (owner, lineage, progress), ``rollback_support``, ``retract_after``,
    ``hand_over``. The defaults describe a target that records nothing: a restore into it is
    refused unless the user accepts ``--sink-rollback keep``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any, Generic, TypeVar

import pyarrow as pa

from exactly import options as opt
from exactly.config import Mode, parse_enum
from exactly.errors import ConfigError, SavepointError
from exactly.protocol.target_state import (
    Edge,
    Lineage,
    Restored,
    RollbackSupport,
    SinkRollback,
    TargetState,
)

__all__ = ["CommitOutcome", "Edge", "Handle", "Lineage", "Payload", "Restored",
           "RollbackSupport", "SinkRollback", "SinkSettings", "TargetState", "TaskInfo",
           "TwoPhaseCommitSink"]

TxnT = TypeVar("TxnT")


@dataclass(frozen=True)
class TaskInfo:
    """Where a write task runs: the query (stable across restarts), the run (new per start),
    the epoch, the partition and the task attempt (unique inside a run)."""

    query_id: str
    run_id: str
    epoch: int
    partition: int
    attempt: int

    @property
    def attempt_key(self) -> str:
        """Names this attempt uniquely across runs: attempt numbers restart with each run."""
        return f"{self.partition:05d}-{self.run_id[:8]}-{self.attempt}"

    @staticmethod
    def key_of_run(key: str, run_id: str) -> bool:
        """True when ``key`` is an :attr:`attempt_key` of an attempt of run ``run_id``."""
        parts = key.split("-")
        return len(parts) == 3 and parts[0].isdigit() and parts[1] == run_id[:8]


@dataclass(frozen=True)
class Payload:
    """What a pre-commit left in the target, as the sink needs it to commit or abort.

    Sinks subclass it with their own typed fields (a staged file, a prepared transaction
    id) and name the subclass in :attr:`TwoPhaseCommitSink.payload_type`. Fields must be
    JSON values: payloads are written to the commit log's intents.
    """

    rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls: type[PayloadT], data: Mapping[str, Any]) -> PayloadT:
        """The payload recorded by :meth:`to_json`; unknown keys are ignored.

        Raises ``TypeError``/``ValueError`` on a malformed record (callers name the file).
        """
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


PayloadT = TypeVar("PayloadT", bound=Payload)


@dataclass(frozen=True)
class Handle(Generic[PayloadT]):
    """Names one pre-commit: the task that staged it and the sink's typed payload.

    Handles are small and travel as Spark commit messages and in commit intents
    (``to_json`` keeps the task's fields flat beside ``payload``).
    """

    task: TaskInfo
    payload: PayloadT

    @property
    def query_id(self) -> str:
        return self.task.query_id

    @property
    def run_id(self) -> str:
        return self.task.run_id

    @property
    def epoch(self) -> int:
        return self.task.epoch

    @property
    def partition(self) -> int:
        return self.task.partition

    @property
    def attempt(self) -> int:
        return self.task.attempt

    @property
    def key(self) -> str:
        return f"{self.epoch}/{self.task.attempt_key}"

    @property
    def rows(self) -> int:
        return self.payload.rows

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.task), "payload": self.payload.to_json()}

    @staticmethod
    def from_json(data: Mapping[str, Any], payload_type: type[PayloadT]) -> Handle[PayloadT]:
        """A handle recorded by :meth:`to_json`, its payload read as ``payload_type``."""
        task = TaskInfo(str(data["query_id"]), str(data["run_id"]), int(data["epoch"]),
                        int(data["partition"]), int(data["attempt"]))
        return Handle(task, payload_type.from_json(data.get("payload") or {}))


class CommitOutcome(str, Enum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"


class TwoPhaseCommitSink(ABC, Generic[TxnT]):
    """Target-specific steps of an exactly-once sink. Subclasses state their guarantee in
    their first docstring line. Instances are pickled to executors: keep them small."""

    #: short name used in logs and errors
    name: str = "sink"
    #: the type of this sink's handle payloads (read back from commit intents)
    payload_type: type[Payload] = Payload
    #: recover (finish intents, abort orphans) when Spark plans a new driver's first epoch,
    #: before any task writes: for targets where a leftover pre-commit holds locks that
    #: would block the replay's writes (see :mod:`exactly.protocol.recovery`)
    recover_before_first_epoch: bool = False

    @property
    @abstractmethod
    def log_directory(self) -> Path | str:
        """Where this sink's commit log and lease live: a directory, or an ``s3://`` prefix
        (:mod:`exactly.checkpoint.store`)."""

    # -- set-up (driver, before the first epoch) ---------------------------------------
    def prepare_target(self, schema: pa.Schema, partitions: int | None = None) -> None:
        """Create or check the target for rows of ``schema`` (tables, marker tables, server
        settings such as the prepared-transaction capacity for ``partitions`` tasks).

        Called once per driver process before the first epoch; must be idempotent.
        Raises ConfigError naming the fix when the target cannot hold this query's output.
        Default: nothing to prepare.
        """

    # -- executor side -------------------------------------------------------------
    @abstractmethod
    def begin_transaction(self, task: TaskInfo) -> TxnT:
        """Open a transaction for one task attempt of an epoch."""

    @abstractmethod
    def write(self, txn: TxnT, batch: pa.RecordBatch) -> None:
        """Add rows to the open transaction; nothing may become visible."""

    @abstractmethod
    def pre_commit(self, txn: TxnT) -> Payload:
        """Make the transaction durable but invisible; return the handle's payload
        (an instance of :attr:`payload_type`).

        After this returns, ``commit_handle`` must be able to succeed, even after a crash
        of every process involved.
        """

    @abstractmethod
    def abort_transaction(self, txn: TxnT) -> None:
        """Drop an open (not pre-committed) transaction after a failure in the task."""

    def commit_visible(self, handle: Handle) -> None:
        """at_least_once mode: make a pre-commit visible at once, inside the task."""
        self.commit_handle(handle)
        self.publish_epoch(handle.epoch, [handle])

    # -- driver side ---------------------------------------------------------------
    def open_run(self, query_id: str, run_id: str) -> None:
        """The driver run ``run_id`` of ``query_id`` holds the lease and is about to commit
        (called before every commit of the run, recovery included). Sinks that keep
        clients across epochs key them by the run; default: nothing to do."""

    def bind_commit_session(self, spark: Any) -> None:
        """The Spark session of the process that commits (``foreachBatch``: the driver's),
        before the first commit of a run. A sink may run a small Spark job of its commit
        phase in it (the Kafka sink publishes an epoch's shares on the executors). Not
        called where the commit runs without one (a Python data source writer's commit);
        default: nothing."""

    def start_early_publish(self, query_id: str, run_id: str, epoch: int) -> None:
        """The driver run ``run_id`` (holding the lease) is about to run epoch ``epoch``'s
        tasks, and will then commit them in this process. A sink may start moving the
        epoch's pre-commits toward the target while the tasks run (e.g. into a transaction
        it opens now), provided nothing becomes visible before :meth:`publish_epoch` with
        the intent's handles, and that a crash before the intent leaves nothing the next
        run's recovery cannot abort. Called only where the driver runs the tasks itself
        (``foreachBatch``); errors are the sink's to absorb (the publish then goes the
        full way). Default: nothing (the publish does all the work)."""

    def stop_early_publish(self, epoch: int) -> None:
        """The commit call of epoch ``epoch`` returned or failed: drop whatever
        :meth:`start_early_publish` began and :meth:`publish_epoch` did not use (abort
        it). Idempotent; must not raise. Default: nothing."""

    @abstractmethod
    def commit_handle(self, handle: Handle) -> CommitOutcome:
        """Commit one pre-commit. Idempotent; raises DataLossError if it vanished."""

    def publish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        """Make the epoch's committed handles visible together (default: nothing to do)."""

    @abstractmethod
    def abort(self, handle: Handle) -> None:
        """Drop a pre-commit. Idempotent: aborting a missing pre-commit is a no-op."""

    @abstractmethod
    def list_pre_commits(self, query_id: str) -> Iterable[Handle]:
        """Every pre-commit of ``query_id`` still present (not committed) in the target."""

    def abort_pre_commits(self, queries: Iterable[str]) -> int:
        """Abort every pre-commit ``queries`` left in the target (a hand-over drops what the
        queries it supersedes left behind); returns how many."""
        aborted = 0
        for query in queries:
            for handle in self.list_pre_commits(query):
                self.abort(handle)
                aborted += 1
        return aborted

    # -- target state (restores; driver, with no query running on the target) ---------
    def describe_target(self) -> str:
        """The target in a few words, without secrets: a path, a table, a topic."""
        return str(self.log_directory)

    def target_state(self, query_id: str) -> TargetState:
        """The target as a restore of a savepoint of ``query_id`` finds it: owner, the
        owner's lineage, and the newest epoch of the owner's line visible in the target
        (:class:`TargetState`). Reads only. Default: unknown (this sink records nothing)."""
        return TargetState.unknown(self.describe_target())

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        """Whether :meth:`retract_after` can take back the epochs after ``epoch`` of
        ``state``'s line, and what keeping them means. Reads only. Default: it cannot."""
        return RollbackSupport(
            retract=f"the {self.name} sink cannot take back output it committed",
            keep="the target keeps those epochs' output and the restored job writes them "
                 "again")

    def retract_after(self, state: TargetState, epoch: int) -> dict[str, Any]:
        """Take back every epoch after ``epoch`` of ``state``'s line from the target, so it
        holds what the line held at ``epoch``. Idempotent. Returns what it did (for the
        restore record). Raises SavepointError when :meth:`rollback_support` refuses."""
        reason = self.rollback_support(state, epoch).retract
        raise SavepointError(f"--sink-rollback retract: {reason}")

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        """Make the target query ``to_query``'s: it continues ``lineage`` (its parent,
        ``lineage[0]``, at the savepoint's epoch, then the parent's ancestors). Records the
        lineage where the target keeps its owner, and drops what the superseded queries of
        ``state``'s line left behind (pre-commits, open transactions). Idempotent. Returns
        what it did. Default: nothing to record."""
        return {"sink": f"the {self.name} sink records no owner"}


@dataclass(frozen=True)
class SinkSettings:
    """Sink options common to every exactly sink, read from ``writeStream`` options."""

    mode: Mode = Mode.EXACTLY_ONCE
    retain_epochs: int = opt.DEFAULT_RETAIN_EPOCHS
    lease_stale_after: float = opt.DEFAULT_LEASE_STALE_AFTER_S
    #: where sinks without a directory of their own keep the commit log and lease
    #: (option ``exactly.logDir``; ``start_query`` sets it under the checkpoint)
    log_dir: str | None = None
    #: Spark's checkpoint directory of the query (option ``checkpointLocation``): the sink
    #: reads each epoch's input positions from its ``offsets/N`` (epoch identity)
    checkpoint_location: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkSettings:
        mode = parse_enum(Mode, options.get(opt.MODE, Mode.EXACTLY_ONCE.value), opt.MODE)
        retain = int(options.get(opt.RETAIN_EPOCHS, opt.DEFAULT_RETAIN_EPOCHS))
        if retain < 1:
            raise ConfigError(f"{opt.RETAIN_EPOCHS} must be >= 1 (the last completed epoch "
                              f"must stay known to recognise its replay), got {retain}")
        return cls(mode=mode,
                   retain_epochs=retain,
                   lease_stale_after=float(options.get(opt.LEASE_STALE_AFTER,
                                                       opt.DEFAULT_LEASE_STALE_AFTER_S)),
                   log_dir=options.get(opt.LOG_DIR),
                   checkpoint_location=options.get(opt.CHECKPOINT_LOCATION))

    def require_log_location(self, sink: str) -> Path | str:
        """The location of the sink's commit log (and of its staged pre-commits, for the
        staging sinks) beside the checkpoint: a Path, or an ``s3://`` URI
        (:mod:`exactly.checkpoint.store`, :mod:`exactly.protocol.staging`)."""
        if not self.log_dir:
            raise ConfigError(
                f"{sink} sink: set option {opt.LOG_DIR} to a directory (or an s3:// prefix) "
                "for the sink's commit log (exactly.ops.query.start_query sets it under "
                "the checkpoint)"
            )
        if self.log_dir.startswith(("s3://", "s3a://")):
            return self.log_dir
        return Path(self.log_dir.removeprefix("file://"))
