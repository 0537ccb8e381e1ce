"""Fault injection at the named points of the commit protocol (DESIGN section 3).

A fault is armed with the sink option ``exactly.fault`` or the environment variable
``EXACTLY_FAULT`` (the option wins), written ``POINT`` or ``POINT@EPOCH``: the process kills
itself with SIGKILL the first time it reaches ``POINT`` in an epoch ``>= EPOCH``. With the
option ``exactly.faultMarker`` / variable ``EXACTLY_FAULT_MARKER`` set to a file path, the
fault fires at most once across restarts: the marker is created atomically just before the
kill and records where it fired.

Driver points kill the driver's whole local process tree, as a crash of its host would: the
Spark driver JVM, the Python driver process that launched it, the PySpark worker daemons and
Python workers under the JVM, and every process carrying the job's ``EXACTLY_JOB_TOKEN``
(:func:`exactly.procs.local_job_pids`). ``in_write`` kills the executor's Python worker inside
``write()``, after its first batch of rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from exactly.errors import ConfigError
from exactly.procs import local_job_pids


class FaultPoint(str, Enum):
    """Protocol points where a crash can be injected."""

    IN_WRITE = "in_write"  # executor, inside step 1
    BEFORE_INTENT = "before_intent"  # driver, before 2b
    AFTER_INTENT = "after_intent"  # driver, after 2b, no handle committed yet
    BETWEEN_COMMITS = "between_commits"  # driver, after the first handle commit (2c)
    AFTER_COMMITS = "after_commits"  # driver, every handle committed, not yet complete
    AFTER_COMPLETE = "after_complete"  # driver, after 2d, before Spark's commit log

    @property
    def on_driver(self) -> bool:
        return self is not FaultPoint.IN_WRITE


DRIVER_POINTS = tuple(p for p in FaultPoint if p.on_driver)
FAULT_OPTION = "exactly.fault"
MARKER_OPTION = "exactly.faultMarker"
FAULT_ENV = "EXACTLY_FAULT"
MARKER_ENV = "EXACTLY_FAULT_MARKER"


@dataclass(frozen=True)
class FaultSpec:
    """One armed fault: a point, the first epoch it may fire in, an optional once-marker."""

    point: FaultPoint
    min_epoch: int = 0
    marker: str | None = None

    @classmethod
    def parse(cls, text: str, marker: str | None = None) -> FaultSpec:
        point_text, _, epoch_text = text.strip().partition("@")
        try:
            point = FaultPoint(point_text.strip().lower())
        except ValueError:
            names = ", ".join(p.value for p in FaultPoint)
            raise ConfigError(
                f"fault point {point_text!r} is unknown; use one of {names}, optionally "
                "followed by @EPOCH"
            ) from None
        try:
            min_epoch = int(epoch_text) if epoch_text else 0
        except ValueError:
            raise ConfigError(f"fault {text!r}: the part after @ must be an epoch number") from None
        return cls(point, min_epoch, marker or None)

    def render(self) -> str:
        return f"{self.point.value}@{self.min_epoch}"


def fault_from(options: Mapping[str, str] | None = None) -> FaultSpec | None:
    """The fault armed by sink options, else by the environment, else ``None``."""
    options = options or {}
    text = options.get(FAULT_OPTION) or os.environ.get(FAULT_ENV)
    if not text:
        return None
    marker = options.get(MARKER_OPTION) or os.environ.get(MARKER_ENV)
    return FaultSpec.parse(text, marker)


def maybe_crash(spec: FaultSpec | None, point: FaultPoint, epoch: int) -> None:
    """Kill this process (and for driver points the driver's whole local process tree)
    if ``spec`` says so."""
    if spec is None or spec.point is not point or epoch < spec.min_epoch:
        return
    if spec.marker and not _claim_marker(spec.marker, point, epoch):
        return
    if point.on_driver:
        for pid in local_job_pids():
            _kill(pid)
    _kill(os.getpid())
    time.sleep(60)  # SIGKILL is asynchronous; never run on past the point


def _claim_marker(path: str, point: FaultPoint, epoch: int) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    record = {"point": point.value, "epoch": epoch, "pid": os.getpid(),
              "host": socket.gethostname(), "at": time.time()}
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
