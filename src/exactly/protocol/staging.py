"""Pre-commits as staged files: one directory per task attempt, shared by staging sinks.

Layout under ``base``: ``<epoch:012d>/<attempt key>/task.json`` plus the attempt's data
file. ``task.json`` is written when the transaction begins, so even an attempt that died
mid-write can be listed (and aborted) by recovery. Handle payloads name the attempt
directory relative to ``root``, so the sink can find it from the driver.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactly.errors import CorruptFileError
from exactly.fsutil import (
    atomic_write_json,
    fsync_dir,
    fsync_file,
    naming,
    read_json,
    require_fields,
)
from exactly.protocol.contract import Handle, Payload, TaskInfo, TwoPhaseCommitSink


@dataclass(frozen=True)
class StagedPayload(Payload):
    """A staged pre-commit: the attempt directory (relative to the sink's root) and the
    data file in it (``None`` when the attempt wrote no rows)."""

    dir: str = ""
    file: str | None = None


@dataclass
class StagedTxn:
    """One task attempt writing a single staged data file."""

    task: TaskInfo
    directory: Path
    data_file: Path
    writer: Any = None  # opened on the first non-empty batch; has close()
    rows: int = 0


def remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: other attempts are still there
        directory.rmdir()


class StagingArea:
    """Attempt directories below ``base``; payload paths are relative to ``root``."""

    def __init__(self, base: Path, root: Path, data_name: str) -> None:
        self.base = base
        self.root = root
        self.data_name = data_name

    def epoch_dir(self, epoch: int) -> Path:
        return self.base / f"{epoch:012d}"

    def begin_txn(self, task: TaskInfo) -> StagedTxn:
        """Begin a transaction whose rows go to this area's data file."""
        directory = self.begin(task)
        return StagedTxn(task, directory, directory / self.data_name)

    def pre_commit(self, txn: StagedTxn) -> StagedPayload:
        """Close and fsync the data file; return the handle's payload."""
        has_file = txn.writer is not None
        if has_file:
            with naming(txn.data_file):
                txn.writer.close()
                txn.writer = None
                fsync_file(txn.data_file)
        return self.payload(txn.directory, txn.rows, has_file)

    def abort_txn(self, txn: StagedTxn) -> None:
        """Close the writer (if any) and remove the attempt's directory."""
        try:
            if txn.writer is not None:
                txn.writer.close()
        finally:
            txn.writer = None
            shutil.rmtree(txn.directory, ignore_errors=True)

    def begin(self, task: TaskInfo) -> Path:
        """Create the attempt's directory and record which task it belongs to."""
        directory = self.epoch_dir(task.epoch) / task.attempt_key
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_json(directory / "task.json", {
            "query_id": task.query_id, "run_id": task.run_id, "epoch": task.epoch,
            "partition": task.partition, "attempt": task.attempt})
        return directory

    def payload(self, directory: Path, rows: int, has_file: bool) -> StagedPayload:
        """The handle payload of a pre-committed attempt (directory entries made durable)."""
        fsync_dir(directory)
        return StagedPayload(rows, str(directory.relative_to(self.root)),
                             self.data_name if has_file else None)

    def directory(self, handle: Handle[StagedPayload]) -> Path:
        return self.root / handle.payload.dir

    def data_file(self, handle: Handle[StagedPayload]) -> Path | None:
        name = handle.payload.file
        return self.directory(handle) / name if name else None

    def discard(self, handle: Handle) -> None:
        """Remove the attempt's directory, and its epoch's directory once empty."""
        shutil.rmtree(self.directory(handle), ignore_errors=True)
        remove_if_empty(self.epoch_dir(handle.epoch))

    def list(self, query_id: str) -> list[Handle]:
        """Every staged attempt of ``query_id`` (names starting with ``_`` are not attempts)."""
        found: list[Handle] = []
        if not self.base.is_dir():
            return found
        for epoch_dir in sorted(self.base.iterdir()):
            if not epoch_dir.name.isdigit():
                continue
            for attempt in sorted(epoch_dir.iterdir()):
                if attempt.name.startswith("_") or not attempt.is_dir():
                    continue
                task = _read_task(attempt) or {
                    "query_id": query_id, "run_id": "", "epoch": int(epoch_dir.name),
                    "partition": -1, "attempt": -1}
                if task["query_id"] != query_id:
                    continue
                has_file = (attempt / self.data_name).exists()
                info = TaskInfo(task["query_id"], task["run_id"], int(task["epoch"]),
                                int(task["partition"]), int(task["attempt"]))
                found.append(Handle(info, StagedPayload(
                    0, str(attempt.relative_to(self.root)),
                    self.data_name if has_file else None)))
        return found


def _read_task(attempt: Path) -> dict[str, Any] | None:
    """``task.json`` of an attempt directory; ``None`` if the attempt died before writing it.

    Raises :class:`CorruptFileError` (naming the file and the repair) when it is damaged.
    """
    from exactly.protocol.repairs import task_repair

    path = attempt / "task.json"
    task = read_json(path, repair=task_repair(attempt))
    if task is None:
        return None
    require_fields(task, path, ("query_id", "run_id", "epoch", "partition", "attempt"),
                   task_repair(attempt))
    try:
        int(task["epoch"]), int(task["partition"]), int(task["attempt"])
    except (TypeError, ValueError) as exc:
        raise CorruptFileError(str(path), f"has a malformed field ({exc})",
                               task_repair(attempt)) from None
    return task


class StagingSink(TwoPhaseCommitSink[StagedTxn]):
    """A sink whose pre-commits are files staged in :attr:`stage` (the file sink, the
    write-ahead sink): the executor side and abort/listing come from the staging area; a
    subclass adds ``write``, ``commit_handle`` and ``publish_epoch``."""

    payload_type = StagedPayload
    stage: StagingArea

    def begin_transaction(self, task: TaskInfo) -> StagedTxn:
        return self.stage.begin_txn(task)

    def pre_commit(self, txn: StagedTxn) -> StagedPayload:
        return self.stage.pre_commit(txn)

    def abort_transaction(self, txn: StagedTxn) -> None:
        self.stage.abort_txn(txn)

    def abort(self, handle: Handle) -> None:
        self.stage.discard(handle)

    def list_pre_commits(self, query_id: str) -> list[Handle]:
        return self.stage.list(query_id)
