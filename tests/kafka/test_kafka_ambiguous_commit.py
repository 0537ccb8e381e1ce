"""The ambiguous commit on the Kafka sink: the broker applied a request, the client never
heard so (issue 28). Through the nemesis proxy, on a real broker, without Spark.

Every connection of the sink's clients goes through ``kafka_proxy`` (the broker advertises the
proxy's port to them); the readers connect directly. Each test reads what a ``read_committed``
and a ``read_uncommitted`` consumer see.

Measured with librdkafka 2.16 (EndTxn v1: it does not bump the producer epoch per
transaction, KIP-890): a request whose answer does not come within ``socket.timeout.ms`` is
given up (the connection is closed) and sent again on a new connection, with no error to the
application (``error_cb`` is not called, the call succeeds); only its log says ``REQTMOUT``.
The first copy, if it was delayed rather than lost, still reaches the coordinator later.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from exactly.config import Mode
from exactly.connectors.kafka.options import KafkaSinkOptions
from exactly.connectors.kafka.publisher import IN_TRANSACTION, read_marker, reap_idle_sessions
from exactly.connectors.kafka.sink import KafkaSink
from exactly.protocol.contract import SinkSettings
from exactly.protocol.faults import SimulatedCrash, raise_simulated_crash
from exactly.testing.harness import ProtocolHarness
from exactly.testing.kafka_broker import consume_all
from exactly.testing.nemesis.proxy import Answer, kafka_request

#: Kafka API keys (the protocol's request header)
END_TXN, ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT = 26, 25, 28
#: the sink's clients give a request up after this long without an answer (librdkafka scans
#: for timed-out requests once a second: measured 2.0-2.4 s here)
SOCKET_TIMEOUT_MS = 1500
#: a late request reaches the broker this long after it was sent: after the client gave it
#: up and sent it again, while the sink is inside the next epoch's transaction
LATE_S = 5.0


@pytest.fixture(autouse=True)
def _producers_closed(kafka_proxy: Any) -> Any:
    """The kept producers of a test are closed after it, before its proxy stops (they would
    go on trying to reach the broker through a port nothing listens on)."""
    yield
    reap_idle_sessions(idle_s=0)


def harness(broker: Any, topic: str, log_dir: Path, **extra: str) -> ProtocolHarness[KafkaSink]:
    """A query writing to ``topic`` through the exactly-once Kafka sink, whose clients
    reach the broker only through the proxy."""
    settings = SinkSettings(mode=Mode.EXACTLY_ONCE, log_dir=str(log_dir))
    options = KafkaSinkOptions.from_options({
        "kafka.bootstrap.servers": broker.proxied_bootstrap, "topic": topic,
        "transactionalIdPrefix": f"ambiguous-{uuid.uuid4().hex[:6]}",
        "kafka.transaction.timeout.ms": "20000",
        "kafka.socket.timeout.ms": str(SOCKET_TIMEOUT_MS),
        "exactly.kafka.publishTimeoutMs": "30000", **extra}, settings.mode)
    return ProtocolHarness(KafkaSink(options, settings), settings)


def parts(epoch: int, count: int = 2, rows: int = 5) -> list[pa.RecordBatch]:
    """The input of ``epoch``: ``count`` partitions of ``rows`` records ``{"id": n}``."""
    batches = []
    for p in range(count):
        ids = range(epoch * 1000 + p * rows, epoch * 1000 + (p + 1) * rows)
        batches.append(pa.record_batch({"key": [str(i % 3) for i in ids],
                                        "value": [json.dumps({"id": i}) for i in ids]}))
    return batches


def expected(*epochs: int) -> list[int]:
    return sorted(i for e in epochs for i in range(e * 1000, e * 1000 + 10))


def ids(broker: Any, topic: str, isolation: str = "read_committed") -> list[int]:
    """Every id a reader with ``isolation`` sees (waits for open transactions to end)."""
    return sorted(json.loads(v)["id"] for _, _, _, v in
                  consume_all(broker.bootstrap, topic, isolation_level=isolation))


def committed_now(broker: Any, topic: str) -> list[int]:
    """The ids a ``read_committed`` reader sees now: everything up to each partition's last
    stable offset (an open transaction ends the read there instead of blocking it)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()
                                  for p in partitions},
                                 isolation_level=IsolationLevel.READ_COMMITTED)
    stable = {tp.partition: f.result(30).offset for tp, f in futures.items()}
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "enable.auto.commit": False,
                         "group.id": f"snapshot-{uuid.uuid4()}",
                         "isolation.level": "read_committed"})
    seen: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while True:
            positions = consumer.position([TopicPartition(topic, p) for p in partitions])
            if all(tp.offset >= stable[tp.partition] for tp in positions):
                return sorted(seen)
            seen += [json.loads(m.value())["id"] for m in consumer.consume(100, 1.0)
                     if m.error() is None]
    finally:
        consumer.close()


@pytest.mark.parametrize("answer", [Answer.DROP, Answer.CUT])
def test_an_end_txn_whose_answer_is_lost_publishes_the_epoch_once_and_renews_the_producer(
        broker, topic, tmp_path, kafka_proxy, answer):
    """The broker commits epoch 1, its answer is lost (dropped: the client times out; cut:
    the connection is reset). librdkafka sends EndTxn again, the coordinator finds the
    transaction committed and says so: epoch 1 once. The next epoch runs on a new producer,
    whose init_transactions fences every request the old one may still have in flight."""
    h = harness(broker, topic, tmp_path)
    h.run_epoch(0, parts(0))
    kept = h.sink._publisher(h.query_id).producer
    lost = kafka_proxy.on_request(kafka_request(END_TXN), answer)
    h.run_epoch(1, parts(1))
    assert lost.fired.is_set()
    h.run_epoch(2, parts(2))
    assert h.sink._publisher(h.query_id).producer is not kept
    assert ids(broker, topic) == expected(0, 1, 2)
    assert ids(broker, topic, "read_uncommitted") == expected(0, 1, 2)
    assert read_marker(h.sink.options, h.query_id) == 3


def test_a_late_end_txn_never_commits_the_next_epoch(broker, topic, tmp_path, kafka_proxy):
    """Epoch 1's EndTxn(commit) is held by the network past the client's timeout;
    librdkafka sends it again, it commits epoch 1, and the sink goes on with epoch 2. The
    first copy then reaches the coordinator while epoch 2's transaction is open. From the
    same producer (same id and epoch) it would commit epoch 2's records before epoch 2's
    marker (measured: read_committed readers saw them there, and a crash at that point
    published epoch 2 twice). From a renewed producer it is fenced."""
    h = harness(broker, topic, tmp_path, **{"exactly.fault": f"{IN_TRANSACTION}@2",
                                            "exactly.faultMarker": str(tmp_path / "fired")})
    h.run_epoch(0, parts(0))
    late = kafka_proxy.on_request(kafka_request(END_TXN), Answer.LATE_REQUEST, delay=LATE_S)
    h.run_epoch(1, parts(1))
    # the late copy reaches the broker by then (it was sent before epoch 1's commit returned)
    arrived = time.monotonic() + LATE_S + 1.0
    assert late.fired.is_set()
    seen: dict[str, list[int]] = {}

    def in_epoch_2s_transaction() -> None:
        time.sleep(max(0.0, arrived - time.monotonic()))
        seen["read_committed"] = committed_now(broker, topic)
        seen["read_uncommitted"] = ids(broker, topic, "read_uncommitted")
        raise_simulated_crash(IN_TRANSACTION, 2, True)  # and the driver dies there

    handles = h.tasks(2, parts(2))
    with pytest.raises(SimulatedCrash), h.pause_at(IN_TRANSACTION, 2, in_epoch_2s_transaction):
        h.commit(2, handles)
    assert seen["read_committed"] == expected(0, 1)  # nothing of the open epoch 2
    assert seen["read_uncommitted"] == expected(0, 1, 2)
    h.restart()
    h.commit(2, h.tasks(2, parts(2)))
    assert ids(broker, topic) == expected(0, 1, 2)  # every epoch once
    # the crashed attempt's records are aborted: read_uncommitted alone sees them
    assert ids(broker, topic, "read_uncommitted") == expected(0, 1, 2, 2)
    assert read_marker(h.sink.options, h.query_id) == 3


@pytest.mark.parametrize("api_key", [ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT],
                         ids=["AddOffsetsToTxn", "TxnOffsetCommit"])
def test_a_lost_answer_to_the_epoch_marker_publishes_the_epoch_once_and_renews_the_producer(
        broker, topic, tmp_path, kafka_proxy, api_key):
    """The answer to send_offsets_to_transaction's requests (adding the marker group to the
    transaction, then the marker itself) is dropped after the broker applied the request:
    librdkafka times out and sends it again; the epoch and its marker commit once, and the
    next epoch runs on a new producer."""
    h = harness(broker, topic, tmp_path)
    h.run_epoch(0, parts(0))
    kept = h.sink._publisher(h.query_id).producer
    lost = kafka_proxy.on_request(kafka_request(api_key), Answer.DROP)
    h.run_epoch(1, parts(1))
    assert lost.fired.is_set()
    assert read_marker(h.sink.options, h.query_id) == 2
    h.run_epoch(2, parts(2))
    assert h.sink._publisher(h.query_id).producer is not kept
    assert ids(broker, topic) == expected(0, 1, 2)
    assert ids(broker, topic, "read_uncommitted") == expected(0, 1, 2)
    assert read_marker(h.sink.options, h.query_id) == 3


def test_an_aborted_publish_is_seen_by_read_uncommitted_and_never_by_read_committed(
        broker, topic, tmp_path, kafka_proxy):
    """The driver dies inside epoch 1's transaction (records produced and flushed). While
    the transaction is open and after it is aborted, read_committed readers see none of it;
    read_uncommitted readers see it (the aborted read Kafka allows them). The restart
    publishes epoch 1 once."""
    h = harness(broker, topic, tmp_path, **{"exactly.fault": f"{IN_TRANSACTION}@1",
                                            "exactly.faultMarker": str(tmp_path / "fired")})
    h.run_epoch(0, parts(0))
    seen: dict[str, list[int]] = {}

    def inside_the_transaction() -> None:
        seen["read_committed"] = committed_now(broker, topic)
        seen["read_uncommitted"] = ids(broker, topic, "read_uncommitted")
        raise_simulated_crash(IN_TRANSACTION, 1, True)

    handles = h.tasks(1, parts(1))
    with pytest.raises(SimulatedCrash), h.pause_at(IN_TRANSACTION, 1, inside_the_transaction):
        h.commit(1, handles)
    assert seen["read_committed"] == expected(0)
    assert seen["read_uncommitted"] == expected(0, 1)
    assert committed_now(broker, topic) == expected(0)  # aborted: still not committed
    assert ids(broker, topic, "read_uncommitted") == expected(0, 1)
    h.restart()
    h.commit(1, h.tasks(1, parts(1)))
    assert ids(broker, topic) == expected(0, 1)
    assert ids(broker, topic, "read_uncommitted") == expected(0, 1, 1)
    assert read_marker(h.sink.options, h.query_id) == 2
