"""The PostgreSQL observer against a real server: what a plain autocommit SELECT sees of
rows committed by hand, with their epochs."""

from __future__ import annotations

from psycopg import sql

from exactly.testing.nemesis.checker import History, Row, check
from exactly.testing.nemesis.observers import PostgresObserver
from exactly.testing.waits import wait_until


def test_the_postgres_observer_sees_each_committed_transaction_with_its_epochs(
        pg, conn, table_name):
    table = sql.Identifier(table_name)
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint, exactly_epoch bigint)").format(table))
    history = History()
    with PostgresObserver(history, pg.dsn, table_name, name="pg", poll_seconds=0.02):
        with conn.transaction():  # epoch 0, one transaction
            conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 0), (2, 0)").format(table))
        wait_until(lambda: history.last("pg"), "epoch 0 seen", timeout=10, poll=0.02)
        with conn.transaction():
            conn.execute(sql.SQL("INSERT INTO {} VALUES (4, 1), (3, 1)").format(table))
    assert history.last("pg") == (Row(1, 0), Row(2, 0), Row(3, 1), Row(4, 1))
    seen = [o.rows for o in history.observations()]
    assert (Row(1, 0), Row(2, 0)) in seen  # a transaction is seen whole or not at all
    assert all(len(rows) in (0, 2, 4) for rows in seen)
    report = check(history, expected_ids={1, 2, 3, 4}, final_rows=history.last("pg"),
                   whole_epochs=True)
    assert report.ok, report.render()
    assert not history.errors
