"""Transactional Kafka sink: ``read_committed`` consumers see every row of every epoch once.

Guarantee: exactly once in ``exactly_once`` mode for consumers with
``isolation.level=read_committed`` (an epoch's records become visible together, in one
Kafka transaction, or not at all); at least once in ``at_least_once`` mode (tasks produce
directly; a replay after a crash produces the replayed epoch again).

Why executors do not hold Kafka transactions: Flink's Kafka sink pre-commits by leaving a
transaction open in each task and commits it later from a restored producer, which needs
reflection on the Java client to resume another producer's transaction. librdkafka
(confluent-kafka) cannot resume a transaction it did not open, and Spark's driver-side commit
runs in a different process from the tasks. So, on the generic committer
(:mod:`exactly.protocol.committer`):

* **pre-commit (executors)** - each task stages its rows durably (an Arrow IPC file under
  the sink's log location, ``exactly.logDir``, beside the checkpoint: a local or shared
  directory, or an ``s3://`` prefix, :mod:`exactly.protocol.staging`) and returns a handle
  naming the file. Nothing reaches Kafka.
* **commit (driver side)** - ``commit_handle`` checks that the staged file is there;
  ``publish_epoch`` (a :class:`~exactly.connectors.kafka.publisher.PublishSession`) uses the
  run's producer with ``transactional.id = <prefix>-<query id>``: opened at the run's first
  publish in the commit worker process, with ``init_transactions()`` (which fences any older
  producer of the query - a zombie driver - and completes or aborts the transaction a
  crashed driver left open), then kept across epochs, and dropped after any error so the
  next epoch starts from a fresh one. It reads the epoch marker, and unless the epoch is
  already published produces all the epoch's staged rows and the new marker in ONE
  transaction, then deletes the staged files.
* **epoch marker** - the consumer-group offset of ``<marker topic>[0]`` for the group
  ``<prefix>-<query id>-epochs``, set to ``epoch + 1`` with ``send_offsets_to_transaction``
  inside the data transaction, so it commits atomically with the rows. After a crash,
  "epoch n is published" is decidable: the committed offset is ``> n``. It is read with
  ``read_committed`` (stable offsets only) after ``init_transactions()``, so no transaction
  of the query is in doubt when it is read.
* **abort / recovery** - aborting deletes a staged file; a transaction a crashed driver left
  open is aborted by the next ``init_transactions()`` (or by the broker after
  ``transaction.timeout.ms``) and re-published from the still-staged files of its intent.

Because a Kafka transaction is only open while one epoch is being published (seconds), not
across a checkpoint interval as in Flink, a job that stays down longer than
``transaction.timeout.ms`` loses nothing: the broker aborts the open transaction (if the
driver died inside a publish), the staged rows stay in checkpoint storage, and the restart
publishes them again. The cost: each epoch's rows cross the staging storage once more, and a
crash inside a publish blocks ``read_committed`` consumers of the touched partitions until the
restart's ``init_transactions()`` or the transaction timeout, whichever comes first.

Target state (restores, :mod:`exactly.protocol.target_state`): a topic has no owner, so the
lineage is recorded per application (``transactionalIdPrefix``) as hand-over edges in the
offset metadata of the group ``<prefix>-lineage`` (:mod:`exactly.connectors.kafka.lineage`).
A line's progress is the epoch marker of its newest query (before that query published any,
the epoch it was restored from). A hand-over fences the transactional producers of the
superseded queries (which aborts a transaction a crashed driver left open, so
``read_committed`` readers are not held back until it times out) and records the edge.
Committed records cannot be taken back: a rollback cannot ``retract``; ``keep`` publishes
the epochs after the savepoint again (``read_committed`` readers then see them twice).

Publishing an epoch in N shares from the executors, each share exactly once by its own
producer and marker (``exactly.kafka.publishShares``): :mod:`exactly.connectors.kafka.shares`.

Options, the start-time checks and the input columns: :mod:`exactly.connectors.kafka.options`;
the publishing producer, the epoch marker and the error handling:
:mod:`exactly.connectors.kafka.publisher`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from exactly.config import Mode
from exactly.connectors.kafka.options import KafkaSinkError, KafkaSinkOptions
from exactly.connectors.kafka.publisher import (
    PublishSession,
    drop_session,
    flush,
    kept_session,
    new_producer,
    produce_batch,
    read_marker,
)
from exactly.connectors.kafka.shares import (
    KafkaPayload,
    epoch_shares,
    publish_in_process,
    publish_on_executors,
    share_ids,
    share_of,
    split,
)
from exactly.connectors.kafka.shares import published_through as target_published_through
from exactly.connectors.kafka.streaming import EpochStream
from exactly.errors import DataLossError
from exactly.logs import log_event
from exactly.protocol.contract import (
    CommitOutcome,
    Edge,
    Handle,
    Lineage,
    RollbackSupport,
    SinkSettings,
    TargetState,
    TaskInfo,
    TwoPhaseCommitSink,
)
from exactly.protocol.stages import open_stage
from exactly.protocol.staging import StagedPayload, StagedTxn
from exactly.protocol.target_state import line_state

logger = logging.getLogger("exactly.kafka")

_STAGED = "rows.arrow"
#: queries this process said publish their shares in process (said once a query: Spark
#: builds a new sink object before every epoch of the data source writer)
_SAID_IN_PROCESS: set[str] = set()


@dataclass
class KafkaTxn:
    """One task attempt: a staging file (exactly_once) or a live producer (at_least_once)."""

    task: TaskInfo
    staged: StagedTxn | None = None
    rows: int = 0  # at_least_once; a staged attempt counts its rows in ``staged``
    producer: Any = field(default=None, repr=False)
    errors: list[str] = field(default_factory=list)


class KafkaSink(TwoPhaseCommitSink[KafkaTxn]):
    """Exactly-once Kafka output for ``read_committed`` consumers: one transaction per epoch,
    or with ``exactly.kafka.publishShares=N`` one per share of an epoch
    (:mod:`exactly.connectors.kafka.shares`)."""

    name = "kafka"
    payload_type = KafkaPayload

    def __init__(self, options: KafkaSinkOptions, settings: SinkSettings) -> None:
        self.options = options
        self.mode = settings.mode
        self.root = settings.require_log_location("exactly.kafka")
        self.stage = open_stage(self.root, "staging", _STAGED)
        self._run_id: str | None = None
        self._stream: EpochStream | None = None
        #: the committing process's Spark session (foreachBatch): epochs in shares are
        #: published by a Spark job of it
        self._spark: Any = None

    def __getstate__(self) -> dict[str, Any]:  # the executors need no stream, no session
        return {**self.__dict__, "_stream": None, "_spark": None}

    def bind_commit_session(self, spark: Any) -> None:
        self._spark = spark

    @property
    def log_directory(self) -> Path | str:
        return self.root

    @property
    def staging(self) -> Path | str:
        return self.stage.base

    def transactional_id(self, query_id: str) -> str:
        return self.options.transactional_id(query_id)

    def marker_group(self, query_id: str) -> str:
        return self.options.marker_group(query_id)

    # -- executor side ----------------------------------------------------------------
    def begin_transaction(self, task: TaskInfo) -> KafkaTxn:
        if self.mode is Mode.AT_LEAST_ONCE:
            txn = KafkaTxn(task)

            def on_delivery(err: Any, _msg: Any) -> None:
                if err is not None:
                    txn.errors.append(err.str())

            txn.producer = new_producer(self.options, {"on_delivery": on_delivery})
            return txn
        return KafkaTxn(task, staged=self.stage.begin_txn(task))

    def write(self, txn: KafkaTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if txn.producer is not None:
            produce_batch(txn.producer, batch, self.options.topic)
            txn.rows += batch.num_rows
            return
        staged = txn.staged
        assert staged is not None
        if staged.writer is None:
            staged.writer = pa.ipc.new_file(self.stage.open_output(staged), batch.schema)
        staged.writer.write_batch(batch)
        staged.rows += batch.num_rows

    def pre_commit(self, txn: KafkaTxn) -> StagedPayload:
        if txn.producer is not None:  # at_least_once: delivered (acknowledged) = done
            flush(txn.producer, self.options.publish_timeout_ms / 1000)
            if txn.errors:
                raise KafkaSinkError(f"Kafka refused records of epoch {txn.task.epoch}: "
                                     f"{txn.errors[0]} ({len(txn.errors)} errors)")
            return KafkaPayload(txn.rows)
        assert txn.staged is not None
        # the share count the epoch is published in goes into the intent with the file
        return KafkaPayload(**asdict(self.stage.pre_commit(txn.staged)),
                            shares=self.options.publish_shares)

    def abort_transaction(self, txn: KafkaTxn) -> None:
        if txn.producer is not None:
            txn.producer.purge()  # what is not sent yet; what was sent stays (at least once)
            return
        if txn.staged is not None:
            self.stage.abort_txn(txn.staged)

    def commit_visible(self, handle: Handle) -> None:
        """at_least_once: the task already produced and flushed its rows."""

    # -- driver side -------------------------------------------------------------------
    def commit_handle(self, handle: Handle) -> CommitOutcome:
        """Check that the pre-commit can still be published (the publish does the work)."""
        staged = self.stage.staged_file(handle)
        if staged is None or staged.exists():
            return CommitOutcome.COMMITTED
        if self._handle_published(handle):
            return CommitOutcome.ALREADY_COMMITTED
        raise DataLossError(
            f"epoch {handle.epoch} partition {handle.partition}: the staged rows "
            f"{staged} named by the commit intent are gone and the epoch was "
            "never published to Kafka; something outside exactly removed them")

    def publish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        """Produce every staged row of the epoch and the epoch marker in one transaction.

        When :meth:`start_early_publish` streamed rows into the epoch's open transaction,
        only what is missing is produced, and only if the transaction holds the rows of
        exactly ``handles`` (otherwise it is aborted and the epoch produced again from
        the handles' files). Idempotent: an epoch whose marker is already committed is not
        produced again. Raises FencedError when a newer producer of the same query took over.
        """
        shares = epoch_shares(handles, self.options.publish_shares)
        if shares > 1:
            self._publish_shares(epoch, handles, shares)
            return
        files = [f for f in map(self.stage.staged_file, handles) if f is not None]
        stream, self._stream = self._stream, None
        if stream is not None and (stream.epoch != epoch or not files):
            self._end_stream(stream)  # e.g. recovery publishing another epoch
            stream = None
        if files:
            session = self._publisher(handles[0].query_id)
            try:
                if stream is not None:
                    stream.stop()  # its thread holds the session until it ends
                with session.busy:
                    streamed = None
                    if stream is not None and stream.session is session:
                        rows = stream.finish(handles)
                        if rows is not None:
                            streamed = (stream.producer, rows)
                    session.publish(epoch, files, streamed)
            except BaseException:
                drop_session(session)  # the next epoch starts from a fresh producer
                raise
        for handle in handles:
            if handle.payload.dir:
                self._remove(handle)

    def _publish_shares(self, epoch: int, handles: Sequence[Handle], shares: int) -> None:
        """Epoch ``epoch`` in ``shares`` shares, each by its own producer in one transaction
        with its own marker (:mod:`exactly.connectors.kafka.shares`): as a Spark job on the
        executors when this process has a Spark session, else here one after the other."""
        stream, self._stream = self._stream, None
        if stream is not None:  # never begun with shares; a stream of another setting
            self._end_stream(stream)
        if not handles:
            return
        query_id = handles[0].query_id
        parts = split(handles, shares)
        if self._spark is not None:
            publish_on_executors(self._spark, self.options, self.stage, query_id, epoch, parts)
        else:
            if query_id not in _SAID_IN_PROCESS:
                _SAID_IN_PROCESS.add(query_id)
                log_event(logger, "kafka_shares_in_process", logging.WARNING, shares=shares,
                          hint="the commit runs without a Spark session (writeStream.format"
                               "(\"exactly.kafka\")): each share is published from this "
                               "process, one after the other; start the query with "
                               "exactly.start_query to publish them on the executors")
            publish_in_process(self.options, self.stage, query_id, epoch, parts)
        for handle in handles:
            if handle.payload.dir:
                self._remove(handle)

    def _handle_published(self, handle: Handle) -> bool:
        """Whether the share (or the whole epoch) ``handle`` was published in is in Kafka."""
        shares = getattr(handle.payload, "shares", 1)
        if shares == 1:
            return self._publisher(handle.query_id).published_through() > handle.epoch
        share = share_of(handle, shares)
        return (read_marker(self.options, handle.query_id, share=share) > handle.epoch
                or read_marker(self.options, handle.query_id) > handle.epoch)

    def abort(self, handle: Handle) -> None:
        if handle.payload.dir:
            self._remove(handle)

    def start_early_publish(self, query_id: str, run_id: str, epoch: int) -> None:
        """Begin the epoch's transaction now and stream each task's staged rows into it
        while the tasks run (:mod:`exactly.connectors.kafka.streaming`); exactly_once only.
        Nothing of it is visible before :meth:`publish_epoch` commits it."""
        if self.mode is not Mode.EXACTLY_ONCE or self.options.publish_shares > 1:
            return  # shares are published by their own producers after the intent
        if self._stream is not None:
            self._end_stream(self._stream)
        self._run_id = run_id
        session = self._publisher(query_id)
        self._stream = EpochStream(session, self.stage, self.options, run_id, epoch)
        self._stream.start()

    def stop_early_publish(self, epoch: int) -> None:
        """Abort what a stream that :meth:`publish_epoch` did not use holds."""
        stream, self._stream = self._stream, None
        if stream is not None:
            self._end_stream(stream)

    @staticmethod
    def _end_stream(stream: EpochStream) -> None:
        """Stop ``stream`` and abort its transaction, if its producer still holds it open
        (best effort: otherwise the next publish, ``init_transactions`` or the transaction
        timeout aborts it)."""
        stream.stop()
        session = stream.session
        with session.busy:
            if session.in_transaction and session.producer is stream.producer:
                try:
                    session.abort_open()
                except Exception as exc:
                    log_event(logger, "stream_abort_failed", logging.WARNING,
                              epoch=stream.epoch, error=str(exc))
                    drop_session(session)  # closing aborts what it can; the next reopens

    def list_pre_commits(self, query_id: str) -> list[Handle]:
        return self.stage.list(query_id)

    # -- helpers -----------------------------------------------------------------------
    def _remove(self, handle: Handle) -> None:
        self.stage.discard(handle)

    def open_run(self, query_id: str, run_id: str) -> None:
        self._run_id = run_id

    def _publisher(self, query_id: str) -> PublishSession:
        """This run's session, kept across epochs in this process (:func:`kept_session`)."""
        return kept_session(self.options, query_id, self._run_id)

    # -- target state (restores) ---------------------------------------------------------
    def describe_target(self) -> str:
        return f"topic {self.options.topic or self.options.marker_topic}"

    def _last_epoch(self, query_id: str) -> int | None:
        after = target_published_through(self.options, query_id)
        return after - 1 if after > 0 else None

    def target_state(self, query_id: str) -> TargetState:
        from exactly.connectors.kafka.lineage import read_edges

        return line_state(self.describe_target(), read_edges(self.options), query_id,
                          self._last_epoch)

    def rollback_support(self, state: TargetState, epoch: int) -> RollbackSupport:
        return RollbackSupport(
            retract="records committed to Kafka cannot be taken back",
            keep="their records stay and the restored job publishes those epochs again: "
                 "read_committed readers then see them twice")

    def hand_over(self, state: TargetState, to_query: str, lineage: Lineage) -> dict[str, Any]:
        """Fence the transactional producers of the savepoint's query and of the line's
        newest query (aborting a transaction a crashed driver left open; none in a fork),
        then record ``to_query`` <- ``lineage[0]``."""
        from confluent_kafka import KafkaError, KafkaException, Producer

        from exactly.connectors.kafka.lineage import record_edge

        fenced = []
        newest = () if state.fresh else (lineage[0].query_id, *state.members[:1])
        for query in dict.fromkeys(newest):
            for txn_id in (self.options.transactional_id(query),
                           *share_ids(self.options, query)):
                producer = Producer({**self.options.client_conf(), "transactional.id": txn_id})
                try:
                    producer.init_transactions(30)
                finally:
                    producer.flush(5)
                fenced.append(txn_id)
        done: dict[str, Any] = {"fenced": fenced}
        try:
            dropped = record_edge(self.options, Edge(to_query, lineage[0], time.time()))
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not state.fresh or not isinstance(error, KafkaError) or \
                    error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            # a fork into a topic the job's first write will create: nothing to record on
            topic = self.options.require_marker_topic()
            log_event(logger, "kafka_fork_lineage_not_recorded", logging.WARNING,
                      topic=topic, query=to_query, parent=lineage[0].query_id,
                      hint="create the topic before restoring to have the fork's lineage "
                           "recorded; a later restore of an older savepoint of "
                           f"{lineage[0].query_id} into it is then checked as a rollback")
            done["lineage_recorded"] = f"no: topic {topic} does not exist yet"
            return done
        if dropped:
            done["lineage_edges_dropped"] = [e.query_id for e in dropped]
        return done
