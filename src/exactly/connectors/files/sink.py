"""Two-phase-commit file sink: readers of the output directory see whole committed epochs.

Guarantee: exactly once in ``exactly_once`` mode (each row of each epoch appears in exactly
one committed file, and an epoch appears all at once or not at all); at least once in
``at_least_once`` mode (files appear as tasks finish; a replay after a crash adds them again).

Layout of ``path``::

    epoch-000000000007/part-00000.parquet   committed epochs, one directory each
    _staging/000000000007/<attempt>/        pre-commits: task.json + the staged data file
    _staging/000000000007/_publish/         the epoch being assembled by the commit
    _exactly/                               the sink's commit log and lease

Begin: create the attempt directory and ``task.json``. Pre-commit: close and fsync the
data file. Commit: rename the file into ``_publish`` under a name fixed by the partition;
publish: rename ``_publish`` to ``epoch-N`` (one atomic directory rename on a POSIX file
system). Readers (pandas, pyarrow, DuckDB ``epoch-*/*.parquet``, Spark) skip names that
start with ``_``. Atomic publication needs a local or POSIX file system (no object stores).

Target state (restores, :mod:`exactly.protocol.target_state`): the directory belongs to one
query at a time, named in ``_exactly/query.json`` with its lineage (``lineage``: the queries
it was restored from, parent first, each with the epoch it continued from). The commit log in
``_exactly/`` is the directory's own, shared by the queries of the line (epoch numbers
continue across restores), so its newest completed epoch is the line's progress. A rollback
can take epochs back (``retract``: their ``epoch-N`` directories, their commit log entries
and any staged leftovers go). ``keep`` leaves them: the restored job's epochs with those
numbers are then taken for replays (an epoch directory is named by its number), so each of
those epochs stays as first written -- when the restored job plans them over the same input;
over other input its commit of the first of them fails (ReplannedEpochError).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from exactly.checkpoint.layout import OUTPUT_LOG_DIR
from exactly.errors import ConfigError, DataLossError, SavepointError
from exactly.fsutil import atomic_write_json, fsync_dir, naming, read_json
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.contract import (
    CommitOutcome,
    Handle,
    Lineage,
    RollbackSupport,
    TargetState,
)
from exactly.protocol.repairs import query_repair
from exactly.protocol.staging import (
    StagedTxn,
    StagingArea,
    StagingSink,
    remove_if_empty,
)
from exactly.protocol.target_state import lineage_from_json, lineage_to_json

#: an epoch directory being retracted is renamed to this prefix first (readers skip ``_``)
RETRACTED_PREFIX = "_retracted-"

FORMATS = {"parquet": "parquet", "json": "jsonl", "jsonl": "jsonl"}


def epoch_dir_name(epoch: int) -> str:
    return f"epoch-{epoch:012d}"


class FileSink(StagingSink):
    """Exactly-once Parquet / JSON-lines files, published one whole epoch at a time."""

    name = "files"
    stage: StagingArea  # POSIX only: an epoch is published by renaming staged files

    def __init__(self, path: str, file_format: str = "parquet",
                 compression: str = "snappy") -> None:
        if not path:
            raise ConfigError("exactly.files sink: set the output directory with "
                              ".option('path', DIR) or .start(DIR)")
        if path.startswith("file://"):
            path = path[len("file://"):]
        elif "://" in path:
            raise ConfigError(
                f"exactly.files sink: {path!r} is not a local path; atomic epoch publication "
                "needs a POSIX file system (local disk, NFS mount). Object stores are not "
                "supported yet."
            )
        fmt = FORMATS.get(file_format.lower())
        if fmt is None:
            raise ConfigError(f"exactly.files sink: format {file_format!r} is not one of "
                              "parquet | json")
        self.root = Path(path).absolute()
        self.extension = fmt
        self.compression = compression
        self.stage = StagingArea(self.root / "_staging", self.root, f"part.{fmt}")

    # -- locations -------------------------------------------------------------------
    @property
    def log_directory(self) -> Path:
        return self.root / OUTPUT_LOG_DIR

    @property
    def staging(self) -> Path:
        return self.stage.base

    def _final_dir(self, epoch: int) -> Path:
        return self.root / epoch_dir_name(epoch)

    def _final_name(self, handle: Handle) -> str:
        return f"part-{handle.partition:05d}.{self.extension}"

    # -- executor side ----------------------------------------------------------------
    def write(self, txn: StagedTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        with naming(txn.data_file):
            if self.extension == "parquet":
                if txn.writer is None:
                    txn.writer = pq.ParquetWriter(txn.data_file, batch.schema,
                                                  compression=self.compression)
                txn.writer.write_batch(batch)
            else:
                if txn.writer is None:
                    txn.writer = open(txn.data_file, "w", encoding="utf-8")  # noqa: SIM115
                lines = (json.dumps(row, default=_json_default, ensure_ascii=False)
                         for row in batch.to_pylist())
                txn.writer.write("\n".join(lines) + "\n")
        txn.rows += batch.num_rows

    def commit_visible(self, handle: Handle) -> None:
        """at_least_once: move the file into its epoch directory at once, under a name
        unique to the attempt, so that a replay adds a second copy."""
        source = self.stage.data_file(handle)
        if source is not None:
            final_dir = self._final_dir(handle.epoch)
            final_dir.mkdir(parents=True, exist_ok=True)
            target = final_dir / f"part-{handle.task.attempt_key}.{self.extension}"
            os.replace(source, target)
            fsync_dir(final_dir)
        self.stage.discard(handle)

    # -- driver side -------------------------------------------------------------------
    def commit_handle(self, handle: Handle) -> CommitOutcome:
        outcome = CommitOutcome.COMMITTED
        source = self.stage.data_file(handle)
        if source is not None:
            publish = self.stage.epoch_dir(handle.epoch) / "_publish"
            target = publish / self._final_name(handle)
            if source.exists():
                publish.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
                fsync_dir(publish)
            elif target.exists() or (self._final_dir(handle.epoch)
                                     / self._final_name(handle)).exists():
                outcome = CommitOutcome.ALREADY_COMMITTED
            else:
                raise DataLossError(
                    f"epoch {handle.epoch} partition {handle.partition}: the staged file "
                    f"{source} named by the commit intent is gone and was never published; "
                    "something outside exactly removed it"
                )
        shutil.rmtree(self.stage.directory(handle), ignore_errors=True)
        return outcome

    def publish_epoch(self, epoch: int, handles: Iterable[Handle]) -> None:
        expects_files = any(h.payload.file for h in handles)
        publish = self.stage.epoch_dir(epoch) / "_publish"
        final = self._final_dir(epoch)
        if expects_files and not final.exists():
            if not publish.exists():
                raise DataLossError(f"epoch {epoch}: nothing to publish in {publish} and "
                                    f"{final} does not exist")
            os.rename(publish, final)
            fsync_dir(self.root)
        elif final.exists() and publish.exists():
            shutil.rmtree(publish)  # a second copy of an epoch that is already visible
        remove_if_empty(self.stage.epoch_dir(epoch))

    # -- target state (restores) ---------------------------------------------------------
    def describe_target(self) -> str:
        return str(self.root)

    def _owner_record(self) -> dict[str, Any] | None:
        path = self.log_directory / "query.json"
        record = read_json(path, repair=query_repair(self.log_directory))
        return record if isinstance(record, dict) and record.get("query_id") else None

    def target_state(self, query_id: str) -> TargetState:
        record = self._owner_record()
        if record is None:
            return TargetState(self.describe_target())
        where = str(self.log_directory / "query.json")
        if "lineage" in record:
            lineage = lineage_from_json(record["lineage"], where)
        else:  # written before lineages: one step at most
            lineage = lineage_from_json([record["restored_from"]] if record.get(
                "restored_from") else [], where)
        done = CommitLog(self.log_directory).completed_epochs()
        return TargetState(self.describe_target(), str(record["query_id"]), lineage,
                           done[-1] if done else None)

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        return RollbackSupport(
            retract=None,
            keep="their epoch directories stay; the restored job takes its epochs with those "
                 "numbers for replays and does not write them again (over the same input "
                 "each stays once, as first written; over other input the restored job "
                 "fails at the first of them)")

    def retract_after(self, state: TargetState, epoch: int) -> dict[str, Any]:
        """Take back every ``epoch-N`` directory with N > ``epoch``, the commit log's
        intents and completions of those epochs, and the staged attempts of those epochs
        (their pre-commits; an epoch half published). Each directory is first renamed to a
        ``_retracted-`` name readers skip (one atomic step: a crash never leaves an epoch
        half visible), then the log entries go, then the renamed directories. Idempotent: a
        retract a crash interrupted is finished by the next one."""
        self._remove_retracted()  # left by an interrupted retract
        removed = []
        for number, directory in sorted(self._epoch_dirs().items()):
            if number > epoch:
                directory.rename(self.root / f"{RETRACTED_PREFIX}{directory.name}")
                removed.append(number)
        fsync_dir(self.root)
        if self.stage.base.is_dir():
            for directory in self.stage.base.iterdir():
                if directory.name.isdigit() and int(directory.name) > epoch:
                    shutil.rmtree(directory, ignore_errors=True)
        for folder in (self.log_directory / "intents", self.log_directory / "complete"):
            for path in folder.glob("*.json") if folder.is_dir() else []:
                if path.stem.isdigit() and int(path.stem) > epoch:
                    path.unlink()
            if folder.is_dir():
                fsync_dir(folder)
        self._remove_retracted()
        return {"retracted_epochs": removed}

    def _epoch_dirs(self, prefix: str = "") -> dict[int, Path]:
        """The output's epoch directories named ``<prefix>epoch-N``, by N."""
        head = f"{prefix}epoch-"
        return {int(d.name.removeprefix(head)): d for d in self.root.glob(f"{head}*")
                if d.name.removeprefix(head).isdigit()}

    def _remove_retracted(self) -> None:
        retracted = list(self.root.glob(f"{RETRACTED_PREFIX}*"))
        for directory in retracted:
            shutil.rmtree(directory)
        if retracted:
            fsync_dir(self.root)

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        """Abort the staged attempts the superseded queries left, then name ``to_query`` the
        owner in ``_exactly/query.json`` with its lineage (atomically replaced). Refused
        while a retract a crash interrupted is unfinished: its epochs are hidden but still
        logged complete, so a kept restore would skip them."""
        hidden = self._epoch_dirs(RETRACTED_PREFIX).keys()
        if hidden & set(CommitLog(self.log_directory).completed_epochs()):
            raise SavepointError(
                f"the file sink's target {self.root} holds a retract a crash interrupted "
                f"({RETRACTED_PREFIX}* directories): run the restore again with "
                "--sink-rollback retract to finish it")
        self._remove_retracted()  # no longer logged: only the removal was interrupted
        aborted = self.abort_pre_commits(state.superseded(lineage))
        record = self._owner_record() or {}
        record.pop("restored_from", None)  # the one-step record of older versions
        atomic_write_json(self.log_directory / "query.json",
                          {**record, "query_id": to_query,
                           "lineage": lineage_to_json(lineage)})
        return {"aborted_pre_commits": aborted}



def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
