"""``exactly ui`` as a subprocess for tests: started on a free port, stopped afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from exactly.testing.ports import free_port


def get_json(url: str, timeout: float = 10) -> tuple[int, Any]:
    """``(status, body)`` of a GET returning JSON (error statuses too)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def get_text(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


@contextmanager
def ui_server(*checkpoints: str | Path, timeout: float = 60) -> Iterator[str]:
    """Run ``exactly ui CHECKPOINT...`` on a free port of 127.0.0.1; yields its base URL
    once ``/jobs`` answers. Raises AssertionError with the server's output when it exits."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exactly.cli", "ui",
                             *map(str, checkpoints), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                output = proc.stdout.read() if proc.stdout else ""
                raise AssertionError(f"exactly ui exited with {proc.returncode}: {output}")
            try:
                if get_json(f"{base}/jobs", timeout=2)[0] == 200:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError("exactly ui did not answer /jobs in time")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
