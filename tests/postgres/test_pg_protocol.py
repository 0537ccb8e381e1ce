"""The PostgreSQL sinks' own promises, beyond the commit protocol.

The protocol's scenarios (visibility, replays, a crash at every point, orphans, Spark's
abort, data loss, fencing, at-least-once) run over the 2PC, write-ahead and upsert sinks in
tests/contract. Here: server crashes and dropped connections, the prepared-transaction
capacity check, quoting, types, table checks, secrets, and the upsert sink's epoch guard.
"""

from __future__ import annotations

import datetime as dt
import decimal
import threading

import pyarrow as pa
import pytest
from pg_rows import SCHEMA, parts, sorted_ids

from exactly.connectors.postgres.two_phase import (
    PostgresTwoPhaseSink,
    check_prepared_capacity,
    prepared_count,
)
from exactly.connectors.postgres.upsert import IdempotentUpsertSink
from exactly.connectors.sql import DatabaseError, pg_connect, redact_dsn
from exactly.errors import ConfigError
from exactly.testing.harness import ProtocolHarness
from exactly.testing.pgcluster import TempPostgres, wait_until_accepting


def test_2pc_prepared_transactions_survive_a_server_crash(tmp_path, table_name):
    """pg_ctl stop -m immediate between PREPARE and COMMIT PREPARED: nothing is lost."""
    with TempPostgres(max_prepared_transactions=4) as server:
        sink = PostgresTwoPhaseSink(server.dsn, table_name, tmp_path / "log")
        sink.prepare_target(SCHEMA, partitions=2)
        h = ProtocolHarness(sink)
        handles = h.tasks(0, parts(0))
        server.restart_after_crash()
        wait_until_accepting(server)
        h.commit(0, handles)
        with server.connect() as c:
            assert sorted_ids(c, table_name) == list(range(10))
            assert prepared_count(c) == 0


def test_2pc_commit_survives_a_terminated_connection(two_pc, pg, conn, table_name, monkeypatch):
    """pg_terminate_backend on the committing connection: the retry finds the work done."""
    import exactly.connectors.postgres.two_phase as mod

    h = ProtocolHarness(two_pc)
    handles = h.tasks(0, parts(0))
    real = mod.pg_connect
    calls = {"n": 0}

    def connect_then_terminate(*args, **kwargs):
        c = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:  # the first commit connection dies before it is used
            pid = c.info.backend_pid
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return c

    monkeypatch.setattr(mod, "pg_connect", connect_then_terminate)
    h.commit(0, handles)
    assert sorted_ids(conn, table_name) == list(range(10))
    assert prepared_count(conn, h.query_id) == 0


def test_2pc_max_prepared_transactions_is_checked_with_the_setting_named():
    with TempPostgres(max_prepared_transactions=0) as server, \
            pg_connect(server.dsn, application="t") as c, \
            pytest.raises(ConfigError, match=r"max_prepared_transactions = 0.*Set "
                                             r"max_prepared_transactions = 4"):
        check_prepared_capacity(c, 2)
    with TempPostgres(max_prepared_transactions=2) as server, \
            pg_connect(server.dsn, application="t") as c:
        with pytest.raises(ConfigError, match="max_prepared_transactions = 8"):
            check_prepared_capacity(c, 4)
        assert check_prepared_capacity(c, 2) == 2


HOSTILE_TABLE = 'we"ird; DROP TABLE x; --'
HOSTILE_COLUMNS = ['id', 'sel"ect', "Mixed Case", "drop table;"]


def test_hostile_table_and_column_names_are_quoted(pg, conn, tmp_path):
    schema = pa.schema([(n, pa.int64() if n == "id" else pa.string()) for n in HOSTILE_COLUMNS])
    quoted = HOSTILE_TABLE.replace('"', '""')
    sink = PostgresTwoPhaseSink(pg.dsn, f'"odd.schema"."{quoted}"', tmp_path / "log")
    sink.prepare_target(schema, partitions=1)
    ProtocolHarness(sink).run_epoch(0, [pa.record_batch(
        [pa.array([1, 2]), pa.array(["a", ""]), pa.array([None, "x"]), pa.array(["'", '"'])],
        schema=schema)])
    from psycopg import sql

    rows = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(
        sql.Identifier("odd.schema", HOSTILE_TABLE))).fetchall()
    # '' stays '', NULL stays NULL; the last column is the epoch
    assert rows == [(1, "a", None, "'", 0), (2, "", "x", '"', 0)]
    assert conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(  # the committed view
        sql.Identifier("odd.schema", HOSTILE_TABLE + "_committed"))).fetchall() == rows


def test_types_round_trip_through_copy(pg, conn, tmp_path, table_name):
    schema = pa.schema([
        ("id", pa.int64()), ("i", pa.int32()), ("s", pa.int16()), ("f", pa.float64()),
        ("r", pa.float32()), ("b", pa.bool_()), ("d", pa.decimal128(10, 2)),
        ("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")),
        ("day", pa.date32()), ("bin", pa.binary()), ("txt", pa.string())])
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc)
    row = {"id": 1, "i": 2, "s": 3, "f": 1.5, "r": 2.5, "b": True,
           "d": decimal.Decimal("12.34"), "ts": when, "ntz": when.replace(tzinfo=None),
           "day": dt.date(2026, 1, 2), "bin": b"\x00\xff", "txt": 'a,"b"\nc'}
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log")
    sink.prepare_target(schema, partitions=1)
    ProtocolHarness(sink).run_epoch(
        0, [pa.RecordBatch.from_pylist([row, {"id": 2}], schema=schema)])
    from psycopg import sql

    got = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(
        sql.Identifier(table_name))).fetchall()
    assert got[0] == (*row.values(), 0)  # the last column is the epoch
    assert got[1] == (2,) + (None,) * 11 + (0,)


def test_timestamps_of_any_time_zone_keep_their_instant_even_in_a_repeated_hour(
        pg, conn, tmp_path, table_name):
    # the COPY sends the UTC wall time: 01:30 on 2026-11-01 happens twice in Los Angeles,
    # and a local wall time would send both rows as one of the two instants
    zone = "America/Los_Angeles"
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz=zone))])
    first = dt.datetime(2026, 11, 1, 8, 30, tzinfo=dt.timezone.utc)  # 01:30 PDT
    second = dt.datetime(2026, 11, 1, 9, 30, tzinfo=dt.timezone.utc)  # 01:30 PST
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log")
    sink.prepare_target(schema, partitions=1)
    ProtocolHarness(sink).run_epoch(0, [pa.RecordBatch.from_pylist(
        [{"id": 1, "ts": first}, {"id": 2, "ts": second}], schema=schema)])
    from psycopg import sql

    got = conn.execute(sql.SQL("SELECT id, ts FROM {} ORDER BY id").format(
        sql.Identifier(table_name))).fetchall()
    assert got == [(1, first), (2, second)]


def test_a_task_of_many_batches_sends_them_all_and_a_refused_row_fails_it_whole(
        pg, conn, tmp_path, table_name):
    from psycopg import sql

    batches = [pa.RecordBatch.from_pylist([{"id": i, "key": f"k{i}"} for i in range(j, j + 3)])
               for j in range(0, 12, 3)]
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log")
    sink.prepare_target(batches[0].schema, partitions=1)
    ProtocolHarness(sink).run_epoch(0, [batches])
    count = sql.SQL("SELECT count(DISTINCT id), count(*) FROM {}").format(
        sql.Identifier(table_name))
    assert conn.execute(count).fetchone() == (12, 12)
    # the server refuses the last batch's row: the whole task's COPY is refused, by name
    conn.execute(sql.SQL("ALTER TABLE {} ADD CHECK (id < 20)").format(
        sql.Identifier(table_name)))
    late = [pa.RecordBatch.from_pylist([{"id": i, "key": "x"} for i in range(j, j + 3)])
            for j in (12, 15, 18)]
    with pytest.raises(DatabaseError, match=f"COPY into .*{table_name}.*check constraint"):
        ProtocolHarness(sink).run_epoch(1, [late])
    assert conn.execute(count).fetchone() == (12, 12)


def test_an_existing_table_that_does_not_fit_is_refused_with_the_column_named(pg, conn,
                                                                              tmp_path,
                                                                              table_name):
    conn.execute(f'CREATE TABLE "{table_name}" (id integer, key text, extra text NOT NULL)')
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log")
    with pytest.raises(ConfigError) as err:
        sink.prepare_target(SCHEMA, partitions=1)
    assert "'id' is integer, the stream writes bigint" in str(err.value)
    assert "'extra' is NOT NULL without a default" in str(err.value)


def test_passwords_never_appear_in_errors(pg, tmp_path):
    wrong = pg.dsn.replace(pg.password, "s3cret-wrong")
    sink = PostgresTwoPhaseSink(wrong, "t", tmp_path / "log")
    with pytest.raises(DatabaseError) as err:
        sink.prepare_target(SCHEMA)
    assert "s3cret-wrong" not in str(err.value)
    assert "password authentication failed" in str(err.value)
    assert pg.password not in repr(PostgresTwoPhaseSink(pg.dsn, "t", tmp_path))
    assert "hunter2" not in redact_dsn("host=h user=u password=hunter2 dbname=d")
    assert "hunter2" not in redact_dsn("postgresql://u:hunter2@h/d")


# -- idempotent sink -------------------------------------------------------------------
def test_upsert_a_replay_of_an_older_epoch_never_moves_a_value_back(pg, conn, tmp_path,
                                                                    table_name):
    schema = pa.schema([("key", pa.string()), ("total", pa.int64())])
    sink = IdempotentUpsertSink(pg.dsn, table_name, ["key"], tmp_path / "log")
    sink.prepare_target(schema)
    h = ProtocolHarness(sink)

    def write(epoch: int, rows: dict[str, int]) -> None:  # a task: its upserts are visible
        h.tasks(epoch, [pa.record_batch({"key": list(rows), "total": list(rows.values())},
                                        schema=schema)])

    write(1, {"a": 10, "b": 5})
    write(2, {"a": 12})
    write(1, {"a": 10, "b": 5})  # a stale replay of epoch 1 (e.g. an older checkpoint)
    write(2, {"a": 12})  # a replay of the newest epoch rewrites the same value
    rows = dict(conn.execute(f'SELECT key, total FROM "{table_name}"').fetchall())
    assert rows == {"a": 12, "b": 5}
    epochs = dict(conn.execute(f'SELECT key, exactly_epoch FROM "{table_name}"').fetchall())
    assert epochs == {"a": 2, "b": 1}


def test_upsert_through_copy_keeps_each_keys_last_row_and_every_value(pg, conn, tmp_path,
                                                                       table_name):
    """The rows go through COPY into a temporary table: values that CSV must quote or
    convert arrive unchanged, a key repeated in a batch and across a task's batches ends at
    its last row, and a user's table named like the stage is not touched."""
    conn.execute('DROP TABLE IF EXISTS exactly_upsert_stage')
    conn.execute('CREATE TABLE exactly_upsert_stage (note text)')
    conn.execute("INSERT INTO exactly_upsert_stage VALUES ('mine')")
    schema = pa.schema([("key", pa.string()), ("note", pa.string()),
                        ("amount", pa.decimal128(10, 2)), ("at", pa.timestamp("us", "UTC"))])
    sink = IdempotentUpsertSink(pg.dsn, table_name, ["key"], tmp_path / "log")
    sink.prepare_target(schema)
    at = dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC)
    first = pa.record_batch({"key": ["a", "b", "a"], "note": ['x,"y"', None, ""],
                             "amount": [decimal.Decimal("1.50"), None, decimal.Decimal("-2")],
                             "at": [at, None, at]}, schema=schema)
    second = pa.record_batch({"key": ["b"], "note": ["line\nbreak"],
                              "amount": [decimal.Decimal("3.25")], "at": [None]}, schema=schema)
    ProtocolHarness(sink).tasks(0, [first, second])  # one task, two batches
    rows = {r[0]: r[1:] for r in conn.execute(
        f'SELECT key, note, amount, at, exactly_epoch FROM "{table_name}"').fetchall()}
    assert rows == {"a": ("", decimal.Decimal("-2.00"), at, 0),
                    "b": ("line\nbreak", decimal.Decimal("3.25"), None, 0)}
    assert conn.execute("SELECT note FROM public.exactly_upsert_stage").fetchall() == [("mine",)]


def test_upsert_concurrent_poller_never_sees_a_value_decrease(pg, conn, tmp_path, table_name):
    schema = pa.schema([("key", pa.string()), ("total", pa.int64())])
    sink = IdempotentUpsertSink(pg.dsn, table_name, ["key"], tmp_path / "log")
    sink.prepare_target(schema)
    h = ProtocolHarness(sink)
    seen: dict[str, int] = {}
    backwards: list[tuple] = []
    stop = threading.Event()

    def poll() -> None:
        with pg.connect() as c:
            while not stop.is_set():
                for key, total in c.execute(f'SELECT key, total FROM "{table_name}"'):
                    if total < seen.get(key, -1):
                        backwards.append((key, seen[key], total))
                    seen[key] = total

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for epoch in range(30):  # every epoch is written, then replayed from 3 epochs back
            for e in (epoch, max(0, epoch - 3), epoch):
                h.tasks(e, [pa.record_batch({"key": ["a", "b"], "total": [e * 10, e * 20]},
                                            schema=schema)])
    finally:
        stop.set()
        poller.join()
    assert backwards == []
    assert seen == {"a": 290, "b": 580}


def test_an_upsert_table_created_by_the_sink_is_accepted_on_restart(pg, tmp_path, table_name):
    schema = pa.schema([("key", pa.string()), ("total", pa.int64())])
    for _ in range(2):  # the second start validates what the first one created
        IdempotentUpsertSink(pg.dsn, table_name, ["key"], tmp_path / "log").prepare_target(schema)
    upsert_2pc = PostgresTwoPhaseSink(pg.dsn, f"{table_name}_2", tmp_path / "log2",
                                      write_mode="upsert", key_columns=["key"])
    upsert_2pc.prepare_target(schema, 1)
    upsert_2pc.prepare_target(schema, 1)


def test_2pc_driver_keeps_one_connection_across_epochs_and_reconnects_after_the_server_drops_it(
        two_pc, pg, conn, table_name, monkeypatch):
    """The commit side (recovery, COMMIT PREPARED, the epochs table, the leftover sweep)
    opens one connection for all the epochs of a run, not one per step; when the server
    drops it while it sits idle between epochs, the next epoch's step fails as transient,
    reconnects and commits."""
    import exactly.connectors.postgres.two_phase as mod
    import exactly.connectors.sql as sql

    real = sql.pg_connect
    opened: list[int] = []

    def counted(*args, **kwargs):
        c = real(*args, **kwargs)
        if kwargs.get("application") == "exactly-commit":
            opened.append(c.info.backend_pid)
        return c

    for module in (mod, sql):  # the sink's own connections and its kept one
        monkeypatch.setattr(module, "pg_connect", counted)
    h = ProtocolHarness(two_pc)
    for epoch in range(3):
        h.run_epoch(epoch, parts(epoch))
    assert len(opened) == 1
    conn.execute("SELECT pg_terminate_backend(%s)", (opened[0],))  # dropped while idle
    h.run_epoch(3, parts(3))
    assert len(opened) == 2
    want = sorted(i for epoch in range(4) for part in parts(epoch)
                  for i in part["id"].to_pylist())
    assert sorted_ids(conn, table_name) == want
    assert prepared_count(conn, h.query_id) == 0
