"""A Kafka topic for the audit: every record from the start to the end offsets of the moment
the audit begins, as a consumer with the given isolation level sees it.

``read_committed`` (the default) is what a downstream consumer of an exactly-once sink
reads: records of committed transactions and non-transactional records. ``read_uncommitted``
adds records of aborted and open transactions: what an at-least-once reader would have
counted. Values are JSON objects; each record also carries its partition and offset, which
order a key's records in time. Records stream into the audit's database in batches.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from exactly.auditor.locations import KafkaLocation
from exactly.auditor.relation import OFFSET, PARTITION, Relation, load_batches
from exactly.errors import AuditInputError, ExactlyError
from exactly.retry import retry_call

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_BATCH = 100_000


def read_to_end(bootstrap: str, topic: str, *, isolation: str = "read_committed",
                timeout: float = 120.0) -> Iterator[Any]:
    """Every record of ``topic`` (confluent-kafka messages, tombstones included) from the
    start to the log end offsets of the moment of the call, as a consumer with
    ``isolation`` sees them.

    The end offsets are read_uncommitted's: Kafka writes a transaction's commit marker
    shortly after ``commit_transaction`` returns, so the last stable offset of this moment
    could stop a read_committed reader before the last transaction; it reads on until it
    passes the ends, which waits for an open transaction to end (up to ``timeout`` s).
    Raises :class:`AuditInputError` for a topic that does not exist, ExactlyError for a
    broker that does not answer or an end not reached in time.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from exactly.connectors.kafka.broker import is_transient

    if isolation not in ISOLATION_LEVELS:
        raise AuditInputError(f"--isolation {isolation}: use read_committed or read_uncommitted")
    where = f"kafka://{bootstrap}/{topic}"
    common = {"bootstrap.servers": bootstrap, "log_level": 2,
              "socket.connection.setup.timeout.ms": 10_000}
    consumer = Consumer({**common, "group.id": f"exactly-verify-{uuid.uuid4()}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        try:
            meta = consumer.list_topics(topic, timeout=15)
        except KafkaException as exc:  # an unreachable broker: a failure, not bad input
            raise ExactlyError(f"{where}: cannot reach the broker: "
                               f"{exc.args[0].str() if exc.args else exc}") from None
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise AuditInputError(f"{where}: topic {topic} does not exist")
        partitions = sorted(found.partitions)
        probe = Consumer({**common, "group.id": "exactly-verify-probe",
                          "isolation.level": "read_uncommitted"})

        def end_offset(partition: int) -> int:
            return int(probe.get_watermark_offsets(TopicPartition(topic, partition),
                                                   timeout=30)[1])

        try:  # a broker that has just restarted answers NOT_LEADER until it leads again
            ends = {p: retry_call(functools.partial(end_offset, p), what="read the log end "
                                  "offset", transient=is_transient, seconds=60,
                                  level=logging.DEBUG, topic=topic, partition=p)
                    for p in partitions}
        finally:
            probe.close()
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise ExactlyError(
                    f"{where}: reading with {isolation} did not reach the end offsets {ends} "
                    f"within {timeout:.0f}s; an open transaction blocks read_committed "
                    "readers until it commits or times out")
            messages = consumer.consume(10_000, 0.5)
            yield from (m for m in messages if m.error() is None)  # not the EOF events
            if messages:
                deadline = time.monotonic() + timeout  # progress: the wait starts again
            for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
    finally:
        consumer.close()


def attach_kafka(con, name: str, location: KafkaLocation, *,
                 isolation: str = "read_committed", timeout: float = 120.0) -> Relation:
    """Consume ``location``'s topic (:func:`read_to_end`) into the DuckDB table ``name`` in
    batches of :data:`_BATCH` records; ``empty`` when the topic had no record."""
    relation = Relation(name, f"{location.describe()} ({isolation})",
                        order=[PARTITION, OFFSET])
    records = read_to_end(location.bootstrap, location.topic, isolation=isolation,
                          timeout=timeout)
    relation.empty = not load_batches(con, name, _batches(records, location))
    return relation


def _batches(records: Iterator[Any], location: KafkaLocation) -> Iterator[pa.Table]:
    values: list[bytes] = []
    partitions: list[int] = []
    offsets: list[int] = []
    for msg in records:
        if msg.value() is None:  # a tombstone
            continue
        values.append(msg.value())
        partitions.append(msg.partition())
        offsets.append(msg.offset())
        if len(values) >= _BATCH:
            yield _table(values, partitions, offsets, location)
            values, partitions, offsets = [], [], []
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
