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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Generic, TypeVar

import pyarrow as pa

from exactly.config import Mode, parse_enum
from exactly.errors import ConfigError

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


@dataclass(frozen=True)
class Handle:
    """Names one pre-commit: what a task staged, so the driver can commit or abort it.

    ``payload`` is sink-specific and JSON-serialisable (a staged file, a prepared
    transaction id, ...). Handles are small and travel as Spark commit messages.
    """

    query_id: str
    run_id: str
    epoch: int
    partition: int
    attempt: int
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> TaskInfo:
        return TaskInfo(self.query_id, self.run_id, self.epoch, self.partition, self.attempt)

    @property
    def key(self) -> str:
        return f"{self.epoch}/{self.task.attempt_key}"

    @property
    def rows(self) -> int:
        return int(self.payload.get("rows", 0))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Handle:
        return cls(**data)


class CommitOutcome(str, Enum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"


class TwoPhaseCommitSink(ABC, Generic[TxnT]):
    """Target-specific steps of an exactly-once sink. Subclasses state their guarantee in
    their first docstring line. Instances are pickled to executors: keep them small."""

    #: short name used in logs and errors
    name: str = "sink"

    @property
    @abstractmethod
    def log_directory(self) -> Path:
        """Local directory holding this sink's commit log and lease."""

    # -- executor side -------------------------------------------------------------
    @abstractmethod
    def begin_transaction(self, task: TaskInfo) -> TxnT:
        """Open a transaction for one task attempt of an epoch."""

    @abstractmethod
    def write(self, txn: TxnT, batch: pa.RecordBatch) -> None:
        """Add rows to the open transaction; nothing may become visible."""

    @abstractmethod
    def pre_commit(self, txn: TxnT) -> dict[str, Any]:
        """Make the transaction durable but invisible; return the handle's payload.

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


@dataclass(frozen=True)
class SinkSettings:
    """Sink options common to every exactly sink, read from ``writeStream`` options."""

    mode: Mode = Mode.EXACTLY_ONCE
    retain_epochs: int = 100
    lease_stale_after: float = 600.0
    #: where sinks without a directory of their own keep the commit log and lease
    #: (option ``exactly.logDir``; ``start_query`` sets it under the checkpoint)
    log_dir: str | None = None
    #: Spark's checkpoint directory of the query (option ``checkpointLocation``): the sink
    #: reads each epoch's input positions from its ``offsets/N`` (epoch identity)
    checkpoint_location: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkSettings:
        mode = parse_enum(Mode, options.get("mode", Mode.EXACTLY_ONCE.value), "mode")
        retain = int(options.get("exactly.retainEpochs", 100))
        if retain < 1:
            raise ConfigError(f"exactly.retainEpochs must be >= 1 (the last completed epoch "
                              f"must stay known to recognise its replay), got {retain}")
        return cls(mode=mode,  # type: ignore[arg-type]
                   retain_epochs=retain,
                   lease_stale_after=float(options.get("exactly.leaseStaleAfterSeconds", 600)),
                   log_dir=options.get("exactly.logDir"),
                   checkpoint_location=options.get("checkpointLocation"))

    def require_log_dir(self, sink: str) -> Path:
        """The commit-log directory for sinks that keep it beside the checkpoint."""
        if not self.log_dir:
            raise ConfigError(
                f"{sink} sink: set option exactly.logDir to a local directory for the sink's "
                "commit log (exactly.spark.runner.start_query sets it under the checkpoint)"
            )
        return Path(self.log_dir.removeprefix("file://"))
