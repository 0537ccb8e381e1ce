"""``exactly run``: start a job's driver process and start it again when it dies.

The launcher is a small process without Spark. It claims the checkpoint (a second
``exactly run`` on it fails with FencedError while this one lives), starts the driver
(:mod:`exactly.ops.driver`) in a session of its own, and waits:

* exit 0: the job stopped, drained, finished or was cancelled: the launcher exits 0;
* exit :data:`~exactly.ops.driver.JOB_FAILED`: the strategy gave up inside the driver (its
  last line names the cause): the launcher exits with the same code;
* death by a signal (SIGKILL, the OOM killer), :data:`~exactly.ops.driver.DRIVER_LOST` (its
  JVM is gone; on Spark Connect, ``exactly run --remote``: the server is gone or restarted,
  and the next driver reconnects once it is back) or any other exit: a process failure.
  Whatever is left of the driver's process tree (PySpark's worker daemons leave its process
  group) is killed, the failure is recorded in the restart
  history, and the restart strategy the driver reported decides: a new driver process after
  its delay, or exit :data:`~exactly.ops.driver.JOB_FAILED` with the cause.

SIGTERM and Ctrl-C are passed on to the driver, which stops gracefully.

Every driver gets what it needs from the launcher in its :class:`~exactly.ops.driver.DriverSpec`
(the run id, a fault armed with ``--fault``, which fires once in the run unless
``--fault-marker`` names its marker) and, for its own processes, two internal environment
variables: a fresh job token (:data:`exactly.procs.JOB_TOKEN_ENV`, to find and kill its
leftovers) and the admission file (:data:`exactly.connectors.admission.ADMISSION_FILE_ENV`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace

from exactly.checkpoint.control import ControlChannel
from exactly.checkpoint.layout import DRIVER_EXIT, JOB_DIR
from exactly.checkpoint.location import checkpoint_uri, host_dir, job_store
from exactly.checkpoint.reach import check_reachable
from exactly.checkpoint.restarts import RestartHistory, new_run_id
from exactly.checkpoint.spark_files import last_committed_epoch
from exactly.checkpoint.status import JobStatus, claim_job, update_status
from exactly.checkpoint.store import LogStore
from exactly.connectors.admission import ADMISSION_FILE_ENV
from exactly.logs import log_event
from exactly.ops.driver import (
    JOB_FAILED,
    DriverSpec,
    describe_exit,
    job_admission_file,
    refuse_on_connect,
)
from exactly.ops.lost_runs import record_epoch_lost, record_lost_run
from exactly.ops.restart import RestartStrategy, restart_delay, strategy_from_json
from exactly.ops.spare import SpareDriver, SpareKeeper, spare_choice
from exactly.ops.supervisor import default_strategy
from exactly.ops.upgrade import NextDriver, Upgrader, refusal
from exactly.procs import (
    JOB_TOKEN_ENV,
    become_subreaper,
    current_process,
    kill_job,
    new_job_token,
    process_id,
    reap_children,
)
from exactly.protocol.faults import FaultSpec

logger = logging.getLogger("exactly.ops.launcher")

#: seconds between two reaps of ended children while the launcher waits
REAP_INTERVAL_S = 0.2
#: the same while an upgrade stops the old job or watches the new one (its gap)
UPGRADE_LOOK_S = 0.05
#: how much longer than ``--stop-timeout`` a new run waits for an orphaned driver to stop
ORPHAN_GRACE_S = 60.0


def launch(spec: DriverSpec, *, out=sys.stderr) -> int:
    """Run the job of ``spec`` until it ends; returns the exit code (see module doc).
    ``exactly run --ha`` is :func:`exactly.ops.ha.launch_ha`."""
    spec.restart_strategy()  # a bad strategy fails here, before anything starts
    checkpoint = checkpoint_of(spec)
    refuse_on_connect(replace(spec, checkpoint=checkpoint))  # one the job file names, too
    spare_choice(spec.spare_driver, remote=spec.remote)  # --spare-driver on with --remote
    directory = job_store(checkpoint)
    refuse_if_run_with_ha(directory)
    run_id = new_run_id()
    spec = prepared(spec, checkpoint, run_id)
    become_subreaper()  # orphans of the driver's tree are re-parented here, and reaped
    lost = claim_job(directory, JobStatus(run_id, current_process(), "starting",
                                          job=os.path.basename(spec.job_file)),
                     wait_for_orphan_s=spec.stop_timeout_s + ORPHAN_GRACE_S,
                     say=lambda text: print(f"exactly run: {text}", file=out, flush=True))
    if lost is not None:
        entry = record_lost_run(checkpoint, lost, noticed_by=run_id)
        print(f"exactly run: {entry['cause']}; recorded in the restart history",
              file=out, flush=True)
    return run_drivers(spec, out=out).code


def checkpoint_of(spec: DriverSpec) -> str:
    """The checkpoint of ``spec`` as every process names it: ``--checkpoint`` (the command
    line checked it: S3 settings, endpoint, bucket), or the one the job file names, checked
    here in one line if not usable."""
    if spec.checkpoint:
        return checkpoint_uri(spec.checkpoint)
    checkpoint = checkpoint_uri(_resolved_checkpoint(spec))
    check_reachable(checkpoint)
    return checkpoint


def prepared(spec: DriverSpec, checkpoint: str, run_id: str) -> DriverSpec:
    """``spec`` for the drivers of run ``run_id`` of this launcher: its checkpoint, run id,
    identity, and a fault that fires once in the run (not in every driver)."""
    schedule = spec.fault_schedule or ([spec.fault] if spec.fault is not None else [])
    # each fires once in this run, not in every driver
    schedule = [fault if fault.marker else fault.with_marker(
        host_dir(checkpoint) / f"fault-{run_id}{f'-{i}' if len(schedule) > 1 else ''}.json")
        for i, fault in enumerate(schedule, 1)]
    return replace(spec, checkpoint=checkpoint, run_id=run_id, fault_schedule=schedule,
                   fault=_armed(schedule), launcher=current_process().to_json())


def _armed(schedule: list[FaultSpec]) -> FaultSpec | None:
    """The fault of the next driver: the first of ``schedule`` that has not fired yet (its
    marker file is absent)."""
    return next((f for f in schedule if not (f.marker and os.path.exists(f.marker))), None)


@dataclass
class RunEnd:
    """How :func:`run_drivers` ended: its exit code; ``signalled`` when a SIGTERM or Ctrl-C
    of the launcher stopped it; ``fenced`` when its :class:`Fence` was lost (the driver was
    killed: another launcher runs the job now)."""

    code: int
    signalled: bool = False
    fenced: bool = False


class Fence:
    """What may end a run from outside: an HA leader that loses its lease calls
    :meth:`lose`, which SIGKILLs the running driver's whole tree at once (a graceful stop
    would let its epoch in flight commit) and keeps any further driver from starting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._token: str | None = None
        self.cause = ""
        self.lost = threading.Event()

    def starting(self, token: str) -> bool:
        """Called before a driver with ``token`` starts; False when the fence is lost."""
        with self._lock:
            if self.lost.is_set():
                return False
            self._token = token
            return True

    def lose(self, cause: str) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.cause = cause
            self.lost.set()
            token = self._token
        if token is not None:
            kill_job(token, what="the driver of a launcher that lost its leader lease")


def driver_env(checkpoint: str) -> dict[str, str]:
    """The environment of the drivers (and spares) of ``checkpoint``'s job, without their
    job token: the admission file is named before their JVMs start."""
    return {**os.environ, ADMISSION_FILE_ENV: str(job_admission_file(host_dir(checkpoint)))}


def run_drivers(spec: DriverSpec, *, out=sys.stderr, fence: Fence | None = None,
                spare: SpareDriver | None = None) -> RunEnd:
    """Start the driver of ``spec`` (prepared: checkpoint, run id) again after every death
    of its process, as its restart strategy says, until the job ends or ``fence`` is lost.
    ``spare``: a warm spare made for this job (an HA standby's), which runs the first
    driver."""
    checkpoint, run_id = str(spec.checkpoint), str(spec.run_id)
    directory = job_store(checkpoint)
    history = RestartHistory(directory, run_id)
    control = ControlChannel(checkpoint)
    stopping: list[int] = []
    child: subprocess.Popen | None = None

    def say(text: str) -> None:
        print(f"exactly run: {text}", file=out, flush=True)

    def forward(signum, frame) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            # the first signal stops gracefully; a second one cancels (SIGINT to the driver)
            child.send_signal(signal.SIGTERM if len(stopping) == 1 else signal.SIGINT)

    def fenced() -> RunEnd:
        say(fence.cause if fence else "")
        return RunEnd(FENCED, fenced=True)

    base_env = driver_env(checkpoint)
    spares = SpareKeeper(spec.to_json(), base_env, directory, run_id,
                         choice=spare_choice(spec.spare_driver, remote=spec.remote,
                                             master=spec.master),
                         say=say, spare=spare)
    upgrader = Upgrader(spec, base_env, retarget=spares.retarget,
                        say=say, refused=refusal(ha=fence is not None, remote=spec.remote))
    upgraded: NextDriver | None = None
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            if upgraded is not None:  # an upgrade's new driver, or its rollback's
                spec, spare, upgraded = upgraded.spec, upgraded.spare, None
            else:
                spare = spares.take()
            # the token marks this driver's processes, for the kill after it
            token = spare.token if spare is not None else new_job_token()
            if fence is not None and not fence.starting(token):
                if spare is not None:
                    spare.discard("the launcher lost its leader lease")
                return fenced()
            started = time.time()
            driver_spec = replace(spec, fault=_armed(spec.fault_schedule)).to_json()
            if spare is not None:
                child = spare.take_over(driver_spec)
            else:
                child = subprocess.Popen([sys.executable, "-m", "exactly.ops.driver",
                                          driver_spec],
                                         env={**base_env, JOB_TOKEN_ENV: token},
                                         start_new_session=True)
            if fence is not None and fence.lost.is_set():  # lost while it started
                kill_job(token, what="the driver of a launcher that lost its leader lease")
            if stopping:  # a SIGTERM between the last driver's end and this one's start
                child.send_signal(signal.SIGTERM)
            update_status(directory, run_id=run_id, driver=process_id(child.pid),
                          state="starting")
            spares.active_started(child.pid, last_committed_epoch(checkpoint))
            code = _wait(child, spares, upgrader, token)
            kill_job(token, what="the driver's leftover processes")
            reap_children(spares.process, upgrader.process)
            if fence is not None and fence.lost.is_set():
                return fenced()
            upgraded = upgrader.after_exit(code, spares.take, stopping=bool(stopping))
            spec = upgrader.spec
            if upgraded is not None:
                if upgraded.rollback:  # the new job failed before its K epochs: no restart
                    history.append("failure", kind="upgrade", cause=upgrader.failure,
                                   action="rollback", ran_s=round(time.time() - started, 3))
                continue
            if code == 0:
                return RunEnd(0, signalled=bool(stopping))
            if code == JOB_FAILED:
                return RunEnd(JOB_FAILED, signalled=bool(stopping))
            if stopping:
                say(f"driver ended with {describe_exit(code)} while stopping")
                return RunEnd(0 if code in (-signal.SIGTERM, -signal.SIGINT) else JOB_FAILED,
                              signalled=True)
            cause = f"ProcessFailure: the driver process {describe_exit(code)}"
            said = _driver_exit_cause(directory, child.pid)
            if said:
                cause = f"{cause}: {said}"
            strategy = _strategy(directory)
            now = time.time()
            repeats = history.repeats(cause)  # before this failure is appended
            delay, repeated = restart_delay(strategy, [*history.counted_failure_times(), now],
                                            repeats, random.Random())
            reason = {"reason": repeated} if repeated else {}
            action = "restart" if delay is not None else "give-up"
            history.append("failure", kind="process", cause=cause, action=action, delay=delay,
                           strategy=strategy.describe(), ran_s=round(now - started, 3),
                           repeats=repeats, **reason)
            record_epoch_lost(checkpoint, cause)
            log_event(logger, "process_restart" if delay is not None else "gave_up",
                      logging.WARNING, cause=cause, delay_s=delay,
                      restarts=history.restarts(), repeats=repeats)
            if delay is None:
                update_status(directory, run_id=run_id, state="failed", detail=cause)
                said = f"{repeated}: " if repeated else ""
                say(f"job failed: {said}{cause} (restart strategy {strategy.describe()} gave "
                    "up)")
                return RunEnd(JOB_FAILED)
            by = " (the spare driver takes over)" if spares.spare is not None else ""
            say(f"{cause}; restarting in {delay:.1f}s{by} (restart {history.restarts()})")
            update_status(directory, run_id=run_id, state="restarting", detail=cause)
            if _wait_or_request(control, delay, stopping, fence, spares):
                if fence is not None and fence.lost.is_set():
                    return fenced()
                return RunEnd(0, signalled=bool(stopping))
    finally:
        upgrader.close()
        spares.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: what :func:`run_drivers` returns (in :attr:`RunEnd.code`) when its fence was lost
FENCED = 76


def refuse_if_run_with_ha(directory: LogStore) -> None:
    """Raise FencedError when launchers of ``exactly run --ha`` run the job: a plain
    ``exactly run`` beside them would be a second driver once their leader fails over."""
    from exactly.checkpoint.leader import LeaderLease, Members
    from exactly.errors import FencedError

    live = Members(directory).live()
    leader = LeaderLease(directory).look(current_process())
    if live or leader.why is None:
        hosts = ", ".join(sorted(f"{m.host} ({m.role})" for m in live)) or (
            leader.term.host if leader.term else "?")
        checkpoint = directory.describe().removesuffix("/" + JOB_DIR)
        raise FencedError(
            f"checkpoint {checkpoint} is run by `exactly run --ha` launchers on {hosts}: "
            "start this one with --ha too (it joins them as a standby), or stop the job "
            f"first with `exactly stop {checkpoint}`. Nothing was started.")


def _resolved_checkpoint(spec: DriverSpec) -> str:
    """The checkpoint the job file names (``exactly run`` without ``--checkpoint``): its job
    is built once in a driver process of its own, which then ends. Raises ConfigError with
    that process's root cause when the job names none or cannot be built."""
    from exactly.errors import ConfigError
    from exactly.ops.driver import RESOLVE

    token = new_job_token()
    try:
        found = subprocess.run([sys.executable, "-m", "exactly.ops.driver", RESOLVE,
                                spec.to_json()], env={**os.environ, JOB_TOKEN_ENV: token},
                               capture_output=True, text=True, start_new_session=True)
    finally:
        kill_job(token, what="the processes that built the job to learn its checkpoint")
    lines = [line for line in found.stdout.splitlines() if line.startswith("{")]
    if found.returncode != 0 or not lines:
        cause = (found.stderr.strip().splitlines() or [f"exit {found.returncode}"])[-1]
        raise ConfigError(f"exactly run without --checkpoint: {cause}")
    return str(json.loads(lines[-1])["checkpoint"])


def _wait(child: subprocess.Popen, spares: SpareKeeper, upgrader: Upgrader | None = None,
          token: str | None = None) -> int:
    """The driver's exit code; meanwhile every other child that ends is reaped (the
    launcher is a child subreaper, or a container's PID 1: the driver's orphaned
    processes end up as its children, and unreaped they stay zombies), the spare is
    kept (:meth:`SpareKeeper.tick`) and an upgrade moves on (:meth:`Upgrader.tick`: the
    old job's driver once it stopped with its savepoint, and a new job that fails before
    its K epochs, have their driver tree, ``token``, killed)."""
    while True:
        reap_children(child, spares.process, upgrader.process if upgrader else None)
        code = child.poll()
        if code is not None:
            return code
        spares.tick()
        ended = upgrader.tick(child.pid) if upgrader is not None else ""
        if ended and token is not None:
            kill_job(token, what=ended)
        busy = upgrader is not None and upgrader.state in ("stopping", "watching")
        time.sleep(UPGRADE_LOOK_S if busy else REAP_INTERVAL_S)


def _driver_exit_cause(directory: LogStore, pid: int) -> str | None:
    """The cause a driver left when it ended on an error a restart may fix (the file is
    removed); None when it left none (killed, or another driver's file)."""
    raw = directory.read(DRIVER_EXIT)
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:
        data = None  # torn by a driver killed while it wrote
    directory.delete(DRIVER_EXIT)
    if not isinstance(data, dict):
        return None
    if data.get("pid") != pid:
        return None  # an earlier driver's
    return str(data.get("cause") or "") or None


def _strategy(directory: LogStore) -> RestartStrategy:
    status = JobStatus.read(directory)
    if status is not None and status.strategy:
        return strategy_from_json(status.strategy)
    return default_strategy()


def answer_without_driver(control: ControlChannel, why: str) -> str | None:
    """Answer the pending stop and cancel requests while no driver runs (nothing is in
    flight): the oldest decides how the job ends, every other one is answered too (no
    command waits in vain, none stays queued for a later run). Returns the job's end state
    (``stopped``, ``cancelled``), or None when nothing was pending -- or when a savepoint
    or a drain is asked for: only a driver can take a savepoint or run the input through
    the job, and the next driver answers every request in order."""
    pending = control.pending()
    if not pending or any(r.needs_driver for r in pending):
        return None
    state = "stopped" if pending[0].action == "stop" else "cancelled"
    for request in pending:
        earlier = "" if request is pending[0] else f" (the job had already {state})"
        control.answer(request, "done", f"{request.action}: {why}{earlier}; nothing was in "
                       "flight")
    return state


def _wait_or_request(control: ControlChannel, seconds: float, stopping: list[int],
                     fence: Fence | None = None, spares: SpareKeeper | None = None) -> bool:
    """Sleep before a restart; True when a stop/cancel arrived meanwhile (answered here:
    no driver runs, so nothing is in flight), or when ``fence`` was lost. Savepoint
    requests, stops that want one and drains stay pending for the next driver
    (:func:`answer_without_driver`)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        reap_children(spares.process if spares is not None else None)
        if spares is not None:
            spares.tick()
        if fence is not None and fence.lost.is_set():
            return True
        if stopping:
            update_status(control.store, state="stopped", detail="stopped between restarts")
            return True
        state = answer_without_driver(control, "no driver was running (between restarts)")
        if state is not None:
            update_status(control.store, detail="", state=state)
            return True
        time.sleep(min(0.2, max(0.0, until - time.monotonic())))
    return False
