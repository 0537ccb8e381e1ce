"""The Kafka sink's lineage record: which of an application's queries was restored from which.

A topic has no owner: any producer may write to it. What ties an application's queries
together is its ``transactionalIdPrefix`` (transactional ids and epoch-marker groups are
``<prefix>-<query id>...``). A restore records its hand-over (new query <- savepoint's query
at epoch N, :class:`~exactly.protocol.target_state.Edge`) in the offset metadata of the group
``<prefix>-lineage`` on ``<marker topic>[0]``, beside the epoch markers: a JSON list of the
newest hand-overs. The broker keeps offset metadata up to ``offset.metadata.max.bytes``
(4096 by default), so the record keeps the newest :data:`MAX_EDGES` hand-overs that fit in
:data:`MAX_BYTES`; a restore older than that counts as a query of its own line (each
hand-over dropped so is logged as a warning, ``kafka_lineage_trimmed``).

The record is written by a plain offset commit (the group has no members), read with
``committed``; both use the sink's connection settings only.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from exactly.connectors.kafka.options import KafkaSinkError, KafkaSinkOptions
from exactly.connectors.kafka.publisher import kafka_call
from exactly.logs import log_event
from exactly.protocol.contract import Edge
from exactly.protocol.target_state import LineageRecordError

logger = logging.getLogger("exactly.kafka")

#: hand-overs kept in the record (the newest)
MAX_EDGES = 30
#: the record's size limit, under the broker's default offset.metadata.max.bytes (4096)
MAX_BYTES = 3500
#: how long one read or write of the record waits for the broker
TIMEOUT_S = 30.0


def _consumer(options: KafkaSinkOptions) -> Any:
    from confluent_kafka import Consumer

    return Consumer({**options.connection_conf(), "group.id": options.lineage_group(),
                     "enable.auto.commit": False})


def read_edges(options: KafkaSinkOptions) -> list[Edge]:
    """The hand-overs recorded for the sink's application (empty before the first)."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(options)
    try:
        (tp,) = kafka_call(consumer.committed,
                           [TopicPartition(options.require_marker_topic(), 0)],
                           timeout=TIMEOUT_S, what="read lineage record")
    finally:
        consumer.close()
    if tp.error is not None:
        raise KafkaSinkError(f"reading the lineage record ({options.lineage_group()}) "
                             f"failed: {tp.error}")
    if not tp.metadata:
        return []
    try:
        return [Edge.from_json(item) for item in json.loads(tp.metadata)]
    except (TypeError, ValueError, KeyError) as exc:
        raise LineageRecordError(
            f"the lineage record of group {options.lineage_group()} on "
            f"{options.require_marker_topic()}[0] is malformed ({exc!r}); delete the group "
            "(kafka-consumer-groups --delete --group ...): the application's queries then "
            "count as never restored") from None


def record_edge(options: KafkaSinkOptions, edge: Edge) -> list[Edge]:
    """Add ``edge`` to the record (replacing an earlier one of the same query), keeping the
    newest hand-overs that fit. Returns the hand-overs dropped to make room, oldest first
    (logged as a warning: restores of their queries no longer follow them)."""
    from confluent_kafka import TopicPartition

    edges = [e for e in read_edges(options) if e.query_id != edge.query_id] + [edge]
    edges.sort(key=lambda e: e.at)
    kept = edges[-MAX_EDGES:]
    text = json.dumps([e.to_json() for e in kept], separators=(",", ":"))
    while len(text.encode()) > MAX_BYTES and len(kept) > 1:
        kept = kept[1:]
        text = json.dumps([e.to_json() for e in kept], separators=(",", ":"))
    dropped = edges[:len(edges) - len(kept)]
    if dropped:
        log_event(logger, "kafka_lineage_trimmed", logging.WARNING,
                  group=options.lineage_group(), dropped=len(dropped), kept=len(kept),
                  dropped_queries=[e.query_id for e in dropped],
                  hint="a restore of a dropped query's savepoint now counts as a line of "
                       "its own on this topic: it is no longer checked against the "
                       "queries restored from it")
    edges = kept
    consumer = _consumer(options)
    try:
        kafka_call(consumer.commit,
                   offsets=[TopicPartition(options.require_marker_topic(), 0, len(edges),
                                           metadata=text)],
                   asynchronous=False, what="write lineage record")
    finally:
        consumer.close()
    return dropped
