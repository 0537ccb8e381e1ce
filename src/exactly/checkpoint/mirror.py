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
from exactly.checkpoint.transfer import download_tree

#: copied whole, besides ``metadata``
LOGS = ("offsets", "commits")
#: only their presence matters to the tools
PRESENCE = ("state", "sources", layout.JOB_DIR)


@contextlib.contextmanager
def mirrored(checkpoint: str, sink_log: str | None = None) -> Iterator[tuple[Path, Path | None]]:
    """``(local copy of the checkpoint, local copy of the sink log or None)``, removed when
    the block ends. ``sink_log`` None: the checkpoint's own ``exactly-sink``, when it has
    one (it is then copied inside the checkpoint's copy)."""
    with tempfile.TemporaryDirectory(prefix="exactly-mirror-") as tmp:
        root = Path(tmp) / "checkpoint"
        root.mkdir()
        store = open_store(checkpoint)
        if store.exists("metadata"):
            store.download("metadata", root / "metadata")
        for folder in LOGS:
            download_tree(store, root / folder, folder)
        for name in PRESENCE:
            if store.list_tree(name):
                (root / name).mkdir(exist_ok=True)
        log: Path | None = None
        if sink_log is None:
            if download_tree(store, root / layout.SINK_LOG_DIR, layout.SINK_LOG_DIR):
                log = root / layout.SINK_LOG_DIR
        else:
            log = Path(tmp) / "sink-log"
            log.mkdir()
            download_tree(open_store(sink_log), log)
        yield root, log
