"""The Kafka sink's consumers and admin clients get only the settings they take.

The sink's ``kafka.*`` options are producer settings (``linger.ms``, ``compression.type``,
``acks``, ...). Its epoch-marker consumers, its lineage-record consumer and the admin client
of the start check are built from them too; given a producer property, librdkafka logs a
``CONFWARN ... is a producer property and will be ignored by this consumer`` line each time
one is made (five per marker read, 905 in one benchmark run). A user's log must stay quiet
when nothing is wrong: librdkafka's own log (its stderr, captured at the file descriptor)
holds no CONFWARN while the sink publishes, reads its marker, records a restore's lineage
and checks the broker.
"""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Consumer

from exactly.config import Mode
from exactly.connectors.kafka.broker import forget_broker_answers
from exactly.connectors.kafka.lineage import read_edges, record_edge
from exactly.connectors.kafka.options import KafkaSinkOptions
from exactly.connectors.kafka.publisher import read_marker
from exactly.connectors.kafka.sink import KafkaSink
from exactly.protocol.contract import Edge, Restored, SinkSettings
from exactly.spark.formats import check_target, sink_for
from exactly.testing.harness import ProtocolHarness

pytestmark = pytest.mark.server

PRODUCER_OPTIONS = {"kafka.linger.ms": "20", "kafka.compression.type": "lz4",
                    "kafka.acks": "all", "kafka.batch.size": "65536",
                    "kafka.client.id": "exactly-quiet"}


def test_no_confwarn_from_the_sinks_consumers_and_admin_clients_with_producer_options(
        broker, topic, tmp_path, capfd):
    # the capture sees librdkafka's own log: a consumer given a producer property warns
    Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "control",
              "linger.ms": 5}).close()
    assert "CONFWARN" in capfd.readouterr().err

    options = {"kafka.bootstrap.servers": broker.bootstrap, "topic": topic,
               "transactionalIdPrefix": f"quiet-{topic}",
               "kafka.transaction.timeout.ms": "20000", **PRODUCER_OPTIONS}
    settings = SinkSettings(mode=Mode.EXACTLY_ONCE, log_dir=str(tmp_path / "log"))
    kafka = KafkaSinkOptions.from_options(options, settings.mode)
    forget_broker_answers()  # the start check asks the broker again (an admin client)
    check_target(sink_for("exactly.kafka", {**options, "exactly.logDir": str(tmp_path)}))
    h = ProtocolHarness(KafkaSink(kafka, settings), settings)
    for epoch in range(2):  # publishes; each publish reads the marker with a new consumer
        h.run_epoch(epoch, [pa.record_batch({"value": [json.dumps({"id": epoch})]})])
    assert read_marker(kafka, h.query_id) == 2
    record_edge(kafka, Edge(str(uuid.uuid4()), Restored(h.query_id, 1), 1.0))
    assert len(read_edges(kafka)) == 1
    assert h.sink.target_state(h.query_id).progress == 1

    log = capfd.readouterr().err
    assert "CONFWARN" not in log, log
