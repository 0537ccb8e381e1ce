"""exactly.connectors.kafka.source.read_kafka on Spark's built-in connector and a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from exactly.connectors.kafka.source import read_kafka
from exactly.errors import ConfigError


def test_read_committed_by_default_bounded_epochs_offsets_in_the_checkpoint(broker, tmp_path):
    name = uuid.uuid4().hex[:8]
    topic, other = f"src-{name}-a", f"src-{name}-b"
    broker.create_topic(topic, 2)
    broker.create_topic(other, 1)
    txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"t-{name}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(10):  # committed
        txn.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    txn.commit_transaction(30)
    txn.begin_transaction()
    for i in range(100, 110):  # aborted: never read with read_committed
        txn.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    txn.flush(30)  # in the log before the abort (abort would drop unsent records)
    txn.abort_transaction(30)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10, 20):  # not transactional: read in both modes
        plain.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    plain.produce(other, json.dumps({"id": 1000}).encode())
    plain.flush(30)

    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("source_job.py")), broker.bootstrap,
         topic, f"src-{name}-.*", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["committed"] == list(range(20))
    assert found["uncommitted"] == sorted([*range(20), *range(100, 110)])
    # maxOffsetsPerTrigger=5 over 20 records (+ control and aborted records in the offsets)
    assert found["committed_batches"] >= 4
    # the offset log holds the end offset of every partition: the epoch is replayable
    assert set(found["committed_last_offsets"][topic]) == {"0", "1"}
    assert found["pattern"] == sorted([*range(20), 1000])
    # partition 0 from offset 3 (ids 0, 2, 4 skipped... 3 records), partition 1 from the start
    assert len(found["from_offsets"]) == 20 - 3
    # the exactly.kafka sink refuses, at start, a timeout above the broker's maximum
    assert "transaction.max.timeout.ms" in found["timeout_error"]
    assert "checkpoint interval < kafka.transaction.timeout.ms" in found["timeout_error"]


def test_read_kafka_refuses_wrong_combinations():
    with pytest.raises(ConfigError, match="exactly one of"):
        read_kafka(None, "x:1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="isolation_level"):
        read_kafka(None, "x:1", topics="t", isolation_level="dirty")  # type: ignore[arg-type]
