"""Adapter from Spark's Python streaming writer API to the two-phase-commit contract.

``write()`` runs in executor Python workers, ``commit()``/``abort()`` in a driver-side
Python worker that Spark starts for the call: nothing but the handles carries over, so all
protocol state lives in the sink's commit log.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from exactly.config import Mode
from exactly.errors import ConfigError, ExactlyError
from exactly.protocol.committer import Committer
from exactly.protocol.contract import Handle, SinkSettings, TaskInfo, TwoPhaseCommitSink
from exactly.protocol.faults import FaultSpec
from exactly.protocol.recovery import recover_on_new_driver
from exactly.protocol.task import slowest, write_task

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass
class HandleMessage(WriterCommitMessage):
    """The commit message of one task: its handle."""

    handle: Handle | None  # None: the task had no rows and pre-committed nothing
    pre_commit_ms: float | None = None


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
    """Runs any :class:`TwoPhaseCommitSink` under the generic commit protocol.

    When Spark plans the query (``streamWriter``), the writer prepares the target once per
    process (:meth:`TwoPhaseCommitSink.prepare_target`) and, for sinks whose pre-commits
    hold locks (``recover_before_first_epoch``), recovers before any task writes.
    """

    def __init__(self, sink: TwoPhaseCommitSink, settings: SinkSettings,
                 fault: FaultSpec | None, schema: StructType | None = None,
                 partitions: int | None = None) -> None:
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
        if schema is not None:
            from pyspark.sql.pandas.types import to_arrow_schema

            prepare_once(sink, to_arrow_schema(schema, timezone="UTC"), partitions)
        if settings.mode is Mode.EXACTLY_ONCE and sink.recover_before_first_epoch:
            recover_on_new_driver(sink, settings, fault)

    def write(self, iterator: Iterator) -> HandleMessage:
        outcome = write_task(self.sink, current_task(), iterator, mode=self.settings.mode,
                             fault=self.fault)
        return HandleMessage(outcome.handle, outcome.pre_commit_ms)

    def commit(self, messages: list, batchId: int) -> None:
        Committer(self.sink, self.settings, self.fault).commit_epoch(
            batchId, _handles(messages), pre_commit_ms=slowest(
                m.pre_commit_ms for m in messages if isinstance(m, HandleMessage)))

    def abort(self, messages: list, batchId: int) -> None:
        Committer(self.sink, self.settings, self.fault).abort_epoch(batchId, _handles(messages))


#: (sink repr, schema) already prepared in this process (Spark plans the writer twice)
_PREPARED: set[tuple[str, str]] = set()


def prepare_once(sink: TwoPhaseCommitSink, schema: pa.Schema,
                 partitions: int | None = None) -> None:
    """``sink.prepare_target(schema, partitions)`` once per process for the same sink."""
    key = (repr(sink), str(schema))
    if key not in _PREPARED:
        sink.prepare_target(schema, partitions)
        _PREPARED.add(key)


def _handles(messages: list) -> list[Handle]:
    return [m.handle for m in messages
            if isinstance(m, HandleMessage) and m.handle is not None]
