"""A warm spare driver: the next driver of ``exactly run``, started before it is needed.

A new driver process spends most of its start on things that do not depend on the fault it
replaces: Python's imports, the JVM, the SparkSession and its package resolution, the job
file's import and ``build(spark)``. The launcher (:mod:`exactly.ops.launcher`) keeps one
spare driver process that has done all of that and then waits: it has started no query,
holds no sink lease, claims nothing in the checkpoint and writes nothing into it. When the
active driver dies and the restart strategy says to restart, the launcher hands the job to
the spare (:meth:`SpareDriver.take_over`), which goes on exactly as a new driver would
(:func:`exactly.ops.driver.supervise`: the same job.json status, run id, sink leases and
fencing), and starts a new spare behind it once the new active driver has committed an
epoch (:data:`SPARE_AFTER_S` at the latest).

The launcher and its spare talk over two pipes: the spare writes ``ready`` (or the cause it
could not get ready) on one, the launcher writes ``go`` on the spare's stdin. A spare whose
stdin closes (the launcher ended, or dropped the spare) exits without a trace; a spare is
killed with its whole process tree by its own job token, never with the active driver's.

Where a spare cannot help (:func:`spare_choice`): on Spark Connect the driver is the
server, and a client's start is not what a fault costs; ``--spare-driver off`` opts out.
On a cluster master the spare asks for no executors until it takes over
(:func:`spare_conf`): dynamic allocation from zero executors, so the active driver keeps
every core.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from exactly.errors import ConfigError
from exactly.logs import log_event
from exactly.procs import JOB_TOKEN_ENV, kill_job, new_job_token, process_id

logger = logging.getLogger("exactly.ops.spare")

#: ``python -m exactly.ops.driver SPARE FD SPEC``: a spare driver that reports on FD
SPARE = "--spare"
#: what a spare writes on its ready pipe once it is warm, and reads on stdin to take over
READY, GO = "ready", "go"
#: the longest a new active driver runs before its spare starts, when no epoch commits
#: sooner (an idle input): a spare starting while the active replays its epoch would take
#: CPU from that epoch
SPARE_AFTER_S = 10.0
#: ``--spare-driver`` values
CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class SpareChoice:
    """Whether ``exactly run`` keeps a spare (``wanted``) and, when not, why (``why``)."""

    wanted: bool
    why: str = ""


#: why ``auto`` keeps no spare on a cluster master (measured: docs/operations.md)
ON_A_CLUSTER = ("on a cluster master the spare holds no executor until it takes over, so "
                "its first epoch waits for executors to start, which is most of what a "
                "driver started from scratch waits for too (measured in docs/operations.md); "
                "--spare-driver on keeps one anyway")


def respawn_delay(deaths: int) -> float:
    """Seconds before a new spare replaces one that died (killed, the OOM killer), after
    ``deaths`` deaths in a row: :data:`SPARE_AFTER_S`, doubling each time (at most 64x)."""
    return SPARE_AFTER_S * 2 ** min(max(deaths - 1, 0), 6)


def spare_choice(setting: str, *, remote: str | None,
                 master: str | None = None) -> SpareChoice:
    """The spare of a run with ``--spare-driver setting`` on ``master`` (None: the default
    master): ``auto`` keeps one where it helps (a local master), ``on`` insists (a
    ConfigError where it cannot work: Spark Connect), ``off`` keeps none."""
    if setting not in CHOICES:
        raise ConfigError(f"--spare-driver {setting!r}: give one of {', '.join(CHOICES)}")
    if setting == "off":
        return SpareChoice(False, "--spare-driver off")
    if remote:
        why = ("on Spark Connect the query runs in the server, which is the Spark driver: a "
               "spare client would save only the client's own start (about a second), and "
               "when the client dies its query goes on in the server until the next client "
               "stops it, which a spare cannot speed up")
        if setting == "on":
            from exactly.spark.connect import refuse

            raise refuse("--spare-driver on", why, "Drop --spare-driver (it is off on "
                         "Connect), or drop --remote (and SPARK_REMOTE) to run the job "
                         "with a Spark driver of its own")
        return SpareChoice(False, why)
    if setting == "auto":
        from exactly.spark.session import default_master, local_cores

        if local_cores(master or default_master()) is None:
            return SpareChoice(False, ON_A_CLUSTER)
    return SpareChoice(True)


def spare_conf(master: str | None, conf: dict[str, str]) -> dict[str, str]:
    """Spark settings of a spare's session on ``master`` beyond the job's own (``conf``).

    A local master needs none: the spare's JVM runs no task until it takes over. On a
    cluster master an idle application would still be given executors (every core a
    standalone master has left), so the spare's session starts with dynamic allocation at
    zero executors (initial and minimum) and shuffle tracking: it holds no core and no
    executor until its first query asks for tasks, after the takeover. Executors it then
    gets are kept while the job runs (no idle timeout), as a static allocation would keep
    them; ``maxExecutors`` is the job's own when it gives one."""
    from exactly.spark.session import default_master, local_cores

    if local_cores(master or default_master()) is not None:
        return {}
    settings = {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.initialExecutors": "0",
        "spark.dynamicAllocation.minExecutors": "0",
        "spark.dynamicAllocation.executorIdleTimeout": "365d",
        "spark.dynamicAllocation.shuffleTracking.timeout": "365d",
    }
    instances = conf.get("spark.executor.instances")
    if instances and "spark.dynamicAllocation.maxExecutors" not in conf:
        settings["spark.dynamicAllocation.maxExecutors"] = instances
    return settings


def file_digest(path: str) -> str | None:
    """SHA-256 of the file at ``path`` (None when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


class SpareDriver:
    """One spare driver process of a launcher (see the module doc)."""

    #: the spare's program, given its ready pipe's descriptor and the spec after it
    PROGRAM = (sys.executable, "-m", "exactly.ops.driver", SPARE)

    def __init__(self, spec_json: str, env: dict[str, str], *,
                 program: tuple[str, ...] = PROGRAM) -> None:
        self.job_file = str(json.loads(spec_json)["job_file"])
        #: the job file as the spare imports it: a spare of a file edited since then would
        #: run the old code (:meth:`SpareKeeper.take` drops it)
        self.job_file_digest = file_digest(self.job_file)
        self.token = new_job_token()
        read_end, write_end = os.pipe()
        self.started = time.time()
        self.ready_at: float | None = None
        self.failure = ""
        self._warm_up_failed = False
        self._said = b""
        try:
            self.process = subprocess.Popen(
                [*program, str(write_end), spec_json],
                env={**env, JOB_TOKEN_ENV: self.token}, stdin=subprocess.PIPE,
                pass_fds=(write_end,), start_new_session=True)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        flags = fcntl.fcntl(read_end, fcntl.F_GETFL)
        fcntl.fcntl(read_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._ready_fd: int | None = read_end
        log_event(logger, "spare_started", pid=self.process.pid)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def warm_up_failed(self) -> bool:
        """Whether it ended by itself before it was warm (its session or build failed)."""
        return self._warm_up_failed

    def identity(self) -> dict[str, object]:
        return process_id(self.pid).to_json()

    def poll(self) -> str:
        """``starting``, ``ready`` or ``dead`` (its cause in :attr:`failure`)."""
        if self._ready_fd is not None:
            self._read_pipe()
        if self.process.poll() is not None:
            if self._ready_fd is not None:
                self._read_pipe()  # what it said just before it ended
            if not self.failure:
                code = self.process.returncode
                self.failure = (f"killed by {signal.Signals(-code).name}" if code < 0
                                else f"exited with code {code}")
            return "dead"
        return "ready" if self.ready_at is not None else "starting"

    def take_over(self, spec_json: str) -> subprocess.Popen:
        """Tell the spare to run the job as the driver of ``spec_json`` (a
        :class:`~exactly.ops.driver.DriverSpec`: its run id, the fault it arms); returns its
        process, the new active driver. A spare that is still starting takes over once it
        is warm (it reads ``go`` then). The spec must not change what the spare's session
        and job were made from (job file, master, Spark settings)."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(f"{GO} {spec_json}\n".encode())
            stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it died meanwhile: the launcher sees its exit like any driver's
        self._close_pipe()
        log_event(logger, "spare_takes_over", pid=self.pid,
                  warm_s=round(time.time() - (self.ready_at or time.time()), 3),
                  ready=self.ready_at is not None)
        return self.process

    def discard(self, why: str, *, quiet: bool = False) -> None:
        """Kill the spare and every process of its tree; it never ran the job. ``quiet``:
        logged at DEBUG (the run ended: its outcome stays the launcher's last word)."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        self._close_pipe()
        kill_job(self.token, what="the spare driver")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        log_event(logger, "spare_discarded", logging.DEBUG if quiet else logging.INFO,
                  pid=self.pid, why=why)

    def _read_pipe(self) -> None:
        assert self._ready_fd is not None
        try:
            chunk = os.read(self._ready_fd, 4096)
        except BlockingIOError:
            return
        if not chunk:  # the spare closed it: ready said before, or it ended
            self._close_pipe()
            return
        self._said += chunk
        for line in self._said.decode(errors="replace").splitlines():
            if line == READY and self.ready_at is None:
                self.ready_at = time.time()
                log_event(logger, "spare_ready", pid=self.pid,
                          start_s=round(self.ready_at - self.started, 3))
            elif line.startswith("failed: "):
                self.failure = line.removeprefix("failed: ")
                self._warm_up_failed = True

    def _close_pipe(self) -> None:
        if self._ready_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._ready_fd)
            self._ready_fd = None


class SpareKeeper:
    """The spare of one ``exactly run`` launcher: started once its active driver settled
    (committed an epoch, or ran :data:`SPARE_AFTER_S`), shown in ``job.json`` (``spare``:
    its process and ``starting`` / ``ready``), handed over at a restart (:meth:`take`),
    discarded when the run ends (:meth:`close`). A spare that dies (killed, the OOM
    killer) is logged with its cause and started again :data:`SPARE_AFTER_S` later,
    doubling after each death in a row; one that cannot get warm (its session or build
    failed) is not started again before the next active driver."""

    def __init__(self, spec_json: str, env: dict[str, str], directory, run_id: str, *,
                 choice: SpareChoice, say, spare: SpareDriver | None = None) -> None:
        self.spec_json = spec_json
        self.env = env
        self.directory = directory
        self.run_id = run_id
        self.choice = choice
        self.say = say
        #: a spare made before the run (an HA standby's): it runs the first driver
        self.spare: SpareDriver | None = spare
        self._shown: str | None = None
        self._active_pid: int | None = None
        self._active_epoch: int | None = None
        self._running_since: float | None = None
        self._settled = False
        self._gave_up = False
        self._deaths = 0
        self._not_before = 0.0
        self._looked_at = 0.0

    @property
    def process(self) -> subprocess.Popen | None:
        return self.spare.process if self.spare is not None else None

    def active_started(self, pid: int, last_epoch: int | None) -> None:
        """A new active driver ``pid`` started (from scratch or from the spare) when Spark's
        commit log ended at ``last_epoch``: it settled once ``job.json`` shows a later one
        (a new leader's claim of ``job.json`` starts without any)."""
        self._active_pid, self._active_epoch = pid, last_epoch
        self._running_since, self._settled, self._gave_up = None, False, False
        self._deaths, self._not_before = 0, 0.0

    def tick(self) -> None:
        """Called while the launcher waits: start the spare when due, follow its state."""
        if not self.choice.wanted:
            return
        if self.spare is None:
            if not self._gave_up and self._active_pid is not None and (
                    time.monotonic() >= self._not_before) and self._active_settled():
                self.spare = SpareDriver(self.spec_json, self.env)
                self._show("starting")
            return
        state = self.spare.poll()
        if state == "dead":
            spare, self.spare = self.spare, None
            warm_up_failed = spare.warm_up_failed
            log_event(logger, "spare_lost", logging.WARNING, pid=spare.pid,
                      cause=spare.failure, warm_up_failed=warm_up_failed)
            spare.discard("it ended")
            self._deaths += 1
            if warm_up_failed:  # its build or session failed: the next one would, too
                self._gave_up = True
                then = "a restart starts the next driver from scratch"
            else:  # killed from outside, or the OOM killer: a new spare, later each time
                delay = respawn_delay(self._deaths)
                self._not_before = time.monotonic() + delay
                then = (f"a new spare starts in {delay:.0f}s (until it is warm, a restart "
                        "starts the next driver from scratch)")
            self.say(f"the spare driver (pid {spare.pid}) ended: {spare.failure}; {then}")
            self._show(None)
            return
        self._show(state)

    def take(self) -> SpareDriver | None:
        """The spare, to take over (None when there is none, it died, or the job file
        changed since it imported it: a new driver then starts from scratch, with the file
        as it is now)."""
        if self.spare is None:
            return None
        self.tick()
        spare, self.spare = self.spare, None
        self._active_pid = None
        self._show(None)
        if spare is not None and file_digest(spare.job_file) != spare.job_file_digest:
            self.say(f"the job file {spare.job_file} changed since the spare driver imported "
                     "it; the next driver starts from scratch with the file as it is now")
            spare.discard("the job file changed")
            return None
        return spare

    def retarget(self, spec_json: str) -> None:
        """The job's driver spec changed (``exactly upgrade`` moved it to a new job file):
        a spare of the old one is discarded, the next one is made from ``spec_json``."""
        self.spec_json = spec_json
        if self.spare is not None:
            self.spare.discard("the job was upgraded to another job file")
            self.spare = None
            self._show(None)

    def close(self, why: str = "the run ended") -> None:
        if self.spare is not None:
            self.spare.discard(why, quiet=True)
            self.spare = None
            self._show(None)

    def _active_settled(self) -> bool:
        if self._settled:
            return True
        now = time.monotonic()
        if now - self._looked_at < 1.0:  # job.json may be an object on S3
            return False
        self._looked_at = now
        from exactly.checkpoint.status import JobStatus

        status = JobStatus.read(self.directory)
        if status is None or status.run_id != self.run_id or status.driver is None or (
                status.driver.pid != self._active_pid or status.state != "running"):
            return False
        if self._running_since is None:
            self._running_since = now
        committed = status.last_epoch is not None and (
            self._active_epoch is None or status.last_epoch > self._active_epoch)
        self._settled = committed or now - self._running_since >= SPARE_AFTER_S
        return self._settled

    def _show(self, state: str | None) -> None:
        if state == self._shown:
            return
        from exactly.checkpoint.status import update_status

        self._shown = state
        spare = None
        if state is not None and self.spare is not None:
            spare = {"process": self.spare.identity(), "state": state,
                     "since": self.spare.ready_at if state == "ready" else self.spare.started}
        update_status(self.directory, run_id=self.run_id, spare=spare)
