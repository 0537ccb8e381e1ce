"""Fencing of the database sinks: a second live instance of a query commits nothing.

As for the file sink (tests/unit/test_protocol.py): a real other process (``sleep 60``) is
recorded as the lease holder; a second instance's commit raises FencedError naming the
holder and writes no intent. Once the holder is dead, a new run takes over, recovers (aborts
both instances' leftovers) and commits.
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from psycopg import sql

from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink, prepared_count
from exactly.connectors.postgres.upsert import IdempotentUpsertSink
from exactly.connectors.wal import PostgresWalTarget, SqliteWalTarget, WriteAheadSink
from exactly.errors import FencedError
from exactly.procs import ProcessId, _stat
from exactly.protocol.committer import Committer
from exactly.protocol.contract import Handle, SinkSettings, TaskInfo
from exactly.protocol.lease import Lease
from exactly.protocol.recovery import recover_on_new_driver

QUERY = str(uuid.uuid4())
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])
EPOCH_0 = list(range(10))


def run_tasks(sink, run_id: str, epoch: int, attempt_base: int = 0) -> list[Handle]:
    """Step 1 as Spark's executors do it: two pre-committed handles of 5 rows."""
    handles = []
    for p in range(2):
        task = TaskInfo(QUERY, run_id, epoch, p, attempt_base + p)
        txn = sink.begin_transaction(task)
        ids = list(range(epoch * 1000 + p * 5, epoch * 1000 + p * 5 + 5))
        sink.write(txn, pa.record_batch({"id": ids, "key": [f"k{i}" for i in ids]},
                                        schema=SCHEMA))
        handles.append(Handle(task, sink.pre_commit(txn)))
    return handles


@contextmanager
def live_holder(sink) -> Iterator[str]:
    """A live process on this host holds the sink's lease for a run; yields that run id."""
    holder = subprocess.Popen(["sleep", "60"])
    try:
        run = str(uuid.uuid4())
        me = ProcessId(socket.gethostname(), holder.pid, _stat(holder.pid)[2])
        Lease(sink.log_directory).acquire(run, me)
        yield run
    finally:
        holder.kill()
        holder.wait()


def committer(sink) -> Committer:
    return Committer(sink, SinkSettings())


def pg_ids(conn, relation: str) -> list[int]:
    return [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(
        sql.Identifier(relation))).fetchall()]


def test_2pc_a_second_live_instance_is_fenced_and_commits_no_prepared_transaction(
        pg, conn, tmp_path, table_name):
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log", retry_seconds=20)
    sink.prepare_target(SCHEMA, partitions=2)
    view = f"{table_name}_committed"
    with live_holder(sink) as first:
        run_tasks(sink, first, 0)  # the live instance is in the middle of epoch 0
        second = run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=10)
        with pytest.raises(FencedError, match=f"run {first} holds it"):
            committer(sink).commit_epoch(0, second)
        assert committer(sink).log.read_intent(0) is None
        assert pg_ids(conn, table_name) == [] and pg_ids(conn, view) == []
        assert prepared_count(conn, QUERY) == 4  # its own not committed, the holder's kept
        # a second driver starting up does not roll back the live instance's transactions
        assert recover_on_new_driver(sink, SinkSettings()) is False
        assert prepared_count(conn, QUERY) == 4
    committer(sink).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=20))
    assert pg_ids(conn, table_name) == EPOCH_0
    assert pg_ids(conn, view) == EPOCH_0
    assert prepared_count(conn, QUERY) == 0  # both instances' leftovers rolled back


@pytest.fixture(params=["postgres", "sqlite"])
def wal(request, pg, tmp_path, table_name) -> WriteAheadSink:
    if request.param == "postgres":
        target = PostgresWalTarget(pg.dsn, table_name)
    else:
        target = SqliteWalTarget(str(tmp_path / "db.sqlite"), table_name)
    sink = WriteAheadSink(target, tmp_path / "log")
    sink.prepare_target(SCHEMA)
    return sink


def wal_ids(sink: WriteAheadSink, pg) -> list[int]:
    if isinstance(sink.target, SqliteWalTarget):
        with sqlite3.connect(sink.target.path) as c:
            return [r[0] for r in c.execute(
                f"SELECT id FROM {sink.target.table.sqlite()} ORDER BY id")]
    with pg.connect() as c:
        return pg_ids(c, sink.target.table.name)


def test_wal_a_second_live_instance_is_fenced_and_loads_nothing(wal, pg):
    with live_holder(wal) as first:
        held = run_tasks(wal, first, 0)
        second = run_tasks(wal, str(uuid.uuid4()), 0, attempt_base=10)
        with pytest.raises(FencedError, match=f"run {first} holds it"):
            committer(wal).commit_epoch(0, second)
        assert committer(wal).log.read_intent(0) is None
        assert wal_ids(wal, pg) == []
        assert not wal.target.has_marker(QUERY, 0)
        staged = {h.key for h in wal.list_pre_commits(QUERY)}
        assert staged == {h.key for h in held + second}  # nothing discarded by the fenced one
    committer(wal).commit_epoch(0, run_tasks(wal, str(uuid.uuid4()), 0, attempt_base=20))
    assert wal_ids(wal, pg) == EPOCH_0
    assert wal.list_pre_commits(QUERY) == []  # both instances' staged rows discarded


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

    def values() -> dict[str, tuple[int, int]]:
        return {k: (i, e) for k, i, e in conn.execute(sql.SQL(
            "SELECT key, id, exactly_epoch FROM {}").format(sql.Identifier(table_name)))}

    def upsert(run: str, epoch: int, rows: dict[str, int], attempt: int) -> Handle:
        txn = sink.begin_transaction(TaskInfo(QUERY, run, epoch, 0, attempt))
        sink.write(txn, pa.record_batch({"id": list(rows.values()), "key": list(rows)},
                                        schema=SCHEMA))
        return Handle(TaskInfo(QUERY, run, epoch, 0, attempt), sink.pre_commit(txn))

    with live_holder(sink) as first:
        upsert(first, 0, {"a": 1, "b": 1}, 0)  # the live instance wrote epochs 0 and 1
        upsert(first, 1, {"a": 2}, 1)
        before = values()
        # the second instance replays epoch 0: b as before, a from stale state
        stale = upsert(str(uuid.uuid4()), 0, {"a": 100, "b": 1}, 10)
        assert values() == before  # a: refused by the epoch guard; b: the same value
        with pytest.raises(FencedError, match=f"run {first} holds it"):
            committer(sink).commit_epoch(0, [stale])
        assert committer(sink).log.read_intent(0) is None
        assert committer(sink).log.completed_epochs() == []
    committer(sink).commit_epoch(2, [upsert(str(uuid.uuid4()), 2, {"a": 3, "c": 3}, 20)])
    assert values() == {"a": (3, 2), "b": (1, 0), "c": (3, 2)}
    assert committer(sink).log.completed_epochs() == [2]


def test_a_fenced_2pc_instance_started_by_spark_fails_and_leaves_the_table_alone(
        spark, pg, conn, tmp_path, table_name):
    """Real Spark: the checkpoint's sink lease is held by a live process; start_query
    refuses the query with FencedError before Spark runs anything (the sink's own check at
    the first commit is the protocol-level tests' subject) and nothing becomes visible.
    After the holder exits, the same query starts and writes everything once."""
    from exactly.config import CheckpointConfig
    from exactly.spark.runner import start_query

    ck = tmp_path / "ck"

    def start():
        df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
              .option("totalRows", 400).option("maxRowsPerTrigger", 200)
              .option("numPartitions", 2).load().select("id", "key"))
        return start_query(df, sink_format="exactly.postgres",
                           options={"dsn": pg.dsn, "table": table_name, "partitions": "2"},
                           checkpoint=CheckpointConfig(storage=str(ck)), available_now=True)

    log_dir = Path(ck) / "exactly-sink"
    log_dir.mkdir(parents=True)

    class LogDir:  # live_holder needs only the directory of the lease
        log_directory = log_dir

    with live_holder(LogDir) as first:
        with pytest.raises(FencedError, match=f"fenced off: run {first} holds it"):
            start()  # start_query refuses it before Spark runs anything
        created = conn.execute("SELECT to_regclass(%s)", (f'"{table_name}"',)).fetchone()[0]
        assert created is None  # refused before the sink even prepared its table
    query = start()
    query.await_termination()
    assert pg_ids(conn, f"{table_name}_committed") == list(range(400))
    assert pg_ids(conn, table_name) == list(range(400))
    assert prepared_count(conn) == 0
