"""What an Iceberg table written by ``exactly.iceberg`` may not hold after a run, and what it
held at each snapshot, for tests: data files no snapshot names (an aborted attempt's: the
orphan sweep's findings), pending-attempt markers, and each snapshot's ids."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from exactly.connectors.iceberg.catalog import IcebergAddress
from exactly.connectors.iceberg.snapshots import main_line
from exactly.connectors.lake_files import PENDING
from exactly.objectstore import Location


def load(address: str) -> Any:
    parsed = IcebergAddress.parse(address)
    return parsed.catalog.load().load_table(parsed.table)


def referenced_files(table: Any) -> set[str]:
    """Every data file some snapshot of the table names (its path inside the file system)."""
    paths: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(_inside(entry.data_file.file_path))
    return paths


def leftovers(address: str) -> list[str]:
    """Data files under the table's ``data/`` that no snapshot names, and pending-attempt
    markers: empty after a run whose aborted attempts were all cleaned up."""
    table = load(address)
    named = referenced_files(table)
    fs, base = Location.parse(table.metadata.location).filesystem()
    found = []
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File:
            continue
        stray = f"{base}/data/" in info.path and info.path.endswith(".parquet") \
            and info.path not in named
        marker = f"/{PENDING}/" in info.path and info.path.endswith(".json")
        if stray or marker:
            found.append(info.path)
    return sorted(found)


def snapshot_ids(table: Any, column: str = "id") -> dict[int, list[int]]:
    """Each main-line snapshot (oldest first) -> the ids a reader of it sees."""
    line = list(main_line(table))
    return {e.snapshot.snapshot_id: table.scan(snapshot_id=e.snapshot.snapshot_id,
                                               selected_fields=(column,)).to_arrow()[column]
            .to_pylist() for e in reversed(line)}


def _inside(uri: str) -> str:
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri.split("://", 1)[1] if "://" in uri else uri
