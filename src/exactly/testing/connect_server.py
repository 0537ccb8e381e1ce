"""A Spark Connect server on this machine, for tests: started from the pip-installed PySpark
(its jars include the server, ``org.apache.spark.sql.connect.service.SparkConnectServer``)
with ``spark-submit``, listening on 127.0.0.1 only.

The server is the Spark driver of every Connect session: its Python workers -- the
``foreachBatch`` runner where exactly's sinks commit, the executors' workers where they write
-- run ``sys.executable`` with the caller's ``PYTHONPATH``, so they import the same exactly.
Every process of the server carries ``EXACTLY_CONNECT_SERVER=<ident>`` in its environment;
:meth:`ConnectServer.stop` and :meth:`~ConnectServer.kill` end all of them and check that
nothing is left. :meth:`~ConnectServer.kill` is what a platform's node loss does (SIGKILL of the
server and its workers); :meth:`~ConnectServer.start` again is the platform restarting it, on
the same port, so a client (``exactly run --remote``) reconnects to the same URL.

Use it as a context manager so that a failing test never leaves a JVM behind.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import psutil
import pyspark

from exactly.procs import ProcessesSurvived, ProcessInfo, processes_with_env
from exactly.spark import worker_daemon
from exactly.spark.pyspark_path import SITE_DIR
from exactly.spark.session import PYTHON_WORKER_SOCKETS
from exactly.testing.ports import free_port

SPARK_HOME = Path(pyspark.__file__).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: environment variable every process of a server carries, with the server's ident
SERVER_ENV = "EXACTLY_CONNECT_SERVER"


class ConnectServerError(RuntimeError):
    """The server did not come up (the message names its log)."""


class ConnectServer:
    """A Spark Connect server (``master``, default ``local[2]``) on 127.0.0.1 with its log under
    ``root``. ``conf`` are extra ``--conf`` settings of the server (its static settings:
    what a platform fixes when it starts the server)."""

    def __init__(self, root: Path, *, master: str = "local[2]",
                 conf: Mapping[str, str] | None = None, java_options: str = "",
                 start_timeout: float = 120.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.ident = f"exactly-connect-{uuid.uuid4().hex[:8]}"
        self.master = master
        self.conf = dict(conf or {})
        self.start_timeout = start_timeout
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        # the sitecustomize of SITE_DIR: the server's Python processes import the installed
        # PySpark (cached bytecode) instead of Spark's zip. The server gives its foreachBatch
        # runner 10 s to connect back; importing PySpark's Connect client from the zip costs
        # that process ~2 s of CPU instead of ~1.2 s, which a loaded 2-core machine stretched
        # past the 10 s
        path = os.pathsep.join([SITE_DIR, *(p for p in sys.path if p and Path(p).is_dir())])
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "PYTHONPATH": path, SERVER_ENV: self.ident}
        for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_CONF_DIR",
                    "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
            self.env.pop(key, None)
        if java_options:
            self.env["JAVA_TOOL_OPTIONS"] = java_options

    @property
    def url(self) -> str:
        """What a client gives ``SparkSession.builder.remote`` (or ``SPARK_REMOTE``)."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "connect-server.log"

    def command(self) -> list[str]:
        settings = {"spark.connect.grpc.binding.address": "127.0.0.1",
                    "spark.connect.grpc.binding.port": str(self.port),
                    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    "spark.ui.enabled": "false", "spark.python.worker.reuse": "true",
                    **PYTHON_WORKER_SOCKETS, "spark.python.daemon.module": worker_daemon.MODULE,
                    "spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false",
                    **self.conf}
        argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS,
                "--name", "exactly-test-connect", "--master", self.master]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        return [*argv, "spark-internal"]

    def start(self) -> ConnectServer:
        """Start the server (again, on the same port) and wait until it accepts clients."""
        if self.running():
            return self
        self.starts += 1
        with open(self.log, "ab") as log:
            log.write(f"\n--- start {self.starts} ---\n".encode())
            self.proc = subprocess.Popen(self.command(), env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConnectServerError(f"the Spark Connect server exited with "
                                         f"{self.proc.returncode}; see {self.log}")
            if _listening(self.port) and "Spark Connect server started" in self._last_start():
                return self
            time.sleep(0.2)
        self.kill()
        raise ConnectServerError(f"the Spark Connect server did not listen on 127.0.0.1:"
                                 f"{self.port} within {self.start_timeout:g} s; see {self.log}")

    def _last_start(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return text.rsplit(f"--- start {self.starts} ---", 1)[-1]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def processes(self) -> list[psutil.Process]:
        """Every live process of this server: the JVM and its Python workers."""
        return processes_with_env(SERVER_ENV, self.ident)

    def kill(self) -> list[ProcessInfo]:
        """SIGKILL the server and every process it started (a lost node); returns them.
        Raises ProcessesSurvived when one outlives the kill."""
        killed = [ProcessInfo.of(p) for p in self.processes()]
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self._check_gone()
        return killed

    def stop(self) -> None:
        """End the server: SIGTERM (it stops its sessions' queries), then SIGKILL of anything
        left after 20 s; checks that nothing of it survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        self.kill()

    def _check_gone(self) -> None:
        deadline = time.monotonic() + 10
        left = self.processes()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.processes()
        if left:
            raise ProcessesSurvived(f"processes of the Spark Connect server {self.ident} "
                                    "outlived SIGKILL", [ProcessInfo.of(p) for p in left])

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
