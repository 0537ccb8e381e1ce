"""An Iceberg table for the audit: the data files of one snapshot, as its manifests name them.

The table is loaded through its catalog (pyiceberg: SQL on SQLite or PostgreSQL, REST);
the snapshot's manifests give its live data files and, for each, the snapshot that added it.
Files under the table's directory that no manifest names -- a pre-commit of the Iceberg sink
not committed yet, or aborted and not yet deleted, a file a compaction replaced -- are never
read. The files are read by PyArrow, in place on a local disk, on ``s3://`` through the
sinks' S3 client (the same ``AWS_*`` settings) and copied into the audit's database in one
scan (datasets.py).

Each row carries the sequence number of the snapshot that added its file (the order of a
key's rows for ``--latest-by-key`` and ``--monotonic``) and that snapshot's epoch: the
``exactly.epoch`` of its summary (:mod:`exactly.connectors.iceberg.snapshots`); rows of
snapshots by other writers have no epoch. A file exactly's compaction wrote holds the rows
of several epochs: its snapshot's summary says how many rows of which epoch, in file order,
and each row gets its epoch and the sequence number of the snapshot that committed that
epoch (on the audited snapshot's main line), as it had before the compaction -- -1 when that
snapshot expired, as for a file whose snapshot expired. Such files are read in order, a
batch at a time, and copied into the audit's database; files of older compactions, which
recorded no rows per epoch, are read as the compaction's own rows (no epoch, its sequence
number). A snapshot with delete files (row-level deletes of another engine) is refused:
PyArrow would read the deleted rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from exactly.auditor.datasets import attach_dataset, tag, with_columns
from exactly.auditor.locations import IcebergLocation
from exactly.auditor.relation import (
    EPOCH,
    VERSION,
    Relation,
    conform,
    first_line,
    ident,
    load_batches,
)
from exactly.connectors.iceberg.snapshots import compacted_epochs, epoch_of, main_line
from exactly.errors import AuditInputError, ConfigError
from exactly.objectstore import Location


def load_table(location: IcebergLocation) -> Any:
    """The table; AuditInputError naming what is wrong (catalog, table)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    what = location.describe()
    try:
        catalog = location.address.catalog.load()
        return catalog.load_table(location.address.table)
    except ConfigError as exc:
        raise AuditInputError(f"{what}: {exc}") from None
    except (NoSuchTableError, NoSuchNamespaceError):
        raise AuditInputError(f"{what}: the catalog has no table {location.address.table}"
                              f"{location.address.name_hint()}") from None


def attach_iceberg(con: Any, name: str, location: IcebergLocation,
                   columns: list[str] | None = None) -> Relation:
    """Make ``name`` the rows of the data files of ``location``'s snapshot (a view of a
    local table, a copy of an object store's; only ``columns`` when it has them all), the
    files of exactly's compaction that record their rows' epochs copied in any case, each
    row with its own epoch. AuditInputError for a table, snapshot or file that cannot be
    read."""
    what = location.describe()
    table = load_table(location)
    snapshot_id = location.address.snapshot
    meta = table.metadata
    if snapshot_id is not None and meta.snapshot_by_id(snapshot_id) is None:
        known = ", ".join(str(s.snapshot_id) for s in meta.snapshots[-5:]) or "none"
        raise AuditInputError(f"{what}: the table has no snapshot {snapshot_id} (its newest: "
                              f"{known})")
    relation = Relation(name, what)
    relation.order = [VERSION]
    epochs = {s.snapshot_id: (epoch_of(s)[1], s.sequence_number) for s in meta.snapshots}
    files: list[tuple[str, int | None, int]] = []
    compacted: list[_CompactedFile] = []
    if snapshot_id is not None or meta.current_snapshot_id is not None:
        try:
            tasks = list(table.scan(snapshot_id=snapshot_id).plan_files())
            added = _added_by(table, snapshot_id)
        except OSError as exc:
            raise AuditInputError(f"{what}: cannot read the table's manifests: "
                                  f"{first_line(exc)}") from None
        if any(task.delete_files for task in tasks):
            raise AuditInputError(f"{what}: the snapshot has delete files (row-level deletes "
                                  "of another engine); the audit reads data files with "
                                  "PyArrow, which would not apply them")
        history = _EpochHistory(table, snapshot_id)
        for task in tasks:
            path = task.file.file_path
            adder = added.get(path, -1)
            runs = history.compacted_runs(adder, path, task.file.record_count)
            if runs is not None:
                compacted.append(_CompactedFile(path, runs))
                continue
            epoch, sequence = epochs.get(adder, (None, -1))
            files.append((path, epoch, sequence))
    schema = with_columns(_arrow_schema(table, snapshot_id), EPOCH, VERSION)
    paths = [p for p, _, _ in files] + [c.path for c in compacted]
    local = not any("://" in p and not p.startswith("file:") for p in paths) \
        and "://" not in meta.location.replace("file://", "")
    fs = _filesystem(meta.location, what)
    fmt = ds.ParquetFileFormat()
    fragments = [fmt.make_fragment(_path(p), fs, partition_expression=tag(
        **{EPOCH: epoch, VERSION: sequence})) for p, epoch, sequence in files]
    dataset = ds.FileSystemDataset(fragments, schema, fmt, fs)
    plain = f"__x_files_{name}" if compacted else name
    try:
        attach_dataset(con, plain, [dataset], copy=not local, columns=columns, what=what)
        if compacted:
            _attach_compacted(con, name, plain, fs, compacted, schema, columns)
    except (OSError, pa.ArrowInvalid) as exc:  # ArrowInvalid: a compacted file's column
        # that does not convert to the table's type (the files' own rows go through DuckDB)
        raise AuditInputError(f"{what}: cannot read its data files: {first_line(exc)}") from None
    relation.epoch = bool(compacted) or any(epoch is not None for _, epoch, _ in files)
    return relation


@dataclass(frozen=True)
class _CompactedFile:
    """A file of exactly's compaction: its rows' ``(epoch, sequence number, rows)`` runs in
    file order."""

    path: str
    runs: Sequence[tuple[int, int, int]]


class _EpochHistory:
    """The epochs of the audited snapshot's main line: which snapshot committed each epoch
    of each query, and what the compactions on it say of the files they added."""

    def __init__(self, table: Any, snapshot_id: int | None) -> None:
        self.meta = table.metadata
        self.sequence: dict[tuple[str, int], int] = {}
        for entry in main_line(table, snapshot_id):  # newest first: a replay's snapshot wins
            if entry.query_id is not None and entry.epoch is not None:
                self.sequence.setdefault((entry.query_id, entry.epoch),
                                         entry.snapshot.sequence_number)
        self._summaries: dict[int, dict[str, tuple[str, list[tuple[int, int]]]]] = {}

    def compacted_runs(self, snapshot_id: int, path: str, records: int
                       ) -> list[tuple[int, int, int]] | None:
        """``(epoch, sequence number, rows)`` of the rows of ``path``, when the snapshot
        that added it is exactly's compaction recording them (and they add up to the file's
        ``records``); else None. An epoch whose snapshot expired gets sequence number -1."""
        if snapshot_id not in self._summaries:
            snapshot = self.meta.snapshot_by_id(snapshot_id)
            self._summaries[snapshot_id] = {} if snapshot is None else compacted_epochs(
                snapshot)
        found = self._summaries[snapshot_id].get(path)
        if found is None:
            return None
        query, runs = found
        if sum(rows for _, rows in runs) != records:
            return None
        return [(epoch, self.sequence.get((query, epoch), -1), rows) for epoch, rows in runs]


def _attach_compacted(con: Any, name: str, plain: str, fs: Any,
                      files: Sequence[_CompactedFile], schema: pa.Schema,
                      columns: list[str] | None) -> None:
    """Make ``name`` the rows of ``plain`` and of the compacted ``files``, these copied into
    the audit's database in one pass over each file, every row tagged with its epoch and
    its epoch's sequence number (a file's order is its runs' order)."""
    if columns is not None and set(columns) <= set(schema.names):
        wanted = [*dict.fromkeys([*columns, EPOCH, VERSION])]
        schema = pa.schema([schema.field(c) for c in wanted])
    copied = f"__x_compacted_{name}"
    load_batches(con, copied, _compacted_batches(fs, files, schema), schema)
    con.execute(f"CREATE VIEW {ident(name)} AS SELECT * FROM {ident(plain)} "
                f"UNION ALL BY NAME SELECT * FROM {ident(copied)}")


def _compacted_batches(fs: Any, files: Sequence[_CompactedFile], schema: pa.Schema
                       ) -> Iterator[pa.Table]:
    """The rows of ``files`` a batch at a time, in file order, conformed to ``schema``, with
    :data:`EPOCH` and :data:`VERSION` filled from each file's runs."""
    for item in files:
        ends = np.cumsum([rows for _, _, rows in item.runs])
        epochs = np.array([epoch for epoch, _, _ in item.runs], dtype=np.int64)
        versions = np.array([version for _, version, _ in item.runs], dtype=np.int64)
        with fs.open_input_file(_path(item.path)) as stream:
            parquet = pq.ParquetFile(stream)
            names = [n for n in schema.names if n in parquet.schema_arrow.names]
            offset = 0
            for batch in parquet.iter_batches(columns=names):
                run = np.searchsorted(ends, np.arange(offset, offset + batch.num_rows),
                                      side="right")
                offset += batch.num_rows
                rows = pa.Table.from_batches([batch])
                rows = rows.append_column(EPOCH, pa.array(epochs[run])) \
                    .append_column(VERSION, pa.array(versions[run]))
                yield conform(rows, schema)


def _added_by(table: Any, snapshot_id: int | None) -> dict[str, int]:
    """Each live data file of the snapshot -> the id of the snapshot that added it."""
    entries = table.inspect.entries(snapshot_id=snapshot_id)
    paths = entries.column("data_file").combine_chunks().field("file_path").to_pylist()
    added = entries.column("snapshot_id").to_pylist()
    status = entries.column("status").to_pylist()
    return {p: s for p, s, st in zip(paths, added, status, strict=True) if st != 2}


def _arrow_schema(table: Any, snapshot_id: int | None) -> Any:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    schema = table.schema()
    if snapshot_id is not None:
        found = table.metadata.snapshot_by_id(snapshot_id)
        if found is not None and found.schema_id is not None:
            schema = table.metadata.schema_by_id(found.schema_id) or schema
    return schema_to_pyarrow(schema, include_field_ids=False)


def _filesystem(table_location: str, what: str) -> Any:
    try:
        return Location.parse(table_location).filesystem()[0]
    except ConfigError as exc:
        raise AuditInputError(f"{what}: {exc}") from None


def _path(uri: str) -> str:
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri.split("://", 1)[1] if "://" in uri else uri
