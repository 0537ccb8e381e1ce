"""Files under an object-store prefix for the audit (``s3://bucket/prefix``), read in place.

The same files as in a local directory (files.py): JSON lines, Parquet and CSV, ``_`` and
``.`` names skipped at any depth below the prefix (the file sink's staging and commit log),
a file directly in an ``epoch-N`` directory in epoch N. They are listed once, and read by
PyArrow through the sinks' S3 client (same ``AWS_*`` settings) as one dataset per format,
the epoch a constant column of each file, and copied into the audit's database in one scan
(datasets.py); the columns of all files are united by name, a column's types promoted where
they differ (an int and a float: a float).

Unlike DuckDB's reader of local files, PyArrow's JSON reader refuses a line that does not
parse: the audit stops with exit 2 naming the file instead of counting a row without a key.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from exactly.auditor.datasets import attach_dataset, parallel, tag, with_columns
from exactly.auditor.files import SUFFIXES, epoch_of, skipped
from exactly.auditor.locations import ObjectFilesLocation
from exactly.auditor.objects import Store, open_store, store_errors
from exactly.auditor.relation import EPOCH, Relation, first_line
from exactly.errors import AuditInputError

_FORMATS: dict[str, Any] = {".parquet": ds.ParquetFileFormat, ".jsonl": ds.JsonFileFormat,
                            ".csv": ds.CsvFileFormat}


def object_data_files(store: Store) -> list[str]:
    """Paths (in the store) of the data files below the location, or the location itself
    when it is one object; ``_`` and ``.`` names skipped."""
    info = store.fs.get_file_info(store.path)
    if info.type == pafs.FileType.File:
        return [store.path]
    found = []
    for info in store.fs.get_file_info(pafs.FileSelector(store.path, recursive=True,
                                                         allow_not_found=True)):
        relative = PurePosixPath(info.path[len(store.path) + 1:])
        if (info.type == pafs.FileType.File and not any(skipped(p) for p in relative.parts)
                and relative.suffix.lower() in SUFFIXES):
            found.append(info.path)
    return sorted(found)


def attach_object_files(con, name: str, location: ObjectFilesLocation,
                        columns: list[str] | None = None) -> Relation:
    """Copy the data files under ``location`` into the table ``name`` (only ``columns``
    when they have them all); ``empty`` when there are none."""
    relation = Relation(name, location.describe())
    store = open_store(location.uri, location.uri)
    with store_errors(store, location.uri):
        files = object_data_files(store)
        if not files:
            relation.empty = True
            return relation
        by_format: dict[str, list[str]] = {}
        for path in files:
            by_format.setdefault(SUFFIXES[PurePosixPath(path).suffix.lower()], []).append(path)
        try:
            datasets = [_dataset(store, fmt, paths) for fmt, paths in sorted(by_format.items())]
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # a file that is not its format
            raise AuditInputError(f"{location.uri}: cannot read its data files: "
                                  f"{first_line(exc)}") from None
        attach_dataset(con, name, datasets, copy=True, columns=columns,
                       what=location.uri)
    relation.epoch = any(epoch_of(path) is not None for path in files)
    if relation.epoch:
        relation.order = [EPOCH]
    return relation


def _dataset(store: Store, fmt: str, paths: list[str]) -> ds.FileSystemDataset:
    file_format = _FORMATS[fmt]()
    fragments = [file_format.make_fragment(path, store.fs,
                                           partition_expression=tag(**{EPOCH: epoch_of(path)}))
                 for path in paths]
    schemas = parallel(lambda fragment: fragment.physical_schema, fragments)
    schema = with_columns(pa.unify_schemas(schemas, promote_options="permissive"), EPOCH)
    return ds.FileSystemDataset(fragments, schema, file_format, store.fs)
