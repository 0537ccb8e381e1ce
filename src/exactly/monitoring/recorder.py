"""Records every epoch of the queries exactly starts into their checkpoint's history.

:func:`watch` is called by :func:`exactly.ops.query.start_query` for every query with a
local checkpoint. It registers one :class:`~pyspark.sql.streaming.StreamingQueryListener`
per session. Spark calls the listener from its listener bus, after the epoch's commit log
entry is written, never from the thread that runs the epoch; the listener only puts the
event on a queue. One background thread per driver process turns events into records --
joining Spark's progress with the sink's completion record and the checkpoint's size on
disk -- and appends them to the history (:mod:`exactly.checkpoint.history`). So recording
adds no step to an epoch's commit path, and a slow or failing history (a full disk) costs
records, never epochs: errors are logged once per kind and the job goes on.

What a driver killed with SIGKILL had not yet written is lost from the history (at most
the records of its last moments); the epochs themselves are in Spark's and the sink's logs.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactly.causes import root_cause
from exactly.checkpoint.history import HISTORY_DIR, HistoryStore, ObjectHistoryStore, open_history
from exactly.checkpoint.layout import JOB_DIR
from exactly.checkpoint.location import checkpoint_exists, local_checkpoint, open_store
from exactly.logs import log_event
from exactly.monitoring import records
from exactly.monitoring.records import SINK_STATS
from exactly.monitoring.sizes import CheckpointSizes, ObjectSizes

logger = logging.getLogger("exactly.monitoring")

#: events kept for a query not (yet) watched: Spark may report before start() returned
_PENDING_MAX = 100


@dataclass
class Watched:
    """A query whose epochs are recorded."""

    query_id: str
    run_id: str  # Spark's runId: new at every start of the same query
    checkpoint: str
    store: HistoryStore | ObjectHistoryStore
    sink_log: Path | str | None
    backend: str | None
    sizes: CheckpointSizes | ObjectSizes
    last_epoch: int = -1


class _Recorder:
    """The process's queue and writer thread."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.watched: dict[str, Watched] = {}
        self.pending: dict[str, tuple[float, list[tuple[Any, ...]]]] = {}
        #: Spark run id -> set once the run's end is recorded (see :func:`wait_ended`)
        self.ended: dict[str, threading.Event] = {}
        self._errors: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="exactly-history",
                                        daemon=True)
        self._thread.start()

    def submit(self, *event: Any) -> None:
        self.events.put(event)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event submitted so far is written (True) or ``timeout``."""
        done = threading.Event()
        self.submit("flush", done)
        return done.wait(timeout)

    # -- the writer thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            event = self.events.get()
            try:
                self._handle(event)
            except Exception as exc:  # never let the history stop the thread
                self._error(type(exc).__name__, exc)

    def _handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "flush":
            event[1].set()
        elif kind == "watch":
            watched: Watched = event[1]
            self.watched[watched.run_id] = watched
            self._backfill(watched)
            watched.store.append(event[2])
            for pending in self.pending.pop(watched.run_id, (0.0, []))[1]:
                self._handle(pending)
        elif kind in ("progress", "terminated"):
            if kind == "progress" and event[1] is None:  # the run id is in the JSON
                event = ("progress", str(json.loads(event[2]).get("runId")), *event[2:])
            watched_or_none = self.watched.get(event[1])
            if watched_or_none is None:
                self._stash(event)
                return
            if kind == "progress":
                self._progress(watched_or_none, event[2], event[3])
            else:
                self._terminated(watched_or_none, event[2], event[3])

    def _stash(self, event: tuple[Any, ...]) -> None:
        """Keep an event of a run not watched (yet): Spark may report before ``watch``
        registered it. Events of runs nobody watches (queries not started by exactly) are
        dropped after a minute."""
        now = time.monotonic()
        for run_id in [r for r, (since, _) in self.pending.items() if now - since > 60.0]:
            del self.pending[run_id]
        stash = self.pending.setdefault(event[1], (now, []))[1]
        if len(stash) < _PENDING_MAX:
            stash.append(event)

    def _progress(self, watched: Watched, progress_json: str, at: float) -> None:
        if not checkpoint_exists(watched.checkpoint):
            return  # deleted (a cancel with delete_on_cancellation): never recreate it
        progress = json.loads(progress_json)
        epoch = int(progress.get("batchId", -1))
        if not records.ran(progress) or epoch <= watched.last_epoch:
            return  # an idle report, or one already recorded
        watched.last_epoch = epoch
        trigger_at = records.parse_spark_time(progress.get("timestamp"))
        duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        if trigger_at is not None and duration_ms is not None:
            at = trigger_at + duration_ms / 1000  # when the epoch ended, not when Spark told
        sample = watched.sizes.measure(since=trigger_at)
        record = records.epoch_record(progress, ended_at=at,
                                      completion=self._completion(watched, epoch),
                                      new_bytes=sample.new_bytes,
                                      full_bytes=sample.full_bytes, backend=watched.backend)
        watched.store.append(record)

    def _backfill(self, watched: Watched) -> None:
        """Record the epochs Spark's commit log holds past the newest recorded one: those a
        driver completed but was killed before recording (``recovered_from``:
        ``commit-log``; times from the log files, rows from the sink's completion)."""
        from exactly.checkpoint.spark_files import batch_numbers, offsets_logged_at

        records = watched.store.read().records
        recorded = [r["epoch"] for r in records
                    if r["kind"] == "epoch" and isinstance(r.get("epoch"), int)]
        newest = max(recorded, default=-1)
        # epochs a restore wrote (copied from a savepoint, or Spark's repartition) are not
        # this job's work: they are older than the restore's record
        restored_at = max((r["at"] for r in records if r["kind"] == "restore"), default=0.0)
        for epoch in batch_numbers(watched.checkpoint, "commits"):
            if epoch <= newest:
                continue
            trigger_at = offsets_logged_at(watched.checkpoint, epoch)
            end_at = open_store(watched.checkpoint).modified(f"commits/{epoch}")
            if end_at is None or end_at <= restored_at:
                continue
            completion = self._completion(watched, epoch)
            sink = {k: completion.get(k) for k in SINK_STATS} if completion else None
            watched.store.append({
                "kind": "epoch", "at": end_at or time.time(), "status": "completed",
                "epoch": epoch, "query_id": watched.query_id, "recovered_from": "commit-log",
                "trigger_at": trigger_at, "end_at": end_at,
                "duration_ms": round((end_at - trigger_at) * 1000, 1)
                if end_at and trigger_at else None,
                "rows_in": None, "rows_out": (completion or {}).get("rows"),
                "sink": sink, "checkpoint": {"new_bytes": None, "full_bytes": None}})
            watched.last_epoch = max(watched.last_epoch, epoch)

    def _completion(self, watched: Watched, epoch: int) -> dict[str, Any] | None:
        if watched.sink_log is None:
            return None
        from exactly.protocol.commitlog import CommitLog

        try:
            return CommitLog(watched.sink_log).completion(epoch)
        except Exception as exc:  # a damaged completion is the sink's to report
            self._error("completion", exc)
            return None

    def _terminated(self, watched: Watched, exception: str | None, at: float) -> None:
        self.watched.pop(watched.run_id, None)
        try:
            self._record_end(watched, exception, at)
        finally:
            ended = self.ended.get(watched.run_id)
            if ended is not None:
                ended.set()

    def _record_end(self, watched: Watched, exception: str | None, at: float) -> None:
        if not checkpoint_exists(watched.checkpoint):
            return
        if exception:
            epoch = epoch_in_flight(watched.checkpoint)
            watched.store.append(records.failed_epoch(
                watched.checkpoint, epoch, failure="query", cause=root_cause(exception),
                at=at, query_id=watched.query_id))
        watched.store.append({"kind": "run_end", "at": at, "query_id": watched.query_id,
                              "outcome": "failed" if exception else "stopped",
                              "last_epoch": watched.last_epoch if watched.last_epoch >= 0
                              else None})

    def _error(self, key: str, exc: BaseException) -> None:
        if key in self._errors:
            return
        self._errors.add(key)
        log_event(logger, "history_not_recorded", logging.WARNING, error=type(exc).__name__,
                  detail=str(exc)[:300],
                  effect="the job goes on; the checkpoint history misses records")


_recorder: _Recorder | None = None
_lock = threading.Lock()


def _the_recorder() -> _Recorder:
    global _recorder
    with _lock:
        if _recorder is None:
            _recorder = _Recorder()
            atexit.register(_recorder.flush, 5.0)  # what a clean exit has left to write
        return _recorder


class _JavaListener:
    """Spark's ``PythonStreamingQueryListener`` interface, implemented for Py4J.

    PySpark's own ``StreamingQueryListener`` converts every progress event field by field
    (one Py4J round trip per field, per state operator, per source) before calling Python;
    this listener asks the JVM for the progress as one JSON string and puts it on the
    recorder's queue: two round trips per epoch on Spark's listener bus thread."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryProgress(self, jevent: Any) -> None:
        self.recorder.submit("progress", None, jevent.progress().json(), time.time())

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        error = jevent.exception()
        self.recorder.submit("terminated", jevent.runId().toString(),
                             error.get() if error.isDefined() else None, time.time())

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _connect_listener(recorder: _Recorder) -> Any:
    """The listener of a Spark Connect session: PySpark's own ``StreamingQueryListener``,
    which the client runs in this process on events the server streams to it (the progress
    arrives as JSON already)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ConnectListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            recorder.submit("progress", str(event.progress.runId), event.progress.json,
                            time.time())

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            recorder.submit("terminated", str(event.runId), event.exception, time.time())

    return ConnectListener()


def _add_listener(spark: Any, recorder: _Recorder) -> Any:
    """Register a :class:`_JavaListener` on ``spark``'s streaming query manager (wrapped
    in PySpark's ``PythonStreamingQueryListenerWrapper``, as PySpark's ``addListener``
    does); returns the JVM listener. On Spark Connect: :func:`_connect_listener`."""
    from exactly.spark.connect import is_connect

    if is_connect(spark):
        listener = _connect_listener(recorder)
        spark.streams.addListener(listener)
        return listener
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)  # the JVM calls the listener back through it
    wrapper = gateway.jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
    jlistener = wrapper(_JavaListener(recorder))
    spark._jsparkSession.streams().addListener(jlistener)
    return jlistener


def epoch_in_flight(checkpoint: str) -> int:
    """The epoch a failure interrupted: the newest in ``offsets/`` without a ``commits/``
    entry, else the one after the last committed epoch."""
    from exactly.checkpoint.spark_files import batch_numbers, uncommitted_epoch

    uncommitted = uncommitted_epoch(checkpoint)
    if uncommitted is not None:
        return uncommitted
    commits = batch_numbers(checkpoint, "commits")
    return commits[-1] + 1 if commits else 0


def watch(spark: Any, query: Any, *, checkpoint: str, run_record: dict[str, Any],
          sink_log: Path | str | None, backend: str | None) -> None:
    """Record ``query``'s epochs into ``<checkpoint>/exactly-job/history``, starting with
    ``run_record``. Registers the listener on ``spark`` once."""
    recorder = _the_recorder()
    if getattr(spark, "_exactly_history_listener", None) is None:
        spark._exactly_history_listener = _add_listener(spark, recorder)
    store = open_history(checkpoint)
    history = f"{JOB_DIR}/{HISTORY_DIR}"
    local = local_checkpoint(checkpoint)
    sizes = (CheckpointSizes(local, exclude=(history,)) if local is not None
             else ObjectSizes(open_store(checkpoint), exclude=(history,)))
    watched = Watched(str(query.id), str(query.runId), checkpoint, store, sink_log, backend,
                      sizes)
    recorder.ended[watched.run_id] = threading.Event()
    recorder.submit("watch", watched, run_record)


def wait_ended(run_id: str, timeout: float = 10.0) -> bool:
    """Wait until the end of Spark run ``run_id`` (a stopped or failed query) is in its
    history, at most ``timeout`` s; True when it is (or the run is not recorded). Spark
    tells listeners asynchronously: a query's ``awaitTermination`` returns before."""
    if _recorder is None:
        return True
    ended = _recorder.ended.get(run_id)
    if ended is None:
        return True
    done = ended.wait(timeout)
    if done:
        _recorder.ended.pop(run_id, None)
    return done


def flush(timeout: float = 10.0) -> bool:
    """Wait until the records submitted so far are written (True), at most ``timeout`` s."""
    return _recorder.flush(timeout) if _recorder is not None else True
