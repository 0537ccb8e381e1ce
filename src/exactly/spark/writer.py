"""Adapter from Spark's Python streaming writer API to the two-phase-commit contract.

``write()`` runs in executor Python workers, ``commit()``/``abort()`` in a driver-side
Python worker that Spark starts for the call: nothing but the handles carries over, so all
protocol state lives in the sink's commit log.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from exactly.config import Mode
from exactly.errors import ConfigError, ExactlyError
from exactly.protocol.committer import Committer
from exactly.protocol.contract import Handle, SinkSettings, TaskInfo, TwoPhaseCommitSink
from exactly.protocol.faults import FaultPoint, FaultSpec, maybe_crash

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass
class HandleMessage(WriterCommitMessage):
    """The commit message of one task: its handle."""

    handle: Handle


def current_task() -> TaskInfo:
    """Query id, run id, epoch, partition and attempt of the running Spark write task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise ExactlyError("exactly sinks write inside Spark tasks only")
    epoch = ctx.getLocalProperty("streaming.sql.batchId")
    query_id = ctx.getLocalProperty("sql.streaming.queryId")
    run_id = ctx.getLocalProperty("spark.jobGroup.id")  # StreamExecution sets it to runId
    if epoch is None or query_id is None or run_id is None or not _UUID.match(run_id):
        raise ExactlyError(
            "exactly sinks need a streaming query's epoch, query id and run id, and this "
            "task has none: write with df.writeStream.format(...).start(), not from a batch "
            "job or inside foreachBatch (and do not change the job group of streaming jobs)"
        )
    return TaskInfo(query_id, run_id, int(epoch), ctx.partitionId(), ctx.taskAttemptId())


class TwoPhaseStreamWriter(DataSourceStreamArrowWriter):
    """Runs any :class:`TwoPhaseCommitSink` under the generic commit protocol."""

    def __init__(self, sink: TwoPhaseCommitSink, settings: SinkSettings,
                 fault: FaultSpec | None) -> None:
        if settings.mode is Mode.EXACTLY_ONCE and not settings.checkpoint_location:
            raise ConfigError(
                f"exactly.{sink.name} sink: give the query's checkpoint directory with "
                "writeStream.option('checkpointLocation', DIR). The sink reads each epoch's "
                "input positions from it to tell a replay from a re-planned epoch; the session "
                "default spark.sql.streaming.checkpointLocation is not visible to sinks."
            )
        self.sink = sink
        self.settings = settings
        self.fault = fault

    def write(self, iterator: Iterator) -> HandleMessage:  # type: ignore[override]
        task = current_task()
        txn = self.sink.begin_transaction(task)
        try:
            wrote_batch = False
            for batch in iterator:
                self.sink.write(txn, batch)
                if not wrote_batch:
                    wrote_batch = True
                    maybe_crash(self.fault, FaultPoint.IN_WRITE, task.epoch)
            if not wrote_batch:
                maybe_crash(self.fault, FaultPoint.IN_WRITE, task.epoch)
            payload = self.sink.pre_commit(txn)
        except BaseException:
            self.sink.abort_transaction(txn)
            raise
        handle = Handle(task.query_id, task.run_id, task.epoch, task.partition, task.attempt,
                        payload)
        if self.settings.mode is Mode.AT_LEAST_ONCE:
            self.sink.commit_visible(handle)
        return HandleMessage(handle)

    def commit(self, messages: list, batchId: int) -> None:  # type: ignore[override]
        Committer(self.sink, self.settings, self.fault).commit_epoch(batchId, _handles(messages))

    def abort(self, messages: list, batchId: int) -> None:  # type: ignore[override]
        Committer(self.sink, self.settings, self.fault).abort_epoch(batchId, _handles(messages))


def _handles(messages: list) -> list[Handle]:
    return [m.handle for m in messages if isinstance(m, HandleMessage)]
