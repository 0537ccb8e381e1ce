"""Which staging area a sink's log location gets: a POSIX directory or an S3 prefix."""

from __future__ import annotations

from pathlib import Path

from exactly.checkpoint.store import is_remote
from exactly.protocol.object_staging import ObjectStagingArea
from exactly.protocol.staging import Stage, StagingArea


def open_stage(root: Path | str, folder: str, data_name: str) -> Stage:
    """The staging area ``<root>/<folder>`` of a sink whose log is at ``root``: a POSIX
    :class:`StagingArea` for a path (or ``file://`` URI), an object-store area for an
    ``s3://`` (or ``s3a://``) URI: the stores the commit log has
    (:mod:`exactly.checkpoint.store`)."""
    if isinstance(root, str) and is_remote(root):
        return ObjectStagingArea(root, folder, data_name)
    local = Path(str(root).removeprefix("file://")).absolute()
    return StagingArea(local / folder, local, data_name)
