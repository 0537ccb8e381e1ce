"""Process identities on this host, read from /proc (Linux).

Spark runs a Python data source's driver-side methods in Python workers forked under the
driver JVM. The JVM ancestor identifies the driver: it is what a lease records and what a
driver-side fault kills.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ProcessId:
    """A process on a host, robust to pid reuse (the kernel start time is part of it)."""

    host: str
    pid: int
    start_ticks: int

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcessId:
        return cls(str(data["host"]), int(data["pid"]), int(data["start_ticks"]))  # type: ignore[arg-type]

    def is_alive(self) -> bool | None:
        """True/False on this host; ``None`` when the process lives on another host."""
        if self.host != socket.gethostname():
            return None
        stat = _stat(self.pid)
        return stat is not None and stat[2] == self.start_ticks


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(command, parent pid, start time in clock ticks) of ``pid``, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[1]), int(fields[19])


def _ancestors(pid: int) -> list[tuple[int, str]]:
    chain = []
    while pid > 1:
        stat = _stat(pid)
        if stat is None:
            break
        chain.append((pid, stat[0]))
        pid = stat[1]
    return chain


def jvm_ancestor() -> int | None:
    """Pid of the nearest ``java`` ancestor of this process (the Spark JVM), if any."""
    for pid, comm in _ancestors(os.getppid()):
        if comm == "java":
            return pid
    return None


def _own_gateway_jvm() -> int | None:
    """Pid of the JVM this process launched when it is a PySpark driver, else None."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    sc = SparkContext._active_spark_context
    proc = getattr(getattr(sc, "_gateway", None), "proc", None) if sc is not None else None
    return proc.pid if proc is not None else None


def driver_identity() -> ProcessId:
    """Identity of the Spark driver, seen from a driver-side worker (the JVM ancestor) or
    from the Python driver itself (e.g. inside ``foreachBatch``)."""
    pid = jvm_ancestor() or os.getpid()
    stat = _stat(pid)
    return ProcessId(socket.gethostname(), pid, stat[2] if stat else 0)


def driver_processes() -> list[int]:
    """Pids that make up the driver: the Python driver that launched the JVM, and the JVM.

    Works from a Python worker under the driver JVM and from the Python driver process.
    """
    jvm = jvm_ancestor()
    if jvm is None:
        own = _own_gateway_jvm()
        return [os.getpid(), own] if own is not None else [os.getpid()]
    pids = []
    stat = _stat(jvm)
    if stat is not None and _launched_by_pyspark(jvm):
        pids.append(stat[1])
    pids.append(jvm)
    return pids


def _launched_by_pyspark(jvm: int) -> bool:
    """PySpark's launcher hands the JVM a connection-info path through its environment."""
    try:
        with open(f"/proc/{jvm}/environ", "rb") as f:
            return b"_PYSPARK_DRIVER_CONN_INFO_PATH=" in f.read()
    except OSError:
        return False
