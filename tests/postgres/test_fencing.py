"""Fencing of the PostgreSQL sinks beyond the protocol scenario.

That a second live instance of a query is fenced and commits nothing is proved for every
sink in tests/contract (test_a_second_live_instance_is_fenced_and_commits_nothing). Here:
what the upsert sink's epoch guard adds (its tasks write before any commit), and the same
refusal when Spark starts the second instance.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pg_rows import sorted_ids
from psycopg import sql

from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink, prepared_count
from exactly.connectors.postgres.upsert import IdempotentUpsertSink
from exactly.errors import FencedError
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])




def test_upsert_a_second_live_instance_is_fenced_at_commit_and_cannot_move_a_value_back(
        pg, conn, tmp_path, table_name):
    """The upsert sink's tasks write directly (no second phase), so the lease, checked by
    the driver, cannot hold back a fenced instance's task writes. What holds: its commit is
    refused (no intent, no completion), the epoch guard refuses its writes of an older epoch
    to keys a newer epoch wrote, and a replay of the same epoch rewrites the same values
    (deterministic input). Use exactly.postgres writeMode=upsert where a second instance
    must write nothing visible."""
    sink = IdempotentUpsertSink(pg.dsn, table_name, ["key"], tmp_path / "log")
    sink.prepare_target(SCHEMA)
    h = ProtocolHarness(sink)

    def values() -> dict[str, tuple[int, int]]:
        return {k: (i, e) for k, i, e in conn.execute(sql.SQL(
            "SELECT key, id, exactly_epoch FROM {}").format(sql.Identifier(table_name)))}

    def rows(values_by_key: dict[str, int]) -> list[pa.RecordBatch]:
        return [pa.record_batch({"id": list(values_by_key.values()),
                                 "key": list(values_by_key)}, schema=SCHEMA)]

    with h.other_live_driver() as first:
        h.tasks(0, rows({"a": 1, "b": 1}), run=first)  # the live instance wrote epochs 0, 1
        h.tasks(1, rows({"a": 2}), run=first)
        before = values()
        # this, the second instance, replays epoch 0: b as before, a from stale state
        stale = h.tasks(0, rows({"a": 100, "b": 1}))
        assert values() == before  # a: refused by the epoch guard; b: the same value
        with pytest.raises(FencedError, match=f"run {first} holds it"):
            h.commit(0, stale)
        assert h.intent(0) is None
        assert h.log.completed_epochs() == []
    h.restart()
    h.run_epoch(2, rows({"a": 3, "c": 3}))
    assert values() == {"a": (3, 2), "b": (1, 0), "c": (3, 2)}
    assert h.log.completed_epochs() == [2]


def test_a_fenced_2pc_instance_started_by_spark_fails_and_leaves_the_table_alone(
        spark, pg, conn, tmp_path, table_name):
    """Real Spark: the checkpoint's sink lease is held by a live process; start_query
    refuses the query with FencedError before Spark runs anything (the sink's own check at
    the first commit is the protocol-level tests' subject) and nothing becomes visible.
    After the holder exits, the same query starts and writes everything once."""
    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query

    ck = tmp_path / "ck"

    def start():
        df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
              .option("totalRows", 400).option("maxRowsPerTrigger", 200)
              .option("numPartitions", 2).load().select("id", "key"))
        return start_query(df, sink_format="exactly.postgres",
                           options={"dsn": pg.dsn, "table": table_name, "partitions": "2"},
                           checkpoint=CheckpointConfig(storage=str(ck)), available_now=True)

    # the sink's commit log and lease as start_query places them under the checkpoint
    log_dir = Path(ck) / "exactly-sink"
    other = ProtocolHarness(PostgresTwoPhaseSink(pg.dsn, table_name, log_dir))
    with other.other_live_driver() as first:
        with pytest.raises(FencedError, match=f"fenced off: run {first} holds it"):
            start()  # start_query refuses it before Spark runs anything
        created = conn.execute("SELECT to_regclass(%s)", (f'"{table_name}"',)).fetchone()[0]
        assert created is None  # refused before the sink even prepared its table
    query = start()
    query.await_termination()
    assert sorted_ids(conn, f"{table_name}_committed") == list(range(400))
    assert sorted_ids(conn, table_name) == list(range(400))
    assert prepared_count(conn, str(query.query.id)) == 0
