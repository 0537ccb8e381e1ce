"""The commit protocol on the transactional Kafka sink and a real broker, without Spark."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer

from exactly.config import Mode
from exactly.connectors.kafka import sink as ksink
from exactly.connectors.kafka.sink import (
    KafkaSink,
    KafkaSinkOptions,
    broker_transaction_max_timeout_ms,
    check_transaction_timeout,
    read_marker,
)
from exactly.errors import ConfigError, FencedError
from exactly.procs import ProcessId
from exactly.protocol.committer import Committer
from exactly.protocol.contract import Handle, SinkSettings, TaskInfo
from exactly.testing.kafka_broker import consume_all

DEAD_DRIVER = ProcessId(socket.gethostname(), 4_000_000, 1)


def make_sink(broker, topic: str, log_dir: Path, mode: Mode = Mode.EXACTLY_ONCE,
              prefix: str = "test") -> KafkaSink:
    settings = SinkSettings(mode=mode, log_dir=str(log_dir))
    options = KafkaSinkOptions.from_options({
        "kafka.bootstrap.servers": broker.bootstrap, "topic": topic,
        "transactionalIdPrefix": prefix, "kafka.transaction.timeout.ms": "20000"}, mode)
    return KafkaSink(options, settings)


def run_tasks(sink: KafkaSink, query: str, run_id: str, epoch: int, parts: int = 2,
              rows: int = 5, attempt_base: int = 0) -> list[Handle]:
    """Step 1 as Spark's executors run it: one pre-committed handle per partition."""
    handles = []
    for p in range(parts):
        task = TaskInfo(query, run_id, epoch, p, attempt_base + p)
        txn = sink.begin_transaction(task)
        start = epoch * 1000 + p * rows
        ids = list(range(start, start + rows))
        sink.write(txn, pa.record_batch({
            "key": [str(i % 3) for i in ids],
            "value": [json.dumps({"id": i}) for i in ids]}))
        payload = sink.pre_commit(txn)
        handle = Handle(TaskInfo(query, run_id, epoch, p, task.attempt), payload)
        if sink.mode is Mode.AT_LEAST_ONCE:
            sink.commit_visible(handle)
        handles.append(handle)
    return handles


def ids(broker, topic: str, isolation: str = "read_committed") -> list[int]:
    return sorted(json.loads(v)["id"] for _, _, _, v in
                  consume_all(broker.bootstrap, topic, isolation_level=isolation))


@pytest.fixture
def query() -> str:
    return str(uuid.uuid4())


def test_nothing_reaches_kafka_before_the_commit_and_all_of_it_after(broker, topic, tmp_path,
                                                                     query):
    sink = make_sink(broker, topic, tmp_path)
    handles = run_tasks(sink, query, str(uuid.uuid4()), 0)
    assert ids(broker, topic, "read_uncommitted") == []  # staged, not in Kafka at all
    Committer(sink, SinkSettings(log_dir=str(tmp_path))).commit_epoch(0, handles)
    assert ids(broker, topic) == list(range(10))
    assert sink.list_pre_commits(query) == []
    assert read_marker(sink.options, query) == 1


def test_a_replay_of_a_published_epoch_produces_nothing(broker, topic, tmp_path, query):
    sink = make_sink(broker, topic, tmp_path)
    settings = SinkSettings(log_dir=str(tmp_path))
    Committer(sink, settings).commit_epoch(0, run_tasks(sink, query, str(uuid.uuid4()), 0))
    Committer(sink, settings).commit_epoch(0, run_tasks(sink, query, str(uuid.uuid4()), 0,
                                                        attempt_base=10))
    assert ids(broker, topic) == list(range(10))
    assert ids(broker, topic, "read_uncommitted") == list(range(10))
    assert sink.list_pre_commits(query) == []


def test_published_but_not_marked_complete_is_not_published_twice(broker, topic, tmp_path,
                                                                  query):
    """Killed after the Kafka commit, before 'complete': the marker decides."""
    sink = make_sink(broker, topic, tmp_path)
    settings = SinkSettings(log_dir=str(tmp_path))
    run = str(uuid.uuid4())
    handles = run_tasks(sink, query, run, 0)
    c = Committer(sink, settings)
    c.lease.acquire(run, DEAD_DRIVER)
    c.log.write_intent(0, run, handles)
    sink.publish_epoch(0, handles)  # the crash happens here, before mark_complete
    assert not c.log.is_complete(0)
    replay = run_tasks(sink, query, str(uuid.uuid4()), 0, attempt_base=10)
    Committer(sink, settings).commit_epoch(0, replay)
    assert ids(broker, topic, "read_uncommitted") == list(range(10))
    assert Committer(sink, settings).log.completion(0)["already_committed"] == 2


def test_a_transaction_left_open_by_a_dead_driver_is_aborted_and_redone(broker, topic,
                                                                       tmp_path, query):
    """Killed inside the publish: the records are in Kafka, uncommitted. The next run's
    init_transactions aborts them and publishes the intent again from the staged rows."""
    sink = make_sink(broker, topic, tmp_path)
    settings = SinkSettings(log_dir=str(tmp_path))
    run = str(uuid.uuid4())
    handles = run_tasks(sink, query, run, 0)
    c = Committer(sink, settings)
    c.lease.acquire(run, DEAD_DRIVER)
    c.log.write_intent(0, run, handles)
    zombie = Producer({"bootstrap.servers": broker.bootstrap,
                       "transactional.id": sink.transactional_id(query)})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for i in range(10):
        zombie.produce(topic, json.dumps({"id": i}).encode())
    zombie.flush(30)  # in the log, not committed: what a SIGKILL mid-publish leaves
    assert ids(broker, topic, "read_uncommitted") == list(range(10))

    replay = run_tasks(sink, query, str(uuid.uuid4()), 0, attempt_base=10)
    Committer(sink, settings).commit_epoch(0, replay)
    assert ids(broker, topic) == list(range(10))  # read_committed: exactly once
    # read_uncommitted also sees the aborted first attempt
    assert ids(broker, topic, "read_uncommitted") == sorted(list(range(10)) * 2)
    with pytest.raises(KafkaException):  # and the zombie is fenced
        zombie.commit_transaction(10)


def test_two_epochs_and_orphans_of_a_dead_run(broker, topic, tmp_path, query):
    sink = make_sink(broker, topic, tmp_path)
    settings = SinkSettings(log_dir=str(tmp_path))
    run_tasks(sink, query, str(uuid.uuid4()), 0)  # crashed before the intent: orphans
    run = str(uuid.uuid4())
    Committer(sink, settings).commit_epoch(0, run_tasks(sink, query, run, 0, attempt_base=10))
    Committer(sink, settings).commit_epoch(1, run_tasks(sink, query, run, 1, attempt_base=20))
    assert ids(broker, topic) == [*range(10), *range(1000, 1010)]
    assert sink.list_pre_commits(query) == []
    assert read_marker(sink.options, query) == 2


def test_at_least_once_produces_from_the_task(broker, topic, tmp_path, query):
    sink = make_sink(broker, topic, tmp_path, mode=Mode.AT_LEAST_ONCE)
    run_tasks(sink, query, str(uuid.uuid4()), 0)
    assert ids(broker, topic) == list(range(10))  # visible before any driver commit
    run_tasks(sink, query, str(uuid.uuid4()), 0)  # a replay duplicates: at least once
    assert len(ids(broker, topic)) == 20


def test_a_fenced_publisher_raises_fenced_error(broker, topic, tmp_path, query, monkeypatch):
    sink = make_sink(broker, topic, tmp_path)
    handles = run_tasks(sink, query, str(uuid.uuid4()), 0)
    session = sink._publisher(query)
    session._open()
    newer = Producer({"bootstrap.servers": broker.bootstrap,
                      "transactional.id": sink.transactional_id(query)})
    newer.init_transactions(30)  # another instance took over
    with pytest.raises(FencedError, match="took over"):
        sink.publish_epoch(0, handles)
    assert ids(broker, topic, "read_uncommitted") == []


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
    assert ksink.KafkaSinkOptions.from_options(
        {"kafka.bootstrap.servers": "x:1", "topic": "t"}, Mode.AT_LEAST_ONCE).topic == "t"


def test_the_chaos_schedule_covers_every_point_once_in_protocol_order():
    from exactly.demos.kafka import PLACEHOLDER_EPOCH, chaos_schedule
    from exactly.protocol.faults import DRIVER_POINTS, FaultPoint

    schedule, in_txn = chaos_schedule(10, None, None)
    assert [s.point for s in schedule] == [*DRIVER_POINTS, FaultPoint.IN_WRITE,
                                           FaultPoint.IN_WRITE]
    assert [s.min_epoch for s in schedule] == [1, 2, 3, 4, 5, PLACEHOLDER_EPOCH, 7]
    assert in_txn == 6
