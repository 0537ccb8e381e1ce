"""A read-only local copy of the small files of a checkpoint on S3, for the offline tools
that read files (``exactly doctor``, ``exactly restore-offsets``).

What is copied: Spark's ``metadata``, ``offsets/`` and ``commits/`` (a few hundred bytes an
epoch) and an exactly sink's commit log (JSON records); of ``state/``, ``sources/`` and
``exactly-job/`` only that they exist. The copy is a snapshot: a job that runs meanwhile
moves on (the tools say so when a live driver holds the sink's lease).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from exactly.checkpoint import layout
from exactly.checkpoint.location import open_store

#: copied whole
SMALL = ("metadata", "offsets", "commits")
#: only their presence matters to the tools
PRESENCE = ("state", "sources", layout.JOB_DIR)


def copy_tree(location: str, folder: str, into: Path) -> int:
    """Copy every object under ``location/folder`` into ``into/folder``; returns how many.
    ``folder`` may also name one object."""
    store = open_store(location)
    single = store.read(folder) if folder else None
    if single is not None:
        (into / folder).parent.mkdir(parents=True, exist_ok=True)
        (into / folder).write_bytes(single)
        return 1
    count = 0
    for name in store.list_tree(folder):
        data = store.read(f"{folder}/{name}")
        if data is None:
            continue  # deleted since it was listed (Spark's maintenance)
        target = into / folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        count += 1
    return count


@contextlib.contextmanager
def mirrored(checkpoint: str, sink_log: str | None = None) -> Iterator[tuple[Path, Path | None]]:
    """``(local copy of the checkpoint, local copy of the sink log or None)``, removed when
    the block ends. ``sink_log`` None: the checkpoint's own ``exactly-sink``, when it has
    one (it is then copied inside the checkpoint's copy)."""
    with tempfile.TemporaryDirectory(prefix="exactly-mirror-") as tmp:
        root = Path(tmp) / "checkpoint"
        root.mkdir()
        store = open_store(checkpoint)
        for name in SMALL:
            copy_tree(checkpoint, name, root)
        for name in PRESENCE:
            if store.list_tree(name):
                (root / name).mkdir(exist_ok=True)
        log: Path | None = None
        if sink_log is None:
            if copy_tree(checkpoint, layout.SINK_LOG_DIR, root):
                log = root / layout.SINK_LOG_DIR
        else:
            log = Path(tmp) / "sink-log"
            log.mkdir()
            copy_tree(sink_log, "", log)
        yield root, log
