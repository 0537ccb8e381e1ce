"""Publishing epochs to Kafka: the driver's transactional producer, the epoch marker, producing.

:class:`PublishSession` is the driver side's producer of one query. It opens a producer
with ``transactional.id = <prefix>-<query id>`` and calls ``init_transactions()``, which
fences any older producer of the query (a zombie driver) and completes or aborts the
transaction a crashed driver left open; then it reads the epoch marker and, unless the
epoch is already published, produces the epoch's staged rows, sets the marker with
``send_offsets_to_transaction`` and commits, all in ONE transaction.

The epoch marker is the consumer-group offset of ``<marker topic>[0]`` for the group
``<prefix>-<query id>-epochs``, set to ``epoch + 1`` inside the data transaction, so it
commits atomically with the rows: "epoch n is published" is decidable after any crash (the
committed offset is ``> n``). It is read ``read_committed`` after ``init_transactions()``,
so no transaction of the query is in doubt when it is read. :func:`read_marker` reads it
from outside without fencing anything.

Errors (the retry policy is :mod:`exactly.retry`):

* fenced (:data:`FENCED_CODES`: a newer producer of the query took over) -
  :class:`~exactly.errors.FencedError` at once, nothing of the open transaction is visible;
* fatal producer errors - :class:`~exactly.connectors.kafka.options.KafkaSinkError` at once;
  the epoch stays staged and the next run publishes it;
* anything else Kafka raises during a publish - retried with a fresh producer each attempt
  (``init_transactions`` settles what the last one left, the marker says whether to produce
  again) until ``exactly.kafka.publishTimeoutMs``, then ``KafkaSinkError``;
* single client calls (:func:`kafka_call`) retry what Kafka flags retriable and a group
  coordinator moving (:data:`COORDINATOR_MOVING`).

A request that may arrive late (the ambiguous commit): librdkafka 2.x does not bump the
producer epoch per transaction (KIP-890), and when a request's answer does not come within
``socket.timeout.ms`` it closes the connection and sends the request again, without telling
the application (the call succeeds, ``error_cb`` is not called; only its log says
``REQTMOUT``). If the first copy was delayed rather than lost, it still reaches the broker,
with the same producer id and epoch: an ``EndTxn(commit)`` of epoch n arriving inside epoch
n+1's transaction commits epoch n+1's records before its marker (measured through the test
kit's fault proxy). So the session watches the producer's log (:data:`SUSPECT_LOG_FACILITIES`:
a request timed out, a connection failed) and its error callback, and before the next publish
replaces a producer that saw either: the new producer's ``init_transactions`` bumps the
epoch, which fences every request the old one may still have on the way.

A transaction begun while the epoch's tasks still run (:meth:`PublishSession.begin_streamed`)
takes the epoch marker first, so the commit after the intent is one request
(``commit_transaction``) instead of three: the marker is as uncommitted as the rows until
then, and aborted with them.

Crash point ``kafka.in_transaction`` (:data:`IN_TRANSACTION`): inside a publish, after the
epoch's records were produced into the open transaction and flushed to the broker's log,
before the commit (and before the marker, unless the transaction was begun early).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from exactly import options as opt
from exactly.connectors.kafka.broker import is_transient
from exactly.connectors.kafka.options import KafkaSinkError, KafkaSinkOptions
from exactly.errors import ConfigError, DataLossError, FencedError
from exactly.logs import log_event
from exactly.protocol.faults import maybe_crash, register_point
from exactly.protocol.staging import StagedFile
from exactly.retry import retry_call

logger = logging.getLogger("exactly.connectors.kafka.publisher")
#: where the publishing producers' own log lines go (event ``librdkafka``)
client_logger = logging.getLogger("exactly.connectors.kafka.librdkafka")

IN_TRANSACTION = register_point(
    "kafka.in_transaction", on_driver=True,
    description="the epoch's records produced into the open Kafka transaction and "
                "flushed, before the commit")

#: how much longer than ``callTimeoutMs`` a transactional call may take before its producer
#: is abandoned (librdkafka's own timeout fires first when it works)
CALL_GRACE_S = 2.0
#: attempts of one client call on retriable errors (:func:`kafka_call`)
CALL_ATTEMPTS = 20
#: one attempt at reading the epoch marker (retried with a new consumer until the publish
#: timeout)
MARKER_READ_TIMEOUT_S = 5.0


# -- error classification ---------------------------------------------------------------
def _codes(*names: str) -> frozenset[int]:
    try:
        from confluent_kafka import KafkaError
    except ImportError:  # pragma: no cover - confluent-kafka is needed to use the sink
        return frozenset()
    return frozenset(getattr(KafkaError, name) for name in names)


#: a newer producer with our transactional id took over: this one must stop
FENCED_CODES = _codes("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH",
                      "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
#: errors of offset fetches that librdkafka does not flag retriable but that pass
COORDINATOR_MOVING = _codes("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS",
                            "COORDINATOR_NOT_AVAILABLE")
#: errors the producer's error callback reports when it lost a broker or gave up on a request
LOST_CODES = _codes("_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT")
#: librdkafka log facilities saying that a request may reach the broker after the producer
#: gave up on it and sent it again: a request timed out (``REQTMOUT``; librdkafka then closes
#: the connection and retries), a broker connection failed (``FAIL``). librdkafka reports
#: neither to the application otherwise (measured with 2.16: no ``error_cb``, the call
#: succeeds)
SUSPECT_LOG_FACILITIES = frozenset({"REQTMOUT", "FAIL"})
#: the producer's ``log_level`` at least (syslog levels): ``FAIL`` lines are at 6 (info)
_MIN_CLIENT_LOG_LEVEL = 6
#: librdkafka's syslog levels as confluent-kafka hands them to a logger (Python levels)
_PY_LEVEL = (50, 50, 50, 40, 30, 20, 20, 10)


def _kafka_error(exc: BaseException) -> Any:
    """The ``KafkaError`` of a ``KafkaException`` (None for other exceptions)."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_fenced(exc: BaseException) -> bool:
    """A newer producer with the same transactional id took over (:data:`FENCED_CODES`)."""
    err = _kafka_error(exc)
    return err is not None and err.code() in FENCED_CODES


def is_retriable_call(exc: BaseException) -> bool:
    """A single client call may simply be made again: Kafka flags the error retriable (or
    the coordinator is moving) and it neither is fatal nor needs the transaction aborted."""
    err = _kafka_error(exc)
    if err is None:
        return False
    return ((err.retriable() or err.code() in COORDINATOR_MOVING)
            and not err.fatal() and not err.txn_requires_abort())


def is_timeout(exc: BaseException) -> bool:
    """The call gave up waiting (librdkafka's ``_TIMED_OUT``)."""
    from confluent_kafka import KafkaError

    err = _kafka_error(exc)
    return err is not None and err.code() == KafkaError._TIMED_OUT


def kafka_call(fn: Callable[..., Any], *args: Any, what: str,
               retry_timeouts: bool = True, seconds: float | None = None,
               **kwargs: Any) -> Any:
    """Call a confluent-kafka API, retrying the errors :func:`is_retriable_call` accepts
    (at most :data:`CALL_ATTEMPTS` attempts, logged at INFO). ``retry_timeouts=False``: a
    call that timed out is not made again on the same client (a transactional producer
    that waited out a call is replaced instead); ``seconds`` bounds the retries too."""
    def transient(exc: BaseException) -> bool:
        return is_retriable_call(exc) and (retry_timeouts or not is_timeout(exc))

    return retry_call(lambda: fn(*args, **kwargs), what=what, transient=transient,
                      attempts=CALL_ATTEMPTS, seconds=seconds, maximum=1.0,
                      level=logging.INFO, log=logger)


# -- producing --------------------------------------------------------------------------
def new_producer(options: KafkaSinkOptions, extra: Mapping[str, Any]) -> Any:
    """An idempotent producer with the sink's settings (and ``extra`` on top)."""
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


def produce_batch(producer: Any, batch: pa.RecordBatch, default_topic: str | None) -> None:
    """Produce the rows of one Arrow batch (Spark's Kafka sink column layout).

    When the producer's local queue is full (``BufferError``) it serves delivery reports
    (``poll``) and produces the record again: flow control, not a failure. Delivery failures
    surface through the producer's delivery callback (at_least_once) or make
    ``commit_transaction`` fail (exactly_once).
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
            except BufferError:
                _produce_when_room(producer, default_topic, value, key)
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
        try:
            produce(topic, values[i], **kwargs)
        except BufferError:
            _produce_when_room(producer, topic, values[i], **kwargs)
    poll(0)


def _produce_when_room(producer: Any, *args: Any, **kwargs: Any) -> None:
    """The local queue is full: let librdkafka send (``poll``), then produce again."""
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*args, **kwargs)
            return
        except BufferError:
            continue


def flush(producer: Any, timeout: float) -> None:
    """Wait until every produced record is delivered; KafkaSinkError after ``timeout``."""
    remaining = producer.flush(timeout)
    if remaining:
        raise KafkaSinkError(f"{remaining} records were not delivered within {timeout:.0f}s; "
                             "check the brokers")


# -- the epoch marker -------------------------------------------------------------------
def read_marker(options: KafkaSinkOptions, query_id: str, timeout: float = 30,
                share: int | None = None) -> int:
    """One past the last epoch of ``query_id`` (of its share ``share``) published to Kafka
    (0 when none was).

    Read-only: it fences nothing (unlike the session's own read, which runs after
    ``init_transactions``); while a publish is in flight it waits for it to settle.
    """
    return read_marker_record(options, query_id, timeout, share)[0]


def read_marker_record(options: KafkaSinkOptions, query_id: str, timeout: float = 30,
                       share: int | None = None) -> tuple[int, dict[str, Any]]:
    """(:func:`read_marker`, the marker's metadata: ``{"epoch": ...}``, for a share also
    ``"share"`` and ``"shares"``; ``{}`` when there is none or it is not JSON)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**options.connection_conf(),
                         "group.id": options.marker_group(query_id, share),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        (tp,) = kafka_call(consumer.committed, [TopicPartition(options.require_marker_topic(), 0)],
                           timeout=timeout, what="read epoch marker")
    finally:
        consumer.close()
    try:
        metadata = json.loads(tp.metadata) if tp.metadata else {}
    except ValueError:
        metadata = {}
    return max(tp.offset, 0), metadata if isinstance(metadata, dict) else {}


# -- the publish session ----------------------------------------------------------------
class ClientLog:
    """The ``logger`` of a session's producer: confluent-kafka hands it librdkafka's log
    lines (from ``poll``, in the calling thread) as ``log(level, fmt, facility, client,
    message)``. Each line goes to :data:`client_logger` as a ``librdkafka`` event when it is
    at least as severe as the user's ``log_level`` (``forward_from``, a syslog level); a line
    of a :data:`SUSPECT_LOG_FACILITIES` facility calls ``on_suspect`` with a reason, whatever
    its level."""

    def __init__(self, on_suspect: Callable[[str], None], forward_from: int) -> None:
        self.on_suspect = on_suspect
        self.forward_from = _PY_LEVEL[max(0, min(forward_from, 7))]

    def log(self, level: int, fmt: str, *args: Any) -> None:
        facility, client, message = [*map(str, args), "", "", ""][:3]
        if facility in SUSPECT_LOG_FACILITIES:
            self.on_suspect(f"librdkafka {facility}: {message}")
        if level >= self.forward_from:
            log_event(client_logger, "librdkafka", level, facility=facility, client=client,
                      message=message)


class PublishSession:
    """The transactional producer of one query (or of one share of its epochs: ``share``,
    of ``shares``), fenced and recovered. ``crash_point``: the fault point inside its
    transaction (the driver's :data:`IN_TRANSACTION`; a share's task its own)."""

    def __init__(self, options: KafkaSinkOptions, query_id: str, share: int | None = None,
                 shares: int = 1, crash_point: str = IN_TRANSACTION) -> None:
        self.options = options
        self.query_id = query_id
        self.share = share
        self.shares = shares
        self.crash_point = crash_point
        #: the producer's transactional id and the group whose offset is its epoch marker
        self.transactional_id = options.transactional_id(query_id, share)
        self.group = options.marker_group(query_id, share)
        self.producer: Any = None
        #: why the producer must not begin another transaction (None: it may)
        self.suspect: str | None = None
        self.in_transaction = False
        #: held while the session talks to Kafka (the idle reaper never closes it then)
        self.busy = threading.RLock()
        self.last_used = time.monotonic()
        self._group_metadata: bytes | None = None
        #: the epoch marker as this producer's own last commit set it (None: read it)
        self._marker: int | None = None
        #: the epoch whose marker the open transaction already holds (None: none)
        self.marker_in_txn: int | None = None

    @property
    def timeout_s(self) -> float:
        return self.options.publish_timeout_ms / 1000

    def _open(self) -> None:
        """Open the producer (fencing older ones, settling what they left); a no-op while
        it is open."""
        if self.producer is not None:
            return
        opts = self.options
        opts.require_marker_topic()
        level = opts.producer_conf.get("log_level", "")
        user_level = int(level) if level.isdigit() else _MIN_CLIENT_LOG_LEVEL
        self.producer = new_producer(opts, {
            "transactional.id": self.transactional_id,
            "transaction.timeout.ms": opts.transaction_timeout_ms,
            "error_cb": self._on_client_error,
            "logger": ClientLog(self._mark_suspect, user_level),
            "log_level": max(user_level, _MIN_CLIENT_LOG_LEVEL)})
        # fences older producers of this transactional id and completes or aborts the
        # transaction a crashed predecessor left open: afterwards nothing is in doubt
        self._txn_call(self.producer.init_transactions, what="init_transactions")
        # what this producer saw before its init_transactions (an outage it waited out)
        # cannot reach a transaction of its new epoch
        self.producer.poll(0)
        self.suspect = None
        self._marker = None

    def _mark_suspect(self, reason: str) -> None:
        if self.suspect is None:
            self.suspect = reason

    def _on_client_error(self, err: Any) -> None:
        """librdkafka's error callback (served by ``poll``): a lost broker connection or a
        timed-out request makes the kept producer suspect. (A transactional producer kept
        across a broker restart was also measured here to hang in
        ``send_offsets_to_transaction`` until its timeout, librdkafka 2.x, where a new one,
        after ``init_transactions``, goes on at once.)"""
        if err.code() in LOST_CODES:
            self._mark_suspect(f"librdkafka error: {err.str()}")

    def _renew_if_suspect(self) -> None:
        """Before a publish: serve the kept producer's callbacks and log; when it gave up
        on a request or lost a connection since its ``init_transactions``, close it, so the
        publish opens a new one (whose epoch fences whatever the old one left on the way)."""
        if self.producer is None:
            return
        self.producer.poll(0)
        if self.suspect is not None:
            log_event(logger, "producer_renewed", reason=self.suspect)
            self.close()

    def _marker_consumer(self) -> Any:
        """A new consumer of the marker group (it never joins the group)."""
        from confluent_kafka import Consumer

        return Consumer({
            **self.options.connection_conf(),
            "group.id": self.group,
            "isolation.level": "read_committed", "enable.auto.commit": False})

    def _marker_group(self) -> bytes:
        """The marker group's metadata for ``send_offsets_to_transaction``: asked of a
        consumer once per session (confluent-kafka hands it out serialized, independent of
        the consumer, which is closed at once)."""
        if self._group_metadata is None:
            consumer = self._marker_consumer()
            try:
                self._group_metadata = consumer.consumer_group_metadata()
            finally:
                consumer.close()
        return self._group_metadata

    def published_through(self) -> int:
        """One past the last epoch whose transaction committed (0 when none did).

        After this producer's own commit the marker is known and not read again (no other
        producer can commit one of this query's epochs without fencing this one, which its
        next transactional call then reports). A freshly opened producer reads it: each
        attempt asks with a new consumer and a short timeout
        (:data:`MARKER_READ_TIMEOUT_S`): a ``committed`` call made while the broker was
        down was measured to wait out its whole timeout after the broker came back
        (librdkafka 2.x); a new consumer answers at once."""
        with self.busy:
            self._open()
            if self._marker is not None:
                return self._marker
            try:
                return self._read_marker()
            finally:
                self.last_used = time.monotonic()

    def _read_marker(self) -> int:
        from confluent_kafka import TopicPartition

        def read() -> Any:
            consumer = self._marker_consumer()
            try:
                (tp,) = consumer.committed(
                    [TopicPartition(self.options.require_marker_topic(), 0)],
                    timeout=min(MARKER_READ_TIMEOUT_S, self.timeout_s))
                return tp
            finally:
                consumer.close()

        tp = retry_call(read, what="read epoch marker",
                        transient=lambda exc: is_retriable_call(exc) or is_transient(exc),
                        seconds=self.timeout_s, maximum=1.0, level=logging.INFO, log=logger)
        if tp.error is not None:
            raise KafkaSinkError(f"reading the epoch marker failed: {tp.error}")
        return max(tp.offset, 0)

    def begin_streamed(self, epoch: int) -> Any:
        """Begin epoch ``epoch``'s transaction before its intent, for the rows streamed while
        its tasks run (:mod:`exactly.connectors.kafka.streaming`); the producer holding it,
        or None when the epoch is already published. A suspect producer is replaced first,
        as before any publish. The caller holds :attr:`busy`."""
        self._renew_if_suspect()
        if self.published_through() > epoch:
            return None
        if self.in_transaction:  # a stream nobody finished: nothing of it may stay
            self.abort_open()
        self.producer.begin_transaction()
        self.in_transaction = True
        # the marker now, while the tasks run: the commit is then one request
        self._send_marker(epoch)
        return self.producer

    def abort_open(self) -> None:
        """Abort the open transaction (streamed rows that the publish cannot use, or held
        too long). The caller holds :attr:`busy`."""
        self._txn_call(self.producer.abort_transaction, what="abort_transaction")
        self.in_transaction = False
        self.marker_in_txn = None

    def publish(self, epoch: int, files: list[StagedFile],
                streamed: tuple[Any, int] | None = None) -> None:
        """Publish the rows staged in ``files`` as epoch ``epoch``, unless it already is.

        ``streamed`` (the producer and the rows it holds in its open transaction): the
        stream already produced exactly the rows of ``files`` into that transaction
        (:meth:`EpochStream.finish <exactly.connectors.kafka.streaming.EpochStream.finish>`);
        when that producer is still this session's, only the marker and the commit are
        left. Any open transaction otherwise is aborted before the epoch is produced again.

        Raises FencedError when a newer producer of the query took over, KafkaSinkError
        when the producer failed fatally or the publish kept failing for
        ``publishTimeoutMs``, DataLossError when a staged file is gone and the epoch is not
        in Kafka.
        """
        from confluent_kafka import KafkaException

        attempts = 0

        def attempt() -> None:
            nonlocal attempts
            attempts += 1
            self._renew_if_suspect()
            try:
                self._publish_once(epoch, files, attempts, streamed)
            except KafkaException as exc:
                self._raise_if_final(epoch, exc)
                raise

        try:
            with self.busy:
                try:
                    retry_call(attempt, what="publish epoch", seconds=self.timeout_s,
                               transient=lambda exc: isinstance(exc, KafkaException),
                               initial=0.2, before_retry=self.close, log=logger, epoch=epoch)
                finally:
                    self.last_used = time.monotonic()
        except KafkaException as exc:
            raise KafkaSinkError(
                f"epoch {epoch}: publishing to Kafka failed for "
                f"{self.options.publish_timeout_ms} ms ({attempts} attempts), last error "
                f"{_describe(exc)}. The epoch stays staged and is published by the next "
                "run; check the brokers, or raise exactly.kafka.publishTimeoutMs.") from exc

    def _publish_once(self, epoch: int, files: list[StagedFile], attempt: int,
                      streamed: tuple[Any, int] | None = None) -> None:
        if streamed is not None and self.in_transaction and self.producer is streamed[0]:
            self._commit_epoch(epoch, streamed[1], attempt, time.perf_counter(), streamed=True)
            return
        if self.producer is not None and self.in_transaction:
            self.abort_open()
        if self.published_through() > epoch:
            log_event(logger, "epoch_already_published", epoch=epoch)
            return
        tables = []
        for staged in files:
            try:
                source = staged.open()
            except FileNotFoundError:
                raise DataLossError(
                    f"epoch {epoch}: staged rows {staged} named by the commit intent "
                    "are gone and the epoch is not in Kafka") from None
            with source:
                tables.append(pa.ipc.open_file(source).read_all())
        started = time.perf_counter()
        producer = self.producer
        producer.begin_transaction()
        self.in_transaction = True
        self.marker_in_txn = None
        rows = 0
        for table in tables:
            for batch in table.to_batches():
                produce_batch(producer, batch, self.options.topic)
                rows += batch.num_rows
        self._commit_epoch(epoch, rows, attempt, started, streamed=False)

    def _commit_epoch(self, epoch: int, rows: int, attempt: int, started: float, *,
                      streamed: bool) -> None:
        """The epoch's rows are in the open transaction: add the marker (unless the
        transaction holds it already) and commit."""
        producer = self.producer
        # the records reach the broker's log, uncommitted, before the crash
        maybe_crash(self.options.fault, self.crash_point, epoch,
                    before=lambda: producer.flush(30))
        if self.marker_in_txn != epoch:
            self._send_marker(epoch)
        self._txn_call(producer.commit_transaction, what="commit_transaction")
        self.in_transaction = False
        self.marker_in_txn = None
        self._marker = epoch + 1
        log_event(logger, "epoch_published", epoch=epoch, rows=rows, attempt=attempt,
                  streamed=streamed, **({"share": self.share, "shares": self.shares}
                                        if self.share is not None else {}),
                  publish_ms=round((time.perf_counter() - started) * 1000, 1))

    def _send_marker(self, epoch: int) -> None:
        """Put epoch ``epoch``'s marker (``epoch + 1``) into the open transaction."""
        from confluent_kafka import TopicPartition

        marker = TopicPartition(self.options.require_marker_topic(), 0, epoch + 1,
                                metadata=json.dumps(self._marker_metadata(epoch)))
        self._txn_call(self.producer.send_offsets_to_transaction, [marker],
                       self._marker_group(), what="send epoch marker")
        self.marker_in_txn = epoch

    def _marker_metadata(self, epoch: int) -> dict[str, Any]:
        """What the marker's offset metadata says: the epoch, and for a share its number
        and the epoch's number of shares (read by :func:`read_marker_record`)."""
        if self.share is None:
            return {"epoch": epoch}
        return {"epoch": epoch, "share": self.share, "shares": self.shares}

    def _txn_call(self, fn: Callable[..., Any], *args: Any, what: str) -> Any:
        """One transactional call of the producer, bounded by ``callTimeoutMs`` even when
        librdkafka does not return: measured with 2.16, ``send_offsets_to_transaction``
        blocked for minutes past its own timeout once every connection of the producer had
        been reset inside the transaction. The call runs in a thread; when it has not
        returned in time the producer is abandoned (never used or closed again: its call
        may still be running) and a ``_TIMED_OUT`` KafkaException is raised, so the publish
        goes on with a new producer, whose ``init_transactions`` fences the old one and
        settles its transaction."""
        from confluent_kafka import KafkaError, KafkaException

        seconds = self.options.call_timeout_s
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                outcome["value"] = kafka_call(fn, *args, seconds, what=what,
                                              retry_timeouts=False, seconds=seconds)
            except BaseException as exc:  # handed to the caller below
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=call, name=f"exactly-kafka-{what}", daemon=True).start()
        if not done.wait(seconds + CALL_GRACE_S):
            self._abandon(what)
            raise KafkaException(KafkaError(
                KafkaError._TIMED_OUT, f"{what} did not return within {seconds:.0f}s "
                f"({opt.KAFKA_CALL_TIMEOUT_MS}); the producer was replaced", retriable=True))
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def _abandon(self, what: str) -> None:
        """Drop a producer whose call did not return: kept referenced, never closed here
        (closing it while librdkafka still runs its call can block for good)."""
        producer, self.producer = self.producer, None
        self.in_transaction = False
        self.marker_in_txn = None
        if producer is not None:
            _abandoned.append(producer)
        log_event(logger, "producer_abandoned", logging.WARNING, call=what,
                  transactional_id=self.transactional_id)

    def _raise_if_final(self, epoch: int, exc: BaseException) -> None:
        """Fenced or fatal: no retry can help; raise the error that says so."""
        err = _kafka_error(exc)
        if err is None:
            return
        if is_fenced(exc):
            raise FencedError(
                f"epoch {epoch}: Kafka fenced this producer "
                f"({self.transactional_id}): {err.str()}. A newer "
                "instance of this query took over; this one must stop. Nothing of "
                "this instance's open transaction becomes visible.") from exc
        if err.fatal():
            raise KafkaSinkError(
                f"epoch {epoch}: the transactional producer failed fatally: "
                f"{err.str()}. Nothing of its open transaction becomes visible; the "
                "epoch stays staged and the next run publishes it.") from exc

    def close(self) -> None:
        """Release the clients; a transaction still open is aborted (best effort: if that
        fails, the next ``init_transactions`` or the transaction timeout aborts it)."""
        producer = self.producer
        self.producer = None
        self.suspect = None
        self._marker = None
        self.marker_in_txn = None
        if producer is not None and self.in_transaction:
            with contextlib.suppress(Exception):
                producer.abort_transaction(10)
        self.in_transaction = False


# -- sessions kept across epochs ----------------------------------------------------------
#: (transactional id, driver run, client settings) -> the session of that run in this process
_kept: dict[tuple[str, str | None, str], PublishSession] = {}
#: producers whose transactional call never returned (:meth:`PublishSession._txn_call`):
#: referenced for the process's life, fenced by their successors
_abandoned: list[Any] = []
_kept_lock = threading.Lock()
#: a kept session unused this long is closed: its query ended (Spark tells a sink nothing
#: when a query stops), or its epochs are further apart, and the next publish opens a new
#: producer. Until then the idle producer holds its broker connections.
KEEP_IDLE_S = 60.0
#: how often the reaper thread looks for idle sessions
REAP_EVERY_S = 5.0
_reaper: threading.Thread | None = None


def reap_idle_sessions(idle_s: float = KEEP_IDLE_S) -> int:
    """Close the kept sessions unused for ``idle_s`` seconds and not talking to Kafka;
    returns how many were closed."""
    now = time.monotonic()
    idle: list[PublishSession] = []
    with _kept_lock:
        for key, session in list(_kept.items()):
            if now - session.last_used >= idle_s and session.busy.acquire(blocking=False):
                del _kept[key]
                idle.append(session)
    for session in idle:
        try:
            log_event(logger, "producer_closed", reason="idle",
                      idle_s=round(now - session.last_used, 1))
            session.close()
        finally:
            session.busy.release()
    return len(idle)


def _reap_while_kept() -> None:
    """The reaper thread: runs while sessions are kept, then ends (restarted on demand)."""
    global _reaper
    while True:
        time.sleep(REAP_EVERY_S)
        try:
            reap_idle_sessions()
        except Exception as exc:  # never let the thread die on a close that failed
            log_event(logger, "producer_reap_failed", logging.WARNING, error=str(exc))
        with _kept_lock:
            if not _kept:
                _reaper = None
                return


def kept_session(options: KafkaSinkOptions, query_id: str,
                 run_id: str | None) -> PublishSession:
    """The publish session of ``run_id`` in this process, opened once and kept across epochs.

    Spark builds a new sink object before every epoch, in a commit worker process it reuses,
    so the transactional producer lives here rather than on the sink: ``init_transactions``
    runs once per run and process, not once an epoch. A session of another run of the same
    transactional id is closed when this one is asked for (that run is over: this one holds
    the lease); the session's own ``init_transactions`` then fences its producer in Kafka
    too. :func:`drop_session` after any error, so the next epoch starts from a fresh
    producer. A session unused for :data:`KEEP_IDLE_S` is closed by a reaper thread
    (:func:`reap_idle_sessions`): the query ended, or its epochs are that far apart.
    """
    txn_id = options.transactional_id(query_id)
    key = (txn_id, run_id, json.dumps(options.client_conf(), sort_keys=True, default=str)
           + f"|{options.transaction_timeout_ms}")
    stale: list[PublishSession] = []
    global _reaper
    with _kept_lock:
        session = _kept.get(key)
        if session is None:
            stale = [_kept.pop(k) for k in list(_kept) if k[0] == txn_id]
            session = _kept[key] = PublishSession(options, query_id)
        session.last_used = time.monotonic()
        if _reaper is None:
            _reaper = threading.Thread(target=_reap_while_kept, daemon=True,
                                       name="exactly-kafka-idle-producers")
            _reaper.start()
    for old in stale:
        old.close()
    return session


def drop_session(session: PublishSession) -> None:
    """Forget and close ``session`` (after an error: the next epoch opens a fresh one)."""
    with _kept_lock:
        for key in [k for k, v in _kept.items() if v is session]:
            del _kept[key]
    session.close()


def _describe(exc: BaseException) -> str:
    err = _kafka_error(exc)
    return err.str() if err is not None else str(exc)
