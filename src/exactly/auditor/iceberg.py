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
snapshots by other writers (a compaction included) have no epoch. A snapshot with delete
files (row-level deletes of another engine) is refused: PyArrow would read the deleted rows.
"""

from __future__ import annotations

from typing import Any

import pyarrow.dataset as ds

from exactly.auditor.datasets import attach_dataset, tag, with_columns
from exactly.auditor.locations import IcebergLocation
from exactly.auditor.relation import EPOCH, VERSION, Relation, first_line
from exactly.connectors.iceberg.snapshots import epoch_of
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
                              ) from None


def attach_iceberg(con: Any, name: str, location: IcebergLocation,
                   columns: list[str] | None = None) -> Relation:
    """Make ``name`` the rows of the data files of ``location``'s snapshot (a view of a
    local table, a copy of an object store's; only ``columns`` when it has them all)."""
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
        for task in tasks:
            path = task.file.file_path
            epoch, sequence = epochs.get(added.get(path, -1), (None, -1))
            files.append((path, epoch, sequence))
    schema = _arrow_schema(table, snapshot_id)
    local = not any("://" in p and not p.startswith("file:") for p, _, _ in files) \
        and "://" not in meta.location.replace("file://", "")
    fs = _filesystem(meta.location, what)
    fmt = ds.ParquetFileFormat()
    fragments = [fmt.make_fragment(_path(p), fs, partition_expression=tag(
        **{EPOCH: epoch, VERSION: sequence})) for p, epoch, sequence in files]
    dataset = ds.FileSystemDataset(fragments, with_columns(schema, EPOCH, VERSION), fmt, fs)
    try:
        attach_dataset(con, name, [dataset], copy=not local, columns=columns, what=what)
    except OSError as exc:
        raise AuditInputError(f"{what}: cannot read its data files: {first_line(exc)}") from None
    relation.epoch = any(epoch is not None for _, epoch, _ in files)
    return relation


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
