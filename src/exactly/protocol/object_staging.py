"""A staging area on object storage (``s3://`` and S3-compatible stores).

Same layout and guarantees as the POSIX :class:`~exactly.protocol.staging.StagingArea`, from
the primitives object stores offer instead of ``fsync`` and renames:

* a staged data file is one object, written by a streaming (multipart) upload that becomes
  visible whole when the pre-commit closes it, and is durable once the store acknowledged it;
  a task that dies mid-write leaves an incomplete upload nobody sees (a bucket lifecycle rule
  ``AbortIncompleteMultipartUpload`` reclaims its parts), while its ``task.json`` lets
  recovery find and abort the attempt;
* "directories" are key prefixes: listing is one recursive LIST of the area (strongly
  consistent on S3), and removing an attempt deletes the objects under its prefix.

Endpoint and credentials come from the ``AWS_*`` environment variables of the process
(:class:`~exactly.objectstore.Location`), like the commit log's: on a cluster, set them for
the executors too (``spark.executorEnv.AWS_...``) or use instance/pod credentials.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from exactly.checkpoint.store import S3LogStore
from exactly.objectstore import Location
from exactly.protocol.contract import Handle, TaskInfo
from exactly.protocol.staging import (
    TASK_FILE,
    Stage,
    StagedFile,
    StagedPayload,
    StagedTxn,
    parse_task,
    task_info,
    task_record,
)


class ObjectStagingArea(Stage):
    """Attempt prefixes below ``<root>/<folder>`` on object storage; payload paths are
    relative to ``root`` (the sink's log location).

    Two clients, one per kind of object: the small ones (``task.json``, listings, deletes) go
    through the commit log's store (:class:`~exactly.checkpoint.store.S3LogStore`, plain
    PUT/GET/LIST/DELETE); data files are streamed out and read back by PyArrow's S3 file
    system, which uploads a large file in parts. PyArrow's own deletes are not used: they
    leave directory-marker objects behind.
    """

    def __init__(self, root: str, folder: str, data_name: str) -> None:
        location = Location.parse(root)
        self.root = location.uri
        self.folder = folder
        self.base = location.child(folder)
        self.data_name = data_name
        self.store = S3LogStore(self.root)
        self._location = location
        self._fs: pafs.FileSystem | None = None
        self._root_path = self.root[len("s3://"):]

    def __getstate__(self) -> dict[str, Any]:  # the executors open their own client
        return {**self.__dict__, "_fs": None}

    @property
    def fs(self) -> pafs.FileSystem:
        """PyArrow's S3 file system (one per settings and process, created on first use)."""
        if self._fs is None:
            self._fs = self._location.filesystem()[0]
        return self._fs

    def __repr__(self) -> str:
        return f"ObjectStagingArea({self.base!r})"

    def _attempt(self, epoch: int, key: str) -> str:
        return f"{self.folder}/{epoch:012d}/{key}"

    # -- executor side -----------------------------------------------------------------
    def begin_txn(self, task: TaskInfo) -> StagedTxn:
        relative = self._attempt(task.epoch, task.attempt_key)
        self.store.write(f"{relative}/{TASK_FILE}",
                         json.dumps(task_record(task), sort_keys=True, indent=1).encode())
        return StagedTxn(task, relative, f"{relative}/{self.data_name}")

    def open_output(self, txn: StagedTxn) -> pa.NativeFile:
        txn.stream = self.fs.open_output_stream(f"{self._root_path}/{txn.data_file}")
        return txn.stream

    def pre_commit(self, txn: StagedTxn) -> StagedPayload:
        """Close the data file: its upload completes, and the object is there whole."""
        has_file = txn.writer is not None
        if has_file:
            txn.close()
        return StagedPayload(txn.rows, txn.directory, self.data_name if has_file else None)

    def abort_txn(self, txn: StagedTxn) -> None:
        try:
            with contextlib.suppress(Exception):  # a half-written upload: removed below
                txn.close()
        finally:
            self._delete_tree(txn.directory)

    # -- driver side -------------------------------------------------------------------
    def has_attempt(self, handle: Handle[StagedPayload]) -> bool:
        return self.store.exists(f"{handle.payload.dir}/{TASK_FILE}")

    def file_in(self, directory: str, name: str) -> StagedFile:
        relative = f"{directory}/{name}"
        return StagedFile(self.fs, f"{self._root_path}/{relative}",
                          self.store.describe(relative))

    def run_attempts(self, epoch: int, run_id: str) -> list[str]:
        """From one listing of the epoch's prefix."""
        epoch_prefix = f"{self.folder}/{epoch:012d}"
        keys = {name.split("/")[0] for name in self.store.list_tree(epoch_prefix)}
        return [self._attempt(epoch, k) for k in sorted(keys) if TaskInfo.key_of_run(k, run_id)]

    def describe(self, handle: Handle[StagedPayload]) -> str:
        return self.store.describe(handle.payload.dir)

    def discard(self, handle: Handle) -> None:
        self._delete_tree(handle.payload.dir)

    def list(self, query_id: str) -> list[Handle]:
        """Every staged attempt of ``query_id``, from one recursive listing of the area
        (names starting with ``_`` are not attempts)."""
        attempts: dict[tuple[str, str], set[str]] = {}
        for name in self.store.list_tree(self.folder):
            parts = name.split("/")
            if len(parts) != 3 or not parts[0].isdigit() or parts[1].startswith("_"):
                continue
            attempts.setdefault((parts[0], parts[1]), set()).add(parts[2])
        found: list[Handle] = []
        for (epoch, key), files in sorted(attempts.items()):
            relative = f"{self.folder}/{epoch}/{key}"
            task_name = f"{relative}/{TASK_FILE}"
            data = self.store.read(task_name) if TASK_FILE in files else None
            task = parse_task(data, self.store.describe(task_name),
                              self.store.describe(relative))
            info = task_info(task, query_id, int(epoch))
            if info.query_id != query_id:
                continue
            found.append(Handle(info, StagedPayload(
                0, relative, self.data_name if self.data_name in files else None)))
        return found

    def _delete_tree(self, relative: str) -> None:
        for name in self.store.list_tree(relative):
            self.store.delete(f"{relative}/{name}")
