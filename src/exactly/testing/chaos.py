"""Crash-and-restart harness: run a job, kill it at protocol points, restart until drained.

Each attempt runs the job in a fresh process (its own session) with one fault armed by the
flags ``--fault POINT@EPOCH --fault-marker FILE`` appended to its command line (every exactly
job command takes them: ``exactly run``, ``exactly pipeline``, the demo jobs), the marker a
once-only file. An attempt that dies by the armed fault is restarted with the next fault; an
attempt that exits cleanly has drained the input. Any other failure stops the harness: it
is a bug, not an injected crash.

Besides faults at protocol points, an attempt can be killed from outside after a delay
(``kill_after``, :class:`RandomKill`): random-time chaos, the whole process tree SIGKILLed
wherever it is.

Every attempt carries a fresh job token in its environment
(:data:`exactly.procs.JOB_TOKEN_ENV`, made by this process: :func:`exactly.procs.new_job_token`).
After every attempt -- a crash, a clean exit, a failure, a watchdog timeout, an external
kill, an exception in a hook -- the harness SIGKILLs whatever is left of the job's process
tree (the PySpark worker daemons live in process groups of their own and outlive their
driver) and checks that nothing carrying the token is alive; if something is, it raises
:class:`exactly.procs.ProcessesSurvived` naming the pids and command lines.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from exactly.errors import ExactlyError
from exactly.procs import JOB_TOKEN_ENV, ProcessInfo, kill_job, new_job_token
from exactly.protocol.faults import FaultPoint, FaultSpec

#: ``Attempt.fired["point"]`` of an attempt killed from outside (``kill_after``)
EXTERNAL_KILL = "external_kill"


@dataclass(frozen=True)
class RandomKill:
    """Kill an attempt's whole process tree from outside, ``delay`` seconds after it started
    or, with ``after_epochs > 0``, ``delay`` seconds after it reported that many epochs."""

    delay: float
    after_epochs: int = 0

    def render(self) -> str:
        since = f"epoch report {self.after_epochs}" if self.after_epochs else "start"
        return f"{self.delay:.2f}s after {since}"


@dataclass
class Attempt:
    number: int
    armed: FaultSpec | None
    returncode: int
    fired: dict | None  # the marker record when the fault fired (or the external kill)
    epochs: list[int] = field(default_factory=list)
    token: str = ""  # the job token of this attempt's processes
    kill: RandomKill | None = None  # the external kill armed for this attempt
    timed_out: bool = False  # the watchdog killed it
    #: processes of the job still alive when the attempt ended (driver exited or killed),
    #: killed by the harness -- with the driver when the harness killed it
    killed: list[ProcessInfo] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return self.fired is not None

    @property
    def killed_externally(self) -> bool:
        return self.fired is not None and self.fired.get("point") == EXTERNAL_KILL

    @property
    def kill_after(self) -> float | None:
        """The armed external kill's delay in seconds, if any."""
        return self.kill.delay if self.kill is not None else None


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
                     timeout: float = 600,
                     kill_after: Sequence[float | RandomKill] = (),
                     end_after_fault: float | None = None) -> list[Attempt]:
    """Run ``command`` with the faults of ``schedule`` armed one per attempt, restarting
    after every injected crash, until an attempt exits cleanly (input drained). A fault
    that is not reached before the input drains does not fire (see :func:`unfired`).

    ``command`` must take the fault flags: an attempt with a fault runs ``command`` followed
    by ``--fault POINT@EPOCH --fault-marker FILE`` (and ``--fault-action`` for a fault whose
    action is not ``kill``; :meth:`~exactly.protocol.faults.FaultSpec.flags`).

    ``kill_after``: one per attempt in order, a delay in seconds or a :class:`RandomKill`;
    an attempt still running that long after its start (or after its N-th epoch report)
    has its whole process tree SIGKILLed from outside (recorded as
    ``fired={"point": "external_kill", ...}``) and is restarted. An armed fault that had
    not fired by then is armed again in the next attempt.

    ``end_after_fault``: seconds; an attempt whose fault fired (its marker file exists) and
    that has not ended that long after is ended by the harness (its process tree killed, as
    after any attempt), instead of waiting for it to die or fail. For jobs whose process
    outlives the crash: a Spark Connect client whose server the fault killed retries the
    server for :data:`exactly.spark.connect.RETRY_SECONDS` before it fails. Default: the
    attempt ends when its process does.

    Returns the attempts. Raises :class:`JobFailed` when an attempt fails on its own or
    runs longer than ``timeout`` seconds, and :class:`exactly.procs.ProcessesSurvived` when
    a process of an attempt outlives the kill that follows it.
    """
    marker_dir = Path(tempfile.mkdtemp(prefix="exactly-faults-"))
    try:
        return _attempts(command, schedule, marker_dir, env, on_line, on_start, on_end, timeout,
                         [k if isinstance(k, RandomKill) else RandomKill(float(k))
                          for k in kill_after], end_after_fault)
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)


def unfired(schedule: Sequence[FaultSpec], attempts: Sequence[Attempt]) -> list[FaultSpec]:
    """Faults of ``schedule`` that never fired (the input drained before they were reached)."""
    fired = sum(a.crashed and not a.killed_externally for a in attempts)
    return list(schedule[fired:])


def _attempts(command, schedule, marker_dir, env, on_line, on_start, on_end,
              timeout, kills: list[RandomKill], end_after_fault: float | None) -> list[Attempt]:
    attempts: list[Attempt] = []
    pending = list(schedule)
    while True:
        armed = pending.pop(0) if pending else None
        attempt = Attempt(len(attempts) + 1, armed, 0, None, token=new_job_token(),
                          kill=kills.pop(0) if kills else None)
        child_env = {**os.environ, **(env or {}), JOB_TOKEN_ENV: attempt.token}
        marker = marker_dir / f"attempt-{attempt.number}.json"
        argv = list(command)
        if armed is not None:
            argv += armed.with_marker(marker).flags()
        if on_start is not None:
            on_start(attempt)
        stderr_tail = _run_attempt(argv, child_env, attempt, on_line, timeout,
                                   (marker, end_after_fault) if armed is not None
                                   and end_after_fault is not None else None)
        if marker.exists():
            attempt.fired = json.loads(marker.read_text())
        elif attempt.killed_externally and armed is not None:
            pending.insert(0, armed)  # not reached before the kill: arm it again
        attempts.append(attempt)
        if on_end is not None:
            on_end(attempt)
        if attempt.crashed:
            continue
        if attempt.timed_out:
            raise JobFailed(f"attempt {attempt.number} ran longer than {timeout:g} s and was "
                            f"killed:\n{stderr_tail}")
        if attempt.returncode != 0:
            raise JobFailed(f"attempt {attempt.number} failed without an injected fault "
                            f"(exit {attempt.returncode}):\n{stderr_tail}")
        return attempts  # a clean exit: the input is drained


def _run_attempt(command, child_env, attempt: Attempt,
                 on_line: Callable[[Attempt, dict], None] | None, timeout: float,
                 end_after_fault: tuple[Path, float] | None = None) -> str:
    """Run one attempt to its end, then kill whatever is left of its process tree.

    The attempt ends when the driver process exits, is killed from outside
    (``attempt.kill``), by the watchdog (``timeout``) or, with ``end_after_fault``
    (marker, seconds), that long after its fault fired; stdout is read in a thread so
    that a leftover process holding the pipe open cannot hold the harness up.
    """
    tail: list[str] = []
    errors: list[BaseException] = []
    reported = threading.Event()  # the epoch report an armed kill waits for has come
    started = time.monotonic()
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env, start_new_session=True)
    try:
        root: psutil.Process | None = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:  # already gone; the token still finds the rest
        root = None

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line)
            del tail[:-60]

    def read_stdout() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("event") == "epoch":
                    attempt.epochs.append(int(event["epoch"]))
                    if attempt.kill and len(attempt.epochs) >= attempt.kill.after_epochs:
                        reported.set()
                if on_line is not None:
                    on_line(attempt, event)
        except BaseException as exc:  # a hook failed: end the attempt, re-raise below
            errors.append(exc)
            _kill(attempt, root)

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=read_stderr, daemon=True)]
    for reader in readers:
        reader.start()
    def left() -> float:
        return max(0.0, timeout - (time.monotonic() - started))

    if attempt.kill is None or attempt.kill.after_epochs <= 0:
        reported.set()
    try:
        while attempt.kill is not None and not reported.is_set() and proc.poll() is None \
                and left() > 0:
            reported.wait(0.1)
        if attempt.kill is not None and reported.is_set():
            try:
                proc.wait(timeout=min(attempt.kill.delay, left()))
            except subprocess.TimeoutExpired:
                if left() > 0:
                    attempt.fired = {"point": EXTERNAL_KILL, "after": attempt.kill.render(),
                                     "epoch": max(attempt.epochs, default=None),
                                     "at": time.time()}
                    attempt.killed = _kill(attempt, root)
        ended_by_fault = (end_after_fault is not None
                          and _ended_after_fault(proc, *end_after_fault, left))
        try:
            if not ended_by_fault:  # else the kill below ends it
                proc.wait(timeout=left())
        except subprocess.TimeoutExpired:
            attempt.timed_out = True
            attempt.killed = _kill(attempt, root)
    finally:
        # whatever ended the attempt (or an exception here): nothing of it may live on
        attempt.killed += _kill(attempt, root)
        proc.wait()
        attempt.returncode = proc.returncode
        if proc.returncode == 0:  # it had drained just before the kill or the watchdog
            attempt.timed_out = False
            if attempt.killed_externally:
                attempt.fired = None
        for reader in readers:
            reader.join(timeout=10)
    if errors:
        raise errors[0]
    return "".join(tail)


def _ended_after_fault(proc: subprocess.Popen, marker: Path, grace: float,
                       left: Callable[[], float]) -> bool:
    """Wait until ``proc`` exits or the watchdog's time is up (False), or until ``grace``
    seconds after ``marker`` appeared -- the attempt's fault fired -- with ``proc`` still
    running (True)."""
    fired_at: float | None = None
    while proc.poll() is None and left() > 0:
        if fired_at is None and marker.exists():
            fired_at = time.monotonic()
        if fired_at is not None and time.monotonic() - fired_at >= grace:
            return True
        time.sleep(0.1)
    return False


def _kill(attempt: Attempt, root: psutil.Process | None) -> list[ProcessInfo]:
    return kill_job(attempt.token, root, what=f"attempt {attempt.number}")


def report_progress(query, out=sys.stdout, poll_seconds: float = 0.5) -> None:
    """The job's side of the harness: one JSON line per finished epoch, then "drained".

    The lines are ``{"event": "epoch", "epoch", "rows", "at", "durations"}`` and, once,
    ``{"event": "drained", "epochs"}``; :func:`run_with_crashes` reads them (``on_line``).
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


def continuous_files_job(out: str | Path, checkpoint: str | Path,
                         options: dict[str, str] | None = None) -> list[str]:
    """A command line that runs a never-ending query until killed: 200 generated rows/s in
    2 partitions into the file sink at ``out``, a 500 ms trigger, checkpoint ``checkpoint``,
    sink ``options`` added. Prints ``started`` once the query runs."""
    code = (
        "from exactly.spark.session import spark_session\n"
        "from exactly.config import CheckpointConfig\n"
        "from exactly.ops.query import start_query\n"
        "spark = spark_session()\n"
        "df = (spark.readStream.format('exactly.datagen').option('rowsPerSecond', 200)\n"
        "      .option('numPartitions', 2).load())\n"
        f"q = start_query(df, sink_format='exactly.files', path={str(out)!r},\n"
        f"                options={dict(options or {})!r},\n"
        f"                checkpoint=CheckpointConfig(interval='500ms', "
        f"storage={str(checkpoint)!r}))\n"
        "print('started', flush=True)\n"
        "q.await_termination()\n"
    )
    return [sys.executable, "-c", code]
