"""Every exactly sink through ``start_query`` on a Spark Connect session writes every row once.

The client is a Connect session to a real Spark Connect server (``connect_server``); the
sinks' tasks write in the server's executors' Python workers and their commit runs in the
Python process the server starts for the query's ``foreachBatch``, where the whole
``TwoPhaseForeachBatch`` -- the sink included -- arrives cloudpickled from the client. Each
test drains a few hundred generated rows in a couple of epochs (``exactly.datagen``,
available_now) and audits the target: every id once, every epoch committed by the protocol.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import functions as F

from exactly.audit import audit_ids, file_ids, json_ids, pg_table_ids
from exactly.config import CheckpointConfig
from exactly.connectors.postgres.two_phase import prepared_count
from exactly.errors import ConfigError
from exactly.ops.query import start_query
from exactly.protocol.commitlog import CommitLog
from exactly.testing.kafka_broker import consume_all

pytestmark = [pytest.mark.spark, pytest.mark.server]

ROWS, PER_EPOCH, KEYS = 600, 200, 7  # 3 epochs
EPOCHS = ROWS // PER_EPOCH


def datagen(spark, rows: int = ROWS):
    return (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
            .option("totalRows", rows).option("maxRowsPerTrigger", PER_EPOCH)
            .option("keys", KEYS).load())


def drain(df, ck: Path, **kwargs):
    query = start_query(df, checkpoint=CheckpointConfig(storage=str(ck), **kwargs.pop(
        "config", {})), available_now=True, **kwargs)
    query.await_termination()
    assert query.query.exception() is None
    return query


def assert_every_epoch_committed(log_dir: Path, epochs: int = EPOCHS) -> None:
    """The sink's commit log (``<checkpoint>/exactly-sink``, the file sink's beside its
    output) completed every epoch."""
    assert CommitLog(log_dir).completed_epochs() == list(range(epochs))


def assert_every_id_once(found: np.ndarray, rows: int = ROWS) -> None:
    report = audit_ids(found, np.arange(rows))
    assert report.ok, report.to_json()
    assert report.found_rows == rows


def test_file_sink_on_connect_writes_every_row_once(remote, tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    drain(datagen(remote), ck, sink_format="exactly.files", path=str(out))
    ids, _ = file_ids(out)
    assert_every_id_once(ids)
    assert_every_epoch_committed(out / "_exactly")


def test_postgres_2pc_sink_on_connect_writes_every_row_once(remote, pg, conn, tmp_path,
                                                            table_name):
    ck = tmp_path / "ck"
    drain(datagen(remote), ck, sink_format="exactly.postgres",
          options={"dsn": pg.dsn, "table": table_name})
    assert_every_id_once(pg_table_ids(conn, table_name))
    assert prepared_count(conn) == 0
    assert_every_epoch_committed(ck / "exactly-sink")


def test_write_ahead_sink_into_postgres_on_connect_writes_every_row_once(remote, pg, conn,
                                                                        tmp_path, table_name):
    ck = tmp_path / "ck"
    drain(datagen(remote), ck, sink_format="exactly.wal",
          options={"dsn": pg.dsn, "table": table_name})
    assert_every_id_once(pg_table_ids(conn, table_name))
    assert_every_epoch_committed(ck / "exactly-sink")


def test_upsert_sink_in_update_mode_on_connect_ends_with_the_inputs_counts(remote, pg, conn,
                                                                          tmp_path, table_name):
    """A streaming count per key, update mode (foreachBatch on the server): the table holds
    the count of every key over the whole input, each epoch committed by the protocol."""
    ck = tmp_path / "ck"
    counts = datagen(remote).groupBy("key").agg(F.count("*").alias("n"))
    drain(counts, ck, sink_format="exactly.upsert", output_mode="update",
          options={"dsn": pg.dsn, "table": table_name, "keyColumns": "key"},
          config={"state_backend": "hashmap"})
    got = dict(conn.execute(f'SELECT key, n FROM "{table_name}"').fetchall())
    assert got == dict(Counter(f"k{i % KEYS:04d}" for i in range(ROWS)))
    assert_every_epoch_committed(ck / "exactly-sink")


def test_kafka_sink_on_connect_writes_every_row_once_for_read_committed_consumers(
        remote, broker, topic, tmp_path):
    ck = tmp_path / "ck"
    df = datagen(remote).select(F.col("key"),
                                F.to_json(F.struct("id", "key", "amount")).alias("value"))
    drain(df, ck, sink_format="exactly.kafka",
          options={"kafka.bootstrap.servers": broker.bootstrap, "topic": topic,
                   "transactionalIdPrefix": f"connect-{topic}"})
    values = [value for _, _, _, value in consume_all(broker.bootstrap, topic)]
    assert_every_id_once(json_ids(values))
    assert_every_epoch_committed(ck / "exactly-sink")


def test_an_object_storage_checkpoint_is_refused_on_connect_before_the_query_starts(
        remote, tmp_path):
    """Refused in the client, naming why, before the server starts anything: no query runs
    and nothing is written."""
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="Spark Connect") as refused:
        start_query(datagen(remote), sink_format="exactly.files", path=str(out),
                    checkpoint=CheckpointConfig(storage="s3a://bucket/ck"), available_now=True)
    assert "s3a" in str(refused.value)
    assert remote.streams.active == []
    assert not out.exists()


def test_spark_kafka_connector_is_refused_on_connect_naming_the_server_start(connect_server):
    from exactly.spark.session import spark_session

    with pytest.raises(ConfigError) as refused:
        spark_session(remote=connect_server.url, kafka=True)
    message = str(refused.value)
    assert "does not work on a Spark Connect session" in message
    assert "jars must be on the server's class path" in message
