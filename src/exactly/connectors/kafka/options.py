"""The options of the ``exactly.kafka`` sink and the checks made before its query starts.

Options (``df.writeStream.format("exactly.kafka")``, keys named in :mod:`exactly.options`):

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
``exactly.kafka.callTimeoutMs``  the longest one transactional call (``init_transactions``,
                              sending the epoch marker, ``commit_transaction``) may wait
                              before the producer is replaced and the publish tried again
                              (default 30000; at most the publish timeout)
``exactly.kafka.publishShares``  publish each epoch in N shares (default 1: the whole epoch in
                              one transaction of one producer); share i by the producer
                              ``<prefix>-<query id>-<i>`` with its own epoch marker
                              (:mod:`exactly.connectors.kafka.shares`)
``exactly.fault``             a fault to inject (:mod:`exactly.protocol.faults`), e.g. the
                              sink's own ``kafka.in_transaction@EPOCH``

Input columns follow Spark's own Kafka sink: ``value`` (string or binary, required),
``key`` (string or binary, optional), ``topic`` (string, optional when option ``topic`` is
set), ``partition`` (int, optional), ``headers`` (array of struct<key string, value binary>,
optional). Other columns are ignored (:func:`check_schema`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactly import options as opt
from exactly.config import Mode
from exactly.errors import ConfigError, ExactlyError
from exactly.protocol.faults import FaultSpec, fault_from

#: librdkafka settings the sink sets itself
_RESERVED = ("transactional.id", "isolation.level")
#: librdkafka properties only a producer takes (scope "P" in librdkafka's CONFIGURATION.md,
#: global and topic level, 2.x). A consumer or admin client given one logs a CONFWARN line
#: ("... is a producer property and will be ignored by this consumer") each time it is made.
PRODUCER_ONLY = frozenset({
    "transactional.id", "transaction.timeout.ms", "enable.idempotence",
    "enable.gapless.guarantee", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "queue.buffering.max.ms", "linger.ms", "message.send.max.retries", "retries",
    "queue.buffering.backpressure.threshold", "compression.codec", "compression.type",
    "compression.level", "batch.num.messages", "batch.size", "delivery.report.only.error",
    "dr_cb", "dr_msg_cb", "sticky.partitioning.linger.ms", "request.required.acks", "acks",
    "request.timeout.ms", "message.timeout.ms", "delivery.timeout.ms", "queuing.strategy",
    "produce.offset.report", "partitioner", "partitioner_cb", "msg_order_cmp",
})


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
    #: bound of one transactional call (see the module docstring)
    call_timeout_ms: int = opt.DEFAULT_KAFKA_CALL_TIMEOUT_MS
    #: the armed fault (options ``exactly.fault``, ``exactly.faultMarker``, ...), for the sink's
    #: own point ``kafka.in_transaction``
    fault: FaultSpec | None = None
    #: shares an epoch is published in (option ``exactly.kafka.publishShares``)
    publish_shares: int = 1

    @classmethod
    def from_options(cls, options: Mapping[str, str], mode: Mode) -> KafkaSinkOptions:
        bootstrap = options.get(opt.KAFKA_BOOTSTRAP, "")
        if not bootstrap:
            raise ConfigError(f"exactly.kafka sink: set option {opt.KAFKA_BOOTSTRAP}, e.g. "
                              f".option('{opt.KAFKA_BOOTSTRAP}', 'host:9092')")
        conf = {k[len(opt.KAFKA_PREFIX):]: str(v) for k, v in options.items()
                if k.startswith(opt.KAFKA_PREFIX) and k != opt.KAFKA_BOOTSTRAP}
        timeout = int(conf.pop(opt.KAFKA_TRANSACTION_TIMEOUT_MS[len(opt.KAFKA_PREFIX):],
                               opt.DEFAULT_TRANSACTION_TIMEOUT_MS))
        for reserved in _RESERVED:
            if reserved in conf:
                raise ConfigError(f"exactly.kafka sink: option {opt.KAFKA_PREFIX}{reserved} is "
                                  f"set by the sink itself; remove it (use "
                                  f"{opt.TRANSACTIONAL_ID_PREFIX})")
        prefix = options.get(opt.TRANSACTIONAL_ID_PREFIX) or None
        if mode is Mode.EXACTLY_ONCE and not prefix:
            raise ConfigError(
                f"exactly.kafka sink: exactly_once needs option {opt.TRANSACTIONAL_ID_PREFIX} "
                "(the transactional ids are <prefix>-<query id>); pick a prefix unique to this "
                f"application, e.g. .option('{opt.TRANSACTIONAL_ID_PREFIX}', 'orders-enricher')")
        topic = options.get(opt.TOPIC) or None
        interval = options.get(opt.CHECKPOINT_INTERVAL_MS)
        return cls(
            bootstrap=bootstrap, producer_conf=conf, topic=topic,
            transactional_id_prefix=prefix, transaction_timeout_ms=timeout,
            marker_topic=options.get(opt.KAFKA_MARKER_TOPIC) or topic,
            checkpoint_interval_ms=int(float(interval)) if interval else None,
            publish_timeout_ms=int(options.get(opt.KAFKA_PUBLISH_TIMEOUT_MS,
                                               opt.DEFAULT_PUBLISH_TIMEOUT_MS)),
            call_timeout_ms=_positive_ms(options, opt.KAFKA_CALL_TIMEOUT_MS,
                                         opt.DEFAULT_KAFKA_CALL_TIMEOUT_MS),
            fault=fault_from(options),
            publish_shares=_shares(options))

    @property
    def call_timeout_s(self) -> float:
        """:attr:`call_timeout_ms` in seconds, never more than the publish timeout."""
        return min(self.call_timeout_ms, self.publish_timeout_ms) / 1000

    def client_conf(self) -> dict[str, Any]:
        """The producers' settings: the bootstrap servers and every ``kafka.*`` option."""
        return {"bootstrap.servers": self.bootstrap, **self.producer_conf}

    def connection_conf(self) -> dict[str, Any]:
        """The settings the sink's consumers (epoch marker, lineage record) and admin
        clients take: :meth:`client_conf` without the producer-only properties
        (:data:`PRODUCER_ONLY`), so connection, security and client id settings apply and
        nothing is logged as ignored."""
        return {key: value for key, value in self.client_conf().items()
                if key not in PRODUCER_ONLY}

    def transactional_id(self, query_id: str, share: int | None = None) -> str:
        """The transactional id of the query's publishing producer (``share``: of that share
        of each epoch, when epochs are published in shares)."""
        base = f"{self.transactional_id_prefix}-{query_id}"
        return base if share is None else f"{base}-{share}"

    def marker_group(self, query_id: str, share: int | None = None) -> str:
        """The consumer group whose offset of ``<marker topic>[0]`` is the epoch marker (of
        one share, ``share``, when epochs are published in shares)."""
        base = f"{self.transactional_id_prefix}-{query_id}-epochs"
        return base if share is None else f"{base}-{share}"

    def lineage_group(self) -> str:
        """The consumer group whose offset metadata of ``<marker topic>[0]`` records the
        restores of this application's queries (:mod:`exactly.connectors.kafka.lineage`)."""
        return f"{self.transactional_id_prefix}-lineage"

    def require_marker_topic(self) -> str:
        """The topic whose partition 0 carries the epoch marker; ConfigError naming the
        option when rows name their topic in a column and no marker topic is set."""
        if self.marker_topic is None:
            raise ConfigError("exactly.kafka sink: rows name their topic in a column, so set "
                              f"option {opt.KAFKA_MARKER_TOPIC} to an existing topic whose "
                              "partition 0 carries the epoch marker (as a group offset)")
        return self.marker_topic


# -- start-time checks ------------------------------------------------------------------
def check_transaction_timeout(transaction_timeout_ms: int, broker_max_timeout_ms: int,
                              checkpoint_interval_ms: int | None) -> None:
    """Refuse a ``transaction.timeout.ms`` the seeds warn about, naming the fix.

    It must not exceed the broker's ``transaction.max.timeout.ms`` (Kafka refuses to start
    such a transaction) and must exceed the checkpoint interval (an epoch's transaction must
    be able to outlive the epoch that produces it).
    """
    key = opt.KAFKA_TRANSACTION_TIMEOUT_MS
    if transaction_timeout_ms > broker_max_timeout_ms:
        raise ConfigError(
            f"exactly.kafka sink: {key}={transaction_timeout_ms} is "
            f"above the broker's transaction.max.timeout.ms={broker_max_timeout_ms}; Kafka "
            "would refuse or abort the transaction and its records would be lost. Set "
            f"checkpoint interval < {key} <= {broker_max_timeout_ms}, "
            "or raise transaction.max.timeout.ms on the brokers.")
    if checkpoint_interval_ms is not None and transaction_timeout_ms <= checkpoint_interval_ms:
        raise ConfigError(
            f"exactly.kafka sink: {key}={transaction_timeout_ms} is not "
            f"above the checkpoint interval ({checkpoint_interval_ms} ms): a transaction could "
            f"time out before its epoch is committed. Set checkpoint interval < {key} <= "
            f"{broker_max_timeout_ms} (the broker's transaction.max.timeout.ms), e.g. a few "
            "times the interval.")


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
        raise ConfigError(f"exactly.kafka sink: give the target with .option('{opt.TOPIC}', "
                          "NAME) or a 'topic' column")
    if "partition" in fields and not isinstance(fields["partition"],
                                                (IntegerType, LongType, ShortType)):
        raise ConfigError("exactly.kafka sink: column 'partition' must be an integer")
    if "headers" in fields and not isinstance(fields["headers"], ArrayType):
        raise ConfigError("exactly.kafka sink: column 'headers' must be "
                          "array<struct<key: string, value: binary>>")


def _shares(options: Mapping[str, str]) -> int:
    raw = options.get(opt.KAFKA_PUBLISH_SHARES)
    if raw is None:
        return 1
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if not 1 <= value <= opt.MAX_KAFKA_PUBLISH_SHARES:
        raise ConfigError(f"exactly.kafka sink: option {opt.KAFKA_PUBLISH_SHARES}={raw!r} must "
                          f"be a whole number from 1 (the default: one transaction an epoch) "
                          f"to {opt.MAX_KAFKA_PUBLISH_SHARES}, e.g. the number of executors")
    return value


def _positive_ms(options: Mapping[str, str], key: str, default: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"exactly.kafka sink: option {key}={raw!r} must be a positive number "
                          f"of milliseconds (default {default})")
    return value
