"""start_query asks the broker for its transaction.max.timeout.ms before Spark starts: a
kafka.transaction.timeout.ms above it fails in one line, not after the first epoch inside
Spark's STREAM_FAILED. Real Spark, real broker (transaction.max.timeout.ms = 300000)."""

from __future__ import annotations

import pytest

from exactly import options as opt
from exactly.config import CheckpointConfig
from exactly.errors import ConfigError
from exactly.spark.runner import start_query


def test_a_transaction_timeout_above_the_brokers_maximum_fails_start_query_before_start(
        spark, broker, topic, tmp_path):
    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
          .option("totalRows", 10).load().selectExpr("cast(id as string) as value"))
    before = {str(q.id) for q in spark.streams.active}
    with pytest.raises(ConfigError) as err:
        start_query(df, sink_format="exactly.kafka", available_now=True,
                    checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")),
                    options={opt.KAFKA_BOOTSTRAP: broker.bootstrap, opt.TOPIC: topic,
                             opt.TRANSACTIONAL_ID_PREFIX: "start-check",
                             opt.KAFKA_TRANSACTION_TIMEOUT_MS: "400000"})
    message = str(err.value)
    assert "kafka.transaction.timeout.ms=400000 is above the broker's " \
           "transaction.max.timeout.ms=300000" in message
    assert "\n" not in message
    assert {str(q.id) for q in spark.streams.active} == before
    assert not (tmp_path / "ck" / "offsets").exists()
