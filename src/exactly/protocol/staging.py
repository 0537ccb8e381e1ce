"""Pre-commits as staged files: one directory per task attempt, shared by staging sinks.

Layout under ``base``: ``<epoch:012d>/<attempt key>/task.json`` plus the attempt's data
file. ``task.json`` is written when the transaction begins, so even an attempt that died
mid-write can be listed (and aborted) by recovery. Handle payloads name the attempt
directory relative to ``root``, so the sink can find it from the driver.

``task.json`` is written whole or not at all (renamed into place) but not fsynced: nothing
but the listing of attempts to abort reads it (a handle carries its task itself), and a
listing treats an attempt whose ``task.json`` is missing or empty -- the attempt died before
writing it, or a power loss took its content -- as an unknown attempt of the query, which
recovery aborts after it finished every intent. The pre-commit makes the data file and the
directory's entries durable.

Two kinds of area offer the same :class:`Stage` interface: :class:`StagingArea`, a local or
shared POSIX directory (files fsynced, directory entries made durable), and
:class:`~exactly.protocol.object_staging.ObjectStagingArea`, a prefix on object storage
(``s3://``), where an object appears whole when its upload completes and needs no fsync.
:func:`open_stage` picks one for a sink's log location. The file sink needs the POSIX one: it
publishes by renaming staged files.
"""

from __future__ import annotations

import contextlib
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from exactly.errors import CorruptFileError
from exactly.fsutil import (
    fsync_dir,
    fsync_file,
    naming,
    parse_json,
    replace_json,
    require_fields,
)
from exactly.protocol.contract import Handle, Payload, TaskInfo, TwoPhaseCommitSink

TASK_FILE = "task.json"
TASK_FIELDS = ("query_id", "run_id", "epoch", "partition", "attempt")


@dataclass(frozen=True)
class StagedPayload(Payload):
    """A staged pre-commit: the attempt directory (relative to the sink's root) and the
    data file in it (``None`` when the attempt wrote no rows)."""

    dir: str = ""
    file: str | None = None


@dataclass
class StagedTxn:
    """One task attempt writing a single staged data file.

    ``directory`` and ``data_file`` name the attempt's directory and data file in the stage:
    local paths in a POSIX area, names relative to the root on object storage. A sink either
    writes ``data_file`` by name (POSIX only) or asks
    :meth:`Stage.open_output` for a stream, which the pre-commit closes after ``writer``.
    """

    task: TaskInfo
    directory: str
    data_file: str
    writer: Any = None  # opened on the first non-empty batch; has close()
    stream: Any = None  # the output stream ``writer`` writes to, when the stage opened it
    rows: int = 0

    def close(self) -> None:
        """Close the writer, then the stream under it (a completed upload on object
        storage); both are cleared even when closing fails."""
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            self.writer = None
            stream, self.stream = self.stream, None
            if stream is not None and not stream.closed:
                stream.close()


@dataclass(frozen=True)
class StagedFile:
    """A staged data file, for the driver to read back: ``shown`` names it in messages."""

    fs: pafs.FileSystem
    path: str
    shown: str

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type == pafs.FileType.File

    def open(self) -> pa.RandomAccessFile:
        """The whole file for random access: a memory map on a local disk, the object read
        in one request on object storage. Raises FileNotFoundError when it is gone."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return pa.memory_map(self.path)
        with self.fs.open_input_stream(self.path) as source:
            return pa.BufferReader(source.read_buffer())

    def __str__(self) -> str:
        return self.shown


def remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: other attempts are still there
        directory.rmdir()


class Stage(ABC):
    """Where a staging sink's executors leave pre-committed rows for the driver.

    Guarantees the committer relies on: once :meth:`pre_commit` returned, the data file is
    complete and durable, and :meth:`staged_file` finds it from any process that reaches the
    location; :meth:`list` finds every attempt whose ``task.json`` was written, including
    attempts that died mid-write, so recovery can abort them.
    """

    root: Path | str  # the sink's log location; payload paths are relative to it
    base: Path | str
    data_name: str

    @abstractmethod
    def begin_txn(self, task: TaskInfo) -> StagedTxn:
        """Create the attempt's directory and its ``task.json``."""

    @abstractmethod
    def open_output(self, txn: StagedTxn) -> pa.NativeFile:
        """A stream that writes the attempt's data file (kept in ``txn.stream``)."""

    @abstractmethod
    def pre_commit(self, txn: StagedTxn) -> StagedPayload:
        """Close the data file and make it durable; return the handle's payload."""

    @abstractmethod
    def abort_txn(self, txn: StagedTxn) -> None:
        """Close the writer (if any) and remove the attempt's directory."""

    @abstractmethod
    def has_attempt(self, handle: Handle[StagedPayload]) -> bool:
        """True while the attempt is staged (checked for attempts that wrote no rows: for
        the others, their data file says it)."""

    @abstractmethod
    def file_in(self, directory: str, name: str) -> StagedFile:
        """The file ``name`` of the attempt staged in ``directory`` (a payload's ``dir``);
        it may not exist (yet)."""

    def staged_file(self, handle: Handle[StagedPayload]) -> StagedFile | None:
        """The attempt's data file, ``None`` when it wrote no rows."""
        name = handle.payload.file
        return self.file_in(handle.payload.dir, name) if name else None

    @abstractmethod
    def run_attempts(self, epoch: int, run_id: str) -> list[str]:
        """The directories (the payloads' ``dir``) of run ``run_id``'s attempts of ``epoch``
        staged so far, in name order: for a driver reading staged rows while its tasks
        still write them (their data files may be incomplete or not there yet)."""

    @abstractmethod
    def describe(self, handle: Handle[StagedPayload]) -> str:
        """The attempt's directory, for messages."""

    @abstractmethod
    def discard(self, handle: Handle) -> None:
        """Remove the attempt's directory, and its epoch's directory once empty."""

    @abstractmethod
    def list(self, query_id: str) -> list[Handle]:
        """Every staged attempt of ``query_id``."""


def task_record(task: TaskInfo) -> dict[str, Any]:
    """What ``task.json`` holds."""
    return {"query_id": task.query_id, "run_id": task.run_id, "epoch": task.epoch,
            "partition": task.partition, "attempt": task.attempt}


def task_info(task: dict[str, Any] | None, query_id: str, epoch: int) -> TaskInfo:
    """The attempt's task from its ``task.json`` (already checked by :func:`checked_task`);
    an unknown task of ``query_id`` when the attempt died before writing it."""
    if task is None:
        return TaskInfo(query_id, "", epoch, -1, -1)
    return TaskInfo(task["query_id"], task["run_id"], int(task["epoch"]),
                    int(task["partition"]), int(task["attempt"]))


class StagingArea(Stage):
    """Attempt directories below ``base`` on a local or shared POSIX file system; payload
    paths are relative to ``root``. Files are fsynced and directory entries made durable."""

    root: Path
    base: Path

    def __init__(self, base: Path, root: Path, data_name: str) -> None:
        self.base = base
        self.root = root
        self.data_name = data_name

    def epoch_dir(self, epoch: int) -> Path:
        return self.base / f"{epoch:012d}"

    def begin_txn(self, task: TaskInfo) -> StagedTxn:
        """Begin a transaction whose rows go to this area's data file."""
        directory = self.epoch_dir(task.epoch) / task.attempt_key
        directory.mkdir(parents=True, exist_ok=True)
        replace_json(directory / TASK_FILE, task_record(task))
        return StagedTxn(task, str(directory), str(directory / self.data_name))

    def open_output(self, txn: StagedTxn) -> pa.NativeFile:
        with naming(txn.data_file):
            txn.stream = pa.OSFile(txn.data_file, "wb")
        return txn.stream

    def pre_commit(self, txn: StagedTxn) -> StagedPayload:
        """Close and fsync the data file; return the handle's payload."""
        has_file = txn.writer is not None
        if has_file:
            with naming(txn.data_file):
                txn.close()
                fsync_file(txn.data_file)
        directory = Path(txn.directory)
        fsync_dir(directory)
        return StagedPayload(txn.rows, str(directory.relative_to(self.root)),
                             self.data_name if has_file else None)

    def abort_txn(self, txn: StagedTxn) -> None:
        try:
            txn.close()
        finally:
            shutil.rmtree(txn.directory, ignore_errors=True)

    def directory(self, handle: Handle[StagedPayload]) -> Path:
        return self.root / handle.payload.dir

    def data_file(self, handle: Handle[StagedPayload]) -> Path | None:
        name = handle.payload.file
        return self.directory(handle) / name if name else None

    def has_attempt(self, handle: Handle[StagedPayload]) -> bool:
        return self.directory(handle).is_dir()

    def file_in(self, directory: str, name: str) -> StagedFile:
        path = str(self.root / directory / name)
        return StagedFile(_LOCAL, path, path)

    def run_attempts(self, epoch: int, run_id: str) -> list[str]:
        directory = self.epoch_dir(epoch)
        try:
            names = sorted(p.name for p in directory.iterdir())
        except FileNotFoundError:
            return []
        return [str((directory / n).relative_to(self.root)) for n in names
                if TaskInfo.key_of_run(n, run_id)]

    def describe(self, handle: Handle[StagedPayload]) -> str:
        return str(self.directory(handle))

    def discard(self, handle: Handle) -> None:
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
                path = attempt / TASK_FILE
                task = parse_task(_task_bytes(path), str(path), str(attempt))
                info = task_info(task, query_id, int(epoch_dir.name))
                if info.query_id != query_id:
                    continue
                has_file = (attempt / self.data_name).exists()
                found.append(Handle(info, StagedPayload(
                    0, str(attempt.relative_to(self.root)),
                    self.data_name if has_file else None)))
        return found


def _task_bytes(path: Path) -> bytes | None:
    """``task.json``'s bytes; None when it is missing or empty (see the module doc)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return data or None


#: local files are read back through a memory map
_LOCAL = pafs.LocalFileSystem(use_mmap=True)


def _repair(attempt: str | Path) -> str:
    from exactly.protocol.repairs import task_repair

    return task_repair(attempt)


def checked_task(task: Any, where: str, attempt: str | Path) -> dict[str, Any] | None:
    """A parsed ``task.json`` (the file ``where`` of ``attempt``) checked for its fields;
    ``None`` (the attempt died before writing it) passes through.

    Raises :class:`CorruptFileError` (naming the file and the repair) when it is damaged.
    """
    if task is None:
        return None
    require_fields(task, where, TASK_FIELDS, _repair(attempt))
    try:
        int(task["epoch"]), int(task["partition"]), int(task["attempt"])
    except (TypeError, ValueError) as exc:
        raise CorruptFileError(where, f"has a malformed field ({exc})",
                               _repair(attempt)) from None
    return task


def parse_task(data: bytes | None, where: str, attempt: str) -> dict[str, Any] | None:
    """``task.json`` read as bytes (``None``: absent), parsed and checked."""
    if data is None:
        return None
    return checked_task(parse_json(data, where, _repair(attempt)), where, attempt)


class StagingSink(TwoPhaseCommitSink[StagedTxn]):
    """A sink whose pre-commits are files staged in :attr:`stage` (the file sink, the
    write-ahead sink): the executor side and abort/listing come from the staging area; a
    subclass adds ``write``, ``commit_handle`` and ``publish_epoch``."""

    payload_type = StagedPayload
    stage: Stage

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
