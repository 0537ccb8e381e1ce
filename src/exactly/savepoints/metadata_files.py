"""Spark's small metadata files of a checkpoint, edited where a savepoint or a restore moves
state: a log or metadata file's JSON line, and the absolute state schema paths of operator
metadata v2 (``state/<op>/_metadata/v2/<batch>``, written for ``transformWithState``).

Operator metadata v2 names its state schema files by absolute path, so a copy of a
checkpoint still points into the checkpoint it was copied from: :func:`relocate_schemas`
points a copy at itself (or at the checkpoint its files are about to be uploaded to).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exactly.errors import SavepointError

_SCHEMA_PATH = re.compile(r"^.*/state/\d+/(_stateSchema/.*)$")


def edit_meta(text: str, edit: Callable[[dict[str, Any]], object]) -> str:
    """A Spark log or metadata file (a version line, then one JSON line, then any others)
    with its JSON line changed by ``edit``."""
    lines = text.split("\n")
    meta = json.loads(lines[1])
    edit(meta)
    lines[1] = json.dumps(meta, separators=(",", ":"))
    return "\n".join(lines)


def renumber_v2(text: str, new_root: str, new_id: int) -> str:
    """Operator metadata v2 (transformWithState) for operator ``new_id`` of the checkpoint at
    ``new_root``: its state schema paths are absolute and must point into the new one."""
    def edit(meta: dict[str, Any]) -> None:
        meta["operatorInfo"]["operatorId"] = new_id
        for store in meta.get("stateStoreInfo", []):
            store["stateSchemaFilePaths"] = [_relocate(p, new_root, new_id)
                                             for p in store.get("stateSchemaFilePaths", [])]

    return edit_meta(text, edit)


def _relocate(path: str, new_root: str, new_id: int) -> str:
    match = _SCHEMA_PATH.match(path)
    if match is None:
        raise SavepointError(f"unexpected state schema path {path} in operator metadata")
    return f"{new_root}/state/{new_id}/{match.group(1)}"


def v2_files(directory: Path) -> list[Path]:
    """The operator metadata v2 files of the local checkpoint ``directory``."""
    return sorted(p for p in directory.glob("state/*/_metadata/v2/*")
                  if p.is_file() and p.name.isdigit() and p.parent.parent.parent.name.isdigit())


def relocate_schemas(directory: Path, new_root: str) -> None:
    """Point the state schema paths of every operator metadata v2 file of the local
    checkpoint ``directory`` at the checkpoint ``new_root`` (a URI: ``file:/...``,
    ``s3a://...``)."""
    for path in v2_files(directory):
        path.write_text(renumber_v2(path.read_text(), new_root,
                                    int(path.parent.parent.parent.name)))
