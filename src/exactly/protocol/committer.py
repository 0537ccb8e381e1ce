"""The generic driver side of the commit protocol (docs/design.md section 3), written once.

Spark calls the sink's ``commit(messages, epoch)`` after every task of the epoch returned
its handle, and writes its own commit log for the epoch only after that call returns. A
crash between the two makes Spark run the epoch again after a restart, with the same input
positions, so the first commit of every run is where recovery happens:

* the run takes the lease (fencing) -- a first commit of a new run then recovers:
  it finishes every intent without a completion and aborts every pre-commit of the
  query that no intent names (failed attempts, a crash before the intent);
* epoch already complete -> the call is a replay if its input (Spark's ``offsets/N``) is
  the one the epoch was committed with: abort its new handles; over different input it is
  a re-planned epoch: refuse with ReplannedEpochError (see exactly.protocol.epoch_identity);
* otherwise write the intent (from here on the epoch *will* commit), commit every
  handle, publish the epoch, record it complete.

Races, case by case:
* crash before the intent: no intent, recovery aborts the old handles, Spark replays the
  epoch and the replay's handles commit.
* crash after the intent, before or between handle commits, or before "complete":
  recovery commits the intent's handles (each commit is idempotent) and marks the epoch
  complete; the replay then finds it complete and aborts its own handles.
* crash after "complete", before Spark's commit log: the replay finds it complete.
* a second live instance: it fails to take the lease and raises FencedError before it
  writes an intent; its handles are aborted by Spark's abort call or by later recovery.
* a holder that passed its lease check (2b) and stopped before writing the intent, then
  lost the lease (paused past ``stale_after``, or the new holder's clock ran ahead): the
  check recorded the intent in the lease, and the new holder's recovery writes the intent
  file before it aborts orphans, so the epoch commits the handles the old holder decided;
  if the old holder resumes, its intent write finds that same intent (or a later holder's).
* Spark's ``abort`` for an epoch that has an intent does nothing: the intent wins.
* Spark re-planned a completed epoch over other input (offsets/N deleted or rewritten):
  the new handles are aborted and ReplannedEpochError names both inputs; an intent of
  this run for the old input is finished first (it decided that epoch).

Replays, recoveries, orphan aborts and fencing are logged at WARNING: they are rare, and an
operator should see each one.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from exactly.checkpoint.sink_leases import note_lease
from exactly.config import Mode
from exactly.errors import ExactlyError, FencedError
from exactly.logs import ensure_console, log_event
from exactly.procs import driver_identity
from exactly.protocol.commitlog import CommitLog, Intent
from exactly.protocol.contract import CommitOutcome, Handle, SinkSettings, TwoPhaseCommitSink
from exactly.protocol.epoch_identity import input_record, replanned_error, same_input
from exactly.protocol.faults import FaultPoint, FaultSpec, maybe_crash
from exactly.protocol.lease import Lease

logger = logging.getLogger("exactly.committer")


class Committer:
    """Runs the commit protocol for one sink."""

    def __init__(self, sink: TwoPhaseCommitSink, settings: SinkSettings,
                 fault: FaultSpec | None = None) -> None:
        self.sink = sink
        self.settings = settings
        self.fault = fault
        self.log = CommitLog(sink.log_directory, sink.payload_type)
        self.lease = Lease(sink.log_directory, stale_after=settings.lease_stale_after)
        #: the (query, run) this committer has begun: an epoch begins its run once
        self._begun: tuple[str, str] | None = None
        #: (run, epoch) of the last epoch this committer completed for its run
        self._last_done: tuple[str, int] | None = None
        #: the log's completed epochs, listed once by the first prune, then kept up to date
        self._completed: list[int] | None = None
        ensure_console()  # driver-side workers have no logging set up: warnings must show

    # -- steps 4 and 5 ----------------------------------------------------------------
    def begin_run(self, query_id: str, run_id: str, keep: Sequence[Handle] = ()) -> bool:
        """Bind the sink to ``query_id``, take the lease for ``run_id`` (FencedError if
        another live driver holds it) and, when this run is new, recover. True if new."""
        self.log.claim_owner(query_id)
        with self._fencing(run_id):
            new = self.lease.acquire(run_id, driver_identity())
            if self.lease.keep(run_id):  # heartbeat until the run ends (exactly.spark.run_end)
                self._note_lease()
            self.sink.open_run(query_id, run_id)
            self._begun = (query_id, run_id)
            if not new:
                return False
            self.recover(query_id, keep=keep)
            return True

    def _note_lease(self) -> None:
        """Note where this sink's lease is in the query's checkpoint, so that the driver
        releases it when the run ends even when this process (a sink-runner worker of
        Spark's) never learns of that (:mod:`exactly.checkpoint.sink_leases`)."""
        checkpoint = self.settings.checkpoint_location
        if not checkpoint:
            return
        try:
            note_lease(checkpoint, str(self.lease.directory))
        except Exception as exc:  # a hint only: the lease goes stale instead
            log_event(logger, "lease_not_noted", logging.WARNING, sink=self.sink.name,
                      checkpoint=checkpoint, error=repr(exc),
                      effect="when this run ends its lease goes stale instead of being "
                             "released at once")

    @contextmanager
    def _fencing(self, run_id: str) -> Iterator[None]:
        """Log a FencedError raised inside (WARNING ``fenced``, naming the error) before it
        leaves the committer, whichever check noticed the fence first: taking the lease, the
        intent check, the intent written first by another run, or the target's own fencing
        (a newer Kafka producer, a Delta conflict). The console says why the epoch failed
        before the query fails."""
        try:
            yield
        except FencedError as exc:
            log_event(logger, "fenced", logging.WARNING, sink=self.sink.name, run_id=run_id,
                      error=type(exc).__name__, detail=str(exc))
            raise

    def ensure_run(self, query_id: str, run_id: str) -> None:
        """:meth:`begin_run` unless this committer has begun ``run_id`` already: a committer
        kept across the epochs of a run (``foreachBatch``) checks owner and lease, and
        recovers, once per run; fencing still holds at every epoch's intent check (2b)."""
        if self._begun != (query_id, run_id):
            self.begin_run(query_id, run_id)
        else:
            self.sink.open_run(query_id, run_id)  # the contract: before every commit

    # -- step 2 ----------------------------------------------------------------------
    def commit_epoch(self, epoch: int, handles: Sequence[Handle], *,
                     pre_commit_ms: float | None = None) -> None:
        """Commit epoch ``epoch`` exactly once, whatever happened to earlier attempts.

        ``pre_commit_ms`` (the slowest task's pre-commit) is kept in the completion record
        for the checkpoint history; it changes nothing in the protocol."""
        started = time.perf_counter()
        steps = _Steps(started)
        if self.settings.mode is Mode.AT_LEAST_ONCE:
            # Data became visible inside the tasks; only the crash points remain, so the
            # same fault schedule can run in both modes.
            if handles:
                self.log.claim_owner(self._identity(handles)[0])
            for point in (FaultPoint.BEFORE_INTENT, FaultPoint.AFTER_INTENT,
                          FaultPoint.BETWEEN_COMMITS, FaultPoint.AFTER_COMMITS,
                          FaultPoint.AFTER_COMPLETE):
                maybe_crash(self.fault, point, epoch)
            return
        if not handles:
            return  # no task ran: nothing was pre-committed, nothing to make visible
        query_id, run_id = self._identity(handles)
        if self._begun != (query_id, run_id):  # foreachBatch began it before its tasks ran
            self.begin_run(query_id, run_id, keep=handles)
        steps.lap("begin")
        with self._fencing(run_id):
            self._commit_begun(epoch, handles, query_id, run_id, started, steps, pre_commit_ms)

    def _commit_begun(self, epoch: int, handles: Sequence[Handle], query_id: str,
                      run_id: str, started: float, steps: _Steps,
                      pre_commit_ms: float | None) -> None:
        """:meth:`commit_epoch` once the run has begun: steps 2a-2d."""
        current = input_record(self.settings.checkpoint_location, epoch)
        steps.lap("input")
        # The epoch right after the one this committer's previous call completed (in this
        # run) can have no completion or intent yet: that call succeeded, so this run has not
        # tried this epoch before (a failed call makes the next one look up again), and a run
        # that wrote them since holds the lease (run ids are new at every start), so this
        # commit is fenced at its intent check below. Skip the two lookups then.
        follows = self._last_done == (run_id, epoch - 1)
        self._last_done = None  # until this call succeeds: a retried call looks up again
        completion = None if follows else self.log.completion(epoch)
        if completion is not None:
            self._check_replay(epoch, completion.get("input"), current, handles,
                               self.log.completion_path(epoch))
            log_event(logger, "replay_of_complete_epoch", logging.WARNING, sink=self.sink.name,
                      epoch=epoch, aborted=len(handles), rows=completion.get("rows"),
                      input_checked=same_input(completion.get("input"), current) is True)
            self._abort_all(handles)
            return
        intent = None if follows else self.log.read_intent(epoch)
        steps.lap("lookup")
        if intent is None:
            maybe_crash(self.fault, FaultPoint.BEFORE_INTENT, epoch)
            record = self.log.intent_record(epoch, run_id, list(handles), current)
            self._verify_lease(run_id, record)  # fencing at 2b, the intent admitted with it
            steps.lap("lease")
            intent = self.log.write_intent(epoch, run_id, list(handles), current, record)
            steps.lap("intent")
            maybe_crash(self.fault, FaultPoint.AFTER_INTENT, epoch)
        else:  # written by this run before a failed commit call: the intent wins
            new = [h for h in handles if h.key not in intent.keys]
            pre_commit_ms = None  # these handles are not the ones the intent commits
            if same_input(intent.input, current) is False:
                self._finish(intent, started)
                self._check_replay(epoch, intent.input, current, new,
                                   self.log.intent_path(epoch))
            self._abort_all(new)
        self._finish(intent, started, pre_commit_ms, steps)
        self._last_done = (run_id, epoch)
        self._sweep_own_leftovers(query_id, run_id, epoch)
        steps.lap("sweep")
        log_event(logger, "epoch_steps", logging.DEBUG, sink=self.sink.name, epoch=epoch,
                  query_id=query_id, steps_ms=steps.ms)

    def _check_replay(self, epoch: int, recorded: dict | None, current: dict | None,
                      handles: Sequence[Handle], record_path) -> None:
        """Raise ReplannedEpochError (after aborting ``handles``) when ``current`` input
        differs from the ``recorded`` input of the committed epoch."""
        verdict = same_input(recorded, current)
        if verdict is None:
            log_event(logger, "replay_input_unchecked", logging.WARNING, sink=self.sink.name,
                      epoch=epoch, detail="the epoch's input was not recorded or is unknown "
                      "(no checkpointLocation): treated as a replay")
            return
        if verdict:
            return
        self._abort_all(handles)
        error = replanned_error(epoch, recorded or {}, current, record_path,
                                self.log.directory, self.settings.checkpoint_location)
        log_event(logger, "replanned_epoch_refused", logging.ERROR, sink=self.sink.name,
                  epoch=epoch, aborted=len(handles), detail=str(error))
        raise error

    def _verify_lease(self, run_id: str, intent: dict[str, Any]) -> None:
        self.lease.verify(run_id, intent)  # FencedError logged by _fencing

    def _finish(self, intent: Intent, started: float | None = None,
                pre_commit_ms: float | None = None, steps: _Steps | None = None) -> None:
        """Steps 2c-2d: commit every handle of the intent, publish, record complete.

        ``steps`` times the commit call's steps: those until the completion go into the
        completion record (``steps_ms``), the rest into the DEBUG event ``epoch_steps``."""
        steps = steps or _Steps(time.perf_counter())
        outcomes = []
        for i, handle in enumerate(intent.handles):
            outcomes.append(self.sink.commit_handle(handle))
            if i == 0:
                maybe_crash(self.fault, FaultPoint.BETWEEN_COMMITS, intent.epoch)
        steps.lap("handles")
        self.sink.publish_epoch(intent.epoch, intent.handles)
        steps.lap("publish")
        maybe_crash(self.fault, FaultPoint.AFTER_COMMITS, intent.epoch)
        stats: dict[str, Any] = {
            "rows": sum(h.rows for h in intent.handles),
            "handles": len(intent.handles),
            "already_committed": sum(o is CommitOutcome.ALREADY_COMMITTED for o in outcomes),
            "run_id": intent.run_id,
            "completed_at": time.time(),
        }
        if started is not None:
            stats["commit_ms"] = round((time.perf_counter() - started) * 1000, 3)
        if pre_commit_ms is not None:
            stats["pre_commit_ms"] = pre_commit_ms
        stats["steps_ms"] = dict(steps.ms)
        stats["input"] = intent.input
        self.log.mark_complete(intent.epoch, stats)
        steps.lap("complete")
        log_event(logger, "epoch_complete", epoch=intent.epoch,
                  **{k: v for k, v in stats.items() if k != "input"})
        maybe_crash(self.fault, FaultPoint.AFTER_COMPLETE, intent.epoch)
        self._prune(intent.epoch)
        steps.lap("prune")

    def _prune(self, epoch: int) -> None:
        """Forget all but the newest ``retain_epochs`` completed epochs. The log is listed
        once per committer; later epochs it completes are added to what that listing found
        (one holder of the lease writes completions), so a kept committer lists nothing."""
        if self._completed is None:
            self._completed = self.log.completed_epochs()
        elif epoch not in self._completed:
            bisect.insort(self._completed, epoch)
        keep = self.settings.retain_epochs
        old = self._completed[:-keep] if keep > 0 else list(self._completed)
        self.log.forget(old)
        del self._completed[:len(old)]

    # -- step 3 ----------------------------------------------------------------------
    def abort_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        """Abort the handles of a failed epoch, unless an intent already decided it."""
        if self.settings.mode is Mode.AT_LEAST_ONCE:
            return
        intent = self.log.read_intent(epoch)
        keep = intent.keys if intent is not None else set()
        self._abort_all([h for h in handles if h.key not in keep])

    # -- step 4 ----------------------------------------------------------------------
    def recover(self, query_id: str, keep: Sequence[Handle] = ()) -> None:
        """Finish incomplete intents, then abort every orphaned pre-commit of the query.

        ``keep`` are the handles of the commit call in progress: they are not orphans.
        """
        pending = self.lease.pending_intent()
        if pending is not None and self.log.adopt_intent(pending, query_id):
            # the previous holder passed its lease check for this intent, then stopped (or
            # was fenced) before writing it: the epoch is decided, finish it below
            log_event(logger, "adopted_admitted_intent", logging.WARNING, sink=self.sink.name,
                      epoch=pending.get("epoch"), run_id=pending.get("run_id"))
        finished = self.log.incomplete_intents()
        for intent in finished:
            log_event(logger, "recover_intent", logging.WARNING, sink=self.sink.name,
                      epoch=intent.epoch, handles=len(intent.handles),
                      rows=sum(h.rows for h in intent.handles))
            self._finish(intent)
        protected = {h.key for h in keep}
        orphans = [h for h in self.sink.list_pre_commits(query_id) if h.key not in protected]
        self._abort_all(orphans)
        level = logging.WARNING if finished or orphans else logging.INFO
        log_event(logger, "recovered", level, sink=self.sink.name, query_id=query_id,
                  intents_finished=[i.epoch for i in finished], orphans_aborted=len(orphans),
                  orphan_epochs=sorted({h.epoch for h in orphans}))

    def _sweep_own_leftovers(self, query_id: str, run_id: str, epoch: int) -> None:
        """Abort this run's pre-commits of finished epochs (failed or speculative attempts).

        Other runs' leftovers are left to recovery: they may belong to a live, fenced
        instance, which must fail on its own lease check and not on vanished files.
        """
        stale = [h for h in self.sink.list_pre_commits(query_id)
                 if h.run_id == run_id and h.epoch <= epoch]
        if stale:
            log_event(logger, "leftover_attempts_aborted", logging.WARNING, sink=self.sink.name,
                      epoch=epoch, aborted=len(stale))
        self._abort_all(stale)

    def _abort_all(self, handles: Sequence[Handle]) -> None:
        for handle in handles:
            self.sink.abort(handle)

    @staticmethod
    def _identity(handles: Sequence[Handle]) -> tuple[str, str]:
        ids = {(h.query_id, h.run_id) for h in handles}
        if len(ids) != 1:
            raise ExactlyError(f"one epoch's handles name several queries or runs: {ids}")
        return ids.pop()


class _Steps:
    """Milliseconds spent in each step of a commit call, lap by lap."""

    def __init__(self, started: float) -> None:
        self._last = started
        self.ms: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = round(self.ms.get(name, 0.0) + (now - self._last) * 1000, 3)
        self._last = now
