"""A disk that fills: a small tmpfs mounted at a path, and a filler file that takes its space.

``SmallDisk(path, size)`` mounts a tmpfs of ``size`` bytes at ``path`` (created if missing);
whatever a job writes there (a sink's staging directory, a commit log, a checkpoint) lives on
that small disk. :meth:`SmallDisk.fill` writes a filler file until only ``leave_bytes`` are
free, so the next write fails with ``ENOSPC`` (*No space left on device*), the way a full
volume fails on a real host; :meth:`SmallDisk.free` removes the filler again.

Mounting needs root (``CAP_SYS_ADMIN``): :func:`why_unavailable` says why it cannot work here,
for a test's skip reason. The disk is unmounted by :meth:`SmallDisk.unmount`, by leaving its
``with`` block (also on an exception), and at the latest when the process exits normally: a
test that fails never leaves a mount behind. Unmounting discards the files on it.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import subprocess
import threading
from pathlib import Path

from exactly.errors import ExactlyError

FILLER = ".nemesis-filler"
_CHUNK = 1 << 20


def why_unavailable() -> str | None:
    """Why a tmpfs cannot be mounted here (not root, no ``mount``), or None when it can."""
    if os.name != "posix" or not Path("/proc/mounts").exists():
        return "a small disk needs Linux (tmpfs, /proc/mounts)"
    if os.geteuid() != 0:
        return ("a small disk is a tmpfs mount, which needs root (CAP_SYS_ADMIN); this test "
                f"runs as uid {os.geteuid()}")
    for tool in ("mount", "umount"):
        if shutil.which(tool) is None:
            return f"a small disk needs the {tool} command, which is not on PATH"
    return None


def _mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


class SmallDisk:
    """A tmpfs of ``size`` bytes at ``path``; a context manager that unmounts at exit.

    Parameters
    ----------
    path
        Where to mount it (created when missing; must be empty: the mount hides its files).
    size
        The disk's size in bytes (tmpfs rounds it up to whole pages).

    Raises
    ------
    ExactlyError
        From :meth:`mount` when mounting fails (the reason from ``mount``), or when ``path``
        is not empty.
    """

    def __init__(self, path: str | Path, size: int) -> None:
        self.path = Path(path)
        self.size = int(size)
        self._lock = threading.Lock()
        self._is_mounted = False

    # -- life -------------------------------------------------------------------------
    def mount(self) -> SmallDisk:
        """Mount the tmpfs (idempotent); returns self."""
        with self._lock:
            if self._is_mounted:
                return self
            self.path.mkdir(parents=True, exist_ok=True)
            if any(self.path.iterdir()):
                raise ExactlyError(f"{self.path}: a small disk mounts over an empty directory "
                                   "only (the mount would hide its files); pick a new path")
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755",
                                   "tmpfs", str(self.path)], capture_output=True, text=True)
            if done.returncode != 0:
                raise ExactlyError(f"mounting a {self.size}-byte tmpfs at {self.path} failed: "
                                   f"{done.stderr.strip() or done.returncode} "
                                   f"({why_unavailable() or 'mount refused it'})")
            self._is_mounted = True
            atexit.register(self.unmount)
            return self

    def unmount(self) -> None:
        """Unmount (idempotent; lazily when files are still open on it): its files are gone."""
        with self._lock:
            if not self._is_mounted:
                return
            self._is_mounted = False
            atexit.unregister(self.unmount)
            if not _mounted(self.path):
                return
            done = subprocess.run(["umount", str(self.path)], capture_output=True, text=True)
            if done.returncode != 0:  # busy: a process still has a file open there
                subprocess.run(["umount", "-l", str(self.path)], check=True,
                               capture_output=True)

    def __enter__(self) -> SmallDisk:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    # -- space ------------------------------------------------------------------------
    @property
    def filler(self) -> Path:
        return self.path / FILLER

    def available(self) -> int:
        """Bytes a writer can still use on the disk."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_bytes: int = 0) -> int:
        """Grow the filler file until at most ``leave_bytes`` are free; returns the bytes free.

        With ``leave_bytes=0`` the disk is full: the next write of one byte fails with
        ``ENOSPC``. Calling it again after files were removed fills the disk again."""
        self._require_mounted()
        with open(self.filler, "ab", buffering=0) as out:
            while (want := self.available() - leave_bytes) > 0:
                try:
                    out.write(b"\0" * min(want, _CHUNK))
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        return self.available()

    def free(self) -> int:
        """Remove the filler; returns the bytes free afterwards."""
        self._require_mounted()
        self.filler.unlink(missing_ok=True)
        return self.available()

    def _require_mounted(self) -> None:
        if not self._is_mounted:
            raise ExactlyError(f"the small disk at {self.path} is not mounted: call mount() or "
                               "use it as a context manager")
