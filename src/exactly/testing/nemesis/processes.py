"""Pause and resume processes (SIGSTOP / SIGCONT): a hung driver, executor or server.

A paused process keeps its sockets, locks and leases but does nothing, then wakes up and
goes on as if no time had passed -- the fault behind zombie writers and expired leases.
:func:`paused` always resumes what it paused (even when the body raises); a process that
died meanwhile is skipped. Finders pick a job's processes by role under its driver.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

from exactly.testing.nemesis.faultlog import FaultLog


def _signal(pids: Iterable[int], sig: signal.Signals) -> list[int]:
    done = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).send_signal(sig)
            done.append(pid)
    return done


@contextlib.contextmanager
def paused(pids: Iterable[int], *, target: str = "processes",
           log: FaultLog | None = None) -> Iterator[list[int]]:
    """SIGSTOP ``pids`` for the body of the ``with``, then SIGCONT them; yields the pids
    that were stopped."""
    stopped = _signal(list(pids), signal.SIGSTOP)
    if log is not None:
        log.record("pause", target, phase="start", pids=stopped)
    try:
        yield stopped
    finally:
        _signal(stopped, signal.SIGCONT)
        if log is not None:
            log.record("pause", target, phase="end", pids=stopped)


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def tree_processes(root_pid: int) -> list[psutil.Process]:
    """``root_pid`` and every descendant, the root first (none once it is gone)."""
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _is_python_worker(proc: psutil.Process) -> bool:
    line = _cmdline(proc)
    return "pyspark.daemon" in line or "pyspark.worker" in line


def driver_pids(driver_pid: int) -> list[int]:
    """A job's driver: the Python driver process ``driver_pid`` and its driver JVM (its
    descendants that are not PySpark workers)."""
    return [p.pid for p in tree_processes(driver_pid) if not _is_python_worker(p)]


def executor_pids(driver_pid: int) -> list[int]:
    """The Python workers under a ``local[N]`` driver (the executors' Python side): the
    worker daemons and the workers they forked."""
    return [p.pid for p in tree_processes(driver_pid) if _is_python_worker(p)]


def tree_pids(root_pid: int) -> list[int]:
    """A server's process and every descendant (PostgreSQL's postmaster and backends)."""
    return [p.pid for p in tree_processes(root_pid)]


def locks_held(pids: Iterable[int], under: Path) -> list[str]:
    """The lock files under ``under`` on which one of ``pids`` holds a ``flock``
    (``/proc/locks``; waiters, marked ``->``, hold nothing). A process paused while it holds
    one blocks every other process's compare-and-swap of that file on a local directory
    until it resumes: a limitation of the local store, which a pause drill avoids by
    pausing again a moment later."""
    files = {path.stat().st_ino: str(path) for path in Path(under).rglob("*.lock")}
    wanted = set(pids)
    held = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        pid, inode = int(fields[4]), int(fields[5].rsplit(":", 1)[1])
        if pid in wanted and inode in files:
            held.append(files[inode])
    return held
