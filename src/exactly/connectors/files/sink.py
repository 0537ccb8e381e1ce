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

from exactly.errors import ConfigError, DataLossError
from exactly.fsutil import fsync_dir, naming
from exactly.protocol.contract import CommitOutcome, Handle
from exactly.protocol.staging import (
    StagedTxn,
    StagingArea,
    StagingSink,
    remove_if_empty,
)

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
        return self.root / "_exactly"

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



def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
