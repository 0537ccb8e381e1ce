"""The life cycle shared by the throw-away servers of tests (the Kafka broker, the S3
server): one process in a session of its own, a work directory, and stop / kill / close."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a server's log, for an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} is missing)"
    return "\n".join(text.splitlines()[-lines:]) or f"({path} is empty)"


class ServerProcess:
    """Stop, kill and close for a server whose process (``proc``) leads its own process
    group and whose data lives in ``workdir`` (removed by :meth:`close` when ``_own_dir``)."""

    proc: subprocess.Popen | None
    workdir: Path
    _own_dir: bool

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server cleanly (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL the server's process group (a crash); ``start`` brings it back on the
        same port and data."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def close(self) -> None:
        """Stop the server and remove its directory if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
