"""The restore marker ``exactly-job/restore.json``: the savepoint restore that made a
checkpoint, whether it is done, and the job files of the ``exactly upgrade`` that made it
(written by :mod:`exactly.savepoints.restore`)."""

from __future__ import annotations

import os
from typing import Any

from exactly.checkpoint.layout import RESTORE_MARKER
from exactly.checkpoint.store import LogStore
from exactly.errors import CorruptFileError
from exactly.fsutil import parse_json


def read_restore_marker(store: LogStore) -> dict[str, Any] | None:
    """The marker in the job store ``store``: ``{"state": "in-progress" | "done",
    "savepoint": ..., "query_id": ..., "upgrade": {...}?}``, or None when there is none.
    Raises CorruptFileError naming the file when it is not JSON."""
    raw = store.read(RESTORE_MARKER)
    if raw is None:
        return None
    value = parse_json(raw, store.describe(RESTORE_MARKER),
                       repair="delete the checkpoint and restore into it again")
    return value if isinstance(value, dict) else None


def upgrade_of(store: LogStore) -> dict[str, Any]:
    """The job file names of the upgrade that made the checkpoint's last restore (``files``:
    the new, the old and a rollback's; ``from``: the old), and that restore's ``state``;
    no files when it was no upgrade, or the marker cannot be read (its restore reports
    that)."""
    try:
        marker = read_restore_marker(store) or {}
    except CorruptFileError:
        marker = {}
    upgrade = marker.get("upgrade")
    if not isinstance(upgrade, dict):
        return {"files": set()}
    files = {os.path.basename(str(upgrade[key])) for key in
             ("job_file", "from_job_file", "rollback_of") if upgrade.get(key)}
    source = upgrade.get("from_job_file")
    return {"state": marker.get("state"), "files": files,
            "from": os.path.basename(str(source)) if source else None}
