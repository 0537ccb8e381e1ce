"""A Spark standalone cluster on this machine, for tests: one master and N workers on
127.0.0.1, started from the pip-installed PySpark (``sbin/spark-daemon.sh``).

Every process of the cluster -- the master and worker JVMs, the executor JVMs the workers
launch for an application, and the executors' Python workers -- carries
``EXACTLY_SPARK_CLUSTER=<ident>`` in its environment (a worker passes its environment to the
executors it launches, an executor to its Python workers). :meth:`StandaloneCluster.stop`
stops the daemons, then SIGKILLs whatever still carries the cluster's ident and checks that
nothing of it is left. Drivers are not part of the cluster: a job submitted to it (``master=
cluster.url``) runs its driver wherever it was started.

Use it as a context manager (or call :meth:`~StandaloneCluster.start` and
:meth:`~StandaloneCluster.stop` in a ``try``/``finally``) so that a failing test never
leaves a JVM behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil
import pyspark

from exactly.procs import ProcessesSurvived, ProcessInfo, is_alive, processes_with_env
from exactly.spark.session import MASTER_ENV
from exactly.testing.ports import free_port

SPARK_HOME = Path(pyspark.__file__).parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: environment variable every process of a cluster carries, with the cluster's ident
CLUSTER_ENV = "EXACTLY_SPARK_CLUSTER"

_TASK = re.compile(r"(Running|Finished) task \S+ in stage \S+ \(TID (\d+)\)")
_ATTEMPT = re.compile(r"Running task \d+\.(\d+) in stage \d+\.(\d+) ")
_FINISHED = re.compile(r"Finished task \S+ in stage")


class ClusterError(RuntimeError):
    """The cluster did not come up (the message names its logs)."""


@dataclass(frozen=True)
class Executor:
    """An executor JVM of the cluster: its pid, application and work directory (which holds
    the executor's ``stdout`` and ``stderr``)."""

    pid: int
    app_id: str
    executor_id: str
    workdir: Path

    def log(self) -> str:
        """The executor's stderr (Spark logs there at INFO level); empty if unreadable."""
        try:
            return (self.workdir / "stderr").read_text(errors="replace")
        except OSError:
            return ""

    def running_tasks(self) -> set[int]:
        """Task ids (TID) the executor's log shows started and not finished."""
        running: set[int] = set()
        for verb, tid in _TASK.findall(self.log()):
            if verb == "Running":
                running.add(int(tid))
            else:
                running.discard(int(tid))
        return running


class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` cores and ``memory`` each) with their own
    log, pid and work directories under ``root``.

    ``java_options`` go to every JVM of the cluster (``JAVA_TOOL_OPTIONS``: the master, the
    workers and the executors they launch), e.g. ``-XX:TieredStopAtLevel=1`` for JVMs that
    live seconds. ``client_conf`` is written to a ``spark-defaults.conf`` that drivers started
    with :meth:`client_env` read (settings their jobs do not set themselves).
    """

    def __init__(self, root: Path, workers: int = 2, *, cores: int = 1, memory: str = "1g",
                 java_options: str = "", client_conf: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.webui_port = free_port()
        self.ident = f"exactly-{uuid.uuid4().hex[:8]}"
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.client_conf = dict(client_conf or {})
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME),
                    "SPARK_LOG_DIR": str(self.root / "logs"),
                    "SPARK_PID_DIR": str(self.root / "pids"),
                    "SPARK_IDENT_STRING": self.ident, "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_WORKER_DIR": str(self.work_dir), "PYSPARK_PYTHON": sys.executable,
                    CLUSTER_ENV: self.ident}
        self.env.pop("SPARK_CONF_DIR", None)
        if java_options:
            self.env["JAVA_TOOL_OPTIONS"] = java_options
        self._started: list[psutil.Process] = []

    # -- addresses ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The master URL to give a driver (``spark://127.0.0.1:PORT``)."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def work_dir(self) -> Path:
        """The workers' directory: one ``app-*/<executor id>`` directory per executor."""
        return self.root / "work"

    @property
    def conf_dir(self) -> Path:
        """``SPARK_CONF_DIR`` of :meth:`client_env` (holds ``spark-defaults.conf``)."""
        return self.root / "client-conf"

    def client_env(self) -> dict[str, str]:
        """Environment for a driver that should run on this cluster: ``EXACTLY_SPARK_MASTER``
        (read by :func:`exactly.spark.session.spark_session` when no master is given) and,
        with ``client_conf``, ``SPARK_CONF_DIR``."""
        env = {MASTER_ENV: self.url}
        if self.client_conf:
            env["SPARK_CONF_DIR"] = str(self.conf_dir)
        return env

    # -- life cycle ---------------------------------------------------------------------

    def start(self, timeout: float = 300) -> None:
        """Start the master, then the workers; return once every worker has registered.

        On any failure everything started so far is stopped before the error is raised."""
        try:
            self._write_client_conf()
            self._daemon("start", MASTER_CLASS, 1, "--host", "127.0.0.1", "--port",
                         str(self.port), "--webui-port", str(self.webui_port))
            for i in range(1, self.workers + 1):
                self._daemon("start", WORKER_CLASS, i, "--host", "127.0.0.1", "--cores",
                             str(self.cores), "--memory", self.memory, "--webui-port",
                             str(free_port()), self.url)
            self._wait_for_workers(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 60) -> list[ProcessInfo]:
        """Stop the workers and the master (SIGTERM through ``spark-daemon.sh``; a worker
        kills its executors), then SIGKILL every process still carrying this cluster's
        ident. Returns the processes that had to be killed; raises
        :class:`exactly.procs.ProcessesSurvived` if any is alive after ``timeout`` seconds.
        Safe to call twice, and after a failed :meth:`start`."""
        for i in range(self.workers, 0, -1):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._daemon("stop", WORKER_CLASS, i)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self._daemon("stop", MASTER_CLASS, 1)
        deadline = time.monotonic() + timeout
        _wait_dead(self._started + self.processes(), 15.0)
        killed: dict[int, ProcessInfo] = {}
        while True:
            alive = [p for p in {p.pid: p for p in self._started + self.processes()}.values()
                     if is_alive(p)]
            if not alive:
                self._started = []
                return list(killed.values())
            if time.monotonic() > deadline:
                raise ProcessesSurvived(f"the Spark cluster {self.ident}",
                                        [_info(p) for p in alive])
            for proc in alive:
                killed.setdefault(proc.pid, _info(proc))
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            _wait_dead(alive, 1.0)

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- what runs ----------------------------------------------------------------------

    def processes(self) -> list[psutil.Process]:
        """Living processes carrying this cluster's ident: master, workers, executors and
        the executors' Python workers (never this process)."""
        return processes_with_env(CLUSTER_ENV, self.ident)

    def application_processes(self) -> list[psutil.Process]:
        """Living processes of applications on the cluster: executor JVMs and their Python
        workers (every process of :meth:`processes` but the master and the workers)."""
        daemons = {p.pid for p in self._started}
        return [p for p in self.processes() if p.pid not in daemons]

    def executors(self) -> list[Executor]:
        """Executor JVMs running on this cluster's workers, oldest application first."""
        found = []
        for proc in self.processes():
            try:
                cmdline = proc.cmdline()
                cwd = Path(proc.cwd())
            except psutil.Error:
                continue
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in cmdline:
                continue
            app = _argument(cmdline, "--app-id")
            executor = _argument(cmdline, "--executor-id")
            if app and executor:
                found.append(Executor(proc.pid, app, executor, cwd))
        return sorted(found, key=lambda e: (e.app_id, int(e.executor_id)))

    def executor_pids(self) -> list[int]:
        """Pids of the executor JVMs launched by this cluster's workers."""
        return [e.pid for e in self.executors()]

    def applications(self) -> list[str]:
        """Ids of the applications that had executors on this cluster, oldest first."""
        if not self.work_dir.exists():
            return []
        return sorted(d.name for d in self.work_dir.iterdir() if d.name.startswith("app-"))

    def finished_tasks(self, app_id: str) -> int:
        """Tasks the executors of application ``app_id`` finished (from their logs)."""
        return sum(len(_FINISHED.findall(log)) for log in self._logs(app_id))

    def reattempts(self, app_id: str) -> int:
        """Task runs of application ``app_id`` that repeated work: a task attempt after the
        first (``task 3.1``) or a task of a resubmitted stage (``stage 7.1``)."""
        return sum(1 for log in self._logs(app_id) for task, stage in _ATTEMPT.findall(log)
                   if int(task) or int(stage))

    def _logs(self, app_id: str) -> list[str]:
        logs = []
        for path in sorted((self.work_dir / app_id).glob("*/stderr")):
            with contextlib.suppress(OSError):
                logs.append(path.read_text(errors="replace"))
        return logs

    def alive_workers(self) -> int:
        """Workers the master reports ALIVE (0 while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/",
                                        timeout=5) as response:
                state = json.load(response)
        except (OSError, ValueError):
            return 0
        return sum(w.get("state") == "ALIVE" for w in state.get("workers", []))

    # -- helpers ------------------------------------------------------------------------

    def _daemon(self, action: str, cls: str, instance: int, *args: str) -> None:
        subprocess.run(["bash", str(SPARK_HOME / "sbin" / "spark-daemon.sh"), action, cls,
                        str(instance), *args], env=self.env, check=True, capture_output=True,
                       timeout=120)
        if action == "start":
            pid_file = self.root / "pids" / f"spark-{self.ident}-{cls}-{instance}.pid"
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                self._started.append(psutil.Process(int(pid_file.read_text().strip())))

    def _wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            dead = [p for p in self._started if not is_alive(p)]
            if dead or time.monotonic() > deadline:
                why = "a daemon exited" if dead else f"not within {timeout:g} s"
                raise ClusterError(f"the Spark cluster {self.ident} did not come up ({why}): "
                                   f"see the logs in {self.root / 'logs'}")
            time.sleep(0.2)

    def _write_client_conf(self) -> None:
        if not self.client_conf:
            return
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "spark-defaults.conf").write_text(
            "".join(f"{key} {value}\n" for key, value in self.client_conf.items()))


def _argument(cmdline: list[str], flag: str) -> str | None:
    try:
        return cmdline[cmdline.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def _wait_dead(procs: list[psutil.Process], timeout: float) -> None:
    """Wait until none of ``procs`` is alive (a zombie is dead), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while any(is_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def _info(proc: psutil.Process) -> ProcessInfo:
    try:
        return ProcessInfo.of(proc)
    except psutil.Error:
        return ProcessInfo(proc.pid, 0, 0, "?", "?")
