"""A Kafka topic for the audit: every record from the start to the end offsets of the moment
the audit begins, as a consumer with the given isolation level sees it.

``read_committed`` (the default) is what a downstream consumer of an exactly-once sink
reads: records of committed transactions and non-transactional records. ``read_uncommitted``
adds records of aborted and open transactions: what an at-least-once reader would have
counted. Values are JSON objects; each record also carries its partition and offset, which
order a key's records in time. Records stream into the audit's database in batches.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.json as pajson

from exactly.auditor.locations import KafkaLocation
from exactly.auditor.relation import OFFSET, PARTITION, Relation, load_batches
from exactly.errors import AuditInputError, ExactlyError

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_BATCH = 100_000


def attach_kafka(con, name: str, location: KafkaLocation, *,
                 isolation: str = "read_committed", timeout: float = 120.0) -> Relation:
    """Consume ``location``'s topic into the DuckDB table ``name``; ``empty`` when the topic
    had no record. Waits up to ``timeout`` s for open transactions to end (read_committed
    cannot read past them); raises :class:`AuditInputError` for a missing topic or an
    unreachable broker."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    if isolation not in ISOLATION_LEVELS:
        raise AuditInputError(f"--isolation {isolation}: use read_committed or read_uncommitted")
    relation = Relation(name, f"{location.describe()} ({isolation})",
                        order=[PARTITION, OFFSET])
    common = {"bootstrap.servers": location.bootstrap, "log_level": 2,
              "socket.connection.setup.timeout.ms": 10_000}
    consumer = Consumer({**common, "group.id": f"exactly-verify-{uuid.uuid4()}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        try:
            meta = consumer.list_topics(location.topic, timeout=15)
        except KafkaException as exc:
            # an unreachable broker is a failure (exit 3), not bad input
            raise ExactlyError(f"{location.describe()}: cannot reach the broker: "
                               f"{exc.args[0].str() if exc.args else exc}") from None
        topic = meta.topics.get(location.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise AuditInputError(f"{location.describe()}: topic {location.topic} does not "
                                  "exist")
        partitions = sorted(topic.partitions)
        # the log end offsets of this moment, as read_uncommitted sees them: Kafka writes a
        # transaction's commit marker shortly after commit_transaction returns, so the last
        # stable offset of this moment could stop a read_committed reader before the job's
        # last epoch; it reads on until it passes the end (or an open transaction times out)
        probe = Consumer({**common, "group.id": "exactly-verify-probe",
                          "isolation.level": "read_uncommitted"})
        try:
            ends = {p: int(probe.get_watermark_offsets(TopicPartition(location.topic, p),
                                                       timeout=30)[1]) for p in partitions}
        finally:
            probe.close()
        consumer.assign([TopicPartition(location.topic, p, 0) for p in partitions])
        loaded = load_batches(con, name, _batches(consumer, location, ends, isolation, timeout))
    finally:
        consumer.close()
    relation.empty = not loaded
    return relation


def _batches(consumer, location: KafkaLocation, ends: dict[int, int], isolation: str,
             timeout: float) -> Iterator[pa.Table]:
    from confluent_kafka import TopicPartition

    pending = {p for p, end in ends.items() if end > 0}
    values: list[bytes] = []
    partitions: list[int] = []
    offsets: list[int] = []
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise AuditInputError(
                f"{location.describe()}: reading with {isolation} did not reach the end "
                f"offsets {ends} within {timeout:.0f}s; an open transaction blocks "
                "read_committed readers until it commits or times out")
        for msg in consumer.consume(10_000, 0.5):
            if msg.error() is not None or msg.value() is None:  # EOF events, tombstones
                continue
            values.append(msg.value())
            partitions.append(msg.partition())
            offsets.append(msg.offset())
        if len(values) >= _BATCH:
            yield _table(values, partitions, offsets, location)
            values, partitions, offsets = [], [], []
            deadline = time.monotonic() + timeout
        for tp in consumer.position([TopicPartition(location.topic, p) for p in pending]):
            if tp.offset >= ends[tp.partition]:
                pending.discard(tp.partition)
    if values:
        yield _table(values, partitions, offsets, location)


def _table(values: list[bytes], partitions: list[int], offsets: list[int],
           location: KafkaLocation) -> pa.Table:
    try:
        table = pajson.read_json(io.BytesIO(b"\n".join(values)))
    except pa.ArrowInvalid:  # values spanning lines, or not JSON at all
        rows = []
        for value, p, o in zip(values, partitions, offsets, strict=True):
            try:
                row = json.loads(value)
            except ValueError:
                raise AuditInputError(f"{location.describe()}: the record at partition {p} "
                                      f"offset {o} is not JSON") from None
            if not isinstance(row, dict):
                raise AuditInputError(f"{location.describe()}: the record at partition {p} "
                                      f"offset {o} is not a JSON object") from None
            rows.append(row)
        table = pa.Table.from_pylist(rows)
    return (table.append_column(PARTITION, pa.array(partitions, pa.int32()))
            .append_column(OFFSET, pa.array(offsets, pa.int64())))
