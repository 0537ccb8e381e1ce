"""exactly's own Kafka reader (``format("exactly.kafka")``, exactly.connectors.kafka.reader)
on a real broker: through Spark (local[2]) into the exactly.files sink, audited by
(partition, offset) and by the ids in the record values; and in-process, where the reader's
driver-side calls (offsets, budgets, admission) run in this process."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.streaming.datasource import ReadAllAvailable

from exactly import options as opt
from exactly.audit import audit_ids, data_files, json_ids
from exactly.config import CheckpointConfig
from exactly.connectors.admission import ADMISSION_FILE_ENV
from exactly.connectors.kafka.reader import (
    READER_OPTIONS,
    KafkaPartition,
    KafkaReaderOptions,
    KafkaSourceError,
    KafkaStreamReader,
    split_budget,
)
from exactly.connectors.kafka.source import read_exactly_kafka
from exactly.errors import ConfigError
from exactly.ops.query import start_query
from exactly.testing.kafka_broker import consume_all

WAIT_S = 120  # bound on waiting for a query (a hang fails the test instead of blocking it)


# -- producing ----------------------------------------------------------------------------
def _value(i: int) -> bytes:
    return json.dumps({"id": i}).encode()


def produce(bootstrap: str, topic: str, ids: Iterable[int]) -> None:
    """Plain (non-transactional) records, id ``i`` into partition ``i % 2``."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in ids:
        producer.produce(topic, _value(i), key=str(i).encode(), partition=i % 2)
    producer.flush(30)


def transactional(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    return producer


def produce_in(producer: Producer, topic: str, ids: Iterable[int]) -> None:
    """Records in ``producer``'s open transaction, flushed (in the log, not yet decided)."""
    for i in ids:
        producer.produce(topic, _value(i), key=str(i).encode(), partition=i % 2)
    producer.flush(30)


# -- running and auditing -----------------------------------------------------------------
def start(spark, bootstrap: str, topic: str, out: Path, checkpoint: Path, *,
          available_now: bool = True, max_offsets: int | None = None):
    events = read_exactly_kafka(spark, bootstrap, topic, max_offsets_per_trigger=max_offsets)
    writer = (events.writeStream.format("exactly.files").option(opt.PATH, str(out))
              .option(opt.CHECKPOINT_LOCATION, str(checkpoint)))
    writer = (writer.trigger(availableNow=True) if available_now
              else writer.trigger(processingTime="200 milliseconds"))
    return writer.start()


def drain(spark, bootstrap: str, topic: str, out: Path, checkpoint: Path, *,
          max_offsets: int | None = None) -> list[int]:
    """Run an availableNow query to its end; the input rows of each epoch that had some."""
    query = start(spark, bootstrap, topic, out, checkpoint, max_offsets=max_offsets)
    assert query.awaitTermination(WAIT_S), "the availableNow query did not stop by itself"
    assert query.exception() is None
    return [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


def rows(out: Path) -> list[dict]:
    """Every row the file sink made visible (committed epochs only)."""
    found: list[dict] = []
    if not out.exists():  # before the first epoch
        return found
    for path in data_files(out):
        found += pq.read_table(path).to_pylist()
    return found


def assert_exactly(out: Path, expected: Iterable[int]) -> list[dict]:
    """The output holds each expected id once, and each (partition, offset) once."""
    found = rows(out)
    report = audit_ids(json_ids(r["value"] for r in found), np.array(list(expected)))
    assert report.ok, report.rows()
    positions = [(r["partition"], r["offset"]) for r in found]
    assert len(positions) == len(set(positions)), "a record was read twice"
    return found


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


# -- through Spark ------------------------------------------------------------------------
def test_every_committed_record_is_read_once_and_aborted_ones_never(spark, broker, topic,
                                                                     tmp_path):
    bootstrap = broker.bootstrap
    produce(bootstrap, topic, range(0, 10))
    committing, aborting = transactional(bootstrap), transactional(bootstrap)
    for txn in (committing, aborting):
        txn.begin_transaction()
    for lo in range(10, 30, 5):  # two transactions interleaved in the same partitions
        produce_in(committing, topic, range(lo, lo + 5))
        produce_in(aborting, topic, range(100 + lo, 105 + lo))
    aborting.abort_transaction(30)
    committing.commit_transaction(30)
    open_txn = transactional(bootstrap)
    open_txn.begin_transaction()
    produce_in(open_txn, topic, range(200, 210))  # still open: held back, and no hang

    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    epochs = drain(spark, bootstrap, topic, out, checkpoint, max_offsets=8)
    assert len(epochs) >= 2
    assert_exactly(out, range(0, 30))

    open_txn.commit_transaction(30)
    aborting.begin_transaction()
    produce_in(aborting, topic, range(300, 310))
    produce(bootstrap, topic, range(30, 40))
    aborting.abort_transaction(30)
    drain(spark, bootstrap, topic, out, checkpoint, max_offsets=8)
    found = assert_exactly(out, [*range(0, 40), *range(200, 210)])
    assert {r["topic"] for r in found} == {topic}
    assert {r["timestampType"] for r in found} == {0}  # create time
    assert {r["key"] for r in found} == {str(json.loads(r["value"])["id"]).encode()
                                         for r in found}


def test_max_offsets_per_trigger_cuts_a_backlog_into_epochs_no_larger_than_the_limit(
        spark, broker, topic, tmp_path):
    produce(broker.bootstrap, topic, range(45))
    epochs = drain(spark, broker.bootstrap, topic, tmp_path / "out", tmp_path / "ck",
                   max_offsets=7)
    assert epochs == [7] * 6 + [3]
    assert_exactly(tmp_path / "out", range(45))


def test_restart_from_the_checkpoint_continues_with_no_duplicate_and_no_gap(spark, broker,
                                                                            topic, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    produce(broker.bootstrap, topic, range(40))
    query = start(spark, broker.bootstrap, topic, out, checkpoint, available_now=False,
                  max_offsets=10)
    try:
        wait_until(lambda: len(rows(out)) >= 10, "the first epochs")
    finally:
        query.stop()
    produce(broker.bootstrap, topic, range(40, 60))

    query = start(spark, broker.bootstrap, topic, out, checkpoint, available_now=False,
                  max_offsets=10)
    try:
        wait_until(lambda: len(rows(out)) >= 60, "every record after the restart")
    finally:
        query.stop()
    assert query.exception() is None
    assert_exactly(out, range(60))


def test_available_now_drains_the_backlog_in_bounded_epochs_and_stops(spark, broker, topic,
                                                                      tmp_path):
    produce(broker.bootstrap, topic, range(30))
    epochs = drain(spark, broker.bootstrap, topic, tmp_path / "out", tmp_path / "ck",
                   max_offsets=10)
    assert sum(epochs) == 30 and len(epochs) == 3
    assert_exactly(tmp_path / "out", range(30))
    # nothing new: a second drain stops at once and reads nothing
    assert drain(spark, broker.bootstrap, topic, tmp_path / "out", tmp_path / "ck") == []


def test_kafka_to_kafka_both_ends_exactly_kafka_through_start_query(spark, broker, topic,
                                                                   tmp_path):
    """One format is source and transactional sink: a sink query still plans (schema() now
    answers for the reader), and start_query accepts the reader's options."""
    out_topic = f"{topic}-out"
    broker.create_topic(out_topic, 2)
    produce(broker.bootstrap, topic, range(25))
    events = read_exactly_kafka(spark, broker.bootstrap, topic, max_offsets_per_trigger=10)
    query = start_query(events.select("key", "value"), sink_format="exactly.kafka",
                        available_now=True,
                        checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")),
                        options={opt.KAFKA_BOOTSTRAP: broker.bootstrap, opt.TOPIC: out_topic,
                                 opt.TRANSACTIONAL_ID_PREFIX: f"reader-{topic}"})
    assert query.await_termination(WAIT_S)
    values = [value for _, _, _, value in consume_all(broker.bootstrap, out_topic)]
    report = audit_ids(json_ids(values), np.arange(25))
    assert report.ok, report.rows()


# -- in-process: the reader's own calls -------------------------------------------------------
def reader(bootstrap: str, topic: str, **extra: str) -> KafkaStreamReader:
    return KafkaStreamReader({opt.KAFKA_BOOTSTRAP: bootstrap, opt.SUBSCRIBE: topic, **extra})


def read_all(r: KafkaStreamReader, start: dict, end: dict) -> list[int]:
    ids: list[int] = []
    for part in r.partitions(start, end):
        for batch in r.read(part):
            ids += [json.loads(v)["id"] for v in batch.column("value").to_pylist()]
    return sorted(ids)


def test_admission_budget_sizes_and_pauses_epochs_and_a_drain_ignores_the_pause(
        broker, topic, tmp_path, monkeypatch):
    produce(broker.bootstrap, topic, range(20))
    admission = tmp_path / "admission.json"
    monkeypatch.setenv(ADMISSION_FILE_ENV, str(admission))
    r = reader(broker.bootstrap, topic)
    try:
        start_offsets = r.initialOffset()
        admission.write_text(json.dumps({"max_rows": 3}))
        end = r.latestOffset(start_offsets, ReadAllAvailable())
        assert read_all(r, start_offsets, end) == [0, 1, 2]  # 2 from one partition, 1 other

        (tmp_path / "ck" / "commits").mkdir(parents=True)
        (tmp_path / "ck" / "commits" / "0").write_text("v1\n{}")
        admission.write_text(json.dumps({"checkpoint": str(tmp_path / "ck"),
                                         "min_pause_s": 3600}))
        assert r.latestOffset(end, ReadAllAvailable()) == end  # paused: no epoch
        admission.write_text(json.dumps({"closed": True}))
        assert r.latestOffset(end, ReadAllAvailable()) == end  # closed: no epoch

        r.prepareForTriggerAvailableNow()  # a drain is bounded: the pause does not hold it
        final = r.latestOffset(end, ReadAllAvailable())
        assert read_all(r, end, final) == list(range(3, 20))
    finally:
        r.stop()


def test_records_deleted_before_they_were_read_fail_the_reader_unless_allowed(broker, topic):
    produce(broker.bootstrap, topic, range(0, 20, 2))  # 10 records, all in partition 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(30)
    from_zero = json.dumps({topic: {"0": 0, "1": 0}})
    strict = reader(broker.bootstrap, topic, startingOffsets=from_zero)
    with pytest.raises(KafkaSourceError, match="failOnDataLoss=false"):
        strict.initialOffset()
    with pytest.raises(KafkaSourceError, match="were deleted"):  # a replay after deletion
        list(strict.read(KafkaPartition(topic, 0, 1, 10)))
    with pytest.raises(KafkaSourceError, match="were deleted"):  # a checkpoint from before
        strict.latestOffset({topic: {"0": 2, "1": 0}}, ReadAllAvailable())
    strict.stop()

    lenient = reader(broker.bootstrap, topic, startingOffsets=from_zero,
                     failOnDataLoss="false")
    start_offsets = lenient.initialOffset()
    assert start_offsets == {topic: {"0": 4, "1": 0}}
    assert read_all(lenient, {topic: {"0": 1, "1": 0}}, {topic: {"0": 10, "1": 0}}) == \
        list(range(8, 20, 2))
    lenient.stop()


# -- pure -----------------------------------------------------------------------------------
def test_unknown_option_is_refused_naming_the_closest_known_one():
    base = {opt.KAFKA_BOOTSTRAP: "h:1", opt.SUBSCRIBE: "t"}
    with pytest.raises(ConfigError, match="did you mean maxOffsetsPerTrigger"):
        KafkaReaderOptions.from_options({**base, "maxOffsetPerTrigger": "5"})
    with pytest.raises(ConfigError, match="did you mean startingOffsets"):
        KafkaReaderOptions.from_options({**base, "startingoffset": "earliest"})
    with pytest.raises(ConfigError, match="Spark's built-in Kafka source"):
        KafkaReaderOptions.from_options({**base, "subscribePattern": "t.*"})
    with pytest.raises(ConfigError, match="startingOffsets"):
        KafkaReaderOptions.from_options({**base, "kafka.auto.offset.reset": "latest"})
    with pytest.raises(ConfigError, match="subscribe"):
        KafkaReaderOptions.from_options({opt.KAFKA_BOOTSTRAP: "h:1"})
    # Spark hands options lower-cased; kafka.* reaches the consumer; read_committed default
    parsed = KafkaReaderOptions.from_options(
        {k.lower(): v for k, v in {**base, "maxOffsetsPerTrigger": "5",
                                   "kafka.fetch.min.bytes": "1"}.items()})
    assert parsed.max_offsets_per_trigger == 5
    assert parsed.consumer_conf == {"fetch.min.bytes": "1", "bootstrap.servers": "h:1",
                                    "isolation.level": "read_committed"}
    # start_query checks source options by exactly.options' table: it accepts the same names
    assert set(opt.SOURCE_OPTIONS["exactly.kafka"]) | {opt.KAFKA_ISOLATION_LEVEL} == \
        READER_OPTIONS


def test_a_row_budget_is_shared_fairly_and_no_partition_waits_forever():
    backlog = {("t", 0): 100, ("t", 1): 2, ("t", 2): 50}
    assert split_budget(backlog, 30) == {("t", 0): 14, ("t", 1): 2, ("t", 2): 14}
    assert split_budget(backlog, 3) == {("t", 0): 1, ("t", 1): 1, ("t", 2): 1}
    assert split_budget(backlog, 1000) == backlog
    # a budget smaller than the partitions with a backlog rotates over them
    four = {("t", p): 10 for p in range(4)}
    served: set[tuple[str, int]] = set()
    for rotation in range(0, 4, 2):  # callers rotate by the offsets taken (2 per epoch)
        grant = split_budget(four, 2, rotation)
        assert sum(grant.values()) == 2
        served |= {k for k, v in grant.items() if v}
    assert served == set(four)
