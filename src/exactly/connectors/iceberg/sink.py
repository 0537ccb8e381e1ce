"""Exactly-once Iceberg sink: one snapshot per epoch, recognised by the table itself.

Guarantee: in ``exactly_once`` mode every row of an epoch is in the table exactly once, and
every Iceberg reader (pyiceberg, DuckDB, Spark, Trino, ...) sees whole epochs only: an epoch
is one snapshot, committed through the catalog. The snapshot's summary carries the query id
and the epoch, and the same commit sets the table property ``exactly.epoch.<query id>``
(:mod:`exactly.connectors.iceberg.snapshots`), so a replayed epoch is recognised by the table,
whatever happened to exactly's own commit log. In ``at_least_once`` mode each task's files
are a snapshot of their own at once (a replay adds them again).

Catalogs (:mod:`exactly.connectors.iceberg.catalog`): pyiceberg's SQL catalog on SQLite (the
embedded default, in the warehouse directory) or PostgreSQL, or a REST catalog. The table's
files on a local disk or an object store (``s3://``); nothing is renamed.

Protocol (docs/design.md section 3):

* task (executor): before its first data file, a *pending marker*
  ``<table location>/_exactly/pending/<query>/<epoch>/<attempt>.json`` naming the files
  (rewritten, before, whenever the task opens another partition's file); then the rows go
  to the data files, written straight to their final place under ``data/``
  (:mod:`exactly.connectors.iceberg.data_files`). An Iceberg reader sees only the files a
  snapshot names. Pre-commit = the files closed (the upload completed on S3); the handle
  carries each file's facts (size, partition, statistics).
* commit (driver): ``commit_handle`` recognises an epoch the table holds, else checks the
  files are there; ``publish_epoch`` adds all files of the epoch in one fast-append snapshot
  (and sets the progress property in the same metadata commit), unless the table's progress
  for the query already reached the epoch; then the markers are deleted.
* Catalog commits are optimistic (the catalog swaps the table's metadata pointer only if it
  still is the one the commit was based on). A commit that loses a race is retried on the
  new metadata, up to :data:`COMMIT_RETRIES` times: a concurrent writer's commit changes
  nothing for the epoch, but a commit of the same epoch by another instance of the query
  fences this one (FencedError; the table refuses the older writer). A commit whose answer
  was lost is decided by the table: it holds the epoch with these very files, or it does not.
* abort: delete the data files, then the marker. Recovery lists pre-commits by marker.

Target state (restores, :mod:`exactly.protocol.target_state`): lineage records as the Delta
sink keeps them (``_exactly/lineage/<query>.json`` under the table location); the progress of a
line is its newest query's progress property. ``retract`` removes the line's data files of
the epochs after the savepoint in one snapshot and sets the progress back; it is refused
when a snapshot of another writer after the line's first retracted epoch may have rewritten
rows (an overwrite, a delete, a replace that is not exactly's own compaction). ``keep``
commits those epochs again (the table then holds them twice).

Options: ``path`` or ``table`` (``namespace.name``), ``warehouse`` (where new tables go; with
no ``catalog.uri`` the embedded SQLite catalog is kept there), ``catalog.<key>`` (pyiceberg
catalog properties: ``catalog.uri``, ``catalog.type``, ``catalog.s3.endpoint``, ...),
``partitionBy`` (the spec of a table the sink creates, :mod:`.partitioning`), ``compression``
(the Parquet codec of a table the sink creates, one of
:data:`~exactly.connectors.iceberg.data_files.PARQUET_CODECS`; default zstd, pyiceberg's;
another name is refused when the sink is built).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from exactly.connectors import lake_files
from exactly.connectors.iceberg import snapshots
from exactly.connectors.iceberg.catalog import CatalogSpec, parse_identifier
from exactly.connectors.iceberg.data_files import (
    FileFacts,
    LayoutWriter,
    OpenFile,
    TableLayout,
    data_file_name,
    file_epoch,
    file_epochs,
    parquet_codec,
)
from exactly.connectors.iceberg.partitioning import build_spec, describe_spec, parse_partitioning
from exactly.errors import ConfigError, DataLossError, FencedError, SavepointError
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

logger = logging.getLogger("exactly.iceberg")

#: how often a catalog commit that lost a race with another writer is tried again
COMMIT_RETRIES = 15
#: the marker's extra field: the data files of the attempt
MARKER_FILES = "files"
#: pyiceberg property -> the storage option of the other sinks (markers, leftovers)
_STORAGE_KEYS = {"s3.endpoint": "AWS_ENDPOINT_URL", "s3.access-key-id": "AWS_ACCESS_KEY_ID",
                 "s3.secret-access-key": "AWS_SECRET_ACCESS_KEY",
                 "s3.session-token": "AWS_SESSION_TOKEN", "s3.region": "AWS_REGION"}


@dataclass(frozen=True)
class IcebergPayload(Payload):
    """The pre-committed data files of one task attempt (their :class:`FileFacts`)."""

    files: list[dict[str, Any]] = field(default_factory=list)

    def facts(self) -> list[FileFacts]:
        return [FileFacts.from_json(f) for f in self.files]


@dataclass
class IcebergTxn:
    """One task attempt writing data files into the table."""

    task: TaskInfo
    writer: LayoutWriter | None = None
    #: partition path ("" unpartitioned) -> the file being written
    open: dict[str, OpenFile] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    rows: int = 0
    #: the marker's PUTs on an object store, running while rows are encoded
    markers: list[Future] = field(default_factory=list)

    def markers_written(self) -> None:
        for future in self.markers:
            future.result()
        self.markers = []


class IcebergSink(TwoPhaseCommitSink[IcebergTxn]):
    """Exactly-once appends to an Iceberg table: one snapshot per epoch."""

    name = "iceberg"
    payload_type = IcebergPayload

    def __init__(self, table: str, log_dir: Any, *, catalog: CatalogSpec,
                 partition_by: str = "", compression: str | None = None) -> None:
        if not table:
            raise ConfigError("exactly.iceberg sink: name the table with .option('table', "
                              "'namespace.name') or .start('namespace.name')")
        self.identifier = parse_identifier(table)
        self.catalog = catalog
        self._log_dir = log_dir
        parse_partitioning(partition_by)  # a bad spec fails now, before the query starts
        self.partition_by = partition_by
        # a codec PyArrow cannot write fails now, not at the first epoch's first file
        self.compression = parquet_codec(compression) if compression else None
        self.layout: TableLayout | None = None
        self._catalog: Any = None
        self._table: Any = None  # the driver's table, kept across epochs

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the table's layout, no catalog. A sink pickled before its table
        exists (the foreachBatch path ships it before ``prepare_target``) goes without; the
        process that prepares the table sets it before any task is planned."""
        if self.layout is None:
            with contextlib.suppress(Exception):  # the executor reads it then, and says why
                table = self._table_if_any()
                if table is not None:
                    self.layout = TableLayout.of(table, self.catalog.io_properties())
        return {**self.__dict__, "_catalog": None, "_table": None}

    def __repr__(self) -> str:
        return f"IcebergSink({self.table_name!r}, {self.catalog!r})"

    @property
    def table_name(self) -> str:
        return ".".join(self.identifier)

    @property
    def log_directory(self) -> Any:
        return self._log_dir

    # -- the table -------------------------------------------------------------------
    def _load_catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = self.catalog.load()
        return self._catalog

    def _iceberg(self, *, fresh: bool = False) -> Any:
        """The table (loaded once, then kept: a commit based on stale metadata is refused by
        the catalog and retried on fresh metadata); ``fresh`` reads it again."""
        from pyiceberg.exceptions import NoSuchTableError

        if self._table is None or fresh:
            try:
                self._table = self._load_catalog().load_table(self.identifier)
            except NoSuchTableError:
                raise ConfigError(
                    f"exactly.iceberg sink: the table {self.table_name} does not exist in "
                    f"the {self.catalog.describe()}; the sink creates it when the query starts "
                    "(was it dropped while the query ran?)") from None
        return self._table

    def _location(self) -> Location:
        """The table's directory (where the markers and lineage records are kept)."""
        storage = {_STORAGE_KEYS[k]: v for k, v in self.catalog.properties.items()
                   if k in _STORAGE_KEYS}
        endpoint = storage.get("AWS_ENDPOINT_URL", "")
        if endpoint.startswith("http://"):
            storage["AWS_ALLOW_HTTP"] = "true"  # an http endpoint the user named themselves
        return Location.parse(self._table_location(), storage)

    def _table_location(self) -> str:
        """The table's location; for a table not created yet (a restore into a fresh
        target records its lineage first), the one the sink will create it at."""
        if self.layout is not None:
            return self.layout.location
        table = self._table_if_any()
        if table is not None:
            self.layout = TableLayout.of(table, self.catalog.io_properties())
            return self.layout.location
        return self._new_table_location()

    def _new_table_location(self) -> str:
        """Where the sink creates the table: the namespace's ``location`` property, else
        ``<warehouse>/<namespace>/<name>`` (pyiceberg's and Iceberg's default)."""
        from pyiceberg.exceptions import NoSuchNamespaceError

        namespace, name = ".".join(self.identifier[:-1]), self.identifier[-1]
        try:
            where = self._load_catalog().load_namespace_properties(namespace).get("location")
        except NoSuchNamespaceError:
            where = None
        if where:
            return f"{where.rstrip('/')}/{name}"
        warehouse = self.catalog.properties.get("warehouse")
        if not warehouse:
            raise ConfigError(
                f"exactly.iceberg sink: the table {self.table_name} does not exist yet and the "
                f"{self.catalog.describe()} names no warehouse to create it in; set "
                ".option('warehouse', DIR or s3://bucket/prefix), or create the table first")
        return f"{warehouse.rstrip('/')}/{namespace}/{name}"

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        return self._location().filesystem()

    def _relative(self, uri: str) -> str:
        """A path inside the table's file system (the FileIO's URI without the scheme)."""
        return uri.split("://", 1)[1] if "://" in uri else uri

    def prepare_target(self, schema: pa.Schema, partitions: int | None = None) -> None:
        """Create the namespace and the table with ``schema`` (and ``partitionBy``) if absent;
        otherwise require the stream's columns and types and the same partitioning
        (ConfigError naming both)."""
        from pyiceberg.catalog import Catalog
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self._load_catalog()
        try:
            table = catalog.load_table(self.identifier)
        except NoSuchTableError:
            table = self._create(catalog, schema)
        wanted = Catalog._convert_schema_if_needed(schema, table.metadata.format_version)
        have = table.schema()
        if _columns(have) != _columns(wanted) or not _nullability_fits(have, wanted):
            raise ConfigError(
                f"exactly.iceberg sink: the table {self.table_name} has columns "
                f"{_show(have)}, the stream writes {_show(wanted)}; select the table's "
                "columns and types in the query, or write to a new table")
        if self.partition_by:
            asked = describe_spec(build_spec(have, parse_partitioning(self.partition_by)), have)
            spec = describe_spec(table.spec(), have)
            if asked != spec:
                raise ConfigError(
                    f"exactly.iceberg sink: the table {self.table_name} is partitioned by "
                    f"{spec}, partitionBy asks for {asked}; drop the option (the table's spec "
                    "is used) or write to a new table")
        self._table = table
        self.layout = TableLayout.of(table, self.catalog.io_properties())

    def _create(self, catalog: Any, schema: pa.Schema) -> Any:
        from pyiceberg.catalog import Catalog
        from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
        from pyiceberg.schema import assign_fresh_schema_ids

        iceberg_schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
        spec = (build_spec(iceberg_schema, parse_partitioning(self.partition_by))
                if self.partition_by else UNPARTITIONED_PARTITION_SPEC)
        properties = {"write.parquet.compression-codec": self.compression} \
            if self.compression else {}
        catalog.create_namespace_if_not_exists(self.identifier[:-1])
        location = self._new_table_location() if self.catalog.properties.get(
            "warehouse") else None  # where a restore may have recorded lineage already
        table = catalog.create_table_if_not_exists(self.identifier, schema=iceberg_schema,
                                                   location=location, partition_spec=spec,
                                                   properties=properties)
        log_event(logger, "iceberg_table_created", table=self.table_name,
                  location=table.metadata.location, partitioning=describe_spec(
                      table.spec(), table.schema()))
        return table

    # -- executor side -----------------------------------------------------------------
    def begin_transaction(self, task: TaskInfo) -> IcebergTxn:
        return IcebergTxn(task)

    def write(self, txn: IcebergTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if txn.writer is None:
            if self.layout is None:  # shipped before the table existed: read it here, once
                self.layout = TableLayout.of(self._iceberg(), self.catalog.io_properties())
            txn.writer = LayoutWriter(self.layout)
        for key, rows in txn.writer.split(batch):
            where = key.to_path() if key is not None else ""
            file = txn.open.get(where)
            if file is None:
                name = data_file_name(txn.task.epoch, txn.task.attempt_key, txn.task.query_id,
                                      len(txn.paths))
                path = txn.writer.path_of(name, key)
                txn.paths.append(path)
                self._write_marker(txn)  # before the data file can exist
                file = txn.open[where] = txn.writer.open(path, key, rows.schema)
            file.add(rows)
            txn.rows += rows.num_rows

    def _write_marker(self, txn: IcebergTxn) -> None:
        fs, base = self._fs()
        task = txn.task
        name = lake_files.marker_name(task.query_id, task.epoch, task.attempt_key)
        marker = (fs, f"{base}/{name}",
                  json.dumps({"query_id": task.query_id, "run_id": task.run_id,
                              "epoch": task.epoch, "partition": task.partition,
                              "attempt": task.attempt, MARKER_FILES: txn.paths}).encode())
        if self._location().is_local:
            lake_files.put_object(*marker)
        else:
            # an object exists only once its upload completes (pre_commit waits for the
            # markers first): the marker's PUT runs while the rows are encoded. PUTs of one
            # key run one after the other, so the newest list is the one that stays
            previous = txn.markers[-1] if txn.markers else None
            txn.markers.append(lake_files.in_background(_put_after, previous, *marker))

    def pre_commit(self, txn: IcebergTxn) -> IcebergPayload:
        if not txn.open:
            return IcebergPayload(0)
        assert txn.writer is not None
        txn.markers_written()  # before any data object can exist
        facts = []
        local = self._location().is_local
        for file in txn.open.values():
            metadata, size = file.close()
            if local:
                fsync_file(self._relative(file.path))
            facts.append(txn.writer.facts(file, metadata, size).to_json())
        txn.open = {}
        return IcebergPayload(txn.rows, facts)

    def abort_transaction(self, txn: IcebergTxn) -> None:
        try:
            for future in txn.markers:
                with contextlib.suppress(Exception):  # written or not, it is deleted below
                    future.result()
            for file in txn.open.values():
                file.discard()
        finally:
            txn.open, txn.markers = {}, []
            if txn.paths:
                self._discard(txn.task, txn.paths)

    def commit_visible(self, handle: Handle) -> None:
        """at_least_once: the task's files are a snapshot of their own at once (the summary
        names the epoch; no progress property: a replay adds them a second time)."""
        if handle.payload.files:
            self._commit(handle.query_id, handle.epoch, [handle], exactly_once=False)
        self._delete_marker(handle.task)

    # -- driver side -------------------------------------------------------------------
    def committed_epoch(self, query_id: str) -> int | None:
        """The newest epoch of ``query_id`` the table holds, or None
        (:func:`exactly.connectors.iceberg.snapshots.committed_epoch`); the table as this
        sink last read or committed it."""
        return snapshots.committed_epoch(self._iceberg(), query_id)

    def commit_handle(self, handle: Handle) -> CommitOutcome:
        """Nothing moves (the files are in their final place): recognise an epoch the table
        already holds, else check that the files are still there."""
        done = self.committed_epoch(handle.query_id)
        if done is not None and done >= handle.epoch:
            return CommitOutcome.ALREADY_COMMITTED
        fs, _ = self._fs()
        missing = [f.path for f in handle.payload.facts()
                   if fs.get_file_info(self._relative(f.path)).type == pafs.FileType.NotFound]
        if not missing:
            return CommitOutcome.COMMITTED
        done = snapshots.committed_epoch(self._iceberg(fresh=True), handle.query_id)
        if done is not None and done >= handle.epoch:
            return CommitOutcome.ALREADY_COMMITTED
        raise DataLossError(
            f"epoch {handle.epoch} partition {handle.partition}: the data file {missing[0]} "
            f"named by the commit intent is gone and was never committed to "
            f"{self.describe_target()}; something outside exactly removed it (an orphan-file "
            "cleanup with a retention shorter than the time a crashed query stayed down?)")

    def publish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        if not handles:
            return
        query_id = handles[0].query_id
        if any(h.payload.files for h in handles):
            self._commit(query_id, epoch, handles, exactly_once=True)
        for handle in handles:
            self._delete_marker(handle.task)

    def _commit(self, query_id: str, epoch: int, handles: Sequence[Handle], *,
                exactly_once: bool) -> None:
        """One snapshot adding the files of ``handles`` (exactly_once: and the progress
        property), retried on fresh metadata when another commit came first."""
        from pyiceberg.exceptions import CommitFailedException

        table = self._iceberg()
        facts = [f for h in handles for f in h.payload.facts()]
        summary = {snapshots.SUMMARY_QUERY: query_id, snapshots.SUMMARY_EPOCH: str(epoch)}
        for attempt in range(COMMIT_RETRIES + 1):
            if exactly_once:
                done = snapshots.committed_epoch(table, query_id)
                if done is not None and done >= epoch:
                    if attempt == 0:
                        return  # recognised before this commit (commit_handle said so too)
                    self._raise_unless_ours(table, query_id, epoch, facts, None)
                    return
            try:
                self._table = self._append(table, query_id, epoch, facts, summary, exactly_once)
            except CommitFailedException as exc:
                table = self._iceberg(fresh=True)  # another commit came first: on its metadata
                log_event(logger, "iceberg_commit_retry", logging.INFO, epoch=epoch,
                          attempt=attempt + 1, detail=str(exc)[:200])
                continue
            except Exception as exc:
                # the ambiguous commit (a lost answer, a dropped connection): the table's own
                # record decides
                table = self._iceberg(fresh=True)
                self._raise_unless_ours(table, query_id, epoch, facts, exc)
                log_event(logger, "iceberg_commit_resolved", logging.WARNING, epoch=epoch,
                          files=len(facts), detail=f"the commit call failed "
                          f"({type(exc).__name__}: {exc}) but the table holds the epoch with "
                          "these files: the answer to the commit was lost after the catalog "
                          "applied it")
                return
            log_event(logger, "iceberg_commit", epoch=epoch, files=len(facts),
                      rows=sum(h.rows for h in handles),
                      snapshot=self._table.metadata.current_snapshot_id)
            return
        raise FencedError(
            f"epoch {epoch} of query {query_id}: {COMMIT_RETRIES + 1} commits to "
            f"{self.describe_target()} in a row lost the race to other writers; this instance "
            "committed nothing of the epoch (the query retries it)")

    def _append(self, table: Any, query_id: str, epoch: int, facts: list[FileFacts],
                summary: dict[str, str], exactly_once: bool) -> Any:
        schema = table.schema()
        specs = table.metadata.specs()
        tx = without_retries(table).transaction()
        if exactly_once:
            tx.set_properties({snapshots.progress_property(query_id): str(epoch)})
        with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for fact in facts:
                append.append_data_file(fact.data_file(schema, specs[fact.spec_id]))
        return tx.commit_transaction()

    def _raise_unless_ours(self, table: Any, query_id: str, epoch: int,
                           facts: Sequence[FileFacts], error: Exception | None) -> None:
        """After a failed or lost commit: return when the table holds ``epoch`` of the query
        with exactly these files; FencedError when it holds the epoch with other files (another
        instance committed it); the error itself when it does not hold the epoch."""
        done = snapshots.committed_epoch(table, query_id)
        if done is None or done < epoch:
            if error is not None:
                raise error
            raise FencedError(f"epoch {epoch} of query {query_id}: the table's progress went "
                              "back while this instance committed")
        snapshot = snapshots.snapshot_of(table, query_id, epoch)
        wanted = {f.path for f in facts}
        if snapshot is not None and wanted <= snapshots.added_paths(table, snapshot):
            return
        raise FencedError(
            f"epoch {epoch} of query {query_id} was committed to {self.describe_target()} by "
            "another writer at the same time; another instance of the query is live. This "
            "instance committed nothing of the epoch.") from error

    def abort(self, handle: Handle) -> None:
        paths = [f.path for f in handle.payload.facts()]
        self._discard(handle.task, paths)

    def list_pre_commits(self, query_id: str) -> list[Handle]:
        fs, base = self._fs()
        location = self._location()
        found = []
        for record in lake_files.marker_records(fs, base, query_id, location.child,
                                                (MARKER_FILES,)):
            task = TaskInfo(record["query_id"], record["run_id"], int(record["epoch"]),
                            int(record["partition"]), int(record["attempt"]))
            files = [{"path": p, "size": 0, "records": 0, "spec_id": 0}
                     for p in record[MARKER_FILES]]
            found.append(Handle(task, IcebergPayload(0, files)))
        return sorted(found, key=lambda h: h.key)

    # -- target state (restores) ---------------------------------------------------------
    def describe_target(self) -> str:
        return f"Iceberg table {self.table_name} ({self.catalog.describe()})"

    def _edges(self) -> list[Edge]:
        fs, base = self._fs()
        return lake_files.read_edges(fs, base, self._location().child)

    def _table_if_any(self) -> Any:
        """The table read afresh, None when the catalog has no such table (a catalog that
        cannot be reached raises: a restore must not take it for a fresh target)."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            self._table = self._load_catalog().load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        return self._table

    def target_state(self, query_id: str) -> TargetState:
        table = self._table_if_any()
        if table is None:
            return TargetState(self.describe_target())
        return line_state(self.describe_target(), self._edges(), query_id,
                          lambda q: snapshots.committed_epoch(table, q))

    def _retract_plan(self, table: Any, state: TargetState,
                      epoch: int) -> tuple[list[Any], str | None]:
        """The live data files of the line's epochs after ``epoch`` (from their names), and
        why removing them would be wrong (None: it is right)."""
        members = state.retracted_members(epoch)
        doomed = []
        for data_file in snapshots.live_files(table):
            found = file_epoch(data_file.file_path, members)
            if found is None:
                continue
            first, last = file_epochs(data_file.file_path)
            if first > epoch:
                doomed.append(data_file)
            elif last > epoch:
                return doomed, (
                    f"the compacted data file {data_file.file_path} holds epochs {first}..{last} "
                    f"of the line, across the savepoint's epoch {epoch}: its rows after {epoch} "
                    f"cannot be taken back alone (a savepoint at epoch {last} or later can be "
                    "restored with retract)")
        rewrites = _rewrites_after(table, members, epoch)
        if rewrites:
            return doomed, (
                f"the table was rewritten after the line's first epoch past {epoch} "
                f"({', '.join(rewrites)}): those epochs' rows may now be in files this sink "
                "cannot tell apart, so removing the line's files would not take them back")
        return doomed, None

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        _, refusal = self._retract_plan(self._iceberg(fresh=True), state, epoch)
        return RollbackSupport(
            retract=refusal,
            keep="their rows stay and the restored job commits those epochs again: the "
                 "table then holds them twice")

    def retract_after(self, state: TargetState, epoch: int) -> dict[str, Any]:
        """One snapshot, planned and made on one metadata version (a concurrent commit makes
        the catalog refuse it, and it is planned again): remove every data file of the line's
        epochs after ``epoch`` and set the progress of the same queries back to ``epoch``.
        Idempotent (a second call finds nothing to remove)."""
        from pyiceberg.exceptions import CommitFailedException

        members = state.retracted_members(epoch)
        for _ in range(COMMIT_RETRIES + 1):
            table = self._iceberg(fresh=True)
            doomed, refusal = self._retract_plan(table, state, epoch)
            if refusal is not None:
                raise SavepointError(f"--sink-rollback retract: {refusal}")
            newer = {snapshots.progress_property(q): str(epoch) for q in members
                     if (snapshots.committed_epoch(table, q) or -1) > epoch}
            if not doomed and not newer:
                return {"retracted_files": 0}
            tx = without_retries(table).transaction()
            if newer:
                tx.set_properties(newer)
            if doomed:
                summary = {snapshots.SUMMARY_RETRACTED: str(epoch),
                           snapshots.SUMMARY_LINE: ",".join(members)}
                with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
                    for data_file in doomed:
                        overwrite.delete_data_file(data_file)
            try:
                self._table = tx.commit_transaction()
            except CommitFailedException:
                continue
            epochs = sorted({file_epoch(f.file_path) or 0 for f in doomed})
            log_event(logger, "iceberg_retract", files=len(doomed), after_epoch=epoch,
                      snapshot=self._table.metadata.current_snapshot_id)
            return {"retracted_files": len(doomed), "retracted_epochs": epochs}
        raise SavepointError(f"--sink-rollback retract: {COMMIT_RETRIES + 1} commits to "
                             f"{self.describe_target()} lost the race to other writers; "
                             "run the restore again")

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        """Abort the pending pre-commits of the superseded queries, then record ``to_query``
        <- ``lineage[0]`` in ``_exactly/lineage/<to_query>.json`` (one atomic write)."""
        aborted = self.abort_pre_commits(state.superseded(lineage))
        fs, base = self._fs()
        lake_files.write_edge(fs, base, Edge(to_query, lineage[0], time.time()),
                              local=self._location().is_local)
        return {"aborted_pre_commits": aborted}

    # -- helpers -------------------------------------------------------------------------
    def _discard(self, task: TaskInfo, paths: Sequence[str]) -> None:
        fs, _ = self._fs()
        for path in paths:
            lake_files.delete_object(fs, self._relative(path))
        self._delete_marker(task)

    def _delete_marker(self, task: TaskInfo) -> None:
        fs, base = self._fs()
        lake_files.delete_marker(
            fs, f"{base}/{lake_files.marker_name(task.query_id, task.epoch, task.attempt_key)}",
            local=self._location().is_local)


def without_retries(table: Any) -> Any:
    """``table`` whose transactions pyiceberg commits once: on a conflict pyiceberg would
    refresh and apply the append again on the newer metadata by itself (its
    ``commit.retry.num-retries``, 4 by default), past the check that the epoch is not in the
    table yet -- a fenced instance's epoch would land a second time. The sink retries itself
    (:meth:`IcebergSink._commit`). The table's own properties are not changed: the catalog
    applies the commit's updates to the metadata it holds."""
    from pyiceberg.table import Table, TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    metadata = table.metadata.model_copy(update={"properties": properties})
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog)


def _put_after(previous: Future | None, fs: pafs.FileSystem, path: str, data: bytes) -> None:
    if previous is not None:
        previous.result()
    lake_files.put_object(fs, path, data)


def _rewrites_after(table: Any, queries: Sequence[str], epoch: int) -> list[str]:
    """Snapshots of other writers that may have rewritten rows of ``queries``' epochs after
    ``epoch``: those after the first such epoch's snapshot that are no appends (exactly's own
    compaction keeps every file's epoch in its name and is no rewrite here)."""
    line = list(snapshots.main_line(table))  # newest first
    first_after: int | None = None
    for position, entry in enumerate(line):
        if entry.query_id in queries:
            if entry.epoch is not None and entry.epoch <= epoch:
                break
            first_after = position
    if first_after is None:
        return []
    found = []
    for entry in reversed(line[:first_after]):
        extra = entry.properties
        if entry.query_id is not None or snapshots.SUMMARY_RETRACTED in extra:
            continue
        if entry.operation in snapshots.APPEND_OPERATIONS or snapshots.SUMMARY_COMPACTION in extra:
            continue
        found.append(f"snapshot {entry.snapshot.snapshot_id}: {entry.operation}")
    return found


def _columns(schema: Any) -> list[tuple[str, str]]:
    return [(f.name, str(f.field_type)) for f in schema.fields]


def _nullability_fits(have: Any, wanted: Any) -> bool:
    """A required column of the table takes only a required column of the stream."""
    stream = {f.name: f.required for f in wanted.fields}
    return all(not f.required or stream.get(f.name, False) for f in have.fields)


def _show(schema: Any) -> str:
    return "(" + ", ".join(f"{f.name} {f.field_type}{' not null' if f.required else ''}"
                           for f in schema.fields) + ")"
