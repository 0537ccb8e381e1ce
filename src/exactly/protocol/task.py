"""The executor side of the commit protocol (step 1 of docs/design.md section 3), written once.

Both Spark adapters (:mod:`exactly.spark.writer` for ``writeStream.format``,
:mod:`exactly.spark.foreach_batch` for ``foreachBatch``) and the protocol tests run a task
through :func:`run_task`, so they agree on every detail:

* ``begin_transaction``, then ``write`` for every non-empty Arrow batch;
* the ``in_write`` fault point fires after the task's first non-empty batch, or before the
  task ends when it had no rows;
* an empty partition pre-commits nothing: its transaction is aborted and no handle is
  returned (no prepared transaction or staged file is left behind);
* any failure before the handle exists aborts the transaction and re-raises -- except a
  :class:`~exactly.protocol.faults.SimulatedCrash`, which, like a kill, cleans nothing up;
* in ``at_least_once`` mode the handle is made visible inside the task (``commit_visible``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from exactly.config import Mode
from exactly.protocol.contract import Handle, TaskInfo, TwoPhaseCommitSink
from exactly.protocol.faults import FaultPoint, FaultSpec, SimulatedCrash, maybe_crash


@dataclass(frozen=True)
class TaskOutcome:
    """What one task attempt produced: its handle and how long its pre-commit took."""

    handle: Handle | None  # None: the task had no rows and pre-committed nothing
    pre_commit_ms: float | None  # None when nothing was pre-committed


def run_task(sink: TwoPhaseCommitSink, task: TaskInfo, batches: Iterable[pa.RecordBatch], *,
             mode: Mode = Mode.EXACTLY_ONCE, fault: FaultSpec | None = None) -> Handle | None:
    """Write ``batches`` as one task attempt of ``task.epoch`` and pre-commit them.

    Returns the handle of the pre-commit, or ``None`` when the task had no rows.
    Guarantee: when this returns a handle, ``commit_handle`` can make the rows visible
    even after every process involved crashed; when it raises, nothing of the task stays
    staged in the target.
    """
    return write_task(sink, task, batches, mode=mode, fault=fault).handle


def write_task(sink: TwoPhaseCommitSink, task: TaskInfo, batches: Iterable[pa.RecordBatch], *,
               mode: Mode = Mode.EXACTLY_ONCE, fault: FaultSpec | None = None) -> TaskOutcome:
    """:func:`run_task` that also reports the pre-commit's wall time (for the history)."""
    txn = sink.begin_transaction(task)
    try:
        wrote = False
        for batch in batches:
            if batch.num_rows == 0:
                continue
            sink.write(txn, batch)
            if not wrote:
                wrote = True
                maybe_crash(fault, FaultPoint.IN_WRITE, task.epoch)
        if not wrote:
            maybe_crash(fault, FaultPoint.IN_WRITE, task.epoch)
            sink.abort_transaction(txn)
            return TaskOutcome(None, None)
        started = time.perf_counter()
        payload = sink.pre_commit(txn)
        pre_commit_ms = round((time.perf_counter() - started) * 1000, 3)
    except SimulatedCrash:
        raise
    except BaseException:
        sink.abort_transaction(txn)
        raise
    handle: Handle = Handle(task, payload)
    if mode is Mode.AT_LEAST_ONCE:
        sink.commit_visible(handle)
    return TaskOutcome(handle, pre_commit_ms)


def slowest(times: Iterable[float | None]) -> float | None:
    """The longest of the tasks' pre-commit times, or None when no task pre-committed."""
    known = [t for t in times if t is not None]
    return max(known) if known else None
