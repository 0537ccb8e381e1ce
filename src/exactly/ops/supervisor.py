"""Run a job's query under Flink's operational policies, in the driver process.

The supervisor starts the query (:func:`exactly.ops.query.start_supervised_query`) and
watches it every ``poll_s``:

* **restarts**: a failed query is started again from its latest complete epoch in the same
  driver process (same JVM, same session) after the wait its :mod:`restart strategy
  <exactly.ops.restart>` gives; when the strategy gives up, :class:`JobFailedError` carries
  the last cause. Failures that no restart can fix (configuration, fencing, ownership, data
  loss, corrupt files) fail the job at once.
* **checkpoint timeout**: an epoch still running ``timeout`` after it started is cancelled
  (the query is stopped, which cancels its Spark jobs; the sink's protocol aborts its
  pre-commits when the query starts again) and counts as a failed checkpoint.
* **tolerable failed checkpoints**: a failed epoch (timeout or failure) is retried at once,
  not counted by the strategy, while no more than ``tolerable_failed_checkpoints`` failed in
  a row; the next one fails over to the restart strategy.
* **min pause / epoch sizing**: through the admission file (:mod:`exactly.ops.pacing`).
* **stop / cancel**: requests of the control channel (:mod:`exactly.checkpoint.control`),
  SIGTERM and Ctrl-C. A stop closes admission, lets the epoch in flight commit, then stops
  the query; ``drain`` then runs the job with ``availableNow`` until the input present now is done.
  A cancel stops at once and applies ``externalized_cleanup``.
* **manual checkpoints**: a ``checkpoint`` request (``exactly checkpoint``) is answered with
  the first epoch that starts after it and commits (:class:`_Manual`), without blocking the
  loop; the min pause is waived until that epoch starts.
* **savepoints**: a ``savepoint`` request copies the last completed epoch while the query
  keeps running; a stop with ``savepoint`` takes one after the query stopped (Flink's
  stop-with-savepoint). The answer names the savepoint's directory
  (:mod:`exactly.savepoints`).

Every failure, restart and recovery goes to the restart history (:mod:`exactly.checkpoint.restarts`)
and to the structured log.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from exactly.causes import root_cause, root_cause_of
from exactly.checkpoint.control import ControlChannel, Request, late_answer
from exactly.checkpoint.history import append_now
from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.checkpoint.spark_files import last_committed_epoch
from exactly.checkpoint.status import DELETING_DETAIL, update_status
from exactly.config import CheckpointConfig, ExternalizedCleanup
from exactly.errors import ExactlyError
from exactly.logs import log_event
from exactly.monitoring.records import failed_epoch
from exactly.ops.job import Job
from exactly.ops.restart import ExponentialDelay, RestartStrategy, restart_delay
from exactly.protocol.faults import FaultSpec

logger = logging.getLogger("exactly.ops.supervisor")

#: failures no restart can fix: the job fails at once with the cause
FATAL_ERRORS = ("ConfigError", "NotSupportedYetError", "FencedError", "OwnershipError",
                "DataLossError", "ReplannedEpochError", "CorruptFileError",
                "CorruptCheckpointFileError", "SourceNotReplayableError",
                "MalformedRecordError", "SavepointError")
#: Spark's errors of a job whose state does not fit it (a changed stateful step after a
#: restore): a restart cannot fix them either
FATAL_SPARK_CONDITIONS = ("STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
                          "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
                          "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
                          "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA")


class Outcome(str, Enum):
    """How a supervised job ended without failing."""

    FINISHED = "finished"  # a bounded input was drained
    STOPPED = "stopped"
    DRAINED = "drained"
    CANCELLED = "cancelled"


class JobFailedError(ExactlyError):
    """The restart strategy gave up (or the failure cannot be fixed by a restart)."""


class DriverLostError(ExactlyError):
    """The driver's JVM (on Spark Connect: the server) is gone or unresponsive: only a new
    driver process can go on (on Connect: it reconnects, once the server is back)."""


#: seconds past one trigger interval after which a manual checkpoint that saw no epoch start
#: (and the query idle, no data available) is answered as "nothing new arrived"
NOTHING_NEW_SLACK_S = 1.0


@dataclass
class _Manual:
    """A manual checkpoint being waited for: the answer is the first epoch newer than
    ``boundary`` (the newest epoch Spark had logged offsets for when the request was taken,
    committed or in flight: an epoch in flight does not count) that commits."""

    request: Request
    boundary: int
    #: monotonic time since which no epoch was in flight (None: one is)
    settled_at: float | None = None


@dataclass
class _Watch:
    """What one started query ended with."""

    kind: str  # stopped | drain | cancelled | finished | query | checkpoint-timeout
    cause: str = ""
    epoch_in_flight: bool = False


def default_strategy() -> RestartStrategy:
    """exponential-delay with Flink's defaults, Flink's choice when checkpointing is on."""
    return ExponentialDelay()


def is_fatal(cause_text: str) -> bool:
    """Whether a failure's text shows one of :data:`FATAL_ERRORS` as its root cause."""
    cause = root_cause(cause_text)
    return cause.split(":", 1)[0].strip() in FATAL_ERRORS or any(
        condition in cause_text for condition in FATAL_SPARK_CONDITIONS)


def driver_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the Spark driver is gone:
    this process's JVM (Py4J), or the Spark Connect server (:func:`connect_server_lost`)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        if name in ("Py4JNetworkError", "ConnectionRefusedError", "BrokenPipeError") or (
                name == "Py4JError" and "Java side" in str(current)):
            return True
        if connect_server_lost(current):
            return True
        current = current.__cause__ or current.__context__
    return False


#: gRPC status codes of a Spark Connect call the server did not answer (after the client's
#: retries, :data:`exactly.spark.connect.RETRY_SECONDS`): down, restarting, unreachable, hung
CONNECT_LOST_STATUS = ("UNAVAILABLE", "DEADLINE_EXCEEDED")
#: Spark's error conditions of a session the server no longer has: it restarted (a new
#: server-side session behind the same session id) or dropped it
CONNECT_LOST_CONDITIONS = ("INVALID_HANDLE.SESSION_CHANGED", "INVALID_HANDLE.SESSION_NOT_FOUND",
                           "INVALID_HANDLE.SESSION_CLOSED", "NO_ACTIVE_SESSION")


def connect_server_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a Spark Connect client's word that its server is gone or restarted
    (a new driver process reconnects and resumes from the checkpoint); a query's own failure
    reported through Connect is not."""
    if not type(exc).__module__.startswith("pyspark."):
        return False
    status = getattr(exc, "getGrpcStatusCode", None)
    if status is not None and getattr(status(), "name", "") in CONNECT_LOST_STATUS:
        return True
    condition = getattr(exc, "getCondition", None)
    if condition is not None and (condition() or "") in CONNECT_LOST_CONDITIONS:
        return True
    # the client checks every answer's server-side session id: a restarted server's differs
    return type(exc).__name__ == "PySparkAssertionError" and (
        "server side session identifier" in str(exc))


class Supervisor:
    """Runs one :class:`Job` until it is stopped, cancelled, finished or failed."""

    def __init__(self, job: Job, *, strategy: RestartStrategy | None = None,
                 run_id: str, poll_s: float = 0.2, stop_timeout_s: float = 600.0,
                 pacer: Any = None, rng: random.Random | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 operators: list[Any] | None = None, fault: FaultSpec | None = None,
                 ha: bool = False) -> None:
        if job.checkpoint.is_memory_storage:
            raise ExactlyError(
                "a supervised job needs a durable checkpoint: its address for stop/cancel and "
                "what every restart resumes from. Give CheckpointConfig(storage=DIR) or "
                "`exactly run --checkpoint DIR`"
            )
        self.job = job
        self.config: CheckpointConfig = job.checkpoint
        self.strategy = strategy or job.restart_strategy or default_strategy()
        self.directory = job_store(self.config.storage)
        self.control = ControlChannel(self.config.storage)
        self.history = RestartHistory(self.directory, run_id)
        self.run_id = run_id
        self.poll_s = poll_s
        self.stop_timeout_s = stop_timeout_s
        self.pacer = pacer
        self.rng = rng or random.Random()
        self._sleep = sleep
        self.consecutive_failed = 0
        self.last_epoch: int | None = last_committed_epoch(self.config.storage)
        self._seen_batch = -1
        self._pending_failure_at: float | None = self._unrecovered_failure()
        self._local: Request | None = None  # a stop/cancel from a signal
        self._taken: set[str] = set()  # requests being handled (not answered yet)
        self._heartbeat_at = 0.0
        self._job_operators = operators  # for savepoints (uid -> operator number)
        self.fault = fault  # armed at the savepoint points (exactly run --fault)
        #: run by an ``exactly run --ha`` leader: a FencedError is the previous leader's
        #: driver still holding a sink's lease (a failover), restarted as the strategy says
        self.ha = ha
        self._manual: list[_Manual] = []  # manual checkpoints not answered yet

    # -- public ---------------------------------------------------------------------------
    def request_stop(self, *, cancel: bool = False) -> None:
        """Ask for a graceful stop (SIGTERM, Ctrl-C); a second request cancels."""
        action = "cancel" if cancel or (self._local and self._local.action == "stop") else "stop"
        self._local = Request(f"signal-{time.time_ns()}", action, {}, time.time())

    def run(self) -> Outcome:
        """Start the query and keep it running; returns how it ended.

        Raises JobFailedError with the last cause when the strategy gives up or the failure
        is fatal, and DriverLostError when the JVM is gone (the launcher restarts the
        process).
        """
        self._status("running")
        drain = end_of_time = False
        while True:
            request = self._next_request()
            if request is not None and request.action == "cancel":
                return self._cancelled(request, None)
            if request is not None and request.action == "savepoint":
                self._savepoint(request, stopping=False)
                request = None
            if request is not None and request.action == "checkpoint":
                self._begin_manual(request)
                request = None
            if request is not None:  # a stop before the query runs: nothing in flight
                if not request.params.get("drain"):
                    self._stopped(request, "stopped before the query started, after epoch "
                                           f"{self.last_epoch}")
                    return self._ended(Outcome.STOPPED)
                drain, self._handled = True, request
            try:
                query = self._start(available_now=drain)
            except Exception as exc:
                if driver_lost(exc):
                    raise DriverLostError(f"the Spark driver is gone: {exc}") from exc
                self._failure("start", "".join(_format(exc)), epoch_in_flight=False)
                continue
            watch = self._watch(query, draining=drain)
            if watch.kind == "cancelled":
                return self._cancelled(self._handled, query)
            if watch.kind == "stopped":
                self._stopped(self._handled, f"stopped after epoch {self.last_epoch}")
                return self._ended(Outcome.STOPPED)
            if watch.kind == "drain":
                drain = True
                continue
            if watch.kind == "finished":
                if drain and not end_of_time:
                    end_of_time = True
                    if self._advance_watermark_to_end():
                        continue  # replay the logged final epoch: every window fires
                if drain:
                    detail = ("drained, watermark advanced to the end of time; stopped "
                              f"after epoch {self.last_epoch}")
                    self._end_detail = self._end_detail or detail  # job.json says so too
                    self._stopped(self._handled, detail)
                    return self._ended(Outcome.DRAINED)
                return self._ended(Outcome.FINISHED)
            self._failure(watch.kind, watch.cause, epoch_in_flight=watch.epoch_in_flight)

    def _advance_watermark_to_end(self) -> bool:
        """Log the drain's final epoch (no input, watermark at the end of time) after the
        drained run stopped; True when the query must start once more to replay it.

        Raises what :func:`append_end_of_time_epoch` raises (a corrupt or busy offset log):
        the drain then fails loudly instead of stopping with windows never emitted."""
        from exactly.checkpoint.spark_files import append_end_of_time_epoch

        epoch = append_end_of_time_epoch(self.config.storage)
        if epoch is None:
            return False
        log_event(logger, "drain_end_of_time", run=self.run_id, epoch=epoch)
        return True

    # -- starting and watching ------------------------------------------------------------
    def _start(self, *, available_now: bool):
        from exactly.ops.query import start_supervised_query

        job = self.job
        if self.pacer is not None:
            self.pacer.open()
        query = start_supervised_query(job.df, sink_format=job.sink_format, checkpoint=self.config,
                            path=job.path, options=dict(job.options),
                            query_name=job.query_name, available_now=available_now,
                            output_mode=job.output_mode,
                            accept_at_most_once=job.accept_at_most_once)
        log_event(logger, "query_supervised", run=self.run_id, query_id=str(query.query.id),
                  available_now=available_now, strategy=self.strategy.describe())
        return query

    _handled: Request | None = None

    def _watch(self, exq, *, draining: bool) -> _Watch:
        query = exq.query
        active_since: float | None = None
        timeout = self.config.timeout_seconds
        try:
            while True:
                request = self._next_request()
                if request is not None and request.action == "savepoint":
                    self._savepoint(request, stopping=False)
                    request = None
                if request is not None and request.action == "checkpoint":
                    self._begin_manual(request)
                    request = None
                if self._manual:
                    self._check_manual(query)
                if request is not None:
                    self._handled = request
                    if request.action == "cancel":
                        exq.halt()
                        return _Watch("cancelled")
                    cancel = self._graceful_stop(exq)
                    if cancel is not None:  # a cancel cut the graceful stop short
                        self._answer(request, "done", "cancelled before it completed",
                                     last_epoch=self.last_epoch)
                        self._handled = cancel
                        return _Watch("cancelled")
                    if draining:  # already draining: a stop just stops
                        return _Watch("stopped")
                    return _Watch("drain" if request.params.get("drain") else "stopped")
                if not query.isActive:
                    exq.run_ended()  # its sink leases released before any restart
                    self._collect_progress(query)
                    error = query.exception()
                    if error is not None:
                        return _Watch("query", "".join(_format(error)),
                                      epoch_in_flight=True)
                    return _Watch("finished")
                now = time.monotonic()
                if self._collect_progress(query):
                    active_since = None
                trigger_active = bool(query.status.get("isTriggerActive"))
                if not trigger_active:
                    active_since = None
                elif active_since is None:
                    active_since = now
                if timeout is not None and active_since is not None and (
                        now - active_since > timeout):
                    epoch = (self.last_epoch + 1) if self.last_epoch is not None else 0
                    log_event(logger, "checkpoint_timeout", logging.WARNING, epoch=epoch,
                              timeout_s=timeout)
                    exq.halt()
                    cause = (f"CheckpointTimeout: epoch {epoch} did not complete within "
                             f"timeout={self.config.timeout!r}; it was cancelled")
                    wall = time.time()
                    append_now(self.config.storage, failed_epoch(
                        self.config.storage, epoch, failure="checkpoint-timeout", cause=cause,
                        at=wall, query_id=str(query.id),
                        trigger_at=wall - (now - active_since)))
                    return _Watch("checkpoint-timeout", cause, epoch_in_flight=True)
                self._beat()
                self._sleep(self.poll_s)
        except Exception as exc:
            if driver_lost(exc):
                raise DriverLostError(f"the Spark driver is gone: {exc}") from exc
            raise

    def _collect_progress(self, query) -> bool:
        """Feed new epochs' progress to the pacer; True when an epoch completed."""
        last = query.lastProgress
        if last is None:
            return False
        latest = _progress_dict(last)
        if int(latest.get("batchId", -1)) <= self._seen_batch or not _ran(latest):
            return False
        recent = [_progress_dict(p) for p in query.recentProgress]
        new = [p for p in recent if int(p.get("batchId", -1)) > self._seen_batch and _ran(p)]
        seen_before = self._seen_batch
        for progress in sorted(new, key=lambda p: int(p.get("batchId", -1))):
            batch_id = int(progress.get("batchId", -1))
            if batch_id <= self._seen_batch:
                continue  # idle progress reports repeat the last batch id
            self._seen_batch = batch_id
            if self.pacer is not None:
                self.pacer.observe_progress(progress)
        if self._seen_batch > seen_before:
            self.last_epoch = self._seen_batch
            self.consecutive_failed = 0
            if self._pending_failure_at is not None:
                recovery = time.time() - self._pending_failure_at
                self.history.append("recovered", epoch=self.last_epoch,
                                    recovery_s=round(recovery, 3))
                log_event(logger, "recovered", epoch=self.last_epoch,
                          recovery_s=round(recovery, 3))
                self._pending_failure_at = None
            return True
        return False

    def _graceful_stop(self, exq) -> Request | None:
        """Let the epoch in flight commit, admit no new one, then stop the query. A cancel
        arriving meanwhile stops the query at once: returns that request (else None)."""
        from exactly.checkpoint.spark_files import batch_numbers
        from exactly.spark.connect import is_connect

        query = exq.query
        self._status("stopping")
        if is_connect(query):
            return self._stop_between_epochs(exq)
        if self.pacer is not None:
            self.pacer.close_admission()
        location = self.config.storage
        grace_until = time.monotonic() + self.config.interval_seconds + 0.5
        deadline = time.monotonic() + self.stop_timeout_s
        quiet = 0
        cancel = None
        while query.isActive:
            cancel = self._cancel_during_stop()
            if cancel is not None:
                break
            self._collect_progress(query)
            offsets = batch_numbers(location, "offsets")
            commits = batch_numbers(location, "commits")
            settled = (offsets[-1:] == commits[-1:]
                       and not query.status.get("isTriggerActive"))
            quiet = quiet + 1 if settled else 0
            if quiet >= 2 and time.monotonic() >= grace_until:
                break
            if self._stop_timed_out(deadline):
                break
            self._sleep(min(self.poll_s, 0.1))
        exq.halt()
        self._collect_progress(query)
        if self.pacer is not None:
            self.pacer.reopen()
        return cancel

    def _stop_between_epochs(self, exq) -> Request | None:
        """:meth:`_graceful_stop` of a query on Spark Connect. Its sources run in the server,
        whose Python workers cannot read the admission file (they inherit the server's
        environment), so no stop can hold the next epoch back: the query is stopped as soon
        as its epoch in flight committed (the checkpoint's offset and commit logs end at the
        same epoch), watched in the checkpoint's files rather than through the server so as
        not to miss the gap before the next trigger. An epoch that started meanwhile is
        aborted by the stop and replayed at the next start."""
        from exactly.checkpoint.spark_files import batch_numbers

        query = exq.query
        location = self.config.storage
        deadline = time.monotonic() + self.stop_timeout_s
        cancel = None
        looks = 0
        while True:
            cancel = self._cancel_during_stop()
            if cancel is not None:
                break
            if batch_numbers(location, "offsets")[-1:] == batch_numbers(location, "commits")[-1:]:
                break
            if self._stop_timed_out(deadline):
                break
            looks += 1
            if looks % 20 == 0 and not query.isActive:  # a call to the server: now and then
                break
            self._sleep(0.05)
        exq.halt()
        self._collect_progress(query)
        return cancel

    def _cancel_during_stop(self) -> Request | None:
        """A cancel that arrived during a graceful stop (logged: the epoch is aborted)."""
        cancel = self._take_cancel()
        if cancel is not None:
            log_event(logger, "stop_cancelled", logging.WARNING,
                      detail="a cancel arrived during the graceful stop: the epoch in "
                             "flight is aborted")
        return cancel

    def _stop_timed_out(self, deadline: float) -> bool:
        """Whether a graceful stop ran past ``deadline`` (logged: the epoch is replayed)."""
        if time.monotonic() <= deadline:
            return False
        log_event(logger, "stop_timeout", logging.WARNING,
                  detail="the epoch in flight did not complete; it is cancelled and "
                         "replayed at the next start", stop_timeout_s=self.stop_timeout_s)
        return True

    def _take_cancel(self) -> Request | None:
        """A cancel waiting to be handled (a second signal, or ``exactly cancel``)."""
        if self._local is not None and self._local.action == "cancel":
            request, self._local = self._local, None
            return request
        for request in self._open_requests():
            if request.action == "cancel":
                self._taken.add(request.id)
                return request
        return None

    # -- manual checkpoints ---------------------------------------------------------------
    def _begin_manual(self, request: Request) -> None:
        """Take a ``checkpoint`` request: its boundary is the newest epoch with offsets now
        (an epoch in flight does not count); the min pause is waived until an epoch past
        the boundary starts. Answered later by :meth:`_check_manual`."""
        from exactly.checkpoint.spark_files import batch_numbers

        offsets = batch_numbers(self.config.storage, "offsets")
        boundary = offsets[-1] if offsets else -1
        self._manual.append(_Manual(request, boundary))
        if self.pacer is not None:
            self.pacer.waive_pause(True)
        log_event(logger, "manual_checkpoint_requested", request=request.id,
                  after_epoch=boundary)

    def _check_manual(self, query: Any) -> None:
        """Answer the manual checkpoints whose epoch committed (``done`` with ``epoch``), or
        that saw no epoch start for one trigger interval (+ :data:`NOTHING_NEW_SLACK_S`)
        after the query settled with no data available (``done``, ``nothing_new``: the last
        committed epoch already holds the state). Restores the min pause once every one of
        them has its epoch started. Never blocks."""
        from exactly.checkpoint.spark_files import batch_numbers

        location = self.config.storage
        offsets = batch_numbers(location, "offsets")
        commits = batch_numbers(location, "commits")
        now = time.monotonic()
        waiting: list[_Manual] = []
        for manual in self._manual:
            done = [c for c in commits if c > manual.boundary]
            if done:
                self._answer_manual(manual, done[0])
                continue
            started = bool(offsets) and offsets[-1] > manual.boundary
            settled = not started and offsets[-1:] == commits[-1:]
            if not settled:
                manual.settled_at = None
            elif manual.settled_at is None:
                manual.settled_at = now
            status = query.status if manual.settled_at is not None else {}
            if (manual.settled_at is not None
                    and now - manual.settled_at > self.config.interval_seconds
                    + NOTHING_NEW_SLACK_S
                    and not status.get("isTriggerActive")
                    and not status.get("isDataAvailable")):
                self._answer_manual(manual, commits[-1] if commits else None,
                                    nothing_new=True)
                continue
            waiting.append(manual)
        self._manual = waiting
        if self.pacer is not None:
            newest = offsets[-1] if offsets else -1
            self.pacer.waive_pause(any(m.boundary >= newest for m in waiting))

    def _answer_manual(self, manual: _Manual, epoch: int | None, *,
                       nothing_new: bool = False) -> None:
        """Answer one manual checkpoint; a committed epoch of its own is recorded in the
        history as ``manual_checkpoint`` (the views mark that epoch ``trigger: manual``)."""
        request = manual.request
        if nothing_new:
            after = f"epoch {epoch}" if epoch is not None else "the start (no epoch yet)"
            detail = (f"nothing new arrived since {after}: no epoch ran, the state is "
                      "already checkpointed")
        else:
            detail = f"manual checkpoint: epoch {epoch} committed"
            append_now(self.config.storage, {
                "kind": "manual_checkpoint", "epoch": epoch, "request": request.id,
                "requested_at": request.requested_at, "trigger": "manual"})
        self._answer(request, "done", detail, epoch=epoch, nothing_new=nothing_new,
                     last_epoch=self.last_epoch)
        log_event(logger, "manual_checkpoint", request=request.id, epoch=epoch,
                  nothing_new=nothing_new)

    def _end_manual(self, outcome: str) -> None:
        """Answer the manual checkpoints still waiting when the job ends: ``done`` when
        their epoch committed meanwhile, else ``refused``."""
        from exactly.checkpoint.spark_files import batch_numbers

        commits = batch_numbers(self.config.storage, "commits")
        for manual in self._manual:
            done = [c for c in commits if c > manual.boundary]
            if done:
                self._answer_manual(manual, done[0])
            else:
                self._answer(manual.request, *late_answer(manual.request, outcome,
                                                          self.last_epoch),
                             last_epoch=self.last_epoch)
        self._manual = []

    # -- savepoints -----------------------------------------------------------------------
    def _stopped(self, request: Request | None, detail: str) -> None:
        """Answer a stop (and take its savepoint when it asked for one)."""
        reason = request.params.get("reason") if request is not None else None
        if reason:  # a stop the driver sent itself: say why in job.json too
            detail = f"{reason}; {detail}"
            self._end_detail = detail
        if request is not None and request.params.get("savepoint") is not None:
            self._savepoint(request, stopping=True, detail=detail)
            return
        self._answer(request, "done", detail, last_epoch=self.last_epoch)

    def _savepoint(self, request: Request, *, stopping: bool, detail: str = "") -> None:
        """Take a savepoint of the last completed epoch and answer ``request`` with its
        path; a failure is answered (the job goes on, or stops as asked) and logged."""
        from exactly.ops.job_savepoints import default_target, take_job_savepoint

        target = request.params.get("savepoint") or request.params.get("target") or \
            self.config.savepoint_dir or str(default_target(self.config.storage))
        prefix = f"{detail}; " if detail else ""
        try:
            path = take_job_savepoint(self.job, target,
                                      trigger="stop" if stopping else "savepoint",
                                      operators=self._operators(), fault=self.fault)
        except Exception as exc:
            cause = root_cause_of(exc)
            log_event(logger, "savepoint_failed", logging.WARNING, cause=cause)
            self._answer(request, "failed", f"{prefix}savepoint failed: {cause}",
                         last_epoch=self.last_epoch)
            return
        self._answer(request, "done", f"{prefix}savepoint {path}", savepoint=str(path),
                     last_epoch=self.last_epoch)

    def _operators(self):
        from exactly.savepoints.operators import job_operators

        if self._job_operators is None:
            self._job_operators = job_operators(self.job.df)
        return self._job_operators

    # -- failures -------------------------------------------------------------------------
    def _failure(self, kind: str, text: str, *, epoch_in_flight: bool) -> None:
        """Record a failure and wait as the strategy says; raises JobFailedError when the
        strategy gives up (on its own terms, or on a cause repeated ``max-repeated-cause``
        times in a row) or the failure is fatal. Every entry records ``repeats``."""
        cause = root_cause(text)
        now = time.time()
        repeats = self.history.repeats(cause)  # before this failure is appended
        if self._pending_failure_at is None:
            self._pending_failure_at = now
        tolerable = self.config.tolerable_failed_checkpoints
        if is_fatal(text) and not (self.ha and root_cause(text).startswith("FencedError")):
            self.history.append("failure", kind=kind, cause=cause, action="give-up",
                                fatal=True, repeats=repeats)
            self._status("failed", cause)
            raise JobFailedError(f"{cause} (not restarted: a restart cannot fix this)")
        if epoch_in_flight:
            self.consecutive_failed += 1
            if self.consecutive_failed <= tolerable:
                self.history.append("failure", kind=kind, cause=cause, action="tolerated",
                                    consecutive=self.consecutive_failed, tolerable=tolerable,
                                    repeats=repeats)
                log_event(logger, "failed_checkpoint_tolerated", logging.WARNING, kind=kind,
                          cause=cause, consecutive=self.consecutive_failed,
                          tolerable=tolerable, repeats=repeats)
                return
        delay, repeated = restart_delay(
            self.strategy, [*self.history.counted_failure_times(), now], repeats, self.rng)
        self.consecutive_failed = 0
        action = "restart" if delay is not None else "give-up"
        reason = {"reason": repeated} if repeated else {}
        entry = self.history.append("failure", kind=kind, cause=cause, action=action,
                                    delay=delay, strategy=self.strategy.describe(),
                                    repeats=repeats, **reason)
        restarts = self.history.restarts()
        log_event(logger, "restart" if delay is not None else "gave_up",
                  logging.WARNING if delay is not None else logging.ERROR, kind=kind,
                  cause=cause, delay_s=delay, restarts=restarts, repeats=repeats,
                  at=entry["at"], **reason)
        if repeated:
            self._status("failed", cause)
            raise JobFailedError(f"{repeated}: {cause} (restart strategy "
                                 f"{self.strategy.describe()} gave up)")
        if delay is None:
            self._status("failed", cause)
            raise JobFailedError(f"{cause} (restart strategy {self.strategy.describe()} "
                                 f"gave up after {restarts} restart(s))")
        self._status("restarting", cause)
        self._wait(delay)

    def _wait(self, seconds: float) -> None:
        """Sleep before a restart; a stop or cancel request cuts the wait short."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if self._peek_request():
                return
            self._sleep(min(self.poll_s, max(0.0, until - time.monotonic())))

    def _unrecovered_failure(self) -> float | None:
        """The time of this run's last failure when no epoch completed after it (a new
        driver process after a process failure records its recovery time)."""
        last_failure = None
        for entry in self.history.entries():
            if entry.get("event") == "failure":
                last_failure = float(entry.get("since") or entry["at"])
            elif entry.get("event") == "recovered":
                last_failure = None
        return last_failure

    # -- requests and status --------------------------------------------------------------
    def _peek_request(self) -> bool:
        """A stop, cancel or savepoint waiting (a manual checkpoint does not cut a restart's
        wait short: it waits for the restarted query's first epoch)."""
        return self._local is not None or any(
            r.action != "checkpoint" for r in self._open_requests())

    def _next_request(self) -> Request | None:
        if self._local is not None:
            request, self._local = self._local, None
            return request
        for request in self._open_requests():
            self._taken.add(request.id)
            return request
        return None

    def _open_requests(self) -> list[Request]:
        """Pending requests this driver has not taken (a drain is answered only when it
        ends), oldest first, without those sent to an earlier run that ended."""
        return [r for r in self.control.pending()
                if r.id not in self._taken and not self._answered_for_an_ended_run(r)]

    def _answered_for_an_ended_run(self, request: Request) -> bool:
        """True, once answered, for a command sent to an earlier run that ended before
        reading it (a stop sent while that run stopped by itself): answered as that run
        would have, not acted on, so it never stops this run. An HA leader acts on requests
        sent to the previous leader's run: that run did not end, it failed over."""
        if request.to_run is None or self.ha or not self.run_id or request.to_run == self.run_id:
            return False
        status, detail = late_answer(request, "ended", self.last_epoch)
        self.control.answer(request, status, f"{detail} (it was sent to run {request.to_run}; "
                            f"run {self.run_id} goes on)", last_epoch=self.last_epoch)
        return True

    def _answer(self, request: Request | None, status: str, detail: str, **extra) -> None:
        if request is not None and not request.id.startswith("signal-"):
            self.control.answer(request, status, detail, **extra)

    def _cancelled(self, request: Request | None, exq) -> Outcome:
        delete = self.config.externalized_cleanup is ExternalizedCleanup.DELETE_ON_CANCELLATION
        self._answer(request, "done", "cancelled" + ("; checkpoint deleted" if delete else ""),
                     last_epoch=self.last_epoch, checkpoint_deleted=delete)
        # with delete: the commands still waiting must not answer their requests themselves
        # into the checkpoint being deleted (ControlChannel.wait_answer)
        self._status("cancelled", DELETING_DETAIL if delete else "")
        if exq is not None:
            exq.halt()
        self._abort_in_flight()
        if not delete:
            self._answer_late_requests("cancelled")
        if delete:
            from exactly.checkpoint.location import delete_checkpoint

            delete_checkpoint(self.config.storage)
        log_event(logger, "cancelled", checkpoint_deleted=delete, last_epoch=self.last_epoch)
        return Outcome.CANCELLED

    def _abort_in_flight(self) -> None:
        """After a cancel: run the protocol's recovery now -- finish what a commit decision
        covers, abort what the cancelled epoch pre-committed (staged files, prepared
        transactions, open Kafka transactions) -- so nothing is left on the target, even when
        the checkpoint is deleted and the query never starts again."""
        from exactly import options as opt
        from exactly.checkpoint.store import open_log_store
        from exactly.ops.query import with_sink_log_dir
        from exactly.protocol.committer import Committer
        from exactly.spark.formats import sink_for

        job = self.job
        if not job.sink_format.lower().startswith("exactly."):
            return  # not a sink of exactly's: nothing of the protocol to clean up
        options = with_sink_log_dir(self.config.storage, job.options)
        if job.path:
            options[opt.PATH] = job.path
        options[opt.CHECKPOINT_LOCATION] = self.config.storage
        options[opt.MODE] = self.config.mode.value
        try:
            built = sink_for(job.sink_format, options)
            data = open_log_store(built.sink.log_directory).read("query.json")
            owner = json.loads(data) if data else None
            if isinstance(owner, dict) and owner.get("query_id"):
                Committer(built.sink, built.settings).recover(str(owner["query_id"]))
        except Exception as exc:  # the sink's next start recovers; say why not now
            log_event(logger, "cancel_cleanup_failed", logging.WARNING, error=repr(exc),
                      detail="the next start of this query aborts the leftovers")

    _end_detail = ""

    def _ended(self, outcome: Outcome) -> Outcome:
        self._status(outcome.value if outcome is not Outcome.DRAINED else "stopped",
                     self._end_detail)
        self._answer_late_requests(outcome.value)
        log_event(logger, "job_ended", outcome=outcome.value, last_epoch=self.last_epoch,
                  restarts=self.history.restarts())
        return outcome

    def _answer_late_requests(self, outcome: str) -> None:
        """Answer what arrived after the job began to end, so no command waits in vain."""
        self._end_manual(outcome)
        for request in self.control.pending():
            if request.id not in self._taken:
                self.control.answer(request, *late_answer(request, outcome, self.last_epoch),
                                    last_epoch=self.last_epoch)

    def _beat(self) -> None:
        if time.monotonic() - self._heartbeat_at >= 2.0:
            self._status("running")

    def _status(self, state: str, detail: str = "") -> None:
        self._heartbeat_at = time.monotonic()
        update_status(self.directory, run_id=self.run_id, state=state, detail=detail,
                      last_epoch=self.last_epoch,
                      restarts=self.history.restarts())


def _ran(progress: dict[str, Any]) -> bool:
    """Whether a progress report is of an epoch that ran (idle reports, sent while no new
    data arrives, carry the *next* epoch's id and no ``addBatch`` time)."""
    return "addBatch" in (progress.get("durationMs") or {})


def _progress_dict(progress: Any) -> dict[str, Any]:
    import json

    if isinstance(progress, dict):
        return progress
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        return json.loads(text)
    return dict(progress)


def _format(exc: BaseException) -> list[str]:
    import traceback

    return traceback.format_exception(exc)
