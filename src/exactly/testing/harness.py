"""Script the commit protocol of a sink in one process: tasks, commits, crashes, restarts.

A test kit for protocol tests of any :class:`~exactly.protocol.contract.TwoPhaseCommitSink`,
the bundled ones and your own. It runs the real protocol code -- the executor side
(:func:`exactly.protocol.task.run_task`) and the driver side
(:class:`exactly.protocol.committer.Committer`) -- without Spark, and simulates what a
cluster does around it:

* **tasks** - every partition runs as one task attempt with a real :class:`TaskInfo`
  (the query id, the current run id, a task attempt number unique in the run), on a pickled
  copy of the sink, as an executor gets it: nothing but the returned handles reaches the
  driver side;
* **a crash** - :meth:`ProtocolHarness.crash_at` arms a fault point; when the protocol
  reaches it, :class:`~exactly.protocol.faults.SimulatedCrash` is raised exactly where a
  SIGKILL would stop the process, and nothing after it runs (no clean-up, no abort). A
  crash inside a task drops the task's objects as a dead executor would (connections
  close, the server rolls their open transactions back); a crash on the driver leaves the
  driver dead until :meth:`ProtocolHarness.restart`;
* **a restart** - a new driver: a new run id, a new committer and a fresh copy of the
  sink, the same query id. Its first commit takes the lease and recovers (finishes
  intents, aborts orphans), as Spark's restart of the query does;
* **a second live instance** - :meth:`ProtocolHarness.other_live_driver` starts another
  process that takes the sink's lease, as a second driver of the same query would.

Every simulated driver runs in this process, so the lease sees one holder: a restarted
driver takes the lease over from the crashed one as a restart in one Spark application
does (:class:`~exactly.protocol.lease.Lease`: "held by its own driver"). A driver that is
alive and somebody else must be another process: that is what ``other_live_driver`` starts.

Tests written with it read like the protocol's specification::

    h = ProtocolHarness(FileSink(str(tmp_path / "out")), visible=read_ids)
    h.commit(2, h.tasks(2, [batch(0, 5), batch(5, 10)]))
    handles = h.tasks(3, [batch(10, 15), batch(15, 20)])
    with h.crash_at(FaultPoint.AFTER_INTENT, epoch=3):
        h.commit(3, handles)        # killed right after the intent of epoch 3
    h.restart()                     # a new driver; Spark replays epoch 3
    h.commit(3, h.tasks(3, [batch(10, 15), batch(15, 20)]))
    assert h.visible() == list(range(20))   # epoch 3 visible once
    assert h.pre_commits() == []            # the replay's pre-commits were aborted

Limits of a simulation in one process:

* sink-specific fault points (``register_point("<sink>.<point>", ...)``) fire where the sink
  reads its own armed fault (e.g. option ``exactly.fault``): build the sink armed (with a
  marker file, or the restarted driver's copy fires again), and ``crash_at`` that point
  installs the simulated crash and checks that it fired;
* a ``finally`` block on the way out still runs under a simulated crash, where a kill
  skips it (e.g. the Kafka sink's publish closes its producer and so aborts the open
  transaction a kill would leave for the next ``init_transactions``);
* the drivers share this process's identity, so start-up recovery that runs once per
  driver process (:func:`exactly.protocol.recovery.recover_on_new_driver`) runs once per
  test; :meth:`ProtocolHarness.recover` runs the recovery of a run's first commit instead.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import pickle
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeAlias, TypeVar

import pyarrow as pa

from exactly.protocol.commitlog import CommitLog, Intent
from exactly.protocol.committer import Committer
from exactly.protocol.contract import Handle, SinkSettings, TaskInfo, TwoPhaseCommitSink
from exactly.protocol.faults import (
    FaultPoint,
    FaultSpec,
    SimulatedCrash,
    fault_action,
    is_driver_point,
    point_name,
    raise_simulated_crash,
)
from exactly.protocol.lease import end_run
from exactly.protocol.task import run_task

__all__ = ["Fault", "InjectedFailure", "ProtocolHarness", "Rows"]

SinkT = TypeVar("SinkT", bound=TwoPhaseCommitSink[Any])

#: one partition's input: a batch, a table, or a sequence of batches (empty: no rows)
Rows: TypeAlias = pa.RecordBatch | pa.Table | Sequence[pa.RecordBatch]


class InjectedFailure(Exception):
    """Raised at a fault point armed with :meth:`ProtocolHarness.fail_at`: an ordinary
    failure (a refused statement, a lost connection), which the code on the way out
    handles as it handles any error -- unlike a crash."""

    def __init__(self, point: str, epoch: int) -> None:
        super().__init__(f"injected failure at {point} in epoch {epoch}")
        self.point = point
        self.epoch = epoch


@dataclass
class Fault:
    """An armed fault of :meth:`ProtocolHarness.crash_at` / ``fail_at``: where it was armed
    and, once it fired, the epoch it fired in."""

    point: str
    min_epoch: int
    fired_in: int | None = None

    @property
    def fired(self) -> bool:
        return self.fired_in is not None

    def render(self) -> str:
        return f"{self.point}@{self.min_epoch}"


def _raise_injected_failure(point: str, epoch: int, on_driver: bool) -> None:
    raise InjectedFailure(point, epoch)


class ProtocolHarness(Generic[SinkT]):
    """One query writing to ``sink`` through the commit protocol, driven step by step.

    Parameters
    ----------
    sink
        The sink, as the query's driver builds it (``prepare_target`` already called).
        Executors and restarted drivers get pickled copies of it as it is now; later
        changes to this object (e.g. a test's monkeypatch) reach the first driver only.
    settings
        The sink settings (mode, retention, lease staleness, checkpoint location).
    query_id
        The query's id, stable across restarts (default: a new UUID).
    visible
        Reads what a reader of the target sees now (e.g. the sorted ids of a table);
        :meth:`visible` calls it.
    """

    def __init__(self, sink: SinkT, settings: SinkSettings | None = None, *,
                 query_id: str | None = None,
                 visible: Callable[[], Sequence[Any]] | None = None) -> None:
        self.settings = settings or SinkSettings()
        self.query_id = query_id or str(uuid.uuid4())
        self._reader = visible
        self._plan = pickle.dumps(sink)  # the sink as the query plan carries it
        self._sink = sink
        self._fault: FaultSpec | None = None
        self._dead: Fault | None = None
        self._attempts: dict[str, Iterator[int]] = {}
        self.run_id = ""
        self.committer: Committer = self._new_driver(sink)

    # -- what the harness simulates ------------------------------------------------------
    @property
    def sink(self) -> SinkT:
        """The current driver's sink."""
        return self._sink

    @property
    def log(self) -> CommitLog:
        """The sink's commit log (intents and completions), as the current driver reads it."""
        return self.committer.log

    def tasks(self, epoch: int, partitions: Sequence[Rows], *,
              run: str | None = None) -> list[Handle]:
        """Step 1: run one task attempt per partition of ``epoch`` and pre-commit its rows.

        Each task runs :func:`~exactly.protocol.task.run_task` on a pickled copy of the
        sink (what an executor gets) with a real :class:`TaskInfo`: this query, the run
        ``run`` (default: the current driver's run; pass another driver's run id to write
        its tasks) and a task attempt number unique in that run, as Spark numbers them.
        Returns the handles Spark hands to the commit, in partition order; a partition
        without rows pre-commits nothing and has no handle.

        Under :meth:`crash_at` ``in_write``, the first task to reach the point dies inside
        ``write()``: its open transaction is dropped without ``abort_transaction`` (its
        objects are collected, which closes its connections and files, as the death of the
        executor process would) and :class:`SimulatedCrash` propagates.
        """
        self._require_alive()
        run_id = run or self.run_id
        attempts = self._attempts.setdefault(run_id, itertools.count())
        executor = self._unpickled()
        handles: list[Handle] = []
        crashed: tuple[str, int] | None = None
        for partition, rows in enumerate(partitions):
            task = TaskInfo(self.query_id, run_id, epoch, partition, next(attempts))
            try:
                handle = run_task(executor, task, _batches(rows), mode=self.settings.mode,
                                  fault=self._fault)
            except SimulatedCrash as crash:
                crashed = (crash.point, crash.epoch)
                break
            if handle is not None:
                handles.append(handle)
        if crashed is not None:
            # The killed executor's transaction is referenced only by the frames of the
            # crash's traceback, released by now: collect it, as process death releases it.
            del executor
            gc.collect()
            raise SimulatedCrash(*crashed)
        return handles

    def commit(self, epoch: int, handles: Sequence[Handle]) -> None:
        """Step 2: Spark's commit call for ``epoch`` with the handles of its tasks
        (:meth:`Committer.commit_epoch`): the first commit of a run takes the lease and
        recovers; a complete epoch is a replay; otherwise intent, commits, completion."""
        self._require_alive()
        self.committer.commit_epoch(epoch, handles)

    def run_epoch(self, epoch: int, partitions: Sequence[Rows]) -> list[Handle]:
        """:meth:`tasks` then :meth:`commit`: one crash-free epoch. Returns its handles."""
        handles = self.tasks(epoch, partitions)
        self.commit(epoch, handles)
        return handles

    def abort(self, epoch: int, handles: Sequence[Handle]) -> None:
        """Step 3: Spark's abort call for a failed ``epoch`` (:meth:`Committer.abort_epoch`):
        drops the handles unless an intent already decided the epoch."""
        self._require_alive()
        self.committer.abort_epoch(epoch, handles)

    def recover(self) -> bool:
        """Step 4 ahead of the first commit: take the lease for the current run and, when
        the run is new, finish the intents and abort the orphans (what the run's first
        commit does first; Spark's writer runs the same recovery when it plans a new
        driver's first epoch for sinks with ``recover_before_first_epoch``). Raises
        FencedError while another live driver holds the lease. True when it recovered."""
        self._require_alive()
        return self.committer.begin_run(self.query_id, self.run_id)

    def restart(self) -> str:
        """A new driver of the same query after the last one stopped or crashed: a new run
        id, a new committer and a fresh copy of the sink as the query plan carries it (no
        memory of the old driver survives, as none survives a process: its lease heartbeat
        ends as a dead process's would, without releasing the lease). Returns the new run
        id."""
        if self.run_id:
            end_run(self.run_id, release=False)
        self.committer = self._new_driver(self._unpickled())
        return self.run_id

    def close(self) -> None:
        """The test is over: stop the current driver's lease heartbeat (the process goes on
        running other tests; a real driver's heartbeat ends with its query). Idempotent."""
        if self.run_id:
            end_run(self.run_id, release=False)

    # -- faults --------------------------------------------------------------------------
    @contextlib.contextmanager
    def crash_at(self, point: str | FaultPoint, epoch: int = 0) -> Iterator[Fault]:
        """Kill the process at ``point`` the first time the block reaches it in an epoch
        ``>= epoch``: :class:`SimulatedCrash` is raised there (nothing after the point
        runs) and the block ends. Fails with AssertionError when the block never reaches
        the point. A crash at a driver point leaves the driver dead: every call but
        :meth:`restart` refuses to run until then.

        Yields the :class:`Fault`, which records the epoch it fired in.
        """
        with self._ending_at(point, epoch, raise_simulated_crash, SimulatedCrash) as fault:
            yield fault
        if is_driver_point(fault.point):
            self._dead = fault

    @contextlib.contextmanager
    def fail_at(self, point: str | FaultPoint, epoch: int = 0) -> Iterator[Fault]:
        """Make the code fail at ``point`` with :class:`InjectedFailure`, an ordinary
        exception (a task aborts its transaction; a commit call fails and Spark may call
        :meth:`abort`). The block ends there; the process lives on. Fails with
        AssertionError when the block never reaches the point."""
        with self._ending_at(point, epoch, _raise_injected_failure, InjectedFailure) as fault:
            yield fault

    @contextlib.contextmanager
    def _ending_at(self, point: str | FaultPoint, epoch: int,
                   action: Callable[[str, int, bool], None],
                   raised: type[SimulatedCrash] | type[InjectedFailure]) -> Iterator[Fault]:
        """Arm ``action`` (which raises ``raised``) at ``point``; the block ends where it
        fires. AssertionError when the block never reaches the point."""
        fault = Fault(point_name(point), epoch)
        with self._armed(fault, action):
            try:
                yield fault
            except raised as stop:
                if stop.point != fault.point:
                    raise
                fault.fired_in = stop.epoch
        if not fault.fired:
            raise AssertionError(f"the fault armed at {fault.render()} never fired: the "
                                 "block did not reach that point")

    @contextlib.contextmanager
    def pause_at(self, point: str | FaultPoint, epoch: int,
                 while_paused: Callable[[], object]) -> Iterator[Fault]:
        """Stop at ``point`` (first reached in an epoch ``>= epoch``) while ``while_paused``
        runs, then go on: what a reader sees while the driver or a task stands there (e.g.
        between two commits of one epoch). Fails with AssertionError when the block never
        reaches the point."""
        fault = Fault(point_name(point), epoch)

        def pause(name: str, at: int, on_driver: bool) -> None:
            if fault.fired:
                return
            fault.fired_in = at
            while_paused()

        with self._armed(fault, pause):
            yield fault
        if not fault.fired:
            raise AssertionError(f"the pause armed at {fault.render()} was never reached")

    @contextlib.contextmanager
    def other_live_driver(self) -> Iterator[str]:
        """Another live driver of the same query holds the sink's lease; yields its run id.

        A separate process takes the lease for a run of its own (as a second instance of
        the query started elsewhere on this host would) and stays alive until the block
        ends, when it is killed: from then on it counts as dead and a new run may take
        the lease over. Use :meth:`tasks` with ``run=`` to write that driver's tasks.
        Raises RuntimeError when it cannot take the lease (a live driver holds it
        already -- this test process does after a commit of this harness).
        """
        run = str(uuid.uuid4())
        code = ("import sys\n"
                "from exactly.procs import driver_identity\n"
                "from exactly.protocol.lease import Lease\n"
                "Lease(sys.argv[1], stale_after=float(sys.argv[3])).acquire(sys.argv[2], "
                "driver_identity())\n"
                "print('holding', flush=True)\n"
                "sys.stdin.read()\n")
        directory = self._sink.log_directory
        if isinstance(directory, Path):
            directory.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(directory), run,
             str(self.settings.lease_stale_after)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stderr is not None
            if proc.stdout.readline().strip() != "holding":
                proc.wait(timeout=30)
                last = (proc.stderr.read().strip().splitlines() or ["it exited"])[-1]
                raise RuntimeError(f"the other driver could not take the lease: {last}")
            yield run
        finally:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    # -- what there is to see --------------------------------------------------------------
    def visible(self) -> list[Any]:
        """What a reader of the target sees now (the ``visible`` reader given at start)."""
        if self._reader is None:
            raise RuntimeError("ProtocolHarness(..., visible=...) was not given a reader")
        return list(self._reader())

    def pre_commits(self) -> list[Handle]:
        """Pre-commits of this query still in the target (``sink.list_pre_commits``)."""
        return list(self._sink.list_pre_commits(self.query_id))

    def intent(self, epoch: int) -> Intent | None:
        """The commit intent of ``epoch`` in the commit log, if written."""
        return self.log.read_intent(epoch)

    def completion(self, epoch: int) -> dict[str, Any] | None:
        """The completion record of ``epoch`` (rows, handles, ``already_committed``...)."""
        return self.log.completion(epoch)

    def incomplete_intents(self) -> list[Intent]:
        """Intents without a completion: epochs that will commit at the next recovery."""
        return self.log.incomplete_intents()

    # -- internals ---------------------------------------------------------------------
    def _new_driver(self, sink: SinkT) -> Committer:
        self._sink = sink
        self._dead = None
        self.run_id = str(uuid.uuid4())
        self.committer = Committer(sink, self.settings, self._fault)
        return self.committer

    @contextlib.contextmanager
    def _armed(self, fault: Fault, action: Callable[[str, int, bool], None]) -> Iterator[None]:
        self._require_alive()
        spec = FaultSpec(fault.point, fault.min_epoch)
        self._fault = self.committer.fault = spec
        try:
            with fault_action(action):
                yield
        finally:
            self._fault = self.committer.fault = None

    def _unpickled(self) -> SinkT:
        """The sink as another process gets it (an executor, a restarted driver)."""
        sink: SinkT = pickle.loads(self._plan)
        return sink

    def _require_alive(self) -> None:
        if self._dead is not None:
            raise RuntimeError(f"the driver crashed at {self._dead.point} in epoch "
                               f"{self._dead.fired_in}: call restart() first")


def _batches(rows: Rows) -> Iterable[pa.RecordBatch]:
    if isinstance(rows, pa.RecordBatch):
        return [rows]
    if isinstance(rows, pa.Table):
        return rows.to_batches()
    return list(rows)
