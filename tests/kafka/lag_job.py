"""An ``exactly run`` job for tests/kafka/test_kafka_group_lag.py: exactly's Kafka reader
(``read_exactly_kafka``, 10 offsets per epoch) into the files sink. ``LAG_BOOTSTRAP``,
``LAG_TOPIC`` and ``LAG_OUT`` come from the environment; the consumer group is not named, so
it is the job's: ``exactly-lag_job``."""

import os

from exactly import CheckpointConfig, Job
from exactly.connectors.kafka.source import read_exactly_kafka


def build(spark):
    events = read_exactly_kafka(spark, os.environ["LAG_BOOTSTRAP"], os.environ["LAG_TOPIC"],
                                max_offsets_per_trigger=10)
    return Job(events, sink_format="exactly.files", path=os.environ["LAG_OUT"],
               checkpoint=CheckpointConfig(interval="500ms"))
