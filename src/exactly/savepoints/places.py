"""Where the savepoint code stages what lives on S3: a local directory of this host.

Savepoints, savepoint directories and checkpoints are each a local directory or an S3 prefix,
opened as a :class:`~exactly.checkpoint.store.LogStore`; the savepoint code works on local
files (Spark reads and writes the state through its local file system), so what lives on S3
moves whole through a directory made here (:mod:`exactly.checkpoint.transfer`).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from exactly.checkpoint.location import host_dir


@contextlib.contextmanager
def staging_dir(checkpoint: str, name: str) -> Iterator[Path]:
    """An empty local directory ``name`` for staging files of ``checkpoint`` (a savepoint
    of it, a restore into it), in the checkpoint's directory of this host (``exactly-job``
    of a local one), removed after the block; what a killed driver left there is removed
    when the next one starts the block (one driver at a time runs a checkpoint)."""
    directory = host_dir(checkpoint) / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
