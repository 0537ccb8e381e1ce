"""The executor side of the commit protocol (step 1 of DESIGN section 3), written once.

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

from collections.abc import Iterable

import pyarrow as pa

from exactly.config import Mode
from exactly.protocol.contract import Handle, TaskInfo, TwoPhaseCommitSink
from exactly.protocol.faults import FaultPoint, FaultSpec, SimulatedCrash, maybe_crash


def run_task(sink: TwoPhaseCommitSink, task: TaskInfo, batches: Iterable[pa.RecordBatch], *,
             mode: Mode = Mode.EXACTLY_ONCE, fault: FaultSpec | None = None) -> Handle | None:
    """Write ``batches`` as one task attempt of ``task.epoch`` and pre-commit them.

    Returns the handle of the pre-commit, or ``None`` when the task had no rows.
    Guarantee: when this returns a handle, ``commit_handle`` can make the rows visible
    even after every process involved crashed; when it raises, nothing of the task stays
    staged in the target.
    """
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
            return None
        payload = sink.pre_commit(txn)
    except SimulatedCrash:
        raise
    except BaseException:
        sink.abort_transaction(txn)
        raise
    handle: Handle = Handle(task, payload)
    if mode is Mode.AT_LEAST_ONCE:
        sink.commit_visible(handle)
    return handle
