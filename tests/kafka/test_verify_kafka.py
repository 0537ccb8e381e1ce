"""``exactly verify`` against a real Kafka broker: a row only in an aborted transaction
fails the audit under read_uncommitted and passes under read_committed; latest value per key
and values that moved backwards along a topic; a missing topic refused with exit 2."""

from __future__ import annotations

import json
import uuid

from click.testing import CliRunner

from exactly.cli import main
from exactly.testing.kafka_broker import quiet_conf


def transactional_producer(bootstrap: str):
    from confluent_kafka import Producer

    producer = Producer({**quiet_conf(bootstrap), "transactional.id": f"t-{uuid.uuid4()}"})
    producer.init_transactions(30)
    return producer


def send(producer, topic: str, rows: list[dict], *, commit: bool) -> None:
    producer.begin_transaction()
    for row in rows:
        producer.produce(topic, json.dumps(row).encode(), str(row.get("key", "")).encode())
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def verify(*args: str):
    return CliRunner().invoke(main, ["verify", *args])


def test_an_aborted_transactions_rows_fail_only_read_uncommitted(broker, topic):
    producer = transactional_producer(broker.bootstrap)
    send(producer, topic, [{"id": i} for i in range(0, 300)], commit=True)
    send(producer, topic, [{"id": i} for i in range(300, 400)], commit=False)  # a crash
    send(producer, topic, [{"id": i} for i in range(300, 400)], commit=True)  # the replay
    args = ["--expect", "select range as id from range(400)", "--output",
            f"kafka://{broker.bootstrap}/{topic}", "--json"]
    committed = verify(*args)
    assert committed.exit_code == 0, committed.output
    assert json.loads(committed.stdout)["found_rows"] == 400
    uncommitted = verify(*args, "--isolation", "read_uncommitted")
    assert uncommitted.exit_code == 1, uncommitted.output
    report = json.loads(uncommitted.stdout)
    assert report["duplicated"]["count"] == 100 and report["duplicate_extra_rows"] == 100
    assert report["duplicated"]["sample"][0] == {"id": 300, "rows": 2}


def test_latest_value_per_key_and_a_count_that_moved_backwards(broker, topic):
    """A topic of updates (a running count per key): the newest record per key is the
    result; a replayed older count after the newest is a value that moved backwards."""
    producer = transactional_producer(broker.bootstrap)
    for n in range(1, 6):
        send(producer, topic, [{"key": k, "n": n} for k in ("a", "b", "c")], commit=True)
    location = f"kafka://{broker.bootstrap}/{topic}"
    truth = "select * from (values ('a', 5), ('b', 5), ('c', 5)) as t(key, n)"
    good = verify("--expect", truth, "--output", location, "--key", "key", "--latest-by-key",
                  "--compare-columns", "n", "--monotonic", "n", "--json")
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["moved_backwards"] == {"count": 0, "sample": []}
    send(producer, topic, [{"key": "b", "n": 3}], commit=True)  # an old value again
    bad = verify("--expect", truth, "--output", location, "--key", "key", "--latest-by-key",
                 "--compare-columns", "n", "--monotonic", "n", "--json")
    assert bad.exit_code == 1
    report = json.loads(bad.stdout)
    assert report["moved_backwards"]["count"] == 1
    assert {k: report["moved_backwards"]["sample"][0][k] for k in ("key", "before", "after")} \
        == {"key": "b", "before": 5, "after": 3}
    assert report["differing"]["sample"] == [{"key": "b", "expected n": 5, "found n": 3}]


def test_a_topic_that_does_not_exist_is_exit_2(broker):
    result = verify("--expect", "select 1 as id", "--output",
                    f"kafka://{broker.bootstrap}/no-such-topic")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"verify: bad input: kafka://{broker.bootstrap}/no-such-topic: topic no-such-topic "
        "does not exist"]


def test_a_record_that_is_not_json_is_exit_2_naming_its_offset(broker, topic):
    producer = transactional_producer(broker.bootstrap)
    producer.begin_transaction()
    producer.produce(topic, b"not json", partition=0)
    producer.commit_transaction(30)
    result = verify("--expect", "select 1 as id", "--output",
                    f"kafka://{broker.bootstrap}/{topic}")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"verify: bad input: kafka://{broker.bootstrap}/{topic}: the record at partition 0 "
        "offset 0 is not JSON"]
