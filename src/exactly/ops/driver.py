"""The driver process of ``exactly run``: one Spark session, one supervised job.

``python -m exactly.ops.driver SPEC_JSON`` is what the launcher (:mod:`exactly.ops.launcher`)
starts, again after every death of the process; :func:`run_job` is the same from Python, in
the caller's process (query restarts only: nothing restarts a process that dies).

Exit codes: 0 the job stopped, drained, finished or was cancelled; :data:`JOB_FAILED` the
restart strategy gave up or the failure cannot be fixed by a restart (the cause is the last
line on stderr); :data:`DRIVER_LOST` the JVM is gone, start a new process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.checkpoint.layout import DRIVER_EXIT
from exactly.checkpoint.location import checkpoint_uri, host_dir, is_remote, job_store
from exactly.checkpoint.reach import check_reachable
from exactly.checkpoint.restarts import new_run_id
from exactly.checkpoint.status import JobStatus, claim_job, update_status
from exactly.checkpoint.store import LogStore
from exactly.connectors.admission import ADMISSION_FILE_ENV
from exactly.errors import ConfigError, ExactlyError, JobBuildError, TransientError
from exactly.logs import log_event
from exactly.ops.job import Job, check_job, load_job_file
from exactly.ops.job_savepoints import RestoreRequest
from exactly.ops.restart import RestartStrategy, restart_strategy, strategy_to_json
from exactly.ops.supervisor import (
    DriverLostError,
    JobFailedError,
    Outcome,
    Supervisor,
    default_strategy,
    driver_lost,
)
from exactly.procs import ProcessId, current_process
from exactly.protocol.faults import FaultSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger("exactly.ops.driver")

JOB_FAILED = 3
DRIVER_LOST = 75


def describe_exit(code: int) -> str:
    """How a driver process that ended with ``code`` ended, for a sentence about it
    ("the driver process ..."): killed by which signal, lost its Spark driver, or its code."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code == DRIVER_LOST:
        return "lost its Spark driver (its JVM, or the Spark Connect server it ran on)"
    return f"exited with code {code}"


@dataclass(frozen=True)
class DriverSpec:
    """Everything a driver process needs, passed as JSON by the launcher."""

    job_file: str
    checkpoint: str | None = None
    strategy: str | None = None
    strategy_options: dict[str, str] = field(default_factory=dict)
    master: str | None = None
    spark_ui: bool = False
    shuffle_partitions: int | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    stop_timeout_s: float = 600.0
    #: ``exactly run -s``: :class:`exactly.ops.job_savepoints.RestoreRequest` as JSON
    restore: dict[str, Any] | None = None
    #: the launcher's run id, the same for every driver process it starts
    run_id: str | None = None
    #: ``exactly run --fault``: a crash point armed in the job's exactly sink and at the
    #: savepoint and restore points (fault injection for tests and drills)
    fault: FaultSpec | None = None
    #: the launcher's process (:class:`exactly.procs.ProcessId` as JSON): a driver whose
    #: launcher is gone stops (:func:`watch_launcher`)
    launcher: dict[str, Any] | None = None
    #: Spark settings the job file and ``--conf`` override (``exactly run --ha``: the
    #: sinks' lease duration)
    default_conf: dict[str, str] = field(default_factory=dict)
    #: run by an ``exactly run --ha`` leader: a driver whose launcher is gone ends at once
    #: (a standby takes the job over and replays its epoch in flight)
    ha: bool = False
    #: ``exactly run --remote`` (or ``SPARK_REMOTE``): the Spark Connect server the job runs
    #: on (:func:`refuse_on_connect` names what cannot go with it)
    remote: str | None = None
    #: ``exactly run --spare-driver``: auto, on or off (:func:`exactly.ops.spare.spare_choice`)
    spare_driver: str = "auto"
    #: ``exactly run --fault A@E1,B@E2``: the launcher's schedule, one fault per driver in
    #: turn (each fires once in the run); ``fault`` is the one armed in this driver
    fault_schedule: list[FaultSpec] = field(default_factory=list)
    #: ``exactly upgrade``: this spare is the new job's driver; before it says ready it
    #: checks that the running job's checkpoint restores into its job as this
    #: :class:`~exactly.ops.job_savepoints.RestoreRequest` (as JSON, savepoint aside) says
    upgrade_check: dict[str, Any] | None = None
    #: ``exactly run --state-backend`` / ``--savepoint-dir``: CheckpointConfig settings
    #: over the job's own (constructor arguments)
    checkpoint_settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DriverSpec:
        data = json.loads(text)
        if data.get("fault") is not None:
            data["fault"] = FaultSpec(**data["fault"])
        data["fault_schedule"] = [FaultSpec(**f) for f in data.get("fault_schedule") or []]
        return cls(**data)

    def restart_strategy(self) -> RestartStrategy | None:
        if self.strategy is None:
            if self.strategy_options:
                raise ConfigError("restart options were given without --restart-strategy; "
                                  "name the strategy they belong to")
            return None
        return restart_strategy(self.strategy, self.strategy_options)


def start_spark(spec: DriverSpec, extra_conf: Mapping[str, str]) -> SparkSession:
    """The session of a supervised job; the admission file must be named before the JVM
    starts (Spark's Python workers inherit the variable from it)."""
    from exactly.spark.session import spark_session

    # no console progress bars between the job's log lines; the job and the command line
    # may still turn them on (a Connect client draws none: the setting is the server's)
    quiet = {} if spec.remote else {"spark.ui.showConsoleProgress": "false"}
    conf = {**quiet, **spec.default_conf, **extra_conf, **spec.spark_conf}
    kwargs: dict[str, Any] = {"app_name": f"exactly-run:{Path(spec.job_file).stem}",
                              "conf": conf}
    if spec.remote:
        kwargs["remote"] = spec.remote
    if spec.master:
        kwargs["master"] = spec.master
    restored_from = str((spec.restore or {}).get("savepoint") or "")
    if is_remote(spec.checkpoint or "") or is_remote(restored_from):
        kwargs["s3a"] = True  # the S3A jars and fs.s3a.* from AWS_*, executors included
    if spec.spark_ui:
        kwargs["ui"] = True
    if spec.shuffle_partitions:
        kwargs["shuffle_partitions"] = spec.shuffle_partitions
    return spark_session(**kwargs)


def refuse_on_connect(spec: DriverSpec, *, ha: bool = False) -> None:
    """Raise ConfigError (:func:`exactly.spark.connect.refuse`) when ``spec`` runs on Spark
    Connect (``spec.remote``) with what a Connect client cannot have: a master or a UI of its
    own (the server's), an object-storage checkpoint or savepoint (the S3A jars are the
    server's), ``--ha`` (a failover kills the old leader's driver process, which on Connect
    does not stop its query: that runs in the server). Nothing has started yet. The checkpoint
    policies that need the admission file are refused once the job is built
    (:func:`supervise`)."""
    from exactly.spark.connect import refuse

    if not spec.remote:
        return
    instead = "Drop --remote (and SPARK_REMOTE) to run the job with a Spark driver of its own"
    if spec.master:
        raise refuse(f"--master {spec.master}", "the Spark Connect server runs the driver and "
                     "chose its master when it started", f"Drop --master; or: {instead}")
    if spec.spark_ui:
        raise refuse("--spark-ui", "the UI is the server's (its spark.ui.* settings, fixed "
                     "when it started)", f"Drop --spark-ui and open the server's UI; or: "
                     f"{instead}")
    if ha:
        raise refuse("--ha", "a failover ends the old leader's driver process at once so that "
                     "its epoch in flight never commits, and on Connect that query runs in "
                     "the server, which outlives the driver", f"Run one `exactly run "
                     f"--remote` (the platform restarts it), or: {instead}")
    restored_from = str((spec.restore or {}).get("savepoint") or "")
    for what, place in (("checkpoint", spec.checkpoint or ""), ("savepoint", restored_from)):
        if is_remote(place):
            raise refuse(f"the {what} {place}", "checkpoints and savepoints on object storage "
                         "need Spark's S3A file system in the driver, and the driver is the "
                         "server, whose jars a client cannot change", f"Give a {what} on a "
                         f"file system the server and this host share; or: {instead}")


def supervise(spark: SparkSession, build: Callable[[SparkSession], Any], *,
              checkpoint: str | None, strategy: RestartStrategy | None, run_id: str,
              stop_timeout_s: float = 600.0, where: str = "build(spark)",
              restore: RestoreRequest | None = None, fault: FaultSpec | None = None,
              ha: bool = False, settings: Mapping[str, Any] | None = None) -> Outcome:
    """Build the job in ``spark`` and run it under a :class:`Supervisor` (SIGTERM and
    Ctrl-C stop it gracefully; a second Ctrl-C cancels). With ``restore``, the savepoint is
    restored into the (new) checkpoint first. ``settings``: CheckpointConfig settings over
    the job's own (``exactly run --state-backend``, ``--savepoint-dir``). ``ha``: run by an
    ``exactly run --ha`` leader (a FencedError is restarted, see :class:`Supervisor`).
    ``fault`` arms a crash point in the job's exactly sink and at the savepoint and restore
    points. Raises JobFailedError /
    DriverLostError as the supervisor does, SavepointError when the savepoint cannot be
    restored."""
    from exactly.ops.job_savepoints import restore_job
    from exactly.ops.pacing import Pacer
    from exactly.savepoints.operators import job_operators, job_sources, record_operators
    from exactly.spark.connect import is_connect, refuse

    try:
        job: Job = with_settings(check_job(_built(build, spark, where), where), settings)
    except (JobBuildError, ConfigError) as exc:
        if checkpoint:
            _record_start_failure(job_store(checkpoint), run_id, "build", exc)
        raise
    job = job.with_checkpoint_dir(checkpoint).with_fault(fault)
    if job.checkpoint.is_memory_storage:
        raise ConfigError("exactly run needs a durable checkpoint, the job's address: give "
                          "--checkpoint DIR (or CheckpointConfig(storage=DIR) in the job)")
    if job.checkpoint.needs_admission and is_connect(spark):
        raise refuse("min_pause_between_checkpoints and epoch sizing (target_epoch_duration)",
                     "exactly's sources learn them from a file named by "
                     "an environment variable Spark's Python workers inherit from the driver "
                     "JVM, and on Connect that JVM is the server's", "Drop them from the "
                     "job's CheckpointConfig (Spark's own maxRowsPerTrigger / "
                     "maxOffsetsPerTrigger options of the source size its epochs), or drop "
                     "--remote (and SPARK_REMOTE) to run the job with a Spark driver of its "
                     "own")
    operators = job_operators(job.df)
    try:
        refuse_backend_of(job, operators)
    except ConfigError as exc:
        _record_start_failure(job_store(job.checkpoint.storage), run_id, "build", exc)
        raise
    if restore is None:
        _refuse_unfinished_restore(job.checkpoint.storage)
    else:
        try:
            done = restore_job(job, restore, operators, fault)
        except ExactlyError as exc:  # refused: nothing was restored, the run ends here
            _record_start_failure(job_store(job.checkpoint.storage), run_id, "restore", exc)
            raise
        if done is not None:
            log_event(logger, "restored", savepoint=restore.savepoint,
                      epoch=done.get("epoch"), restored=done.get("restored"),
                      dropped=done.get("dropped"), new=done.get("new"))
    directory = job_store(job.checkpoint.storage)
    # the uids a later `-s CHECKPOINT` maps state and source positions by
    record_operators(directory, operators, job_sources(job.df))
    chosen = strategy or job.restart_strategy or default_strategy()
    # tell the launcher which strategy counts process restarts, and who the driver is
    update_status(directory, run_id=run_id, strategy=strategy_to_json(chosen),
                  driver=current_process())
    config = job.checkpoint
    admission = job_admission_file(host_dir(job.checkpoint.storage))
    if config.needs_admission and not admission_named(admission):
        raise ConfigError("min_pause_between_checkpoints and epoch sizing need exactly to "
                          "name the job's admission file before Spark's JVM starts (its "
                          "Python workers inherit it): run the job with `exactly run`, or "
                          "with run_job(build, checkpoint=DIR) as the first Spark session of "
                          "this process")
    pacer = Pacer(admission, config.storage,
                  min_pause_s=config.min_pause_seconds, target_s=config.epoch_target_seconds)
    supervisor = Supervisor(job, strategy=chosen, run_id=run_id, pacer=pacer, ha=ha,
                            stop_timeout_s=stop_timeout_s, operators=operators, fault=fault)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum, frame) -> None:
        log_event(logger, "stop_requested", logging.WARNING, signal=signal.Signals(signum).name)
        supervisor.request_stop()

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        return supervisor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        pacer.remove()


def with_settings(job: Job, settings: Mapping[str, Any] | None) -> Job:
    """``job`` with ``settings`` (CheckpointConfig constructor arguments given at launch)
    over its own checkpoint settings, checked like the job's own (ConfigError naming the
    setting)."""
    if not settings:
        return job
    return replace(job, checkpoint=job.checkpoint.replace(**settings))


def refuse_backend_of(job: Job, operators: Sequence[Any]) -> None:
    """Raise ConfigError when the job's state backend cannot hold one of its stateful
    steps: Spark keeps transformWithState state in RocksDB only (its query would fail at
    every start, restarted forever)."""
    from exactly.config import StateBackend

    if job.checkpoint.state_backend is not StateBackend.HASHMAP:
        return
    steps = [op.uid or op.logical for op in operators
             if op.logical.startswith("TransformWithState")]
    if steps:
        raise ConfigError(
            f"state_backend='hashmap' cannot hold the state of {', '.join(steps)}: Spark keeps "
            "transformWithState state in RocksDB only (HDFSBackedStateStoreProvider is not "
            "supported by TransformWithState). Drop --state-backend hashmap (or "
            "CheckpointConfig(state_backend='hashmap')), or give rocksdb")


def _refuse_unfinished_restore(checkpoint: str) -> None:
    """A checkpoint whose restore was interrupted (a crash during ``exactly run -s`` or
    ``exactly upgrade``) holds part of a checkpoint: running on it without finishing the
    restore would start a query on that part. Raises SavepointError naming the restore."""
    from exactly.errors import SavepointError
    from exactly.savepoints.restore import read_marker

    marker = read_marker(checkpoint)
    if marker is None or marker.get("state") != "in-progress":
        return
    upgrade = marker.get("upgrade") or {}
    job = f" into {upgrade['job_file']}" if upgrade.get("job_file") else ""
    raise SavepointError(
        f"{checkpoint} holds an unfinished restore of {marker.get('savepoint')}{job} (it was "
        "interrupted): finish it first, `exactly run JOB -s "
        f"{marker.get('savepoint')} --checkpoint {checkpoint}`, with the job file it was "
        "restoring")


def _built(build: Callable[[SparkSession], Any], spark: SparkSession, where: str) -> Any:
    """``build(spark)``; an exception from it becomes a JobBuildError naming its root cause
    and where in the job file it was raised (a restart does not fix the job file), except a
    TransientError (the job's own word that a restart may help) and a lost Spark driver."""
    try:
        return build(spark)
    except (TransientError, JobBuildError):
        raise
    except Exception as exc:
        if driver_lost(exc):
            raise DriverLostError(f"the Spark driver is gone: {exc}") from exc
        from exactly.causes import root_cause_of

        raise JobBuildError(
            f"build(spark) of {where} raised {root_cause_of(exc)}{_raised_at(exc, where)}; "
            "not restarted: a restart does not fix an error in the job (raise "
            "exactly.TransientError from it for one that a restart can fix)") from exc


def _raised_at(exc: BaseException, where: str) -> str:
    """`` (at job.py:12)``: the last frame of the traceback in the job file, if any."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).name == Path(where).name]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def run_job(build: Callable[[SparkSession], Any] | str | Path, *, checkpoint: str | None = None,
            restart_strategy: RestartStrategy | None = None, spark: SparkSession | None = None,
            stop_timeout_s: float = 600.0, restore: RestoreRequest | None = None,
            fault: FaultSpec | None = None) -> Outcome:
    """Run a job in this process under the supervisor until it stops (Python API of
    ``exactly run`` without process restarts).

    ``build`` is a ``build(spark) -> Job`` function or the path of a job file. Without
    ``spark``, exactly starts the session (needed for min pause and epoch sizing).
    ``restore`` (``exactly run -s``) restores a savepoint into the new checkpoint first.
    ``fault`` (``exactly run --fault``) arms a crash point, for tests and drills.
    Raises JobFailedError with the last cause when the restart strategy gives up, and
    SavepointError when the savepoint cannot be restored.
    """
    if isinstance(build, (str, Path)):
        job_file = load_job_file(build)
        build_fn, conf, where = job_file.build, job_file.session_conf(), str(job_file.path)
    else:
        build_fn, conf, where = build, {}, getattr(build, "__name__", "build")
    run_id = new_run_id()
    if checkpoint:
        checkpoint = checkpoint_uri(checkpoint)
        check_reachable(checkpoint)  # S3: settings, endpoint, bucket, in one line if not
    own_session = spark is None
    if spark is None:
        if checkpoint and not _jvm_running():  # Spark's Python workers inherit it from the JVM
            os.environ[ADMISSION_FILE_ENV] = str(job_admission_file(host_dir(checkpoint)))
        spark = start_spark(DriverSpec(str(where)), conf)
    if checkpoint:
        claim_job(job_store(checkpoint), JobStatus(run_id, current_process(), "starting"))
    try:
        return supervise(spark, build_fn, checkpoint=checkpoint, strategy=restart_strategy,
                         run_id=run_id, stop_timeout_s=stop_timeout_s, where=str(where),
                         restore=restore, fault=fault)
    finally:
        if own_session:
            _stop_quietly(spark)


#: ``python -m exactly.ops.driver RESOLVE SPEC``: print the job's checkpoint and exit
RESOLVE = "--resolve-checkpoint"


def resolve_checkpoint(spec: DriverSpec) -> str:
    """The checkpoint the job file of ``spec`` names in its ``CheckpointConfig(storage=...)``,
    learnt by building the job in a session of its own (``exactly run`` without
    ``--checkpoint``). Raises ConfigError when the job names none (``memory``)."""
    job_file = load_job_file(spec.job_file)
    # building the job only defines its DataFrames: a small local session does (no cluster
    # application is registered for it)
    small = replace(spec, spark_ui=False) if spec.remote else replace(
        spec, master="local[1]", spark_ui=False)
    spark = start_spark(small, job_file.session_conf())
    try:
        job = check_job(job_file.build(spark), str(job_file.path))
    finally:
        _stop_quietly(spark)
    if job.checkpoint.is_memory_storage:
        raise ConfigError(
            f"{job_file.path}: the job names no checkpoint (CheckpointConfig(storage=...) is "
            "'memory') and no --checkpoint was given; exactly run needs a durable checkpoint, "
            "the job's address: give --checkpoint DIR, or CheckpointConfig(storage=DIR) in the "
            "job")
    return job.checkpoint.storage


def main(argv: list[str] | None = None) -> int:
    """Entry of a driver process started by the launcher; returns the exit code."""
    from exactly.logs import configure

    configure()
    args = sys.argv[1:] if argv is None else argv
    if args[0] == RESOLVE:
        return _resolve_main(DriverSpec.from_json(args[1]))
    from exactly.ops.spare import SPARE

    spare = args[0] == SPARE
    spec = DriverSpec.from_json(args[2] if spare else args[0])
    run_id = spec.run_id or new_run_id()
    session: list[SparkSession] = []
    code = DRIVER_CRASHED
    try:
        warm = None
        if spare:
            warm = _warm_spare(spec, session, int(args[1]))
            if warm is None:  # never asked to take over, or could not get warm
                code = 0
                return code
        if warm is not None:  # the run it takes over: run id, fault, launcher
            spec = warm.spec
            run_id = spec.run_id or run_id
        if spec.launcher is not None and spec.checkpoint:
            watch_launcher(ProcessId.from_json(spec.launcher), spec.checkpoint, run_id,
                           at_once=spec.ha)
        code = _drive(spec, run_id, session, warm)
        return code
    finally:
        if session:  # a lost server: nothing to release, and no retries waiting for it
            _stop_quietly(session[0], lost=code == DRIVER_LOST)
        if spec.launcher is not None:
            _end_orphaned(ProcessId.from_json(spec.launcher))


@dataclass
class _Warm:
    """What a spare driver prepared before it took over: the job file and the job it built."""

    job_file: Any
    job: Job
    #: the spec of the run it took over (the launcher's ``go``): its run id, the fault it
    #: arms, its launcher; the session and the job were made from the spare's own spec,
    #: which differs from this one in none of what they depend on
    spec: DriverSpec


def _warm_spare(spec: DriverSpec, session: list[SparkSession], ready_fd: int) -> _Warm | None:
    """The warm-up of a spare driver (:mod:`exactly.ops.spare`): the job file imported, the
    session started (with :func:`~exactly.ops.spare.spare_conf`), ``build(spark)`` run;
    then ``ready`` on ``ready_fd`` and a wait for the launcher's ``go`` on stdin. Returns
    what it prepared once told to take over; None when stdin closed first (the launcher
    ended or dropped it) or the warm-up failed (its cause written on ``ready_fd``: the
    launcher starts a new driver from scratch when it needs one). Writes nothing into the
    checkpoint before ``go``."""
    from exactly.causes import root_cause_of
    from exactly.ops.spare import GO, READY, spare_conf

    def say(line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, f"{line}\n".encode())

    try:
        try:
            job_file = load_job_file(spec.job_file)
            conf = job_file.session_conf()
            spark = start_spark(spec, {**spare_conf(spec.master, {**conf, **spec.spark_conf}),
                                       **conf})
            session.append(spark)
            job = check_job(_built(job_file.build, spark, str(job_file.path)),
                            str(job_file.path))
            _warm_up(spark, spec)
            if spec.upgrade_check is not None:
                _check_upgrade(job, spec, job_file.spark_conf)
        except Exception as exc:
            say(f"failed: {root_cause_of(exc)}")
            return None
        say(READY)
        word, _, given = sys.stdin.readline().strip().partition(" ")
        if word != GO:
            return None
        return _Warm(job_file, job, DriverSpec.from_json(given) if given else spec)
    finally:
        with contextlib.suppress(OSError):
            os.close(ready_fd)


def _check_upgrade(job: Job, spec: DriverSpec, spark_conf: Mapping[str, str]) -> None:
    """``exactly upgrade``'s check in the new job's spare, before the running job is
    touched (:func:`~exactly.ops.job_savepoints.check_upgrade`); raises what the restore
    would raise."""
    from exactly.ops.job_savepoints import check_upgrade
    from exactly.savepoints.operators import job_operators

    request = _restore_request(replace(spec, restore={**(spec.upgrade_check or {}),
                                                      "savepoint": ""}), spark_conf)
    assert request is not None
    plan = check_upgrade(with_settings(job.with_checkpoint_dir(spec.checkpoint),
                                       spec.checkpoint_settings), request,
                         job_operators(job.df))
    log_event(logger, "upgrade_checked", restored=plan.get("restored"),
              dropped=plan.get("dropped"), new=plan.get("new"),
              partitions=plan.get("partitions"), backend=plan.get("backend"))


def _warm_up(spark: SparkSession, spec: DriverSpec) -> None:
    """Start the spare's Python workers where its JVM runs the tasks (a local master):
    :mod:`exactly.ops.spare_warmup`."""
    from exactly.ops.spare_warmup import warm_python_workers
    from exactly.spark.session import default_master, local_cores

    cores = local_cores(spec.master or default_master())
    if cores is not None:
        warm_python_workers(spark, cores)


def _drive(spec: DriverSpec, run_id: str, session: list[SparkSession],
           warm: _Warm | None = None) -> int:
    """The job of a driver process, in the session it appends to ``session`` (a spare's,
    ``warm``, when it took over); returns the exit code (see the module doc)."""
    try:
        strategy = spec.restart_strategy()
        build: Callable[[SparkSession], Any]
        if warm is not None:
            job_file, spark = warm.job_file, session[0]
            built = warm.job
            build = lambda _spark: built  # noqa: E731 - built once, in the spare's warm-up
        else:
            job_file = load_job_file(spec.job_file)
            spark = start_spark(spec, job_file.session_conf())
            session.append(spark)
            build = job_file.build
        outcome = supervise(spark, build, checkpoint=spec.checkpoint,
                            strategy=strategy, run_id=run_id,
                            stop_timeout_s=spec.stop_timeout_s, where=str(job_file.path),
                            restore=_restore_request(spec, job_file.spark_conf),
                            fault=spec.fault, ha=spec.ha, settings=spec.checkpoint_settings)
        print(f"exactly run: job {outcome.value}", file=sys.stderr, flush=True)
        return 0
    except DriverLostError as exc:
        print(f"exactly run: driver lost: {exc}", file=sys.stderr, flush=True)
        return DRIVER_LOST
    except TransientError as exc:
        return _lost(exc) or _crashed(spec, run_id, exc, "a transient error (restarted)")
    except (JobFailedError, ExactlyError) as exc:
        from exactly.causes import root_cause_of

        if _lost(exc):
            return DRIVER_LOST
        text = str(exc) if isinstance(exc, JobFailedError) else root_cause_of(exc)
        _mark_failed(spec, text)
        print(f"exactly run: job failed: {text}", file=sys.stderr, flush=True)
        return JOB_FAILED
    except Exception as exc:  # unforeseen: the launcher restarts the process, with the cause
        return _lost(exc) or _crashed(spec, run_id, exc, "an unexpected error")


def _lost(exc: BaseException) -> int:
    """:data:`DRIVER_LOST` when ``exc`` says the Spark driver is gone (e.g. a Spark Connect
    server that is down or restarting: the session could not be opened, or a call of the
    build or the restore found it gone), else 0. The launcher then starts a new driver
    process as the restart strategy says; on Connect it reconnects once the server is back."""
    if not driver_lost(exc):
        return 0
    print(f"exactly run: driver lost: the Spark driver is gone: {exc}", file=sys.stderr,
          flush=True)
    return DRIVER_LOST


#: exit code of a driver that ended on an error a restart may fix (its cause is in
#: ``exactly-job/driver-exit.json``)
DRIVER_CRASHED = 1


def _crashed(spec: DriverSpec, run_id: str, exc: BaseException, what: str) -> int:
    import traceback

    from exactly.causes import root_cause_of

    traceback.print_exception(exc, file=sys.stderr)
    cause = root_cause_of(exc)
    if spec.checkpoint:  # for the launcher, which reads it into the restart history
        job_store(spec.checkpoint).write(DRIVER_EXIT, json.dumps(
            {"pid": os.getpid(), "run": run_id, "cause": cause}).encode())
    print(f"exactly run: driver ended on {what}: {cause}", file=sys.stderr, flush=True)
    return DRIVER_CRASHED


#: seconds between two looks of a driver at its launcher
LAUNCHER_POLL_S = 0.5


def watch_launcher(launcher: ProcessId, checkpoint: str, run_id: str, *,
                   at_once: bool = False) -> threading.Thread:
    """Watch the launcher from a daemon thread of the driver: once it is gone (killed alone,
    its terminal closed), the driver records it in the restart history and in ``job.json``
    and sends itself a stop (the epoch in flight commits, then the driver exits and takes
    its Spark processes with it). A driver never outlives its launcher by more than
    :data:`LAUNCHER_POLL_S` plus its graceful stop; meanwhile ``exactly stop`` and
    ``cancel`` reach it and a new ``exactly run`` waits for it.

    ``at_once`` (a driver of an ``exactly run --ha`` leader): the driver kills its own
    processes at once instead: a standby takes the job over and replays the epoch in
    flight, and a driver finishing it meanwhile would hold its sinks' leases against the
    new leader's."""
    thread = threading.Thread(target=_watch, args=(launcher, checkpoint, run_id, at_once),
                              name="exactly-launcher-watch", daemon=True)
    thread.start()
    return thread


def _watch(launcher: ProcessId, checkpoint: str, run_id: str, at_once: bool = False) -> None:
    import time

    from exactly.checkpoint.control import ControlChannel
    from exactly.checkpoint.restarts import RestartHistory

    while launcher.is_alive() is not False:
        time.sleep(LAUNCHER_POLL_S)
    directory = job_store(checkpoint)
    if at_once:
        _end_at_once(launcher, directory, run_id)
    cause = (f"LauncherLost: the launcher of this driver (`exactly run` pid {launcher.pid}) "
             "ended without stopping it; the driver stops (its epoch in flight commits) and "
             "exits: a driver never outlives its launcher")
    log_event(logger, "launcher_lost", logging.WARNING, launcher_pid=launcher.pid)
    RestartHistory(directory, run_id).append("failure", kind="launcher", cause=cause,
                                             action="stop")
    update_status(directory, run_id=run_id, state="stopping", detail=cause)
    ControlChannel(checkpoint).post("stop", drain=False,
                                    reason=f"its launcher (pid {launcher.pid}) ended")


def _end_at_once(launcher: ProcessId, directory: LogStore, run_id: str) -> None:
    """The HA driver whose launcher died: record it, then SIGKILL its own processes (the
    JVM, PySpark's workers) and itself; the epoch in flight is replayed by the next leader."""
    import psutil

    from exactly.checkpoint.restarts import RestartHistory
    from exactly.procs import JOB_TOKEN_ENV, job_processes, token_maker

    cause = (f"LauncherLost: the HA launcher of this driver (`exactly run --ha` pid "
             f"{launcher.pid}) is gone; the driver ended at once (a standby takes the job "
             "over and replays the epoch in flight)")
    log_event(logger, "launcher_lost", logging.WARNING, launcher_pid=launcher.pid, ha=True)
    with contextlib.suppress(Exception):
        RestartHistory(directory, run_id).append("failure", kind="launcher", cause=cause,
                                                 action="stop")
    token = os.environ.get(JOB_TOKEN_ENV)
    if token and token_maker(token) == (launcher.pid, launcher.start_ticks):
        for proc in job_processes(token):
            if proc.pid != os.getpid():
                with contextlib.suppress(psutil.Error):
                    proc.kill()
    os.kill(os.getpid(), signal.SIGKILL)


def _end_orphaned(launcher: ProcessId) -> None:
    """A driver whose launcher is gone kills what is left of its own job's processes (its
    launcher would have); nothing to do while the launcher lives."""
    from exactly.procs import JOB_TOKEN_ENV, kill_job, token_maker

    if launcher.is_alive() is not False:
        return
    token = os.environ.get(JOB_TOKEN_ENV)
    if token_maker(token) == (launcher.pid, launcher.start_ticks):
        kill_job(token, what="the processes of a driver whose launcher ended")


def _resolve_main(spec: DriverSpec) -> int:
    """Print ``{"checkpoint": ...}`` of :func:`resolve_checkpoint` on stdout (exit 0), or the
    root cause on stderr (exit :data:`JOB_FAILED`)."""
    try:
        print(json.dumps({"checkpoint": resolve_checkpoint(spec)}), flush=True)
        return 0
    except Exception as exc:
        from exactly.causes import root_cause_of

        print(root_cause_of(exc), file=sys.stderr, flush=True)
        return JOB_FAILED


def _jvm_running() -> bool:
    """Whether this process already started Spark's JVM (its environment is fixed then)."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def job_admission_file(directory: Path) -> Path:
    """The admission file of the job whose job directory is ``directory``: the only file a
    job's pacer writes (and deletes), and what exactly names to its sources (``exactly run``,
    :func:`run_job`). A different file named by the environment is never written."""
    return directory / "admission.json"


def admission_named(path: Path) -> bool:
    """True when this process's environment names ``path`` to Spark's Python workers
    (set by exactly before the JVM started), so its sources read what the pacer writes."""
    named = os.environ.get(ADMISSION_FILE_ENV)
    return named is not None and Path(named).absolute() == path.absolute()


def _restore_request(spec: DriverSpec, spark_conf: Mapping[str, str]) -> RestoreRequest | None:
    """The restore of ``exactly run -s``; without ``--parallelism`` the state partitions
    are ``--shuffle-partitions`` or the job file's ``spark.sql.shuffle.partitions`` when
    given, else the savepoint's."""
    if spec.restore is None:
        return None
    request = RestoreRequest.from_json(spec.restore)
    if request.parallelism is None:
        configured = spark_conf.get("spark.sql.shuffle.partitions")
        chosen = spec.shuffle_partitions or (int(configured) if configured else None)
        if chosen:
            request = replace(request, parallelism=chosen)
    return request


def _record_start_failure(directory: LogStore, run_id: str, kind: str,
                          exc: BaseException) -> None:
    """A run that failed before its query started (a refused restore) ends here: its cause
    goes to the restart history and ``job.json`` (state ``failed``), so ``exactly
    checkpoints`` and ``exactly ui`` show the run and why it ended."""
    from exactly.causes import root_cause_of
    from exactly.checkpoint.restarts import RestartHistory

    cause = root_cause_of(exc)
    RestartHistory(directory, run_id).append("failure", kind=kind, cause=cause,
                                             action="give-up", fatal=True)
    update_status(directory, run_id=run_id, state="failed", detail=cause)


def _mark_failed(spec: DriverSpec, detail: str) -> None:
    if spec.checkpoint:
        update_status(job_store(spec.checkpoint), run_id=spec.run_id, state="failed",
                      detail=detail)


def _stop_quietly(spark: SparkSession, *, lost: bool = False) -> None:
    """Stop ``spark``. ``lost``: its driver is gone; a Spark Connect session then only
    closes its channel (releasing it on the server would wait out the client's retries)."""
    from exactly.spark.connect import is_connect

    if lost and is_connect(spark):
        with contextlib.suppress(Exception):
            spark.release_session_on_close = False  # type: ignore[attr-defined]
    try:
        spark.stop()
    except Exception as exc:  # the JVM may already be gone
        log_event(logger, "spark_stop_failed", logging.DEBUG, error=repr(exc))


if __name__ == "__main__":
    sys.exit(main())
