"""Output mode update through start_query: a streaming aggregation (count per key over
exactly.datagen) into PostgreSQL by the keyed sinks, run by start_query through foreachBatch
(Python data source sinks refuse update) under the same checkpoint configuration. Real Spark,
real PostgreSQL."""

from __future__ import annotations

from collections import Counter

import pytest
from psycopg import sql

from exactly.auditor import AuditSpec, PostgresLocation, run_audit
from exactly.config import CheckpointConfig
from exactly.connectors.sql import TableName
from exactly.ops.query import start_query

KEYS, PER_EPOCH = 7, 500


def counts_query(spark, total: int):
    from pyspark.sql import functions as F

    events = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
              .option("totalRows", total).option("maxRowsPerTrigger", PER_EPOCH)
              .option("keys", KEYS).load())
    return events.groupBy("key").agg(F.count("*").alias("n"))


def expected(total: int) -> dict[str, int]:
    return dict(Counter(f"k{i % KEYS:04d}" for i in range(total)))


#: the aggregation as a batch query over exactly.datagen's rows 0..total-1 (key k<i % keys>)
BATCH_TRUTH = ("select 'k' || lpad(cast(range % {keys} as varchar), 4, '0') as key, "
               "count(*) as n from range({total}) group by 1")


def table_rows(conn, relation: str) -> dict[str, tuple[int, int]]:
    rows = conn.execute(sql.SQL("SELECT key, n, exactly_epoch FROM {}").format(
        sql.Identifier(relation))).fetchall()
    return {key: (n, epoch) for key, n, epoch in rows}


@pytest.mark.parametrize(("fmt", "options"), [
    ("exactly.postgres", {"writeMode": "upsert", "keyColumns": "key"}),
    # exactly.upsert in update mode is killed at every protocol point by the slow
    # test_pg_chaos.py [upsert-keyed-every-point]; exactly.postgres in update mode (this
    # test's first case) in the default lane by tests/connect/test_chaos_on_connect.py
    pytest.param("exactly.upsert", {"keyColumns": "key"}, marks=pytest.mark.slow),
])
def test_a_streaming_count_in_update_mode_ends_with_the_inputs_counts_across_a_restart(
        spark, pg, conn, tmp_path, table_name, fmt, options):
    config = CheckpointConfig(storage=str(tmp_path / "ck"), state_backend="hashmap")
    for total in (3000, 4000):  # the second run resumes from the checkpoint
        query = start_query(counts_query(spark, total), sink_format=fmt, output_mode="update",
                            options={"dsn": pg.dsn, "table": table_name, **options},
                            checkpoint=config, available_now=True)
        query.await_termination()
        assert query.query.exception() is None
        assert query.checkpoint_location == str(tmp_path / "ck")
        rows = table_rows(conn, table_name)
        assert {key: n for key, (n, _) in rows.items()} == expected(total)
    # every key is in every epoch, so each epoch rewrote every row in place: 8 epochs
    assert {epoch for _, epoch in rows.values()} == {4000 // PER_EPOCH - 1}
    assert sorted(p.name for p in (tmp_path / "ck" / "commits").iterdir()
                  if p.name.isdigit()) == [str(n) for n in range(8)]
    # ... each committed by the protocol, whose log start_query placed under the checkpoint
    assert len(list((tmp_path / "ck" / "exactly-sink" / "complete").glob("*.json"))) == 8
    if fmt == "exactly.postgres":  # the epoch-consistent view shows the same counts
        assert {k: n for k, (n, _) in table_rows(conn, f"{table_name}_committed").items()} \
            == expected(4000)
    # exactly verify agrees: the batch truth of the count, as SQL, against the final table
    report = run_audit(AuditSpec(output=PostgresLocation(pg.dsn, TableName.parse(table_name)),
                                 expect=BATCH_TRUTH.format(total=4000, keys=KEYS),
                                 keys=("key",), compare=("n",)))
    assert report.ok, report.rows()
    assert (report.expected_keys, report.found_rows) == (KEYS, KEYS)
