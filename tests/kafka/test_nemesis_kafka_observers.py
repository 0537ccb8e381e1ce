"""The Kafka observers against a real broker: a read_committed consumer sees committed
transactions only, a read_uncommitted one also an aborted transaction's records."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from exactly.testing.kafka_broker import quiet_conf
from exactly.testing.nemesis.checker import READ_UNCOMMITTED, History, check
from exactly.testing.nemesis.observers import KafkaObserver, json_row


def test_kafka_observers_see_committed_records_and_uncommitted_ones_only_read_uncommitted(
        broker, topic):
    producer = Producer({**quiet_conf(broker.bootstrap), "transactional.id": f"obs-{topic}"})
    producer.init_transactions(30)
    history = History()
    row = json_row("id", epoch_field="epoch")
    with (KafkaObserver(history, broker.bootstrap, topic, name="rc", row=row),
          KafkaObserver(history, broker.bootstrap, topic, name="ru", row=row,
                        isolation=READ_UNCOMMITTED)):
        for epoch, ids, commit in ((0, [1, 2], True), (1, [9], False), (1, [3, 4], True)):
            producer.begin_transaction()
            for i in ids:
                producer.produce(topic, json.dumps({"id": i, "epoch": epoch}).encode(),
                                 partition=i % 2)
            producer.flush(30)  # on the broker's log: an abort would purge unsent records
            producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    rc, ru = history.stream("rc"), history.stream("ru")
    assert sorted((r.id, r.epoch) for r in rc) == [(1, 0), (2, 0), (3, 1), (4, 1)]
    assert sorted(r.id for r in ru) == [1, 2, 3, 4, 9]
    report = check(history, expected_ids={1, 2, 3, 4}, final_rows=rc, whole_epochs={"rc"})
    assert report.ok, report.render()
    assert report.stats["uncommitted reads seen"] == 1
    assert not history.errors
