"""Every exactly sink through ``start_query`` on a Spark Connect session writes every row once.

The client is a Connect session to a real Spark Connect server (``connect_server``); the
sinks' tasks write in the server's executors' Python workers and their commit runs in the
Python process the server starts for the query's ``foreachBatch``, where the whole
``TwoPhaseForeachBatch`` -- the sink included -- arrives cloudpickled from the client. Each
test drains a few hundred generated rows in a couple of epochs (``exactly.datagen``,
available_now) and audits the target: every id once, every epoch committed by the protocol.
Each scenario runs in a Connect client process of its own (``in_client``, conftest.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pyspark.sql import functions as F

from exactly.audit import audit_ids, file_ids, json_ids, pg_table_ids
from exactly.checkpoint.history import open_history
from exactly.config import CheckpointConfig
from exactly.connectors.postgres.two_phase import prepared_count
from exactly.errors import ConfigError
from exactly.ops.query import start_query
from exactly.protocol.commitlog import CommitLog
from exactly.testing.kafka_broker import consume_all

pytestmark = [pytest.mark.spark, pytest.mark.server]

#: files, PostgreSQL 2PC and Kafka through start_query on Connect are audited in the default
#: lane by tests/connect/test_chaos_on_connect.py; their short runs here are slow proofs

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


def files(spark, tmp: str) -> None:
    out, ck = Path(tmp) / "out", Path(tmp) / "ck"
    drain(datagen(spark), ck, sink_format="exactly.files", path=str(out))
    ids, _ = file_ids(out)
    assert_every_id_once(ids)
    assert_every_epoch_committed(out / "_exactly")


def postgres_2pc(spark, tmp: str, dsn: str, table: str) -> None:
    ck = Path(tmp) / "ck"
    drain(datagen(spark), ck, sink_format="exactly.postgres",
          options={"dsn": dsn, "table": table})
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert_every_id_once(pg_table_ids(conn, table))
        assert prepared_count(conn) == 0
    assert_every_epoch_committed(ck / "exactly-sink")


def write_ahead(spark, tmp: str, dsn: str, table: str) -> None:
    ck = Path(tmp) / "ck"
    drain(datagen(spark), ck, sink_format="exactly.wal", options={"dsn": dsn, "table": table})
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert_every_id_once(pg_table_ids(conn, table))
    assert_every_epoch_committed(ck / "exactly-sink")


def upsert_counts(spark, tmp: str, dsn: str, table: str) -> None:
    ck = Path(tmp) / "ck"
    counts = datagen(spark).groupBy("key").agg(F.count("*").alias("n"))
    drain(counts, ck, sink_format="exactly.upsert", output_mode="update",
          options={"dsn": dsn, "table": table, "keyColumns": "key"},
          config={"state_backend": "hashmap"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = dict(conn.execute(f'SELECT key, n FROM "{table}"').fetchall())
    assert got == dict(Counter(f"k{i % KEYS:04d}" for i in range(ROWS)))
    assert_every_epoch_committed(ck / "exactly-sink")
    # the history (exactly checkpoints / ui) is fed by Connect's client-side listener
    records = open_history(str(ck)).read().records
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == list(range(EPOCHS))
    assert all(r["status"] == "completed" and r.get("recovered_from") is None for r in epochs)
    assert [r["rows_in"] for r in epochs] == [PER_EPOCH] * EPOCHS
    assert [r["kind"] for r in records if r["kind"] in ("run", "run_end")] == ["run", "run_end"]


def kafka(spark, tmp: str, bootstrap: str, topic: str) -> None:
    ck = Path(tmp) / "ck"
    df = datagen(spark).select(F.col("key"),
                               F.to_json(F.struct("id", "key", "amount")).alias("value"))
    drain(df, ck, sink_format="exactly.kafka",
          options={"kafka.bootstrap.servers": bootstrap, "topic": topic,
                   "transactionalIdPrefix": f"connect-{topic}"})
    values = [value for _, _, _, value in consume_all(bootstrap, topic)]
    assert_every_id_once(json_ids(values))
    assert_every_epoch_committed(ck / "exactly-sink")


def iceberg(spark, tmp: str) -> None:
    from pyiceberg.catalog import load_catalog

    ck, lake = Path(tmp) / "ck", Path(tmp) / "lake"
    drain(datagen(spark).select("id", "key"), ck, sink_format="exactly.iceberg",
          path="db.events", options={"warehouse": str(lake)})
    table = load_catalog("exactly", type="sql", uri=f"sqlite:///{lake}/catalog.db") \
        .load_table("db.events")
    assert_every_id_once(np.array(table.scan(selected_fields=("id",)).to_arrow()["id"]))
    assert len(table.metadata.snapshots) == EPOCHS  # one snapshot an epoch
    assert_every_epoch_committed(ck / "exactly-sink")


def object_storage_refused(spark, tmp: str) -> None:
    """Refused in the client, naming why, before the server starts anything: no query runs
    and nothing is written."""
    out = Path(tmp) / "out"
    with pytest.raises(ConfigError, match="Spark Connect") as refused:
        start_query(datagen(spark), sink_format="exactly.files", path=str(out),
                    checkpoint=CheckpointConfig(storage="s3a://bucket/ck"), available_now=True)
    assert "s3a" in str(refused.value)
    assert spark.streams.active == []
    assert not out.exists()


MODULE = "test_sinks_on_connect"


@pytest.mark.slow
def test_file_sink_on_connect_writes_every_row_once(in_client, tmp_path):
    in_client(MODULE, "files", tmp=str(tmp_path))


@pytest.mark.slow
def test_postgres_2pc_sink_on_connect_writes_every_row_once(in_client, pg, tmp_path,
                                                            table_name):
    in_client(MODULE, "postgres_2pc", tmp=str(tmp_path), dsn=pg.dsn, table=table_name)


def test_write_ahead_sink_into_postgres_on_connect_writes_every_row_once(in_client, pg,
                                                                        tmp_path, table_name):
    in_client(MODULE, "write_ahead", tmp=str(tmp_path), dsn=pg.dsn, table=table_name)


def test_upsert_sink_in_update_mode_on_connect_ends_with_the_inputs_counts_and_its_history(
        in_client, pg, tmp_path, table_name):
    """A streaming count per key, update mode (foreachBatch on the server): the table holds
    the count of every key over the whole input, each epoch committed by the protocol, and
    the checkpoint's history records every epoch (Connect's client-side listener)."""
    in_client(MODULE, "upsert_counts", tmp=str(tmp_path), dsn=pg.dsn, table=table_name)


@pytest.mark.slow
def test_kafka_sink_on_connect_writes_every_row_once_for_read_committed_consumers(
        in_client, broker, topic, tmp_path):
    in_client(MODULE, "kafka", tmp=str(tmp_path), bootstrap=broker.bootstrap, topic=topic)


@pytest.mark.slow  # CI budget: the Iceberg sink's protocol runs in process in the default lane
def test_iceberg_sink_on_connect_writes_every_row_once_in_one_snapshot_per_epoch(
        in_client, tmp_path):
    in_client(MODULE, "iceberg", tmp=str(tmp_path))


def test_an_object_storage_checkpoint_is_refused_on_connect_before_the_query_starts(
        in_client, tmp_path):
    in_client(MODULE, "object_storage_refused", tmp=str(tmp_path))


def test_spark_kafka_connector_is_refused_on_connect_naming_the_server_start(connect_server):
    """Refused before connecting: no session is opened in this (pytest) process."""
    from exactly.spark.session import spark_session

    with pytest.raises(ConfigError) as refused:
        spark_session(remote=connect_server.url, kafka=True)
    message = str(refused.value)
    assert "does not work on a Spark Connect session" in message
    assert "jars must be on the server's class path" in message
