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
  the sink's log directory, ``exactly.logDir``, beside the checkpoint) and returns a handle
  naming the file. Nothing reaches Kafka.
* **commit (driver side)** - ``commit_handle`` checks that the staged file is there;
  ``publish_epoch`` opens a producer with ``transactional.id = <prefix>-<query id>``, calls
  ``init_transactions()`` (which fences any older producer of the query - a zombie driver -
  and completes or aborts the transaction a crashed driver left open), reads the epoch
  marker, and unless the epoch is already published produces all the epoch's staged rows
  and the new marker in ONE transaction, then deletes the staged files.
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

Input columns follow Spark's own Kafka sink: ``value`` (string or binary, required),
``key`` (string or binary, optional), ``topic`` (string, optional when option ``topic`` is
set), ``partition`` (int, optional), ``headers`` (array of struct<key string, value binary>,
optional). Other columns are ignored.

Options (``df.writeStream.format("exactly.kafka")``):

``kafka.bootstrap.servers``   required
``kafka.<librdkafka option>`` passed to the producers (librdkafka names, e.g.
                              ``kafka.compression.type``, ``kafka.security.protocol``)
``topic``                     default topic of rows without a ``topic`` column
``transactionalIdPrefix``     required in exactly_once mode; the transactional id and the
                              marker group are ``<prefix>-<query id>[-epochs]``
``kafka.transaction.timeout.ms``  default 60000; checked at start against the broker's
                              ``transaction.max.timeout.ms`` and the checkpoint interval
``exactly.kafka.markerTopic`` topic whose partition 0 carries the marker offset (default:
                              ``topic``); must exist, is never written to
``exactly.checkpointIntervalMs``  the trigger interval, for the timeout check
``exactly.kafka.publishTimeoutMs``  give up publishing one epoch after this (default 300000)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from exactly.config import Mode
from exactly.errors import ConfigError, DataLossError, ExactlyError, FencedError
from exactly.fsutil import fsync_file
from exactly.logs import log_event
from exactly.protocol.contract import (
    CommitOutcome,
    Handle,
    SinkSettings,
    TaskInfo,
    TwoPhaseCommitSink,
)
from exactly.protocol.staging import StagedPayload, StagingArea

logger = logging.getLogger("exactly.connectors.kafka.sink")

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
DEFAULT_PUBLISH_TIMEOUT_MS = 300_000
#: a sink-specific crash point inside ``publish_epoch``: after the epoch's records were
#: produced into the open transaction, before its commit (maybe_crash_in_transaction)
KAFKA_FAULT_ENV = "EXACTLY_KAFKA_FAULT"
KAFKA_FAULT_MARKER_ENV = "EXACTLY_KAFKA_FAULT_MARKER"
IN_TRANSACTION = "in_transaction"
_STAGED = "rows.arrow"
_SINK_COLUMNS = ("key", "value", "topic", "partition", "headers")


class KafkaSinkError(ExactlyError):
    """Kafka refused or failed an operation of the sink; the message names the cause."""


@dataclass(frozen=True)
class KafkaSinkOptions:
    """The parsed options of one ``exactly.kafka`` sink."""

    bootstrap: str
    producer_conf: dict[str, str]
    topic: str | None
    transactional_id_prefix: str | None
    transaction_timeout_ms: int
    marker_topic: str | None
    checkpoint_interval_ms: int | None
    publish_timeout_ms: int

    @classmethod
    def from_options(cls, options: Mapping[str, str], mode: Mode) -> KafkaSinkOptions:
        bootstrap = options.get("kafka.bootstrap.servers", "")
        if not bootstrap:
            raise ConfigError("exactly.kafka sink: set option kafka.bootstrap.servers, e.g. "
                              ".option('kafka.bootstrap.servers', 'host:9092')")
        conf = {k[len("kafka."):]: str(v) for k, v in options.items()
                if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        timeout = int(conf.pop("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
        for reserved in ("transactional.id", "isolation.level"):
            if reserved in conf:
                raise ConfigError(f"exactly.kafka sink: option kafka.{reserved} is set by the "
                                  "sink itself; remove it (use transactionalIdPrefix)")
        prefix = options.get("transactionalIdPrefix") or None
        if mode is Mode.EXACTLY_ONCE and not prefix:
            raise ConfigError(
                "exactly.kafka sink: exactly_once needs option transactionalIdPrefix (the "
                "transactional ids are <prefix>-<query id>); pick a prefix unique to this "
                "application, e.g. .option('transactionalIdPrefix', 'orders-enricher')")
        topic = options.get("topic") or None
        interval = options.get("exactly.checkpointIntervalMs")
        return cls(
            bootstrap=bootstrap, producer_conf=conf, topic=topic,
            transactional_id_prefix=prefix, transaction_timeout_ms=timeout,
            marker_topic=options.get("exactly.kafka.markerTopic") or topic,
            checkpoint_interval_ms=int(float(interval)) if interval else None,
            publish_timeout_ms=int(options.get("exactly.kafka.publishTimeoutMs",
                                               DEFAULT_PUBLISH_TIMEOUT_MS)))

    def client_conf(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.producer_conf}


# -- start-time checks ------------------------------------------------------------------
def broker_transaction_max_timeout_ms(conf: Mapping[str, Any], timeout: float = 30) -> int:
    """The broker's ``transaction.max.timeout.ms`` (AdminClient ``describe_configs``)."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(dict(conf))
    try:
        brokers = admin.list_topics(timeout=timeout).brokers
    except Exception as exc:
        raise KafkaSinkError(f"cannot reach Kafka at {conf.get('bootstrap.servers')}: {exc}. "
                             "Check kafka.bootstrap.servers and that the broker is up") from exc
    broker_id = str(min(brokers))
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, broker_id)])
    (config,) = [f.result(timeout) for f in futures.values()]
    return int(config["transaction.max.timeout.ms"].value)


def check_transaction_timeout(transaction_timeout_ms: int, broker_max_timeout_ms: int,
                              checkpoint_interval_ms: int | None) -> None:
    """Refuse a ``transaction.timeout.ms`` the seeds warn about, naming the fix.

    It must not exceed the broker's ``transaction.max.timeout.ms`` (Kafka refuses to start
    such a transaction) and must exceed the checkpoint interval (an epoch's transaction must
    be able to outlive the epoch that produces it).
    """
    if transaction_timeout_ms > broker_max_timeout_ms:
        raise ConfigError(
            f"exactly.kafka sink: kafka.transaction.timeout.ms={transaction_timeout_ms} is "
            f"above the broker's transaction.max.timeout.ms={broker_max_timeout_ms}; Kafka "
            "would refuse or abort the transaction and its records would be lost. Set "
            f"checkpoint interval < kafka.transaction.timeout.ms <= {broker_max_timeout_ms}, "
            "or raise transaction.max.timeout.ms on the brokers.")
    if checkpoint_interval_ms is not None and transaction_timeout_ms <= checkpoint_interval_ms:
        raise ConfigError(
            f"exactly.kafka sink: kafka.transaction.timeout.ms={transaction_timeout_ms} is not "
            f"above the checkpoint interval ({checkpoint_interval_ms} ms): a transaction could "
            "time out before its epoch is committed. Set checkpoint interval < "
            f"kafka.transaction.timeout.ms <= {broker_max_timeout_ms} (the broker's "
            "transaction.max.timeout.ms), e.g. a few times the interval.")


def check_schema(schema: Any, topic: str | None) -> None:
    """Check the DataFrame's columns against what the sink writes (Spark's Kafka layout)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
    )

    fields = {f.name: f.dataType for f in schema.fields}
    text = (StringType, BinaryType)
    if "value" not in fields or not isinstance(fields["value"], text):
        raise ConfigError("exactly.kafka sink: the DataFrame needs a 'value' column of type "
                          "string or binary, e.g. df.select(to_json(struct('*')).alias("
                          "'value'))")
    if "key" in fields and not isinstance(fields["key"], text):
        raise ConfigError("exactly.kafka sink: column 'key' must be string or binary; cast it")
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise ConfigError("exactly.kafka sink: column 'topic' must be a string")
    if "topic" not in fields and not topic:
        raise ConfigError("exactly.kafka sink: give the target with .option('topic', NAME) or a "
                          "'topic' column")
    if "partition" in fields and not isinstance(fields["partition"],
                                                (IntegerType, LongType, ShortType)):
        raise ConfigError("exactly.kafka sink: column 'partition' must be an integer")
    if "headers" in fields and not isinstance(fields["headers"], ArrayType):
        raise ConfigError("exactly.kafka sink: column 'headers' must be "
                          "array<struct<key: string, value: binary>>")


# -- the sink --------------------------------------------------------------------------
@dataclass
class KafkaTxn:
    """One task attempt: a staging file (exactly_once) or a live producer (at_least_once)."""

    task: TaskInfo
    directory: Path | None = None
    rows: int = 0
    writer: Any = field(default=None, repr=False)
    sink: Any = field(default=None, repr=False)
    producer: Any = field(default=None, repr=False)
    errors: list[str] = field(default_factory=list)


class KafkaSink(TwoPhaseCommitSink[KafkaTxn]):
    """Exactly-once Kafka output for ``read_committed`` consumers: one transaction per epoch."""

    name = "kafka"
    payload_type = StagedPayload

    def __init__(self, options: KafkaSinkOptions, settings: SinkSettings) -> None:
        self.options = options
        self.mode = settings.mode
        self.root = settings.require_log_dir("exactly.kafka")
        self.stage = StagingArea(self.root / "staging", self.root, _STAGED)
        self._session: _PublishSession | None = None

    def __getstate__(self) -> dict[str, Any]:  # clients never travel to executors
        state = dict(self.__dict__)
        state["_session"] = None
        return state

    @property
    def log_directory(self) -> Path:
        return self.root

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def transactional_id(self, query_id: str) -> str:
        return f"{self.options.transactional_id_prefix}-{query_id}"

    def marker_group(self, query_id: str) -> str:
        return f"{self.options.transactional_id_prefix}-{query_id}-epochs"

    # -- executor side ----------------------------------------------------------------
    def begin_transaction(self, task: TaskInfo) -> KafkaTxn:
        if self.mode is Mode.AT_LEAST_ONCE:
            txn = KafkaTxn(task)

            def on_delivery(err: Any, _msg: Any) -> None:
                if err is not None:
                    txn.errors.append(err.str())

            txn.producer = _new_producer(self.options, {"on_delivery": on_delivery})
            return txn
        return KafkaTxn(task, directory=self.stage.begin(task))

    def write(self, txn: KafkaTxn, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if txn.producer is not None:
            _produce_batch(txn.producer, batch, self.options.topic)
        else:
            assert txn.directory is not None
            if txn.writer is None:
                txn.sink = pa.OSFile(str(txn.directory / _STAGED), "wb")
                txn.writer = pa.ipc.new_file(txn.sink, batch.schema)
            txn.writer.write_batch(batch)
        txn.rows += batch.num_rows

    def pre_commit(self, txn: KafkaTxn) -> StagedPayload:
        if txn.producer is not None:  # at_least_once: delivered (acknowledged) = done
            _flush(txn.producer, self.options.publish_timeout_ms / 1000)
            if txn.errors:
                raise KafkaSinkError(f"Kafka refused records of epoch {txn.task.epoch}: "
                                     f"{txn.errors[0]} ({len(txn.errors)} errors)")
            return StagedPayload(txn.rows)
        assert txn.directory is not None
        has_file = txn.writer is not None
        if has_file:
            txn.writer.close()
            txn.sink.close()
            txn.writer = txn.sink = None
            fsync_file(txn.directory / _STAGED)
        return self.stage.payload(txn.directory, txn.rows, has_file)

    def abort_transaction(self, txn: KafkaTxn) -> None:
        if txn.producer is not None:
            txn.producer.purge()  # what is not sent yet; what was sent stays (at least once)
            return
        with contextlib.suppress(Exception):
            if txn.writer is not None:
                txn.writer.close()
                txn.sink.close()
        if txn.directory is not None:
            shutil.rmtree(txn.directory, ignore_errors=True)

    def commit_visible(self, handle: Handle) -> None:
        """at_least_once: the task already produced and flushed its rows."""

    # -- driver side -------------------------------------------------------------------
    def commit_handle(self, handle: Handle) -> CommitOutcome:
        """Check that the pre-commit can still be published (the publish does the work)."""
        if not handle.payload.file or self._staged(handle).exists():
            return CommitOutcome.COMMITTED
        if self._publisher(handle.query_id).published_through() > handle.epoch:
            return CommitOutcome.ALREADY_COMMITTED
        raise DataLossError(
            f"epoch {handle.epoch} partition {handle.partition}: the staged rows "
            f"{self._staged(handle)} named by the commit intent are gone and the epoch was "
            "never published to Kafka; something outside exactly removed them")

    def publish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        """Produce every staged row of the epoch and the epoch marker in one transaction.

        Idempotent: an epoch whose marker is already committed is not produced again.
        Raises FencedError when a newer producer of the same query took over.
        """
        files = [self._staged(h) for h in handles if h.payload.file]
        if files:
            session = self._publisher(handles[0].query_id)
            try:
                session.publish(epoch, files)
            finally:
                self._session = None
                session.close()
        for handle in handles:
            if handle.payload.dir:
                self._remove(handle)

    def abort(self, handle: Handle) -> None:
        if handle.payload.dir:
            self._remove(handle)

    def list_pre_commits(self, query_id: str) -> list[Handle]:
        return self.stage.list(query_id)

    # -- helpers -----------------------------------------------------------------------
    def _staged(self, handle: Handle) -> Path:
        return self.stage.directory(handle) / _STAGED

    def _remove(self, handle: Handle) -> None:
        self.stage.discard(handle)

    def _publisher(self, query_id: str) -> _PublishSession:
        if self._session is None or self._session.query_id != query_id:
            self._session = _PublishSession(self, query_id)
        return self._session


class _PublishSession:
    """The driver side's transactional producer of one query, fenced and recovered."""

    def __init__(self, sink: KafkaSink, query_id: str) -> None:
        self.sink = sink
        self.options = sink.options
        self.query_id = query_id
        self.producer: Any = None
        self.consumer: Any = None
        self.in_transaction = False

    def _open(self) -> None:
        from confluent_kafka import Consumer

        if self.producer is not None:
            return
        opts = self.options
        if opts.marker_topic is None:
            raise ConfigError("exactly.kafka sink: rows name their topic in a column, so set "
                              "option exactly.kafka.markerTopic to an existing topic whose "
                              "partition 0 carries the epoch marker (as a group offset)")
        self.producer = _new_producer(opts, {
            "transactional.id": self.sink.transactional_id(self.query_id),
            "transaction.timeout.ms": opts.transaction_timeout_ms})
        self.consumer = Consumer({
            **opts.client_conf(), "group.id": self.sink.marker_group(self.query_id),
            "isolation.level": "read_committed", "enable.auto.commit": False})
        # fences older producers of this transactional id and completes or aborts the
        # transaction a crashed predecessor left open: afterwards nothing is in doubt
        _call(self.producer.init_transactions, opts.publish_timeout_ms / 1000,
              what="init_transactions")

    def published_through(self) -> int:
        """One past the last epoch whose transaction committed (0 when none did)."""
        from confluent_kafka import TopicPartition

        self._open()
        (tp,) = _call(self.consumer.committed,
                      [TopicPartition(self.options.marker_topic, 0)],
                      timeout=self.options.publish_timeout_ms / 1000, what="read epoch marker")
        if tp.error is not None:
            raise KafkaSinkError(f"reading the epoch marker failed: {tp.error}")
        return max(tp.offset, 0)

    def publish(self, epoch: int, files: list[Path]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        deadline = time.monotonic() + self.options.publish_timeout_ms / 1000
        attempt = 0
        while True:
            attempt += 1
            try:
                if self.published_through() > epoch:
                    log_event(logger, "epoch_already_published", epoch=epoch)
                    return
                tables = []
                for path in files:
                    if not path.exists():
                        raise DataLossError(
                            f"epoch {epoch}: staged rows {path} named by the commit intent "
                            "are gone and the epoch is not in Kafka")
                    with pa.memory_map(str(path)) as source:
                        tables.append(pa.ipc.open_file(source).read_all())
                started = time.perf_counter()
                self.producer.begin_transaction()
                self.in_transaction = True
                rows = 0
                for table in tables:
                    for batch in table.to_batches():
                        _produce_batch(self.producer, batch, self.options.topic)
                        rows += batch.num_rows
                maybe_crash_in_transaction(epoch, self.producer)
                marker = TopicPartition(self.options.marker_topic, 0, epoch + 1,
                                        metadata=json.dumps({"epoch": epoch, "rows": rows}))
                _call(self.producer.send_offsets_to_transaction, [marker],
                      self.consumer.consumer_group_metadata(),
                      self.options.publish_timeout_ms / 1000, what="send epoch marker")
                _call(self.producer.commit_transaction, self.options.publish_timeout_ms / 1000,
                      what="commit_transaction")
                self.in_transaction = False
                log_event(logger, "epoch_published", epoch=epoch, rows=rows, attempt=attempt,
                          publish_ms=round((time.perf_counter() - started) * 1000, 1))
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() in _FENCED_CODES:
                    raise FencedError(
                        f"epoch {epoch}: Kafka fenced this producer "
                        f"({self.sink.transactional_id(self.query_id)}): {err.str()}. A newer "
                        "instance of this query took over; this one must stop. Nothing of "
                        "this instance's open transaction becomes visible.") from exc
                if err.fatal():
                    raise KafkaSinkError(
                        f"epoch {epoch}: the transactional producer failed fatally: "
                        f"{err.str()}. Nothing of its open transaction becomes visible; the "
                        "epoch stays staged and the next run publishes it.") from exc
                if time.monotonic() > deadline:
                    raise KafkaSinkError(
                        f"epoch {epoch}: publishing to Kafka failed for "
                        f"{self.options.publish_timeout_ms} ms, last error {err.str()}. The "
                        "epoch stays staged and is published by the next run; check the "
                        "brokers, or raise exactly.kafka.publishTimeoutMs.") from exc
                log_event(logger, "publish_retry", logging.WARNING, epoch=epoch,
                          attempt=attempt, error=err.str())
                # start over with a fresh producer: init_transactions settles the outcome of
                # whatever this one left, and the marker then says whether to produce again
                self.close()
                time.sleep(min(0.2 * attempt, 2.0))

    def close(self) -> None:
        """Release the clients; a transaction still open is aborted (best effort: if that
        fails, the next ``init_transactions`` or the transaction timeout aborts it)."""
        producer, consumer = self.producer, self.consumer
        self.producer = self.consumer = None
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()
        if producer is not None and self.in_transaction:
            with contextlib.suppress(Exception):
                producer.abort_transaction(10)
        self.in_transaction = False


def _fenced_codes() -> frozenset[int]:
    try:
        from confluent_kafka import KafkaError
    except ImportError:  # pragma: no cover - confluent-kafka is needed to use the sink
        return frozenset()
    return frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                      KafkaError.INVALID_PRODUCER_EPOCH,
                      KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})


_FENCED_CODES = _fenced_codes()


def _coordinator_moving() -> frozenset[int]:
    try:
        from confluent_kafka import KafkaError
    except ImportError:  # pragma: no cover
        return frozenset()
    return frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                      KafkaError.COORDINATOR_NOT_AVAILABLE})


#: errors of offset fetches that librdkafka does not flag retriable but that pass
_COORDINATOR_MOVING = _coordinator_moving()


def _call(fn: Any, *args: Any, what: str, **kwargs: Any) -> Any:
    """Call a confluent-kafka API, retrying errors Kafka marks retriable."""
    from confluent_kafka import KafkaException

    for attempt in range(20):
        try:
            return fn(*args, **kwargs)
        except KafkaException as exc:
            err = exc.args[0]
            retriable = err.retriable() or err.code() in _COORDINATOR_MOVING
            if not retriable or err.fatal() or err.txn_requires_abort() or attempt == 19:
                raise
            log_event(logger, "kafka_retry", logging.INFO, call=what, error=err.str())
            time.sleep(min(0.1 * (attempt + 1), 1.0))
    raise AssertionError("unreachable")


def _new_producer(options: KafkaSinkOptions, extra: Mapping[str, Any]) -> Any:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "enable.idempotence": True,
        "linger.ms": 5,
        # Java clients' partitioner, so that keys land where Spark's and Java producers put them
        "partitioner": "murmur2_random",
        "queue.buffering.max.messages": 500_000,
        **options.client_conf(),
        **extra,
    }
    return Producer(conf)


def _produce_batch(producer: Any, batch: pa.RecordBatch, default_topic: str | None) -> None:
    """Produce the rows of one Arrow batch (Spark's Kafka sink column layout).

    Delivery failures surface through the producer's delivery callback (at_least_once) or
    make ``commit_transaction`` fail (exactly_once).
    """
    names = batch.schema.names
    values = batch.column(names.index("value")).to_pylist()
    keys = (batch.column(names.index("key")).to_pylist() if "key" in names
            else [None] * batch.num_rows)
    produce, poll = producer.produce, producer.poll
    if not {"topic", "partition", "headers"} & set(names):  # the common, fast path
        if default_topic is None:
            raise ConfigError("exactly.kafka sink: rows have no topic column and option "
                              "topic is not set")
        for value, key in zip(values, keys, strict=True):
            try:
                produce(default_topic, value, key)
            except BufferError:  # local queue full: let librdkafka send, then retry
                while True:
                    poll(0.05)
                    try:
                        produce(default_topic, value, key)
                        break
                    except BufferError:
                        continue
        poll(0)
        return
    n = batch.num_rows
    topics = batch.column(names.index("topic")).to_pylist() if "topic" in names else None
    parts = batch.column(names.index("partition")).to_pylist() if "partition" in names else None
    headers = batch.column(names.index("headers")).to_pylist() if "headers" in names else None
    for i in range(n):
        topic = topics[i] if topics is not None and topics[i] is not None else default_topic
        if topic is None:
            raise ConfigError(f"exactly.kafka sink: row {i} has no topic and option topic is "
                              "not set")
        kwargs: dict[str, Any] = {}
        if keys[i] is not None:
            kwargs["key"] = keys[i]
        if parts is not None and parts[i] is not None:
            kwargs["partition"] = int(parts[i])
        if headers is not None and headers[i]:
            kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
        while True:
            try:
                produce(topic, values[i], **kwargs)
                break
            except BufferError:
                poll(0.05)
    poll(0)


def _flush(producer: Any, timeout: float) -> None:
    remaining = producer.flush(timeout)
    if remaining:
        raise KafkaSinkError(f"{remaining} records were not delivered within {timeout:.0f}s; "
                             "check the brokers")


def maybe_crash_in_transaction(epoch: int, producer: Any = None) -> None:
    """Sink-specific fault ``EXACTLY_KAFKA_FAULT=in_transaction[@EPOCH]``: SIGKILL the driver
    with the epoch's records produced into the open transaction, before its commit.

    Fires once across restarts when ``EXACTLY_KAFKA_FAULT_MARKER`` names a file; also claims
    the core fault marker (``EXACTLY_FAULT_MARKER``) when one is set, so that
    :func:`exactly.testing.chaos.run_with_crashes` counts the attempt as an injected crash.
    """
    spec = os.environ.get(KAFKA_FAULT_ENV)
    if not spec:
        return
    point, _, at = spec.partition("@")
    if point != IN_TRANSACTION or epoch < int(at or 0):
        return
    from exactly.procs import local_job_pids
    from exactly.protocol.faults import MARKER_ENV

    record = json.dumps({"point": f"kafka_{IN_TRANSACTION}", "epoch": epoch,
                         "pid": os.getpid(), "at": time.time()})
    once = os.environ.get(KAFKA_FAULT_MARKER_ENV)
    if once:
        try:
            fd = os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(record)
    if producer is not None:  # the records are in the broker's log, uncommitted
        producer.flush(30)
    core = os.environ.get(MARKER_ENV)
    if core:
        with contextlib.suppress(FileExistsError), open(core, "x") as f:
            f.write(record)
    for pid in [*local_job_pids(), os.getpid()]:  # the driver's whole local tree
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(60)


def read_marker(options: KafkaSinkOptions, query_id: str, timeout: float = 30) -> int:
    """One past the last epoch of ``query_id`` published to Kafka (0 when none was).

    Read-only: it fences nothing (unlike the sink's own read, which runs after
    ``init_transactions``); while a publish is in flight it waits for it to settle.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**options.client_conf(),
                         "group.id": f"{options.transactional_id_prefix}-{query_id}-epochs",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(options.marker_topic, 0)], timeout=timeout)
        return max(tp.offset, 0)
    finally:
        consumer.close()


__all__: Iterable[str] = (
    "KafkaSink", "KafkaSinkError", "KafkaSinkOptions",
    "broker_transaction_max_timeout_ms", "check_schema", "check_transaction_timeout", "read_marker")
