"""Exactly-once Delta Lake sink: one Delta commit per epoch, recognised by the table itself.

Guarantee: in ``exactly_once`` mode every row of an epoch is in the table exactly once, and
every Delta reader (deltalake, DuckDB, Spark's Delta reader, ...) sees whole epochs only:
an epoch is one Delta commit. The commit carries an application transaction (Delta's
``txn`` action) with app id ``exactly-<query id>`` and version = the epoch, so a replayed
epoch is recognised by the table, whatever happened to exactly's own commit log. In
``at_least_once`` mode each task commits its file at once (a replay adds it again).

Works on a local directory and on object storage (``s3://bucket/prefix`` and S3-compatible
stores): nothing is renamed. Delta's own commit (``_delta_log/N.json``) is created only if
absent, which ``deltalake`` does with the store's conditional put; on S3-compatible stores
give it storage option ``conditional_put=etag`` when the store needs it (see
docs/delta.md).

Protocol (docs/design.md section 3):

* task (executor): on the first row, a *pending marker*
  ``_exactly/pending/<query>/<epoch>/<attempt>.json`` names the data file; then the rows go
  to the data file, written straight to its final place in the table directory
  (``part-<epoch>-<attempt>-<query>.<codec>.parquet``), one file per task, Spark's Arrow
  batches buffered into row groups of :data:`ROW_GROUP_ROWS` rows (``deltalake``'s size).
  A Delta reader ignores a file the log does not name. Pre-commit = the file closed (and
  fsynced on a local disk); the handle carries its size and statistics.
* commit (driver): ``commit_handle`` checks the file is there; ``publish_epoch`` commits all
  files of the epoch in one Delta transaction with the ``txn`` action, unless the table's
  ``txn`` version for the query already reached the epoch; then the markers are deleted.
* abort: delete the data file, then the marker. Recovery lists pre-commits by marker.

A data file whose task died before its marker was written cannot happen (marker first); a
file whose marker was lost is invisible to readers and removed by Delta's ``VACUUM``.

Target state (restores, :mod:`exactly.protocol.target_state`): several queries may append to
one table, so the table records lineage as hand-over edges, one small JSON object per restored
query under the table's ``_exactly/lineage/<query>.json`` (beside the pending markers; works
on a local disk and on object storage). The progress of a line is the ``txn`` version of its
newest query (before that query committed any, the epoch it was restored from). A rollback
can ``retract``: one Delta commit removes every data file of the line's epochs after the
savepoint (the sink names each file by its epoch and query) and sets the line's ``txn``
versions back to the savepoint's epoch. Other writers' commits stay, and the removed files
stay readable by time travel until ``VACUUM``. It is refused when a commit after the line's
first retracted epoch may have rewritten that epoch's rows into files of other names
(OPTIMIZE, DELETE, UPDATE, MERGE, RESTORE, an overwrite: anything but an append or a
metadata change). ``keep`` commits those epochs again (the table then holds them twice).

Compaction (:mod:`exactly.connectors.delta.compaction`) merges a query's files of contiguous
epochs into files named ``part-<first>-<last>-c<token>-<query>[.<codec>].parquet``
(:func:`data_file` reads both kinds of name), so a retract still knows each row's epochs: a
compacted file wholly after the savepoint is removed, one wholly at or before it stays, and
one spanning it refuses the retract. Its commits rewrite no rows and are no rewrite for the
rule above.

Options: ``path`` (the table), ``storage.<KEY>`` (storage options for ``deltalake`` and the
data files, e.g. ``storage.AWS_ENDPOINT_URL``; ``AWS_*`` environment variables are used
for keys not given), ``compression`` (Parquet codec, default snappy). The table is created
on the first epoch with the stream's schema, or must have the stream's columns and types.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from exactly.connectors import lake_files
from exactly.connectors.delta.commits import COMPACTION_KEY, app_id, read_commit
from exactly.connectors.delta.stats import file_stats
from exactly.errors import (
    ConfigError,
    DataLossError,
    FencedError,
    SavepointError,
)
from exactly.fsutil import fsync_file
from exactly.logs import log_event
from exactly.objectstore import Location
from exactly.protocol.contract import (
    CommitOutcome,
    Edge,
    Handle,
    Lineage,
    Payload,
    RollbackSupport,
    TargetState,
    TaskInfo,
    TwoPhaseCommitSink,
)
from exactly.protocol.target_state import line_state

logger = logging.getLogger("exactly.delta")

PENDING = lake_files.PENDING
LINEAGE = lake_files.LINEAGE
#: commits of other writers that add no rows and rewrite none (a retract may follow them)
HARMLESS_OPERATIONS = frozenset({"CREATE TABLE", "SET TBLPROPERTIES", "VACUUM START",
                                 "VACUUM END", "UPGRADE PROTOCOL", "ADD COLUMNS",
                                 "ADD CONSTRAINT", "DROP CONSTRAINT"})
#: how often ``deltalake`` retries a commit that lost a race with another writer
COMMIT_RETRIES = 15
#: rows of a Parquet row group (``deltalake``'s and parquet-rs's default): a task's Arrow
#: batches (Spark sends 10,000 rows each) are buffered into row groups this large
ROW_GROUP_ROWS = 1024 * 1024
#: a row group is written once its buffered batches hold this many bytes, however few rows
ROW_GROUP_BYTES = 128 * 1024 * 1024
#: names of the data files: a task's (one epoch) and a compaction's (epochs first..last)
_TASK_FILE = re.compile(r"^part-(\d{12})-\d{5,}-[^-]*-\d+-(.+)\.parquet$")
_COMPACTED_FILE = re.compile(r"^part-(\d{12})-(\d{12})-c[0-9a-f]{8}-(.+)\.parquet$")
#: Parquet codecs PyArrow writes: the name's suffix between the query id and ``.parquet``
_CODECS = frozenset({"snappy", "gzip", "brotli", "zstd", "lz4", "lz4_raw"})


@dataclass(frozen=True)
class DeltaPayload(Payload):
    """A pre-committed data file: its path relative to the table and its add-action facts
    (``file`` is ``None`` when the attempt wrote no rows)."""

    file: str | None = None
    size: int = 0
    modified_ms: int = 0
    stats: str = ""


@dataclass
class DeltaTxn:
    """One task attempt writing one Parquet file into the table directory."""

    task: TaskInfo
    file: str
    stream: Any = None
    writer: pq.ParquetWriter | None = None
    rows: int = 0
    schema: pa.Schema | None = None
    #: batches not yet written: the next row group
    buffered: list[pa.RecordBatch] = field(default_factory=list)
    buffered_rows: int = 0
    buffered_bytes: int = 0
    #: the pending marker's PUT on an object store, running while the rows are encoded
    marker: Future | None = None

    def marker_written(self) -> None:
        """Wait for the pending marker's PUT; raises its error."""
        if self.marker is not None:
            self.marker.result()

    def flush(self) -> None:
        """Write the buffered batches as one row group."""
        if self.buffered and self.writer is not None:
            self.writer.write_table(pa.Table.from_batches(self.buffered),
                                    row_group_size=max(self.buffered_rows, 1))
        self.buffered, self.buffered_rows, self.buffered_bytes = [], 0, 0


class DeltaSink(TwoPhaseCommitSink[DeltaTxn]):
    """Exactly-once appends to a Delta Lake table: one Delta commit per epoch."""

    name = "delta"
    payload_type = DeltaPayload

    def __init__(self, table: str, log_dir: Path | str, *,
                 storage_options: Mapping[str, str] | None = None,
                 compression: str = "snappy") -> None:
        if not table:
            raise ConfigError("exactly.delta sink: set the table with .option('path', URI) "
                              "or .start(URI) (a local directory or s3://bucket/prefix)")
        self.location = Location.parse(table, storage_options)
        self._log_dir = log_dir
        self.compression = compression
        self._table: Any = None  # the driver's DeltaTable, kept across epochs
        #: (query, epoch, the table's txn version read for it): one read per epoch
        self._checked: tuple[str, int, int | None] = ("", -1, None)
        #: (query, the table version this sink's last commit made, its epoch): while the
        #: table has no newer version, the query's txn version is that epoch, known without
        #: reading the log (``transaction_version`` reads commit files: a GET on S3)
        self._own: tuple[str, int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:  # executors get no DeltaTable
        return {**self.__dict__, "_table": None}

    def __repr__(self) -> str:
        return f"DeltaSink({self.location!r}, compression={self.compression!r})"

    # -- locations -------------------------------------------------------------------
    @property
    def log_directory(self) -> Path | str:
        return self._log_dir

    @property
    def uri(self) -> str:
        return self.location.uri

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        return self.location.filesystem()

    @staticmethod
    def _marker_name(task: TaskInfo) -> str:
        return lake_files.marker_name(task.query_id, task.epoch, task.attempt_key)

    def _data_name(self, task: TaskInfo) -> str:
        return (f"part-{task.epoch:012d}-{task.attempt_key}-{task.query_id}"
                f"{_codec_suffix(self.compression)}.parquet")

    # -- the table -------------------------------------------------------------------
    def _delta(self, *, fresh: bool = True):
        from deltalake import DeltaTable

        if self._table is None:
            self._table = DeltaTable(self.uri, storage_options=self.location.resolved_options())
        elif fresh:
            self._table.update_incremental()
        return self._table

    def prepare_target(self, schema: pa.Schema, partitions: int | None = None) -> None:
        """Create the table with ``schema`` if it does not exist; otherwise require the
        stream's columns and types (ConfigError naming the differences)."""
        from deltalake import DeltaTable, Schema
        from deltalake.exceptions import DeltaError

        wanted = _columns(Schema.from_arrow(schema))
        options = self.location.resolved_options()
        try:
            if not DeltaTable.is_deltatable(self.uri, storage_options=options):
                DeltaTable.create(self.uri, schema=schema, mode="ignore",
                                  storage_options=options)
            table = self._delta()
        except (DeltaError, OSError) as exc:
            raise ConfigError(f"exactly.delta sink: cannot open or create the Delta table at "
                              f"{self.uri} ({exc}); check the path and the storage options "
                              "(endpoint, credentials, bucket)") from None
        have = _columns(table.schema())
        if have != wanted:
            raise ConfigError(
                f"exactly.delta sink: the table at {self.uri} has columns {_show(have)}, the "
                f"stream writes {_show(wanted)}; select the table's columns and types in the "
                "query, or write to a new table")

    # -- executor side -----------------------------------------------------------------
    def begin_transaction(self, task: TaskInfo) -> DeltaTxn:
        return DeltaTxn(task, self._data_name(task))

    def write(self, txn: DeltaTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if txn.writer is None:
            fs, base = self._fs()
            marker = (fs, f"{base}/{self._marker_name(txn.task)}", json.dumps({
                "query_id": txn.task.query_id, "run_id": txn.task.run_id,
                "epoch": txn.task.epoch, "partition": txn.task.partition,
                "attempt": txn.task.attempt, "file": txn.file}).encode())
            if self.location.is_local:
                lake_files.put_object(*marker)  # the data file exists once opened: marker first
            else:
                # an object exists only once its upload completes (pre_commit waits for the
                # marker before that): the marker's PUT runs while the rows are encoded
                txn.marker = lake_files.in_background(lake_files.put_object, *marker,
                                                      name="exactly-delta-marker")
            txn.stream = fs.open_output_stream(f"{base}/{txn.file}")
            txn.schema = batch.schema
            txn.writer = pq.ParquetWriter(txn.stream, batch.schema, compression=self.compression)
        txn.buffered.append(batch)
        txn.buffered_rows += batch.num_rows
        txn.buffered_bytes += batch.nbytes
        txn.rows += batch.num_rows
        if txn.buffered_rows >= ROW_GROUP_ROWS or txn.buffered_bytes >= ROW_GROUP_BYTES:
            txn.flush()

    def pre_commit(self, txn: DeltaTxn) -> DeltaPayload:
        if txn.writer is None:
            return DeltaPayload(0)
        txn.flush()
        txn.writer.close()
        metadata = txn.writer.writer.metadata  # the footer, known once closed
        txn.writer = None
        size = txn.stream.tell()  # every byte of the file went through this stream
        txn.marker_written()  # before the data object can exist
        txn.stream.close()  # on S3: the upload completes here, atomically
        txn.stream = None
        modified = int(time.time() * 1000)  # no HEAD request: the file was written just now
        if self.location.is_local:
            fsync_file(f"{self.location.uri}/{txn.file}")
        assert txn.schema is not None
        return DeltaPayload(txn.rows, txn.file, size, modified,
                            file_stats(metadata, txn.schema))

    def abort_transaction(self, txn: DeltaTxn) -> None:
        try:
            with contextlib.suppress(Exception):  # written or not, it is deleted below
                txn.marker_written()
            if txn.writer is not None:
                txn.writer.close()
            if txn.stream is not None:
                txn.stream.close()
        finally:
            txn.writer = txn.stream = None
            txn.buffered = []
            if txn.rows or txn.schema is not None:
                self._discard(txn.task, txn.file)

    def commit_visible(self, handle: Handle) -> None:
        """at_least_once: commit the task's file at once, in a Delta commit of its own
        without an application transaction (a replay adds it a second time)."""
        if handle.payload.file:
            table = self._delta()
            table.create_write_transaction(
                [_add(handle)], "append", table.schema(),
                commit_properties=_commit_properties(None, handle.epoch, handle.query_id))
        self._delete_marker(handle.task)

    # -- driver side -------------------------------------------------------------------
    def committed_epoch(self, query_id: str) -> int | None:
        """The last epoch of ``query_id`` the table holds (its ``txn`` version), or None.

        When the newest table version is the one this sink's own last commit made, that
        commit's epoch, without reading the log: only one commit came after the version the
        commit was based on, so it is that commit, and its ``txn`` is the query's newest."""
        table = self._delta()
        own = self._own
        if own is not None and own[0] == query_id and table.version() == own[1]:
            return own[2]
        return table.transaction_version(app_id(query_id))

    def commit_handle(self, handle: Handle) -> CommitOutcome:
        """Nothing moves (the file is in its final place): recognise an epoch the table
        already holds, else check that the file is still there."""
        if self._checked[:2] != (handle.query_id, handle.epoch):  # once per epoch
            self._checked = (handle.query_id, handle.epoch,
                             self.committed_epoch(handle.query_id))
        done = self._checked[2]
        if done is not None and done >= handle.epoch:
            return CommitOutcome.ALREADY_COMMITTED
        if not handle.payload.file:
            return CommitOutcome.COMMITTED
        fs, base = self._fs()
        if fs.get_file_info(f"{base}/{handle.payload.file}").type != pafs.FileType.NotFound:
            return CommitOutcome.COMMITTED
        done = self.committed_epoch(handle.query_id)  # the cached version may be stale
        self._checked = (handle.query_id, handle.epoch, done)
        if done is not None and done >= handle.epoch:
            return CommitOutcome.ALREADY_COMMITTED
        raise DataLossError(
            f"epoch {handle.epoch} partition {handle.partition}: the data file "
            f"{self.location.child(handle.payload.file)} named by the commit intent is gone and "
            "was never committed to the table; something outside exactly removed it (a VACUUM "
            "with a retention shorter than the time a crashed query stayed down?)")

    def publish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        if not handles:
            return
        query_id = handles[0].query_id
        if self._checked[:2] == (query_id, epoch):
            # commit_handle read the table for this epoch just before (one read per epoch):
            # a commit of another writer since then is Delta's conflict check's to handle
            table, done = self._delta(fresh=False), self._checked[2]
        else:
            table = self._delta()
            done = table.transaction_version(app_id(query_id))
        self._checked = ("", -1, None)  # a later call for this epoch reads the table again
        adds = [_add(h) for h in handles if h.payload.file]
        if adds and (done is None or done < epoch):
            from deltalake.exceptions import CommitFailedError, DeltaError

            self._own = None
            based_on = table.version()
            try:
                table.create_write_transaction(
                    adds, "append", table.schema(),
                    commit_properties=_commit_properties(app_id(query_id), epoch, query_id))
            except (DeltaError, OSError) as exc:
                # the ambiguous commit: the table's own record decides (docstring)
                if not self._holds_epoch(query_id, epoch, [a.path for a in adds], based_on,
                                         exc):
                    if not isinstance(exc, CommitFailedError):
                        raise
                    # the table's own fencing: another writer set this query's transaction
                    # version between our read and our commit
                    raise FencedError(
                        f"epoch {epoch} of query {query_id} was committed to {self.uri} by "
                        f"another writer at the same time ({exc}); another instance of the "
                        "query is live. This instance committed nothing of the epoch."
                    ) from exc
            else:
                # the commit is version based_on + 1 unless another writer's came first
                self._own = (query_id, based_on + 1, epoch)
                log_event(logger, "delta_commit", epoch=epoch, files=len(adds),
                          rows=sum(h.rows for h in handles), based_on_version=based_on)
        for handle in handles:
            self._delete_marker(handle.task)

    def _holds_epoch(self, query_id: str, epoch: int, files: Sequence[str], based_on: int,
                     error: Exception) -> bool:
        """After a failed Delta commit of ``epoch``: whether the table holds it with exactly
        this commit's ``files`` (the commit happened). Cases, one by one:

        * the answer to the PUT of ``_delta_log/N.json`` was lost after the store created it
          (a reset, a timeout): the object store sends the PUT again, it is refused (the
          version exists), and ``deltalake`` checks the winning commit for conflicts -- the
          winner is this very commit, whose ``txn`` for the query's app id makes it a
          "concurrent transaction" (CommitFailedError), or the retries end in a transport
          error. The table's ``txn`` version reached the epoch and holds these files: True.
        * another instance of the query committed the epoch meanwhile: the ``txn`` version
          reached it with other files: False (the caller raises FencedError).
        * nothing was committed (the version is below the epoch): False. A PUT delayed on
          the wire that reaches the store later can only create the version it was sent
          for, and only if nothing else took it: the epoch is never committed twice.
        * this commit happened and a compaction merged its files into another since: they
          are no longer in the newest version, but the commit that added them is newer
          than ``based_on`` (the version this commit was made on): True.

        Raises the store's error when the table cannot be read either."""
        table = self._delta()  # read again: the version the failed call saw is stale
        done = table.transaction_version(app_id(query_id))
        if done is None or done < epoch:
            return False
        present = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
        if not set(files) <= present and not self._added_since(based_on, table.version(),
                                                              files):
            return False
        log_event(logger, "delta_commit_resolved", logging.WARNING, epoch=epoch,
                  files=len(files), table_version=table.version(),
                  detail=f"the commit call failed ({type(error).__name__}: {error}) but the "
                         "table holds the epoch with these files: the answer to the commit was "
                         "lost after the store applied it")
        return True

    def _added_since(self, based_on: int, newest: int, files: Sequence[str]) -> bool:
        """Whether one commit of the versions after ``based_on`` up to ``newest`` added all
        of ``files`` (read from the commit files, a few after a lost answer)."""
        fs, base = self._fs()
        wanted = set(files)
        return any(wanted <= set(read_commit(fs, base, version).added)
                   for version in range(based_on + 1, newest + 1))

    def abort(self, handle: Handle) -> None:
        if handle.payload.file:
            self._discard(handle.task, handle.payload.file)
        else:
            self._delete_marker(handle.task)

    def list_pre_commits(self, query_id: str) -> list[Handle]:
        fs, base = self._fs()
        found: list[Handle] = []
        for record in lake_files.marker_records(fs, base, query_id, self.location.child,
                                                ("file",)):
            task = TaskInfo(record["query_id"], record["run_id"], int(record["epoch"]),
                            int(record["partition"]), int(record["attempt"]))
            found.append(Handle(task, DeltaPayload(0, record["file"])))
        return sorted(found, key=lambda h: h.key)

    # -- target state (restores) ---------------------------------------------------------
    def describe_target(self) -> str:
        return f"Delta table {self.uri}"

    def _edges(self) -> list[Edge]:
        fs, base = self._fs()
        return lake_files.read_edges(fs, base, self.location.child)

    def _table_if_any(self):
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.uri,
                                        storage_options=self.location.resolved_options()):
            return None
        return self._delta()

    def target_state(self, query_id: str) -> TargetState:
        table = self._table_if_any()
        if table is None:
            return TargetState(self.describe_target())
        return line_state(self.describe_target(), self._edges(), query_id,
                          lambda q: table.transaction_version(app_id(q)))

    def _retract_plan(self, table: Any, state: TargetState,
                      epoch: int) -> tuple[list[Any], str | None]:
        """In ``table``'s snapshot: the add actions of the line's files of epochs after
        ``epoch`` (from their names; the queries of :meth:`TargetState.retracted_members`),
        and why a retract would be wrong (None: it is right)."""
        members = state.retracted_members(epoch)
        adds = pa.table(table.get_add_actions(flatten=True))
        doomed, spanning = [], []
        for row in adds.select(["path", "size_bytes"]).to_pylist():
            found = _line_file(row["path"], members)
            if found is None or found.last <= epoch:
                continue
            if found.first > epoch:
                doomed.append(row)
            else:  # a compacted file holding epochs on both sides of the savepoint
                spanning.append(found)
        rewrites = _rewrites_after(table, state.members, epoch)
        if rewrites:
            return doomed, (
                f"the table was rewritten after the line's first epoch past {epoch} "
                f"({', '.join(rewrites)}): those epochs' rows may now be in files this sink "
                "cannot tell apart, so removing the line's files would not take them back")
        if spanning:
            spanning.sort(key=lambda f: (f.last, f.path))
            shown = "; ".join(f"{self.location.child(f.path)} (epochs {f.first}..{f.last} of "
                              f"query {f.query_id})" for f in spanning[:3])
            more = f" and {len(spanning) - 3} more" if len(spanning) > 3 else ""
            return doomed, (
                f"compaction merged epochs on both sides of epoch {epoch} into one file: "
                f"{shown}{more}; removing it would take back epochs up to {epoch} too, "
                f"keeping it would keep epochs after {epoch}. Restore from a savepoint at or "
                f"after epoch {spanning[-1].last} (the file's last epoch), or use "
                "--sink-rollback keep")
        return doomed, None

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        _, refusal = self._retract_plan(self._delta(), state, epoch)
        return RollbackSupport(
            retract=refusal,
            keep="their rows stay and the restored job commits those epochs again: the "
                 "table then holds them twice")

    def retract_after(self, state: TargetState, epoch: int) -> dict[str, Any]:
        """One Delta commit, planned and made on one snapshot (a concurrent commit is
        checked by Delta's conflict detection): remove every file of the line's epochs after
        ``epoch`` and set the ``txn`` version of the same queries (the savepoint's query and
        its descendants in the line) back to ``epoch``. Idempotent (a second call finds
        nothing to remove)."""
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import RemoveAction

        members = state.retracted_members(epoch)
        for _ in range(COMMIT_RETRIES + 1):
            table = self._delta()
            doomed, refusal = self._retract_plan(table, state, epoch)
            if refusal is not None:
                raise SavepointError(f"--sink-rollback retract: {refusal}")
            now = int(time.time() * 1000)
            newer = []
            for query in members:
                version = table.transaction_version(app_id(query))
                if version is None or version > epoch:
                    newer.append(Transaction(app_id(query), epoch, now))
            if not doomed and not newer:
                return {"retracted_files": 0}
            try:
                # on this very snapshot, never rebased onto a newer version: deltalake does
                # not see a concurrent removal by a commit whose removes say dataChange=false
                # (a compaction), so a rebased retract would leave the rows the compaction
                # moved into its new files (measured with deltalake 1.6). A lost race plans
                # again on the new version.
                table.create_write_transaction(
                    [RemoveAction(row["path"], True, now, row["size_bytes"]) for row in doomed],
                    "append", table.schema(),
                    commit_properties=CommitProperties(
                        app_transactions=newer or None,
                        custom_metadata={"exactly.retractedAfter": str(epoch),
                                         "exactly.line": ",".join(members)},
                        max_commit_retries=0))
            except CommitFailedError as exc:
                log_event(logger, "delta_retract_raced", logging.WARNING, after_epoch=epoch,
                          based_on_version=table.version(), detail=str(exc))
                continue
            epochs: set[int] = set()
            for row in doomed:
                found = _line_file(row["path"], members)
                assert found is not None
                epochs.update(range(found.first, found.last + 1))
            log_event(logger, "delta_retract", files=len(doomed), after_epoch=epoch,
                      table_version=table.version() + 1)
            return {"retracted_files": len(doomed), "retracted_epochs": sorted(epochs)}
        raise SavepointError(
            f"--sink-rollback retract: every one of {COMMIT_RETRIES + 1} attempts to commit "
            f"the retract to {self.uri} lost the race against another writer's commit; stop "
            "the table's other writers (and compaction) and restore again")

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        """Abort the pending pre-commits of the superseded queries, then record ``to_query``
        <- ``lineage[0]`` in ``_exactly/lineage/<to_query>.json`` (one atomic write)."""
        aborted = self.abort_pre_commits(state.superseded(lineage))
        fs, base = self._fs()
        lake_files.write_edge(fs, base, Edge(to_query, lineage[0], time.time()),
                              local=self.location.is_local)
        return {"aborted_pre_commits": aborted}

    # -- helpers -------------------------------------------------------------------------
    def _discard(self, task: TaskInfo, file: str) -> None:
        fs, base = self._fs()
        lake_files.delete_object(fs, f"{base}/{file}")
        self._delete_marker(task)

    def _delete_marker(self, task: TaskInfo) -> None:
        fs, base = self._fs()
        lake_files.delete_marker(fs, f"{base}/{self._marker_name(task)}",
                                 local=self.location.is_local)


@dataclass(frozen=True)
class DataFile:
    """A data file of this sink, as its name tells: the query that wrote it and the epochs
    ``first..last`` its rows come from (``first == last`` for a task's file; a compacted
    file, :mod:`exactly.connectors.delta.compaction`, may span several)."""

    path: str
    query_id: str
    first: int
    last: int
    compacted: bool


def data_file(path: str) -> DataFile | None:
    """Read a data file's name: a task's ``part-<epoch>-<attempt>-<query>[.<codec>].parquet``
    or a compaction's ``part-<first>-<last>-c<token>-<query>[.<codec>].parquet``; None for a
    file of another writer. (The compacted form is tried first: a query id that starts with
    digits would let it pass for a task's name.)"""
    name = path.rsplit("/", 1)[-1]
    compacted = _COMPACTED_FILE.match(name)
    if compacted:
        first, last = int(compacted.group(1)), int(compacted.group(2))
        if first > last:
            return None
        return DataFile(path, _without_codec(compacted.group(3)), first, last, True)
    task = _TASK_FILE.match(name)
    if task:
        epoch = int(task.group(1))
        return DataFile(path, _without_codec(task.group(2)), epoch, epoch, False)
    return None


def compacted_name(query_id: str, first: int, last: int, token: str,
                   compression: str) -> str:
    """The name of a compacted file of ``query_id``'s epochs ``first..last`` (``token``: 8
    hex digits, unique per file)."""
    return (f"part-{first:012d}-{last:012d}-c{token}-{query_id}"
            f"{_codec_suffix(compression)}.parquet")


def _codec_suffix(compression: str) -> str:
    return "" if compression.lower() == "none" else f".{compression}"


def _without_codec(rest: str) -> str:
    stem, dot, codec = rest.rpartition(".")
    return stem if dot and stem and codec.lower() in _CODECS else rest


def _line_file(path: str, queries: Sequence[str]) -> DataFile | None:
    """The data file ``path`` when one of ``queries`` wrote it, else None."""
    found = data_file(path)
    return found if found is not None and found.query_id in queries else None


def _is_append(commit: Mapping[str, Any]) -> bool:
    """A commit of another writer that cannot have moved this sink's rows: an append (Spark
    and delta-rs writes in append mode, streaming appends) or a metadata change."""
    operation = commit.get("operation")
    if operation in HARMLESS_OPERATIONS:
        return True
    params = commit.get("operationParameters") or {}
    metrics = commit.get("operationMetrics") or {}
    removed = metrics.get("num_removed_files", metrics.get("numRemovedFiles", 0))
    appends = ((operation == "WRITE" and params.get("mode") == "Append")
               or (operation == "STREAMING UPDATE" and params.get("outputMode") == "Append"))
    return appends and not int(removed or 0)


def _rewrites_after(table, queries: Sequence[str], epoch: int) -> list[str]:
    """Commits of other writers that may have rewritten rows of ``queries``' epochs after
    ``epoch``: those newer than the first such epoch's commit that are no appends. Reads the
    history back to the line's newest commit of an epoch <= ``epoch`` (or to the start)."""
    limit = 64
    while True:
        history = table.history(limit)  # newest first
        first_after: int | None = None
        others: list[Mapping[str, Any]] = []
        reached = False
        for commit in history:
            query = commit.get("exactly.queryId")
            if query in queries:
                if int(commit.get("exactly.epoch", -1)) <= epoch:
                    reached = True
                    break
                first_after = commit["version"]
            elif (query is None and "exactly.retractedAfter" not in commit
                  and COMPACTION_KEY not in commit):  # a compaction keeps epochs in names
                others.append(commit)
        if reached or len(history) < limit:
            break
        limit *= 4
    if first_after is None:
        return []
    return [f"version {c['version']}: {c.get('operation')}" for c in reversed(others)
            if c["version"] > first_after and not _is_append(c)]


def _columns(schema) -> list[tuple[str, str]]:
    """``(name, Delta type)`` of a Delta schema's top-level fields, types as compact JSON."""
    return [(f["name"], json.dumps(f["type"], sort_keys=True, separators=(",", ":")))
            for f in json.loads(schema.to_json())["fields"]]


def _show(columns: list[tuple[str, str]]) -> str:
    return "(" + ", ".join(f"{name} {kind.strip(chr(34))}" for name, kind in columns) + ")"


def _add(handle: Handle):
    from deltalake.transaction import AddAction

    payload: DeltaPayload = handle.payload
    assert payload.file is not None
    return AddAction(payload.file, payload.size, {}, payload.modified_ms, True,
                     payload.stats or json.dumps({"numRecords": payload.rows}))


def _commit_properties(app: str | None, epoch: int, query_id: str):
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        app_transactions=[Transaction(app, epoch, int(time.time() * 1000))] if app else None,
        custom_metadata={"exactly.queryId": query_id, "exactly.epoch": str(epoch)},
        max_commit_retries=COMMIT_RETRIES)
