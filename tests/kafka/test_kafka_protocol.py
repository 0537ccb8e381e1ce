"""The transactional Kafka sink's own promises, on a real broker, without Spark.

The protocol's scenarios (nothing visible before the commit, replays, a crash at every
point, orphans, Spark's abort, data loss, fencing, at-least-once) run over the Kafka sink in
tests/contract. Here: the epoch marker, a transaction a dead driver left open, a producer
fenced by Kafka itself, and the start-time checks.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer

from exactly.config import Mode
from exactly.connectors.kafka.broker import broker_transaction_max_timeout_ms
from exactly.connectors.kafka.options import (
    KafkaSinkOptions,
    check_transaction_timeout,
)
from exactly.connectors.kafka.publisher import (
    IN_TRANSACTION,
    read_marker,
    reap_idle_sessions,
)
from exactly.connectors.kafka.sink import KafkaSink
from exactly.errors import ConfigError, FencedError
from exactly.protocol.contract import SinkSettings
from exactly.protocol.faults import FaultPoint
from exactly.testing.harness import ProtocolHarness
from exactly.testing.kafka_broker import consume_all


def harness(broker, topic: str, log_dir: Path, **extra: str) -> ProtocolHarness[KafkaSink]:
    """A query writing to ``topic`` through the exactly-once Kafka sink (``extra``: more
    sink options)."""
    settings = SinkSettings(mode=Mode.EXACTLY_ONCE, log_dir=str(log_dir))
    options = KafkaSinkOptions.from_options({
        "kafka.bootstrap.servers": broker.bootstrap, "topic": topic,
        "transactionalIdPrefix": "test", "kafka.transaction.timeout.ms": "20000", **extra},
        settings.mode)
    return ProtocolHarness(KafkaSink(options, settings), settings)


def parts(epoch: int, count: int = 2, rows: int = 5) -> list[pa.RecordBatch]:
    """The input of ``epoch``: ``count`` partitions of ``rows`` records ``{"id": n}``."""
    batches = []
    for p in range(count):
        start = epoch * 1000 + p * rows
        ids = list(range(start, start + rows))
        batches.append(pa.record_batch({"key": [str(i % 3) for i in ids],
                                        "value": [json.dumps({"id": i}) for i in ids]}))
    return batches


def ids(broker, topic: str, isolation: str = "read_committed") -> list[int]:
    return sorted(json.loads(v)["id"] for _, _, _, v in
                  consume_all(broker.bootstrap, topic, isolation_level=isolation))


def test_the_epoch_marker_is_one_past_the_last_published_epoch(broker, topic, tmp_path):
    h = harness(broker, topic, tmp_path)
    assert read_marker(h.sink.options, h.query_id) == 0
    h.run_epoch(0, parts(0))
    assert read_marker(h.sink.options, h.query_id) == 1
    h.run_epoch(1, parts(1))
    assert read_marker(h.sink.options, h.query_id) == 2
    assert ids(broker, topic) == [*range(10), *range(1000, 1010)]


def test_a_transaction_left_open_by_a_dead_driver_is_aborted_and_redone(broker, topic,
                                                                       tmp_path):
    """Killed inside the publish: the records are in Kafka, uncommitted. The next run's
    init_transactions aborts them and publishes the intent again from the staged rows."""
    h = harness(broker, topic, tmp_path)
    handles = h.tasks(0, parts(0))
    with h.crash_at(FaultPoint.AFTER_INTENT, epoch=0):
        h.commit(0, handles)
    # ... and the dead driver had produced the epoch into its open transaction
    zombie = Producer({"bootstrap.servers": broker.bootstrap,
                       "transactional.id": h.sink.transactional_id(h.query_id)})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for i in range(10):
        zombie.produce(topic, json.dumps({"id": i}).encode())
    zombie.flush(30)  # in the log, not committed: what a SIGKILL mid-publish leaves
    assert ids(broker, topic, "read_uncommitted") == list(range(10))

    h.restart()
    h.commit(0, h.tasks(0, parts(0)))
    assert ids(broker, topic) == list(range(10))  # read_committed: exactly once
    # read_uncommitted also sees the aborted first attempt
    assert ids(broker, topic, "read_uncommitted") == sorted(list(range(10)) * 2)
    with pytest.raises(KafkaException):  # and the zombie is fenced
        zombie.commit_transaction(10)


def test_killed_inside_the_publish_a_new_driver_publishes_the_epoch_once(broker, topic,
                                                                       tmp_path):
    """The sink's own crash point: the epoch's records are in the open transaction, before
    the marker and the commit. (A simulated crash still runs the publish's clean-up, which
    aborts that transaction; after a kill the next init_transactions aborts it, see above.)"""
    h = harness(broker, topic, tmp_path, **{"exactly.fault": f"{IN_TRANSACTION}@0",
                                            "exactly.faultMarker": str(tmp_path / "fired")})
    with h.crash_at(IN_TRANSACTION, epoch=0):
        h.run_epoch(0, parts(0))
    h.restart()
    h.commit(0, h.tasks(0, parts(0)))
    assert ids(broker, topic) == list(range(10))
    assert ids(broker, topic, "read_uncommitted") == sorted(list(range(10)) * 2)
    assert read_marker(h.sink.options, h.query_id) == 1


def test_a_fenced_publisher_raises_fenced_error(broker, topic, tmp_path):
    h = harness(broker, topic, tmp_path)
    handles = h.tasks(0, parts(0))
    h.sink._publisher(h.query_id)._open()
    newer = Producer({"bootstrap.servers": broker.bootstrap,
                      "transactional.id": h.sink.transactional_id(h.query_id)})
    newer.init_transactions(30)  # another instance took over
    with pytest.raises(FencedError, match="took over"):
        h.sink.publish_epoch(0, handles)
    assert ids(broker, topic, "read_uncommitted") == []


def test_a_run_keeps_one_producer_across_epochs_and_a_fresh_one_after_an_error(broker, topic,
                                                                              tmp_path):
    h = harness(broker, topic, tmp_path)
    h.run_epoch(0, parts(0))
    session = h.committer.sink._publisher(h.query_id)
    producer = session.producer
    assert producer is not None
    h.run_epoch(1, parts(1))  # no new producer, no second init_transactions
    assert h.committer.sink._publisher(h.query_id).producer is producer
    # another producer of the transactional id takes over: the kept one is fenced ...
    newer = Producer({"bootstrap.servers": broker.bootstrap,
                      "transactional.id": h.sink.transactional_id(h.query_id)})
    newer.init_transactions(30)
    handles = h.tasks(2, parts(2))
    with pytest.raises(FencedError, match="took over"):
        h.commit(2, handles)
    assert ids(broker, topic, "read_uncommitted") == [*range(10), *range(1000, 1010)]
    # ... and dropped: the same run's next commit opens a fresh producer, which publishes
    h.commit(2, handles)
    assert h.committer.sink._publisher(h.query_id) is not session
    assert ids(broker, topic) == [*range(10), *range(1000, 1010), *range(2000, 2010)]
    assert read_marker(h.sink.options, h.query_id) == 3


def test_a_new_run_in_the_same_process_closes_the_old_runs_producer(broker, topic, tmp_path):
    h = harness(broker, topic, tmp_path)
    h.run_epoch(0, parts(0))
    old = h.committer.sink._publisher(h.query_id)
    assert old.producer is not None
    h.restart()
    h.run_epoch(1, parts(1))
    assert old.producer is None  # closed, not left open beside the new run's
    assert h.committer.sink._publisher(h.query_id).producer is not None
    assert ids(broker, topic) == [*range(10), *range(1000, 1010)]


def test_an_idle_runs_producer_is_closed_and_the_next_epoch_opens_a_fresh_one(broker, topic,
                                                                              tmp_path):
    """Spark tells a sink nothing when its query ends: a kept producer unused for the idle
    time is closed (never one that is publishing), and a later epoch opens a new one."""
    h = harness(broker, topic, tmp_path)
    h.run_epoch(0, parts(0))
    session = h.committer.sink._publisher(h.query_id)
    assert session.producer is not None
    held, release = threading.Event(), threading.Event()

    def publishing() -> None:  # another thread talking to Kafka through the session
        with session.busy:
            held.set()
            release.wait(30)

    worker = threading.Thread(target=publishing)
    worker.start()
    held.wait(30)
    reap_idle_sessions(idle_s=0)  # (earlier tests' sessions in this process may go)
    assert session.producer is not None  # busy: not reaped however long it has been idle
    release.set()
    worker.join()
    assert reap_idle_sessions(idle_s=3600) == 0  # used just now
    assert reap_idle_sessions(idle_s=0) >= 1
    assert session.producer is None
    h.run_epoch(1, parts(1))
    fresh = h.committer.sink._publisher(h.query_id)
    assert fresh is not session and fresh.producer is not None
    assert ids(broker, topic) == [*range(10), *range(1000, 1010)]
    assert read_marker(h.sink.options, h.query_id) == 2


def test_transaction_timeout_is_checked_against_the_broker_and_the_interval(broker):
    broker_max = broker_transaction_max_timeout_ms({"bootstrap.servers": broker.bootstrap})
    assert broker_max == broker.transaction_max_timeout_ms
    check_transaction_timeout(60_000, broker_max, 1_000)
    with pytest.raises(ConfigError, match=r"transaction\.max\.timeout\.ms"):
        check_transaction_timeout(broker_max + 1, broker_max, 1_000)
    with pytest.raises(ConfigError, match="checkpoint interval"):
        check_transaction_timeout(10_000, broker_max, 30_000)


def test_exactly_once_needs_a_transactional_id_prefix():
    with pytest.raises(ConfigError, match="transactionalIdPrefix"):
        KafkaSinkOptions.from_options({"kafka.bootstrap.servers": "x:1", "topic": "t"},
                                      Mode.EXACTLY_ONCE)
    assert KafkaSinkOptions.from_options(
        {"kafka.bootstrap.servers": "x:1", "topic": "t"}, Mode.AT_LEAST_ONCE).topic == "t"

