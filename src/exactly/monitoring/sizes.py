"""The size of a checkpoint on disk, per epoch: the full size and the bytes the epoch added.

Spark and exactly write checkpoint files once and rename them into place (offsets, commits,
state deltas and snapshots, RocksDB zips and SST files, the sink's commit log); a directory's
modification time changes whenever a file appears in it or leaves it. :class:`CheckpointSizes`
therefore re-lists only the directories whose modification time changed since its last
measurement, so measuring after every epoch costs what the epoch changed, not the size of the
checkpoint. Bytes "new" in an epoch are those of files modified at or after the epoch's
trigger time.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from exactly.checkpoint.store import LogStore

#: a directory whose modification time is older than this is trusted to be unchanged
_SETTLED_S = 2.0


@dataclass(frozen=True)
class SizeSample:
    full_bytes: int
    new_bytes: int
    files: int


@dataclass
class _Dir:
    mtime_ns: int
    #: file name -> (size, mtime in seconds, inode)
    files: dict[str, tuple[int, float, int]]
    subdirs: list[str]


class CheckpointSizes:
    """Measures one checkpoint directory; keep one instance per running query."""

    def __init__(self, root: str | os.PathLike[str], *, exclude: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        #: paths relative to root not counted (exactly's own history)
        self.exclude = {Path(e) for e in exclude}
        self._dirs: dict[Path, _Dir] = {}

    def measure(self, since: float | None = None) -> SizeSample:
        """Full size of the checkpoint, and the bytes of files modified at or after ``since``
        (a Unix time; 0 new bytes without it)."""
        full = new = files = 0
        seen: set[Path] = set()
        stack = [self.root]
        while stack:
            directory = stack.pop()
            seen.add(directory)
            entry = self._scan(directory)
            if entry is None:
                continue
            for size, mtime, _ in entry.files.values():
                full += size
                files += 1
                if since is not None and mtime >= since:
                    new += size
            for name in entry.subdirs:
                child = directory / name
                if child.relative_to(self.root) not in self.exclude:
                    stack.append(child)
        for gone in set(self._dirs) - seen:
            del self._dirs[gone]
        return SizeSample(full, new, files)

    def _scan(self, directory: Path) -> _Dir | None:
        try:
            mtime_ns = directory.stat().st_mtime_ns
        except FileNotFoundError:
            self._dirs.pop(directory, None)
            return None
        cached = self._dirs.get(directory)
        # a directory changed in the last seconds is listed again: file systems stamp times
        # coarsely, so a file added right after a listing can leave the time unchanged
        if (cached is not None and cached.mtime_ns == mtime_ns
                and time.time() - mtime_ns / 1e9 > _SETTLED_S):
            return cached
        files: dict[str, tuple[int, float, int]] = {}
        subdirs: list[str] = []
        # a file listed before, with the same inode and settled, keeps its size: Spark and
        # exactly write a file once and rename it into place (a rename over a name brings a
        # new inode), so only new files are stat'ed
        known = cached.files if cached is not None else {}
        settled = time.time() - _SETTLED_S
        try:
            with os.scandir(directory) as entries:
                for item in entries:
                    try:
                        if item.is_dir(follow_symlinks=False):
                            subdirs.append(item.name)
                        elif (item.name in known and known[item.name][1] < settled
                              and known[item.name][2] == item.inode()):
                            files[item.name] = known[item.name]
                        elif item.is_file(follow_symlinks=False):
                            stat = item.stat(follow_symlinks=False)
                            files[item.name] = (stat.st_size, stat.st_mtime, stat.st_ino)
                    except FileNotFoundError:
                        continue  # removed while listed (Spark's maintenance, a temp file)
        except FileNotFoundError:
            self._dirs.pop(directory, None)
            return None
        entry = _Dir(mtime_ns, files, subdirs)
        self._dirs[directory] = entry
        return entry


class ObjectSizes:
    """:class:`CheckpointSizes` for a checkpoint on an object store: one listing of the
    prefix per measurement (1,000 objects a request), sizes and times from the listing."""

    def __init__(self, store: LogStore, *, exclude: tuple[str, ...] = ()) -> None:
        self.store = store
        self.exclude = tuple(e.rstrip("/") + "/" for e in exclude)

    def measure(self, since: float | None = None) -> SizeSample:
        full = new = files = 0
        for name, size, modified in self.store.stat_tree(""):
            if name.startswith(self.exclude):
                continue
            full += size
            files += 1
            if since is not None and modified >= since:
                new += size
        return SizeSample(full, new, files)
