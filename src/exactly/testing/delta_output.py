"""What a Delta table written by ``exactly.delta`` may not hold after a run, for tests:
data files its log does not name (an aborted attempt's) and pending-attempt markers."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
from deltalake import DeltaTable

from exactly.connectors.delta.sink import PENDING
from exactly.objectstore import Location


def leftovers(uri: str, storage_options: dict[str, str] | None = None) -> list[str]:
    """Paths of data files under the table that its newest version does not name, and of
    pending-attempt markers: empty after a run whose aborted attempts were all cleaned up."""
    table = DeltaTable(uri, storage_options=storage_options or {})
    named = {Path(u).name for u in table.file_uris()}
    fs, base = Location.parse(uri, storage_options).filesystem()
    found = []
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
        if info.type != pafs.FileType.File or "/_delta_log/" in info.path:
            continue
        stray_data = info.path.endswith(".parquet") and Path(info.path).name not in named
        marker = f"/{PENDING}/" in info.path and info.path.endswith(".json")
        if stray_data or marker:
            found.append(info.path)
    return sorted(found)
