"""A Delta table for the audit: the files of one version, as the table's log names them.

``deltalake`` reads the log and gives the version's files (with their partition values);
files in the table's directory that the log does not name -- a pre-commit of the Delta sink
not committed yet, or aborted and not yet deleted, a file an ``OPTIMIZE`` or a ``DELETE``
replaced -- are never read. The files are read by PyArrow, in place on a local disk, on
``s3://`` through the sinks' S3 client (the same ``AWS_*`` settings) and copied into the
audit's database in one scan (datasets.py).

Each row carries the table version of the commit that added its file (the order of a key's
rows for ``--latest-by-key`` and ``--monotonic``) and that commit's epoch: the version of
its ``exactly-<query id>`` application transaction (see
:mod:`exactly.connectors.delta.commits`); rows of commits by other writers have no epoch.
"""

from __future__ import annotations

import pyarrow.dataset as ds
import pyarrow.fs as pafs

from exactly.auditor.datasets import attach_dataset, tag, with_columns
from exactly.auditor.locations import DeltaLocation
from exactly.auditor.objects import open_store, store_errors
from exactly.auditor.relation import EPOCH, VERSION, Relation, first_line
from exactly.connectors.delta.commits import file_origins
from exactly.errors import AuditInputError


def attach_delta(con, name: str, location: DeltaLocation,
                 columns: list[str] | None = None) -> Relation:
    """Make ``name`` the rows of the files of ``location``'s version (the newest when it
    names none): a view of a local table, a copy of an object store's (only ``columns``
    when it has them all). AuditInputError for a table that cannot be read (no log, a
    version it does not have, reader features PyArrow lacks)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, DeltaProtocolError

    what = location.describe()
    relation = Relation(name, what)
    store = open_store(location.uri, what)
    with store_errors(store, what):
        options = store.location.resolved_options()
        try:
            table = DeltaTable(location.uri, version=location.version, storage_options=options)
            root = pafs.SubTreeFileSystem(store.path, store.fs)
            dataset = table.to_pyarrow_dataset(filesystem=root)
        except DeltaProtocolError as exc:
            raise AuditInputError(f"{what}: {first_line(exc).rstrip('.')} (the audit reads "
                                  "a table's files with PyArrow, which applies neither "
                                  "deletion vectors nor column mapping)") from None
        except DeltaError as exc:
            problem = _version_problem(location, options) or first_line(exc)
            if "No files in log segment" in problem:
                problem = "its _delta_log/ holds no commit"
            raise AuditInputError(f"{what}: cannot read the table: {problem}") from None
        fragments = list(dataset.get_fragments())
        origins = file_origins(store.fs, store.path, [f.path for f in fragments],
                               table.version())
    fmt = dataset.format
    tagged = [fmt.make_fragment(f.path, root, partition_expression=f.partition_expression & tag(
        **{EPOCH: origins[f.path].epoch, VERSION: origins[f.path].version}))
        for f in fragments]
    schema = with_columns(dataset.schema, EPOCH, VERSION)
    with store_errors(store, what):
        attach_dataset(con, name, [ds.FileSystemDataset(tagged, schema, fmt, root)],
                       copy=not store.location.is_local, columns=columns, what=what)
    relation.epoch = any(o.epoch is not None for o in origins.values())
    relation.order = [VERSION]
    return relation


def _version_problem(location: DeltaLocation, options: dict[str, str]) -> str | None:
    """Why ``location.version`` cannot be read, when the newest version can."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    if location.version is None:
        return None
    try:
        newest = DeltaTable(location.uri, storage_options=options).version()
    except DeltaError:
        return None
    if location.version > newest:
        return f"it has no version {location.version}; its newest is {newest}"
    return (f"version {location.version} is no longer in its log (cleaned up after a "
            f"checkpoint); read a newer one (the newest is {newest})")
