"""Run any :class:`TwoPhaseCommitSink` from ``foreachBatch``: every output mode, same protocol.

Python data source sinks refuse Update output mode, which continuously updated aggregates
need. ``foreachBatch(func)`` accepts every mode and calls ``func(batch_df, epoch)`` in the
driver process, again with the same epoch after a crash. :class:`TwoPhaseForeachBatch` is
such a ``func``; it runs the SAME sink and the SAME :class:`~exactly.protocol.committer.Committer`
as the data-source path:

1. (driver) bind the sink to the query, take the lease; a new run recovers first -- before
   any task writes, so leftover pre-commits cannot block the replay's writes;
2. (executors) ``batch_df.mapInArrow`` runs ``begin_transaction / write / pre_commit`` per
   partition and returns the handle; ``collect()`` brings the handles to the driver;
3. (driver) ``Committer.commit_epoch(epoch, handles)``; on failure ``abort_epoch``.

Fault points fire as in the data-source path: ``in_write`` in the executor's Python worker,
the driver points in this driver process (which then kills its JVM too).

``start_query(df, sink_format=..., output_mode="update", ...)`` builds this writer itself,
with the sink built from the format's options (:func:`exactly.spark.formats.sink_for`) and
the checkpoint configuration applied as for the other modes; build it by hand only for a
sink of your own.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from exactly.config import Mode
from exactly.errors import ExactlyError
from exactly.logs import log_event
from exactly.protocol.committer import Committer
from exactly.protocol.contract import Handle, SinkSettings, TaskInfo, TwoPhaseCommitSink
from exactly.protocol.faults import FaultSpec, SimulatedCrash
from exactly.protocol.task import slowest, write_task
from exactly.spark.gc_freeze import freeze_once

logger = logging.getLogger("exactly.foreach_batch")


#: what each task of ``mapInArrow`` returns: its handle (JSON) and its pre-commit time, as
#: Spark's type built once (a DDL string is parsed in the JVM at every epoch) and as Arrow's
_HANDLE_TYPE = StructType([StructField("handle", StringType()),
                           StructField("pre_commit_ms", DoubleType())])
_HANDLE_ROWS = to_arrow_schema(_HANDLE_TYPE)


def _partition_writer(sink: TwoPhaseCommitSink, mode: Mode, fault: FaultSpec | None,
                      query_id: str, run_id: str, epoch: int):
    """The function ``mapInArrow`` runs in each task: step 1 of the protocol."""

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise ExactlyError("TwoPhaseForeachBatch: the partition writer runs in Spark "
                               "tasks only")
        task = TaskInfo(query_id, run_id, epoch, ctx.partitionId(), ctx.taskAttemptId())
        outcome = write_task(sink, task, batches, mode=mode, fault=fault)
        if outcome.handle is not None:
            yield pa.RecordBatch.from_pydict({"handle": [json.dumps(outcome.handle.to_json())],
                                              "pre_commit_ms": [outcome.pre_commit_ms]},
                                             schema=_HANDLE_ROWS)

    return write_partition


def running_checkpoint(query_id: str) -> str:
    """The resolved checkpoint directory of the active streaming query ``query_id``.

    ``foreachBatch`` runs in the driver process with a clone of the user's session, whose
    query manager does not list the query; the session the query was started from does.
    A classic session only (Connect: :meth:`TwoPhaseForeachBatch._connect_identity`).
    """
    from pyspark.sql import SparkSession

    query = SparkSession.builder.getOrCreate().streams.get(query_id)
    if query is None:
        raise ExactlyError(
            f"TwoPhaseForeachBatch: cannot find the running query {query_id} to read its "
            "checkpoint location; pass it as SinkSettings(checkpoint_location=DIR)"
        )
    return str(query._jsq.streamingQuery().resolvedCheckpointRoot())


class TwoPhaseForeachBatch:
    """``df.writeStream.foreachBatch(TwoPhaseForeachBatch(sink, settings))``.

    Guarantee: the sink's own (exactly once for 2PC and write-ahead sinks), in every output
    mode. ``prepare`` (default True) calls the sink's ``prepare_target(schema, partitions)``
    before the first epoch this object sees (table creation, server checks).
    """

    def __init__(self, sink: TwoPhaseCommitSink, settings: SinkSettings,
                 fault: FaultSpec | None = None, prepare: bool = True) -> None:
        self.sink = sink
        self.settings = settings
        self.fault = fault
        self.prepare = prepare
        self._prepared = False
        #: kept across epochs: it begins (owner, lease, recovery) once per run
        self._committer: Committer | None = None
        #: on Spark Connect: (query id, run id) of the run this process serves
        self._run_identity: tuple[str, str] | None = None
        #: whether the session's run ends are watched (exactly.spark.run_end)
        self._watching = False

    def _identity(self, batch_df: Any) -> tuple[str, str]:
        """(query id, run id) of the query calling this function."""
        from exactly.spark.connect import is_connect

        if is_connect(batch_df):
            return self._connect_identity()
        sc = batch_df.sparkSession.sparkContext
        query_id = sc.getLocalProperty("sql.streaming.queryId")
        run_id = sc.getLocalProperty("spark.jobGroup.id")
        if not query_id or not run_id:
            raise ExactlyError("TwoPhaseForeachBatch runs inside writeStream.foreachBatch only "
                               "(no streaming query id / run id in this call)")
        return query_id, run_id

    def _connect_identity(self) -> tuple[str, str]:
        """On Spark Connect this function runs in the Python process the server starts for
        the query's ``foreachBatch`` (one per run of the query, gone when the run ends),
        whose session sees neither the query nor its local properties: the query id is the
        one Spark wrote into the checkpoint's ``metadata`` before the first epoch, the run id
        is this process's own."""
        if self._run_identity is None:
            from exactly.checkpoint.spark_files import read_metadata

            location = self.settings.checkpoint_location
            query_id = read_metadata(location) if location else None
            if not query_id:
                raise ExactlyError(
                    "TwoPhaseForeachBatch on Spark Connect needs the query's checkpoint to "
                    "know the query (the server's foreachBatch process cannot see it): pass "
                    "SinkSettings(checkpoint_location=DIR), the query's checkpointLocation, "
                    "or start the query with exactly.start_query")
            self._run_identity = (query_id, f"connect-{uuid.uuid4()}")
        return self._run_identity

    def __call__(self, batch_df: Any, epoch: int) -> None:
        from exactly.spark.connect import is_connect

        query_id, run_id = self._identity(batch_df)
        if not self._watching and not is_connect(batch_df):
            from pyspark.sql import SparkSession

            from exactly.spark.run_end import watch_run_ends

            # the session the query runs in (batch_df's is a clone): the run's end stops
            # the lease heartbeat this object's committer starts
            watch_run_ends(SparkSession.builder.getOrCreate())
            self._watching = True
        freeze_once()  # full collections of the driver's loaded modules out of the epochs
        if self.prepare and not self._prepared:
            # no RDDs on Connect: the sink's checks of the task count are skipped there
            partitions = None if is_connect(batch_df) else batch_df.rdd.getNumPartitions()
            self.sink.prepare_target(to_arrow_schema(batch_df.schema, timezone="UTC"),
                                     partitions)
            self._prepared = True
        if self.settings.mode is Mode.EXACTLY_ONCE and not self.settings.checkpoint_location:
            self.settings = replace(self.settings,
                                    checkpoint_location=running_checkpoint(query_id))
        if self._committer is None or self._committer.settings is not self.settings:
            self._committer = Committer(self.sink, self.settings, self.fault)
        if not is_connect(batch_df):  # (on Connect, mapInArrow jobs need the client's API)
            self.sink.bind_commit_session(batch_df.sparkSession)
        committer = self._committer
        if self.settings.mode is Mode.EXACTLY_ONCE:
            committer.ensure_run(query_id, run_id)  # a new run recovers before its tasks write
        writer = _partition_writer(self.sink, self.settings.mode, self.fault, query_id, run_id,
                                   epoch)
        if self.settings.mode is Mode.EXACTLY_ONCE:  # overlap the publish with the tasks
            self.sink.start_early_publish(query_id, run_id, epoch)
        try:
            # as Arrow: the handles reach Python without a row of Python objects each
            rows = batch_df.mapInArrow(writer, _HANDLE_TYPE).toArrow()
            handles = [Handle.from_json(json.loads(text), self.sink.payload_type)
                       for text in rows.column("handle").to_pylist()]
            try:
                committer.commit_epoch(epoch, handles, pre_commit_ms=slowest(
                    rows.column("pre_commit_ms").to_pylist()))
            except SimulatedCrash:
                raise
            except BaseException:
                log_event(logger, "commit_failed", logging.WARNING, epoch=epoch,
                          handles=len(handles))
                self._committer = None  # whatever runs next begins afresh
                committer.abort_epoch(epoch, handles)
                raise
        finally:
            if self.settings.mode is Mode.EXACTLY_ONCE:
                self.sink.stop_early_publish(epoch)
