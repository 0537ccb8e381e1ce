"""start_query asks the broker for its transaction.max.timeout.ms before Spark starts: a
kafka.transaction.timeout.ms above it fails in one line, not after the first epoch inside
Spark's STREAM_FAILED. Real Spark, real broker (transaction.max.timeout.ms = 300000)."""

from __future__ import annotations

import threading

import pytest

from exactly import options as opt
from exactly.config import CheckpointConfig
from exactly.connectors.kafka.broker import (
    broker_transaction_max_timeout_ms,
    forget_broker_answers,
)
from exactly.connectors.kafka.options import KafkaSinkError
from exactly.errors import ConfigError
from exactly.ops.query import start_query


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


def test_the_brokers_answer_is_kept_per_process_and_a_restarting_broker_is_waited_for(broker):
    # Spark asks for the stream writer before every epoch: a broker restarting then must
    # not fail the epoch (it did, in CI), and a healthy one is not asked twice an epoch
    conf = {"bootstrap.servers": broker.bootstrap}
    forget_broker_answers()
    assert broker_transaction_max_timeout_ms(conf) == broker.transaction_max_timeout_ms
    broker.kill()
    restart = threading.Timer(3.0, broker.start)
    try:
        # kept: the dead broker is not asked
        assert broker_transaction_max_timeout_ms(conf, seconds=1) == \
            broker.transaction_max_timeout_ms
        forget_broker_answers()
        restart.start()
        assert broker_transaction_max_timeout_ms(conf, seconds=60) == \
            broker.transaction_max_timeout_ms
    finally:
        restart.cancel()
        if restart.is_alive():
            restart.join()
        broker.start()


def test_a_broker_that_stays_unreachable_fails_the_check_naming_the_bootstrap_option():
    forget_broker_answers()
    with pytest.raises(KafkaSinkError, match=r"127\.0\.0\.1:1: .*Check kafka\.bootstrap"
                                             r"\.servers and that the broker is up"):
        broker_transaction_max_timeout_ms({"bootstrap.servers": "127.0.0.1:1"}, seconds=2)
