"""Process identities on this host, and killing a job's whole process tree (Linux).

Spark runs a Python data source's driver-side methods in Python workers forked under the
driver JVM. The JVM ancestor identifies the driver: it is what a lease records.

A job is more than its driver: the Python driver launches the driver JVM, the JVM starts
PySpark worker daemons (``pyspark.daemon``), and the daemons fork the Python workers. Each
daemon puts itself into a process group of its own (``os.setpgid(0, 0)``), so killing the
driver's process group leaves the daemons and their workers alive, and once the driver is
dead they are re-parented to pid 1, out of reach of a walk down from the driver. A driver
started by exactly (the launcher of ``exactly run``, the crash harness
:func:`exactly.testing.chaos.run_with_crashes`) therefore carries a unique token in its
environment (:data:`JOB_TOKEN_ENV`, internal plumbing: set by exactly for its own processes,
never set it yourself): the Python driver passes its environment to the JVM, the JVM to every
worker daemon it starts, and a forked worker shares its daemon's. Finding a job's processes
is a scan of every process's environment for the token (:func:`job_processes`), and
:func:`kill_job` SIGKILLs the job's whole tree, scans again until nothing of it is left, and
raises :class:`ProcessesSurvived` naming the pids and command lines of anything that will
not die.

A token names the process that made it (:func:`new_job_token`). A fault firing in a job
(:func:`local_job_pids`) kills by its own token only when that process is one of its
ancestors (:func:`trusted_job_token`): a token set by hand or inherited from elsewhere never
makes a fault kill processes beyond the job's own tree.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from exactly.errors import ExactlyError

#: environment variable carrying the token of a job's processes (internal: set by exactly --
#: the ``exactly run`` launcher, the crash harness, the test kit -- for the processes of a
#: job it starts; never set it yourself)
JOB_TOKEN_ENV = "_EXACTLY_JOB_TOKEN"
#: the first part of every token :func:`new_job_token` makes
_TOKEN_PREFIX = "exactly"
#: names this host in leases instead of its host name (containers that share a host name,
#: tests that play two hosts on one machine)
HOST_ID_ENV = "EXACTLY_HOST_ID"


def host_identity() -> str:
    """The name of this host in leases: ``$EXACTLY_HOST_ID`` if set, else the host name.

    Two hosts must never share one: a lease holder whose host matches is checked by pid,
    exactly, and a holder elsewhere only by the age of its lease."""
    return os.environ.get(HOST_ID_ENV) or socket.gethostname()


@dataclass(frozen=True)
class ProcessId:
    """A process on a host, robust to pid reuse (the kernel start time is part of it)."""

    host: str
    pid: int
    start_ticks: int
    #: the PID namespace the pid is counted in (``pid:[inode]``; empty in records written
    #: before it was recorded: taken as this process's namespace)
    pidns: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessId:
        return cls(str(data["host"]), int(data["pid"]), int(data["start_ticks"]),
                   str(data.get("pidns") or ""))

    def is_alive(self) -> bool | None:
        """True/False on this host; ``None`` when the process lives on another host. A
        zombie (a process that exited and was not reaped yet) is dead.

        A process of another PID namespace (a container) is looked up by its pid in that
        namespace when the namespace is visible from here (from the host, or a parent
        namespace). When it is not (a sibling container, or a namespace that is gone), the
        pid and start time are checked here, as for a process recorded without its
        namespace: two live containers must not share a host name (``$EXACTLY_HOST_ID``)."""
        if self.host != host_identity():
            return None
        pid = self.pid
        if self.pidns and self.pidns != pid_namespace():
            seen = _pid_seen_here(self.pidns, self.pid)
            if seen == 0:  # the namespace is visible from here, the process is not in it
                return False
            if seen is not None:
                pid = seen
        stat = _stat(pid)
        return stat is not None and stat[2] == self.start_ticks and stat[3] not in _DEAD


#: process states of /proc/<pid>/stat that are no longer a running process: zombie, dead
_DEAD = ("Z", "X", "x")


def pid_namespace() -> str:
    """The PID namespace of this process (``pid:[4026531836]``); empty where unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _pid_seen_here(namespace: str, pid: int) -> int | None:
    """The pid, in this process's namespace, of process ``pid`` of PID namespace
    ``namespace``; 0 when that namespace is visible from here but has no such process; None
    when no process of that namespace is visible from here."""
    visible = False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                continue
            visible = True
            with open(f"/proc/{entry.name}/status") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")),
                             [])
        except OSError:
            continue
        if nspid and int(nspid[-1]) == pid:
            return int(entry.name)
    return 0 if visible else None


def _stat(pid: int) -> tuple[str, int, int, str] | None:
    """(command, parent pid, start time in clock ticks, state) of ``pid``, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[1]), int(fields[19]), fields[0]


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


def current_process() -> ProcessId:
    """Identity of this very process."""
    return process_id(os.getpid())


def process_id(pid: int) -> ProcessId:
    """Identity of process ``pid`` on this host (start time 0 if it is already gone)."""
    stat = _stat(pid)
    return ProcessId(host_identity(), pid, stat[2] if stat else 0, pid_namespace())


def driver_identity() -> ProcessId:
    """Identity of the Spark driver, seen from a driver-side worker (the JVM ancestor) or
    from the Python driver itself (e.g. inside ``foreachBatch``)."""
    return process_id(jvm_ancestor() or _own_gateway_jvm() or os.getpid())


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


# -- a job's process tree ------------------------------------------------------------------


class ProcessesSurvived(ExactlyError):
    """Processes of a job are still alive after it was killed; names them."""

    def __init__(self, what: str, survivors: list[ProcessInfo]) -> None:
        self.survivors = survivors
        listing = "\n".join(f"  pid {p.pid} (pgid {p.pgid}, ppid {p.ppid}): {p.cmdline}"
                            for p in survivors)
        super().__init__(f"{len(survivors)} process(es) of {what} survived SIGKILL:\n{listing}")


@dataclass(frozen=True)
class ProcessInfo:
    """What a process was when it was found: enough to name it in a report."""

    pid: int
    ppid: int
    pgid: int
    name: str
    cmdline: str

    @classmethod
    def of(cls, proc: psutil.Process) -> ProcessInfo:
        with proc.oneshot():
            pid, name, ppid = proc.pid, _safe(proc.name, "?"), _safe(proc.ppid, 0)
            cmdline = " ".join(_safe(proc.cmdline, [])) or name
        try:
            pgid = os.getpgid(pid)
        except OSError:
            pgid = 0
        return cls(pid, ppid, pgid, name, cmdline)


def _safe(call, default):
    try:
        return call()
    except psutil.Error:
        return default


def new_job_token() -> str:
    """A token unique to one run of a job, naming this process as its maker: put it into
    the environment (:data:`JOB_TOKEN_ENV`) of the job's processes that this process
    starts."""
    me = current_process()
    return f"{_TOKEN_PREFIX}-{me.pid}-{me.start_ticks}-{uuid.uuid4().hex}"


def token_maker(token: str | None) -> tuple[int, int] | None:
    """``(pid, start ticks)`` of the process that made ``token`` (:func:`new_job_token`);
    None for a token that no exactly process made."""
    parts = (token or "").split("-")
    if len(parts) != 4 or parts[0] != _TOKEN_PREFIX or not all(p.isdigit() for p in parts[1:3]):
        return None
    return int(parts[1]), int(parts[2])


def trusted_job_token() -> str | None:
    """This process's job token when exactly set it for this process's job: the process
    that made it is an ancestor of this one (the launcher or harness that started the
    driver). None without a token, and for a token set by hand or inherited from another
    job (a stray variable): nothing may be killed by it."""
    token = os.environ.get(JOB_TOKEN_ENV)
    maker = token_maker(token)
    if maker is None:
        return None
    pid, ticks = maker
    ancestors = {p for p, _ in _ancestors(os.getppid())}
    stat = _stat(pid)
    return token if pid in ancestors and stat is not None and stat[2] == ticks else None


def is_alive(proc: psutil.Process) -> bool:
    """True while ``proc`` (the same process, not a reused pid) runs; a zombie is dead."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes_with_env(name: str, value: str) -> list[psutil.Process]:
    """Living processes on this host whose environment carries ``name=value`` (never this
    process)."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(name) == value and is_alive(proc):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def job_processes(token: str) -> list[psutil.Process]:
    """Living processes on this host whose environment carries the job token ``token``
    (never this process)."""
    return processes_with_env(JOB_TOKEN_ENV, token)


def _descendants(root: psutil.Process | None) -> list[psutil.Process]:
    if root is None or not is_alive(root):
        return []
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_job(token: str | None = None, root: psutil.Process | None = None, *,
             timeout: float = 30.0, what: str = "the job") -> list[ProcessInfo]:
    """SIGKILL every process of a job and check that none is left.

    The job is ``root`` and its descendants (while ``root`` lives) and every process whose
    environment carries ``token`` (which finds workers already re-parented away from a dead
    driver). Killing and scanning repeat until a scan finds nothing alive, so a process
    forked between a scan and its kill is caught by the next round. Returns the processes
    that were alive and were killed; raises :class:`ProcessesSurvived` (naming them) when
    some are still alive after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    killed: dict[tuple[int, float], tuple[psutil.Process, ProcessInfo]] = {}
    while True:
        targets = {p.pid: p for p in _descendants(root)}
        if token:
            targets.update((p.pid, p) for p in job_processes(token))
        for proc, _ in killed.values():
            targets.setdefault(proc.pid, proc)
        alive = [p for p in targets.values() if is_alive(p)]
        if not alive:
            return [info for _, info in killed.values()]
        if time.monotonic() > deadline:
            raise ProcessesSurvived(what, [_info(p, killed) for p in alive])
        for proc in alive:
            key = (proc.pid, _safe(proc.create_time, 0.0))
            if key not in killed:
                killed[key] = (proc, _info(proc, killed))
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.kill()
        _wait_dead(alive, min(0.5, max(0.0, deadline - time.monotonic())))


def _info(proc: psutil.Process, known) -> ProcessInfo:
    for p, info in known.values():
        if p.pid == proc.pid:
            return info
    try:
        return ProcessInfo.of(proc)
    except psutil.Error:
        return ProcessInfo(proc.pid, 0, 0, "?", "?")


def _wait_dead(procs: Iterable[psutil.Process], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if is_alive(p)]
        if pending:
            time.sleep(0.01)


def local_job_pids() -> list[int]:
    """Pids of the local job this process belongs to, without this process: the driver
    (:func:`driver_processes`), every descendant of the driver JVM (worker daemons and
    workers), and every process carrying this process's job token when exactly set it
    (:func:`trusted_job_token`). A crash of the driver's host kills all of them; a
    driver-side fault does the same."""
    pids = set(driver_processes())
    jvm = jvm_ancestor() or _own_gateway_jvm()
    if jvm is not None:
        with contextlib.suppress(psutil.Error):
            pids.update(p.pid for p in psutil.Process(jvm).children(recursive=True))
    token = trusted_job_token()
    if token:
        pids.update(p.pid for p in job_processes(token))
    pids.discard(os.getpid())
    return sorted(pids)


# -- a launcher's children -------------------------------------------------------------------

#: prctl option that makes a process the reaper of its orphaned descendants (linux/prctl.h)
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the parent of its orphaned descendants (Linux's child subreaper):
    a process of its tree whose parent dies is re-parented here instead of to pid 1, so it
    stays within reach and its exit is reaped here (:func:`reap_children`). Returns False
    where the kernel refuses it (not Linux). A PID 1 is every orphan's reaper anyway."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def reap_children(*known: subprocess.Popen | None) -> int:
    """Collect the exit status of every child of this process that has ended, without
    blocking, so none stays a zombie (what a PID 1 or a child subreaper must do for the
    orphans it inherits). When one of the ``known`` children is among them its
    ``returncode`` is set, as its own ``poll()`` would. Returns how many were reaped."""
    children = {child.pid: child for child in known if child is not None}
    reaped = 0
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1
        child = children.get(pid)
        if child is not None and child.returncode is None:
            child.returncode = os.waitstatus_to_exitcode(status)
