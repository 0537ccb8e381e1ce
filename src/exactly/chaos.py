"""Crash-and-restart harness: run a job, kill it at protocol points, restart until drained.

Each attempt runs the job in a fresh process (its own session) with one fault armed
through ``EXACTLY_FAULT`` and a once-only marker file. An attempt that dies by the armed
fault is restarted with the next fault; an attempt that exits cleanly has drained the
input. Any other failure stops the harness: it is a bug, not an injected crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exactly.errors import ExactlyError
from exactly.faults import FAULT_ENV, MARKER_ENV, FaultPoint, FaultSpec


@dataclass
class Attempt:
    number: int
    armed: FaultSpec | None
    returncode: int
    fired: dict | None  # the marker record when the fault fired
    epochs: list[int] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return self.fired is not None


class JobFailed(ExactlyError):
    """An attempt failed without an injected fault: the job itself is broken."""


def random_schedule(crashes: int, epochs: int, rng: random.Random,
                    points: Sequence[FaultPoint] = tuple(FaultPoint)) -> list[FaultSpec]:
    """``crashes`` faults at random points, at epochs spread over ``[0, epochs)``."""
    if crashes <= 0:
        return []
    span = max(epochs, 1)
    at = sorted(rng.sample(range(span), crashes) if crashes <= span
                else [rng.randrange(span) for _ in range(crashes)])
    return [FaultSpec(rng.choice(list(points)), epoch) for epoch in at]


def run_with_crashes(command: Sequence[str], schedule: Sequence[FaultSpec], *,
                     env: dict[str, str] | None = None,
                     on_line: Callable[[Attempt, dict], None] | None = None,
                     on_start: Callable[[Attempt], None] | None = None,
                     on_end: Callable[[Attempt], None] | None = None,
                     timeout: float = 600) -> list[Attempt]:
    """Run ``command`` with the faults of ``schedule`` armed one per attempt, restarting
    after every injected crash, until an attempt exits cleanly (input drained). A fault
    that is not reached before the input drains does not fire (see :func:`unfired`).

    Returns the attempts. Raises :class:`JobFailed` when an attempt fails on its own.
    """
    marker_dir = Path(tempfile.mkdtemp(prefix="exactly-faults-"))
    try:
        return _attempts(command, schedule, marker_dir, env, on_line, on_start, on_end, timeout)
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)


def unfired(schedule: Sequence[FaultSpec], attempts: Sequence[Attempt]) -> list[FaultSpec]:
    """Faults of ``schedule`` that never fired (the input drained before they were reached)."""
    fired = sum(a.crashed for a in attempts)
    return list(schedule[fired:])


def _attempts(command, schedule, marker_dir, env, on_line, on_start, on_end,
              timeout) -> list[Attempt]:
    attempts: list[Attempt] = []
    pending = list(schedule)
    while True:
        armed = pending.pop(0) if pending else None
        attempt = Attempt(len(attempts) + 1, armed, 0, None)
        child_env = {**os.environ, **(env or {})}
        child_env.pop(FAULT_ENV, None)
        child_env.pop(MARKER_ENV, None)
        marker = marker_dir / f"attempt-{attempt.number}.json"
        if armed is not None:
            child_env[FAULT_ENV] = armed.render()
            child_env[MARKER_ENV] = str(marker)
        if on_start is not None:
            on_start(attempt)
        proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=child_env, start_new_session=True)
        stderr_tail = _drain(proc, attempt, on_line, timeout)
        attempt.returncode = proc.returncode
        if marker.exists():
            attempt.fired = json.loads(marker.read_text())
        attempts.append(attempt)
        if on_end is not None:
            on_end(attempt)
        if attempt.crashed:
            continue
        if proc.returncode != 0:
            raise JobFailed(f"attempt {attempt.number} failed without an injected fault "
                            f"(exit {proc.returncode}):\n{stderr_tail}")
        return attempts  # a clean exit: the input is drained


def _drain(proc: subprocess.Popen, attempt: Attempt,
           on_line: Callable[[Attempt, dict], None] | None, timeout: float) -> str:
    tail: list[str] = []
    watchdog = threading.Timer(timeout, lambda: _kill_group(proc))
    watchdog.start()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line)
            del tail[:-60]

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "epoch":
            attempt.epochs.append(int(event["epoch"]))
        if on_line is not None:
            on_line(attempt, event)
    proc.wait()
    watchdog.cancel()
    reader.join(timeout=5)
    return "".join(tail)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def report_progress(query, out=sys.stdout, poll_seconds: float = 0.5) -> None:
    """The job's side of the harness: one JSON line per finished epoch, then "drained".

    ``query`` is a running ``StreamingQuery``; returns when it terminates (raising its error).
    """
    seen: set[int] = set()
    while True:
        finished = query.awaitTermination(poll_seconds)
        for progress in query.recentProgress:
            batch = progress["batchId"]
            if batch not in seen and progress.get("numInputRows") is not None:
                seen.add(batch)
                print(json.dumps({"event": "epoch", "epoch": batch,
                                  "rows": progress["numInputRows"], "at": time.time(),
                                  "durations": progress.get("durationMs", {})}),
                      file=out, flush=True)
        if finished:
            break
    print(json.dumps({"event": "drained", "epochs": len(seen)}), file=out, flush=True)


def python_command(*args: str) -> list[str]:
    """The ``exactly`` command line run by this interpreter."""
    return [sys.executable, "-m", "exactly.cli", *args]
