"""The epoch's transaction filled while its tasks run (exactly.connectors.kafka.streaming).

Driven step by step as ``foreachBatch`` drives the sink: ``start_early_publish`` before the
tasks, the tasks, the commit (intent, then ``publish_epoch``), ``stop_early_publish``. Every
test audits what ``read_committed`` and ``read_uncommitted`` consumers of the topic see.
A SIGKILL of the driver while the streamed transaction is open is in the chaos run
(tests/kafka/test_kafka_chaos.py's slow proofs, point ``kafka.streaming``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
from json_records import ids, rows

from exactly.config import Mode
from exactly.connectors.kafka.options import KafkaSinkOptions
from exactly.connectors.kafka.publisher import read_marker
from exactly.connectors.kafka.sink import KafkaSink
from exactly.connectors.kafka.streaming import EpochStream, StagedTail
from exactly.protocol.contract import SinkSettings, TaskInfo
from exactly.protocol.staging import StagedFile
from exactly.testing.harness import ProtocolHarness


def harness(broker, topic: str, log_dir: Path) -> ProtocolHarness[KafkaSink]:
    settings = SinkSettings(mode=Mode.EXACTLY_ONCE, log_dir=str(log_dir))
    options = KafkaSinkOptions.from_options({
        "kafka.bootstrap.servers": broker.bootstrap, "topic": topic,
        "transactionalIdPrefix": "test", "kafka.transaction.timeout.ms": "20000"},
        settings.mode)
    return ProtocolHarness(KafkaSink(options, settings), settings)


def stable_end(broker, topic: str) -> int:
    """The sum of the topic's last stable offsets: what read_committed readers can reach
    (a transaction still open holds it at its first record)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lso-probe",
                         "isolation.level": "read_committed"})
    try:
        partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                   for p in partitions)
    finally:
        consumer.close()


def streamed(stream: EpochStream, rows_wanted: int) -> None:
    """Wait until the stream thread produced ``rows_wanted`` rows (it polls every 10 ms)."""
    deadline = time.monotonic() + 60
    while sum(a.produced_rows for a in stream.attempts.values()) < rows_wanted:
        assert stream.error is None, stream.error
        assert time.monotonic() < deadline, "the stream never produced the staged rows"
        time.sleep(0.02)


def test_rows_streamed_while_the_tasks_run_are_invisible_until_the_epoch_commits(
        broker, topic, tmp_path):
    h = harness(broker, topic, tmp_path)
    h.recover()
    h.sink.start_early_publish(h.query_id, h.run_id, 0)
    stream = h.sink._stream
    assert stream is not None
    handles = h.tasks(0, [[rows(0, 5)], [rows(5, 5)]])
    streamed(stream, 10)
    stream.producer.flush(30)
    assert ids(broker, topic, "read_uncommitted") == list(range(10))  # in the open txn
    assert stable_end(broker, topic) == 0  # no intent yet: nothing visible
    h.commit(0, handles)
    h.sink.stop_early_publish(0)
    assert stable_end(broker, topic) > 10  # the records and the commit markers
    assert ids(broker, topic) == list(range(10))
    # the publish used the streamed transaction: nothing was produced a second time
    assert ids(broker, topic, "read_uncommitted") == list(range(10))
    assert read_marker(h.sink.options, h.query_id) == 1


def test_an_attempt_streamed_then_failed_and_retried_is_published_once(broker, topic,
                                                                       tmp_path):
    """A task attempt's first rows went into the open transaction, then the attempt failed
    (its staged files removed) and Spark ran it again: the intent names the retry only, so
    the streamed transaction is aborted and the epoch published from the intent's files."""
    h = harness(broker, topic, tmp_path)
    h.recover()
    h.sink.start_early_publish(h.query_id, h.run_id, 0)
    stream = h.sink._stream
    assert stream is not None
    executor = KafkaSink(h.sink.options, SinkSettings(mode=Mode.EXACTLY_ONCE,
                                                      log_dir=str(tmp_path)))
    failed = executor.begin_transaction(TaskInfo(h.query_id, h.run_id, 0, 0, 900))
    executor.write(failed, rows(0, 5))
    streamed(stream, 5)
    executor.abort_transaction(failed)  # the attempt failed after its rows were streamed
    handles = h.tasks(0, [[rows(0, 5)], [rows(5, 5)]])  # the retry, and the other task
    h.commit(0, handles)
    h.sink.stop_early_publish(0)
    assert ids(broker, topic) == list(range(10))
    assert read_marker(h.sink.options, h.query_id) == 1
    # the streamed copy of the failed attempt is in the log, aborted
    assert sorted(set(ids(broker, topic, "read_uncommitted"))) == list(range(10))
    assert len(ids(broker, topic, "read_uncommitted")) > 10


def test_a_replayed_epoch_already_published_opens_no_transaction(broker, topic, tmp_path):
    h = harness(broker, topic, tmp_path)
    h.run_epoch(0, [[rows(0, 5)]])
    h.sink.start_early_publish(h.query_id, h.run_id, 0)  # Spark runs epoch 0 again
    stream = h.sink._stream
    assert stream is not None
    handles = h.tasks(0, [[rows(0, 5)]])
    h.commit(0, handles)  # a replay: its handles are aborted
    h.sink.stop_early_publish(0)
    assert stream.already_published and stream.attempts == {}
    h.run_epoch(1, [[rows(5, 5)]])
    assert ids(broker, topic) == list(range(10))
    assert ids(broker, topic, "read_uncommitted") == list(range(10))


def test_the_streamed_transaction_holds_the_marker_uncommitted_and_aborts_it_with_the_rows(
        broker, topic, tmp_path):
    """The early transaction takes the epoch's marker when it begins (the commit after the
    intent is then one request). Until that commit the marker is as invisible as the rows:
    an epoch that ends before its intent aborts both, and the replay publishes it once."""
    h = harness(broker, topic, tmp_path)
    h.recover()
    h.sink.start_early_publish(h.query_id, h.run_id, 0)
    stream = h.sink._stream
    assert stream is not None
    h.tasks(0, [[rows(0, 5)]])
    streamed(stream, 5)
    session = h.sink._publisher(h.query_id)
    assert session.marker_in_txn == 0  # in the open transaction, before any intent
    assert read_marker(h.sink.options, h.query_id) == 0  # read_committed: not published
    h.sink.stop_early_publish(0)  # the epoch failed before its intent
    assert session.marker_in_txn is None and not session.in_transaction
    assert read_marker(h.sink.options, h.query_id) == 0
    assert ids(broker, topic) == []
    h.run_epoch(0, [[rows(0, 5)]])  # Spark replays the epoch
    assert ids(broker, topic) == list(range(5))
    assert read_marker(h.sink.options, h.query_id) == 1


def test_a_growing_arrow_file_is_read_batch_by_batch_until_its_footer(tmp_path):
    """Every prefix of a staged file yields only whole batches, in order, and the file is
    complete only once its footer is there."""
    batch = rows(0, 30)
    path = tmp_path / "rows.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        for i in range(3):
            writer.write_batch(batch.slice(i * 10, 10))
    data = path.read_bytes()
    growing = tmp_path / "growing.arrow"
    tail = StagedTail(StagedFile(pa.fs.LocalFileSystem(), str(growing), str(growing)))
    got: list[int] = []
    for size in range(0, len(data), 7):
        growing.write_bytes(data[:size])
        got += [json.loads(v)["id"] for b in tail.read_new()
                for v in b.column("value").to_pylist()]
        assert not tail.complete
    growing.write_bytes(data)
    got += [json.loads(v)["id"] for b in tail.read_new() for v in b.column("value").to_pylist()]
    assert tail.complete and got == list(range(30)) and tail.rows == 30
