"""``exactly upgrade``: a running job moves to a new job file through a savepoint, with no
driver start in the gap, and back to its old job file when the new one fails early.

The Flink Kubernetes Operator's savepoint upgrade with rollback, done by the launcher of
``exactly run`` (:mod:`exactly.ops.launcher`), which owns the job's drivers. ``exactly
upgrade CK NEW_JOB.py`` queues an ``upgrade`` request in the job's control channel; the
launcher (never the driver) takes it and:

1. **warms the new job**: a spare driver (:mod:`exactly.ops.spare`) of ``NEW_JOB.py`` starts
   beside the running driver: session, ``build(spark)``, Python workers. Before it says
   ready it **checks the restore** against a copy of the running checkpoint's last
   completed epoch (:func:`~exactly.ops.job_savepoints.check_upgrade`: operators by uid,
   state schemas, partitions, sources, the sink's rollback rule). A refusal, or a new job
   that cannot be built, is the answer: the running job was not touched.
2. **stops the old job with a savepoint** (Flink's stop-with-savepoint: the epoch in flight
   commits, then the savepoint of the last completed epoch).
3. **restores the savepoint into the same checkpoint** in the warm driver: the restore
   marker (``exactly-job/restore.json``) is set to "in progress" first, so the restore
   replaces Spark's files of the old query with the savepoint's, as an interrupted restore
   is redone (a crash anywhere from here on leaves a marker the next driver finishes from,
   and a driver without that restore refuses to start on it). The job keeps its address:
   the same checkpoint, history, control channel; the epochs go on from the savepoint's.
4. **watches the first K epochs** (``--epochs``, default :data:`DEFAULT_EPOCHS`): once the
   new job committed them the upgrade is done and later restarts run the new job file. If
   the new driver fails before (a query failure it records, its process dying, the job
   failing), the launcher **rolls back**: the old job file restored from the same savepoint
   with the sink rollback rule (``--sink-rollback``), in the old job's warm spare when there
   is one, and the answer says so.

Not on ``exactly run --ha`` (a standby would fail over to the job file it was started with)
nor on Spark Connect (no spare driver there): there the upgrade is refused with the way to
do it by hand (``exactly stop --savepoint``, then ``exactly run NEW -s SAVEPOINT``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.checkpoint.control import ControlChannel, Request
from exactly.checkpoint.history import append_now
from exactly.checkpoint.location import job_store, same_place
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.spark_files import last_committed_epoch
from exactly.checkpoint.status import JobStatus, update_status
from exactly.checkpoint.store import is_remote
from exactly.errors import ConfigError
from exactly.logs import log_event
from exactly.ops.driver import JOB_FAILED, describe_exit
from exactly.ops.job_savepoints import RestoreRequest
from exactly.ops.spare import SpareDriver, file_digest
from exactly.protocol.target_state import SinkRollback
from exactly.savepoints.restore import mark_in_progress, read_marker

if TYPE_CHECKING:
    import subprocess

    from exactly.ops.driver import DriverSpec

logger = logging.getLogger("exactly.ops.upgrade")

#: the control action of ``exactly upgrade``
UPGRADE = "upgrade"
#: epochs the new job must commit before the upgrade is done (and no longer rolled back)
DEFAULT_EPOCHS = 3
#: ``--sink-rollback`` values
ROLLBACK_CHOICES = tuple(r.value for r in SinkRollback)
#: seconds between two looks of the launcher at its upgrade's progress (a checkpoint on S3:
#: :data:`REMOTE_LOOK_INTERVAL_S`, each look lists the commit log)
LOOK_INTERVAL_S = 0.1
REMOTE_LOOK_INTERVAL_S = 1.0
#: the longest the stop waits, once the new job is warm, for an epoch to commit: the stop is
#: sent just after one, so the epoch after it is not half-way (an idle input: sent anyway)
STOP_ALIGN_S = 3.0
#: seconds between two listings of the control channel for upgrade requests
REQUESTS_LOOK_S = 1.0


@dataclass(frozen=True)
class UpgradeRequest:
    """What ``exactly upgrade`` asks for (the parameters of its control request)."""

    job_file: str
    parallelism: int | None = None
    allow_non_restored_state: bool = False
    sink_rollback: str = "refuse"
    epochs: int = DEFAULT_EPOCHS
    #: where the savepoint goes [default: the job's savepoint target]
    target: str | None = None

    def params(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> UpgradeRequest:
        """The request of ``params``; raises ConfigError naming what is wrong."""
        job_file = params.get("job_file")
        if not job_file or not os.path.isfile(str(job_file)):
            raise ConfigError(f"the new job file {job_file!r} does not exist on the launcher's "
                              "host (give a path it can read)")
        rollback = str(params.get("sink_rollback") or "refuse")
        if rollback not in ROLLBACK_CHOICES:
            raise ConfigError(f"--sink-rollback {rollback!r}: one of "
                              f"{', '.join(ROLLBACK_CHOICES)}")
        epochs = int(params.get("epochs") or DEFAULT_EPOCHS)
        parallelism = params.get("parallelism")
        if epochs < 1 or (parallelism is not None and int(parallelism) < 1):
            raise ConfigError("--epochs and --parallelism are at least 1")
        return cls(str(Path(str(job_file)).absolute()),
                   int(parallelism) if parallelism is not None else None,
                   bool(params.get("allow_non_restored_state")), rollback, epochs,
                   str(params["target"]) if params.get("target") else None)

    def restore(self, savepoint: str) -> dict[str, Any]:
        """The new job's restore of ``savepoint``, as a DriverSpec carries it."""
        return RestoreRequest(savepoint, self.allow_non_restored_state,
                              parallelism=self.parallelism,
                              sink_rollback=SinkRollback(self.sink_rollback)).to_json()


def refusal(*, ha: bool, remote: str | None) -> str | None:
    """Why a run cannot be upgraded in place (None: it can)."""
    by_hand = ("stop it with a savepoint (exactly stop CK --savepoint) and start the new "
               "job from it (exactly run NEW_JOB.py -s SAVEPOINT)")
    if ha:
        return ("an `exactly run --ha` job cannot be upgraded in place: its standbys would "
                f"fail over to the job file they were started with; {by_hand} on every host")
    if remote:
        return ("a job on Spark Connect cannot be upgraded in place: it keeps no spare "
                f"driver to warm the new job in; {by_hand}")
    return None


def _restored(checkpoint: str, query_id: str) -> bool:
    marker = read_marker(checkpoint)
    return marker is not None and marker.get("state") == "done" and \
        marker.get("query_id") == query_id


def _savepoint_epoch(path: str) -> int:
    from exactly.savepoints.manifest import read_manifest

    return read_manifest(path, checksums=False).epoch


@dataclass
class NextDriver:
    """What the launcher runs next instead of a restart: ``spec`` in ``spare`` (None: a
    driver from scratch)."""

    spec: DriverSpec
    spare: SpareDriver | None
    #: the new job failed before its K epochs, and this is the old one rolled back
    rollback: bool = False


class Upgrader:
    """The upgrades of one launcher run (see the module doc): called while its driver runs
    (:meth:`tick`) and when that driver ended (:meth:`after_exit`)."""

    def __init__(self, spec: DriverSpec, env: dict[str, str], *, say,
                 retarget: Callable[[str], None], refused: str | None = None) -> None:
        self.spec = spec
        self.checkpoint = str(spec.checkpoint)
        self.control = ControlChannel(self.checkpoint)
        self.directory = job_store(self.checkpoint)
        self.env = env
        self.say = say
        #: tells the launcher's spare keeper that the job's spec changed (an upgrade done)
        self.retarget = retarget
        self.refused = refused
        self.state = "idle"
        self.request: Request | None = None
        self.upgrade: UpgradeRequest | None = None
        self.new_spare: SpareDriver | None = None
        self.stop_request: Request | None = None
        self.savepoint: str | None = None
        self.epoch: int | None = None
        self.old_spec: DriverSpec | None = None
        self.new_spec: DriverSpec | None = None
        self.query_id: str | None = None
        self.started_at = 0.0
        self.failure = ""
        self._looked_at = 0.0
        self._look_interval = (REMOTE_LOOK_INTERVAL_S if is_remote(self.checkpoint)
                               else LOOK_INTERVAL_S)
        self._ready: tuple[float, int | None] | None = None
        self._old_stopped = False
        self._listed_at = float("-inf")
        self._old_digest: str | None = None

    @property
    def process(self) -> subprocess.Popen | None:
        """The new job's spare while it warms (the launcher reaps it)."""
        return self.new_spare.process if self.new_spare is not None else None

    # -- while a driver runs ----------------------------------------------------------------
    def tick(self, driver_pid: int | None) -> str:
        """Move the upgrade on; returns why the running driver's tree must be killed now
        ("" when it must not): the old job stopped with its savepoint and has only its
        session to tear down (the new job need not wait for that), or the new job failed
        before its K epochs (:meth:`after_exit` then rolls back)."""
        now = time.monotonic()
        if now - self._looked_at < self._look_interval:
            return ""
        self._looked_at = now
        if now - self._listed_at >= REQUESTS_LOOK_S:  # a listing of the control channel
            self._listed_at = now
            self._take_request(driver_pid)
        if self.state == "warming":
            self._warming()
        elif self.state == "stopping":
            return self._stopping(driver_pid)
        elif self.state == "watching":
            return self._watching()
        elif self.state == "rolling-back":
            self._rolling_back()
        return ""

    def _take_request(self, driver_pid: int | None) -> None:
        pending = [r for r in self.control.pending(launcher=True) if r.action == UPGRADE
                   and (self.request is None or r.id != self.request.id)]
        if not pending:
            return
        if self.request is not None:  # one at a time
            for other in pending:
                self.control.answer(other, "refused", "another upgrade is in progress "
                                    f"(to {self.upgrade.job_file if self.upgrade else '?'}); "
                                    "send this one again once it ended")
            return
        run_id = str(self.spec.run_id)
        for stale in [r for r in pending if r.to_run is not None and r.to_run != run_id]:
            self.control.answer(stale, "refused", f"it was sent to run {stale.to_run}, which "
                                f"ended before it began; run {run_id} goes on: send it again")
        pending = [r for r in pending if r.to_run is None or r.to_run == run_id]
        if not pending:
            return
        request, later = pending[0], pending[1:]
        for other in later:
            self.control.answer(other, "refused", "another upgrade is in progress "
                                f"(request {request.id}); send it again once it ended")
        if self.refused is not None:
            self.control.answer(request, "refused", self.refused)
            return
        if driver_pid is None:
            return  # between restarts: taken once a driver runs
        try:
            upgrade = UpgradeRequest.from_params(request.params)
        except ConfigError as exc:
            self.control.answer(request, "refused", str(exc))
            return
        if same_place(upgrade.job_file, self.spec.job_file):
            self.control.answer(request, "refused", f"{upgrade.job_file} is the job file the "
                                "job runs: put the new version in a file of its own, so that "
                                "a rollback can run the old one")
            return
        self.request, self.upgrade = request, upgrade
        self.old_spec = self.spec
        self._old_digest = file_digest(self.spec.job_file)
        # the run's faults stay armed (``exactly run --fault``): the new job's driver arms
        # the next one that has not fired when it takes over, as any next driver does
        self.new_spec = replace(self.spec, job_file=upgrade.job_file, restore=None,
                                upgrade_check=upgrade.restore(""))
        self.new_spare = SpareDriver(self.new_spec.to_json(), self.env)
        self.state, self._ready = "warming", None
        self._status(f"upgrading to {os.path.basename(upgrade.job_file)}: starting its "
                     "driver and checking the restore")
        self.say(f"upgrade to {upgrade.job_file}: its driver starts and checks the restore "
                 "before the running job is touched")
        log_event(logger, "upgrade_started", job_file=upgrade.job_file,
                  epochs=upgrade.epochs, request=request.id)

    def _warming(self) -> None:
        assert self.new_spare is not None and self.upgrade is not None
        state = self.new_spare.poll()
        if state == "dead":
            cause = self.new_spare.failure
            self._drop_new_spare("its check or start failed")
            self._end("refused", f"the new job {self.upgrade.job_file} cannot take the job "
                      f"over: {cause}. The running job was not touched", outcome="refused")
            return
        if state != "ready":
            return
        # the stop goes out just after an epoch committed: the old job's last epoch is then
        # the one that just ended, not one the stop waits for
        committed = last_committed_epoch(self.checkpoint)
        if self._ready is None:
            self._ready = (time.monotonic(), committed)
            return
        since, first = self._ready
        if committed == first and time.monotonic() - since < STOP_ALIGN_S:
            return
        params: dict[str, Any] = {"savepoint": self.upgrade.target or "",
                                  "reason": "exactly upgrade"}
        self.stop_request = self.control.post("stop", **params)
        self.state = "stopping"
        self._status(f"upgrading to {os.path.basename(self.upgrade.job_file)}: stopping the "
                     "old job with a savepoint")

    def _stopping(self, driver_pid: int | None) -> str:
        if self.new_spare is not None and self.new_spare.poll() == "dead":
            # killed meanwhile: the upgrade goes on with a driver from scratch
            self.say(f"the new job's driver ended while the old job stopped "
                     f"({self.new_spare.failure}); it starts from scratch")
            self._drop_new_spare("it ended")
        assert self.stop_request is not None
        answer = self.control.answer_of(self.stop_request)
        if answer is None or answer.get("status") != "done" or not answer.get("savepoint"):
            return ""  # a failed savepoint: the old driver ends by itself (after_exit)
        status = JobStatus.read(self.directory)
        if status is None or status.state != "stopped" or status.driver is None or (
                status.driver.pid != driver_pid):
            return ""
        self._old_stopped = True  # its query stopped, savepoint taken, job.json written
        return "the old driver, stopped with its savepoint for the upgrade"

    def _watching(self) -> str:
        assert self.upgrade is not None and self.epoch is not None
        failure = self._failure_since(self.started_at)
        if failure is not None:
            self.failure = failure
            self.say(f"the new job failed before it committed {self.upgrade.epochs} "
                     f"epoch(s): {failure}; rolling back")
            return "the driver of a new job that failed in its first epochs"
        committed = last_committed_epoch(self.checkpoint)
        if committed is not None and committed >= self.epoch + self.upgrade.epochs:
            self._confirmed(committed)
        return ""

    def _confirmed(self, committed: int) -> None:
        assert self.upgrade is not None and self.epoch is not None
        self._adopt_new_job()
        append_now(self.checkpoint, {"kind": "upgrade", "job_file": self.upgrade.job_file,
                                     "from_job_file": self.old_spec.job_file
                                     if self.old_spec else None,
                                     "savepoint": self.savepoint, "epoch": self.epoch,
                                     "query_id": self.query_id, "confirmed_at_epoch":
                                     committed})
        self._end("done", f"upgraded to {self.upgrade.job_file} from the savepoint "
                  f"{self.savepoint} (epoch {self.epoch}); the new job committed epochs "
                  f"{self.epoch + 1}..{committed}", outcome="upgraded",
                  savepoint=self.savepoint, epoch=self.epoch)

    def _rolling_back(self) -> None:
        assert self.query_id is not None
        if _restored(self.checkpoint, self.query_id):
            self._end("failed", f"rolled back: the new job failed before it committed "
                      f"{self.upgrade.epochs if self.upgrade else '?'} epoch(s) "
                      f"({self.failure}); the old job {self.spec.job_file} runs again from "
                      f"the savepoint {self.savepoint} (epoch {self.epoch}, --sink-rollback "
                      f"{self.upgrade.sink_rollback if self.upgrade else 'refuse'})",
                      outcome="rolled_back", savepoint=self.savepoint, epoch=self.epoch)

    # -- when the driver ended -------------------------------------------------------------
    def after_exit(self, code: int, old_spare: Callable[[], SpareDriver | None], *,
                   stopping: bool = False) -> NextDriver | None:
        """What runs after the driver ended with ``code`` (None: the launcher goes on as
        without an upgrade). ``old_spare`` hands out the old job's warm spare, for a
        rollback or a failed stop. ``stopping``: the launcher itself was told to stop (a
        SIGTERM): nothing more starts."""
        if stopping and self.request is not None:
            self._drop_new_spare("the launcher was stopped")
            self._withdraw_stop()
            self._end("failed", f"`exactly run` was stopped during the upgrade "
                      f"({self.state}); the checkpoint holds the job "
                      f"{self._holder()}: start that file", outcome="failed")
            return None
        if self.state == "warming" and self.new_spare is not None:
            self._drop_new_spare("the job's driver ended while the upgrade warmed up")
            then = ("the job ended" if code == 0 else
                    "the restart strategy decides, as without an upgrade")
            self._end("refused", f"the job's driver {describe_exit(code)} before the upgrade could "
                      f"stop it; {then}. Send the upgrade again once the job runs",
                      outcome="refused")
            return None
        if self.state == "stopping":
            return self._stopped(code, old_spare)
        if self.state == "watching" and code != 0:
            return self._roll_back(code, old_spare())
        if self.state == "watching":  # stopped as asked before its K epochs
            assert self.upgrade is not None and self.new_spec is not None
            self._adopt_new_job()
            self._end("done", f"upgraded to {self.upgrade.job_file} from the savepoint "
                      f"{self.savepoint}; the job was stopped before it committed "
                      f"{self.upgrade.epochs} epoch(s)", outcome="upgraded",
                      savepoint=self.savepoint, epoch=self.epoch)
        if self.state == "rolling-back":
            self._rolling_back()  # its restore may be done: then it rolled back
        if self.state == "rolling-back":
            later = ("the job failed" if code == JOB_FAILED else
                     "the restart strategy decides; a restarted driver finishes the restore")
            self._end("failed", f"the rollback to {self.spec.job_file} from the savepoint "
                      f"{self.savepoint}: its driver {describe_exit(code)} before its restore was "
                      f"done; {later} (exactly checkpoints {self.checkpoint})",
                      outcome="rollback_failed")
        return None

    def _stopped(self, code: int, old_spare: Callable[[], SpareDriver | None]
                 ) -> NextDriver | None:
        assert self.stop_request is not None and self.upgrade is not None
        if self._old_stopped:  # it had stopped, and was ended by the launcher (tick)
            code, self._old_stopped = 0, False
        answer = self.control.answer_of(self.stop_request) or {}
        savepoint = str(answer.get("savepoint") or "")
        if code != 0 or answer.get("status") != "done" or not savepoint:
            self._drop_new_spare("the old job did not stop with a savepoint")
            self._withdraw_stop()  # never to stop a later driver of this run
            if code != 0:  # a crash: the restart strategy decides, as without an upgrade
                self._end("failed", f"the old job's driver {describe_exit(code)} before it stopped "
                          "with the upgrade's savepoint; the restart strategy decides, as "
                          "without an upgrade", outcome="failed")
                return None
            if answer.get("status") == "failed":  # its savepoint failed: it runs again
                self._end("failed", f"the old job could not take the upgrade's savepoint "
                          f"({answer.get('detail')}); it runs again from its checkpoint",
                          outcome="failed")
                return NextDriver(self.spec, old_spare())
            # a stop or cancel of the user's came first: the job ends as they asked
            self._end("refused", "the job was stopped or cancelled before the upgrade's stop "
                      "(the job ends as asked; the upgrade did not begin)",
                      outcome="refused")
            return None
        self.savepoint, self.epoch = savepoint, _savepoint_epoch(savepoint)
        assert self.new_spec is not None and self.old_spec is not None
        # marked before the restoring driver starts: it replaces the old query's Spark files
        # with the savepoint's, as an interrupted restore is redone, and no driver without
        # that restore starts on the checkpoint
        self.query_id = mark_in_progress(self.checkpoint, savepoint, self.epoch, upgrade={
            "job_file": self.upgrade.job_file, "from_job_file": self.old_spec.job_file})
        # from here on the checkpoint is the new job's (a rollback gives it back)
        update_status(self.directory, run_id=self.spec.run_id,
                      job=os.path.basename(self.upgrade.job_file))
        self.new_spec = replace(self.new_spec, upgrade_check=None,
                                restore=self.upgrade.restore(savepoint))
        spare, self.new_spare = self.new_spare, None
        self.state, self.started_at = "watching", time.time()
        self._status(f"upgrading to {os.path.basename(self.upgrade.job_file)}: restoring the "
                     f"savepoint of epoch {self.epoch}")
        self.say(f"upgrade: the old job stopped with the savepoint {savepoint} (epoch "
                 f"{self.epoch}); the new job restores it")
        log_event(logger, "upgrade_restoring", savepoint=savepoint, epoch=self.epoch,
                  warm=spare is not None)
        return NextDriver(self.new_spec, spare)

    def _roll_back(self, code: int, spare: SpareDriver | None) -> NextDriver:
        assert self.old_spec is not None and self.upgrade is not None
        assert self.savepoint is not None and self.epoch is not None
        self.failure = self.failure or f"its driver {describe_exit(code)}"
        self.query_id = mark_in_progress(self.checkpoint, self.savepoint, self.epoch, upgrade={
            "job_file": self.old_spec.job_file, "rollback_of": self.upgrade.job_file})
        update_status(self.directory, run_id=self.spec.run_id,
                      job=os.path.basename(self.old_spec.job_file))
        rollback = replace(self.upgrade, parallelism=None, allow_non_restored_state=False)
        self.spec = replace(self.old_spec, restore=rollback.restore(self.savepoint))
        if file_digest(self.old_spec.job_file) != self._old_digest:
            self.failure += (f"; the old job file {self.old_spec.job_file} changed since the "
                             "upgrade began: the rollback runs it as it is now")
        self.state = "rolling-back"
        self._status(f"upgrade rolled back: restoring {os.path.basename(self.spec.job_file)} "
                     f"from the savepoint of epoch {self.epoch}")
        self.say(f"upgrade rolled back: the new job failed ({self.failure}); the old job "
                 f"{self.spec.job_file} restores the savepoint {self.savepoint}")
        log_event(logger, "upgrade_rolled_back", logging.WARNING, cause=self.failure,
                  savepoint=self.savepoint, warm=spare is not None)
        return NextDriver(self.spec, spare, rollback=True)

    def close(self) -> None:
        """The run ends: an upgrade still in flight is answered, its spare discarded."""
        self._drop_new_spare("the run ended", quiet=True)
        if self.request is not None:
            self._withdraw_stop()
            self._end("failed", f"the job's run ended during the upgrade (state "
                      f"{self.state}); the checkpoint holds the job {self._holder()}",
                      outcome="failed")

    # -- helpers -----------------------------------------------------------------------------
    def _adopt_new_job(self) -> None:
        """The new job file is the job's from now on: later restarts and spares run it."""
        assert self.new_spec is not None
        self.spec = self.new_spec
        self.retarget(self.spec.to_json())
        update_status(self.directory, run_id=self.spec.run_id,
                      job=os.path.basename(self.spec.job_file))

    def _failure_since(self, since: float) -> str | None:
        history = RestartHistory(self.directory, str(self.spec.run_id))
        for entry in history.entries():
            if entry.get("event") == "failure" and float(entry.get("at") or 0) >= since:
                return str(entry.get("cause") or "a failure")
        return None

    def _drop_new_spare(self, why: str, *, quiet: bool = False) -> None:
        if self.new_spare is not None:
            self.new_spare.discard(why, quiet=quiet)
            self.new_spare = None

    def _withdraw_stop(self) -> None:
        """Answer the upgrade's own stop request if no driver did: left queued, it would
        stop a later driver of this run."""
        if self.stop_request is not None and self.control.exists() and \
                self.control.answer_of(self.stop_request) is None:
            self.control.answer(self.stop_request, "refused", "withdrawn: the upgrade that "
                                "sent it ended")
        self.stop_request = None

    def _holder(self) -> str:
        status = JobStatus.read(self.directory)
        return status.job if status is not None and status.job else "?"

    def _end(self, status: str, detail: str, **extra: Any) -> None:
        # a checkpoint deleted meanwhile (a cancel with delete_on_cancellation) stays deleted
        if self.request is not None and self.control.exists():
            self.control.answer(self.request, status, detail, **extra)
        log_event(logger, "upgrade_ended", logging.INFO if status == "done" else
                  logging.WARNING, status=status, detail=detail)
        self.say(f"upgrade: {status}: {detail}")
        self.request = None
        self.state = "idle"
        self._status("")

    def _status(self, detail: str) -> None:
        update_status(self.directory, run_id=self.spec.run_id, upgrade=detail or None)

