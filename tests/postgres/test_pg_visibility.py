"""What a reader of the 2PC sink's table sees: the plain table vs the epoch-consistent view.

PostgreSQL commits prepared transactions one at a time, so between two ``COMMIT PREPARED``s of
one epoch the plain table holds part of it. The view ``<table>_committed`` shows only epochs
whose completion record (written after the last ``COMMIT PREPARED``) is committed.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from pg_rows import SCHEMA, parts, sorted_ids
from psycopg import sql

from exactly.connectors.postgres.two_phase import (
    MARKER_RETAIN_EPOCHS,
    PostgresTwoPhaseSink,
    prepared_count,
)
from exactly.errors import ConfigError
from exactly.protocol.faults import FaultPoint
from exactly.testing.harness import ProtocolHarness
from exactly.testing.pgcluster import TempPostgres
from exactly.testing.readers import BackgroundReader


def epoch_ids(n: int, parts: int = 2, rows: int = 5) -> list[int]:
    return [n * 1000 + i for i in range(parts * rows)]




def test_between_two_commit_prepared_the_table_shows_part_of_the_epoch_the_view_none(
        two_pc, conn, table_name):
    h = ProtocolHarness(two_pc)
    h.run_epoch(0, parts(0))
    view = f"{table_name}_committed"
    assert sorted_ids(conn, view) == epoch_ids(0)

    seen = {}

    def look() -> None:
        seen["table"], seen["view"] = sorted_ids(conn, table_name), sorted_ids(conn, view)

    with h.pause_at(FaultPoint.BETWEEN_COMMITS, 1, look):  # between two COMMIT PREPAREDs
        h.run_epoch(1, parts(1))  # ... then the commit call goes on
    assert seen["table"] == epoch_ids(0) + epoch_ids(1)[:5]  # half of epoch 1
    assert seen["view"] == epoch_ids(0)  # none of epoch 1
    assert sorted_ids(conn, view) == epoch_ids(0) + epoch_ids(1)
    assert sorted_ids(conn, table_name) == sorted_ids(conn, view)


def test_recovery_of_a_half_committed_epoch_makes_the_whole_epoch_visible_in_the_view(
        two_pc, conn, table_name):
    h = ProtocolHarness(two_pc)
    with h.crash_at(FaultPoint.BETWEEN_COMMITS, epoch=0):  # killed after one COMMIT PREPARED
        h.run_epoch(0, parts(0))
    view = f"{table_name}_committed"
    assert sorted_ids(conn, view) == []

    h.restart()
    h.commit(0, h.tasks(0, parts(0)))  # recovery finishes the intent
    assert sorted_ids(conn, view) == epoch_ids(0)
    assert sorted_ids(conn, table_name) == epoch_ids(0)
    assert prepared_count(conn, h.query_id) == 0


def test_upsert_mode_view_never_shows_a_value_of_an_incomplete_epoch(pg, conn, tmp_path,
                                                                   table_name):
    schema = pa.schema([("key", pa.string()), ("total", pa.int64())])
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log", write_mode="upsert",
                                key_columns=["key"])
    sink.prepare_target(schema, partitions=2)
    h = ProtocolHarness(sink)

    def rows(*partitions: dict[str, int]) -> list[pa.RecordBatch]:
        return [pa.record_batch({"key": list(p), "total": list(p.values())}, schema=schema)
                for p in partitions]

    def view() -> dict[str, tuple[int, int]]:
        return {k: (t, e) for k, t, e in conn.execute(sql.SQL(
            "SELECT key, total, exactly_epoch FROM {}").format(
            sql.Identifier(f"{table_name}_committed"))).fetchall()}

    h.run_epoch(0, rows({"a": 1, "b": 1}, {"c": 1}))
    assert view() == {"a": (1, 0), "b": (1, 0), "c": (1, 0)}
    seen = []
    # after the first COMMIT PREPARED, key a holds epoch 1's value in the table
    with h.pause_at(FaultPoint.BETWEEN_COMMITS, 1, lambda: seen.append(view())):
        h.run_epoch(1, rows({"a": 2}, {"c": 2, "d": 2}))
    assert seen and all(epoch == 0 for _, epoch in seen[0].values())  # no value of epoch 1
    assert view() == {"a": (2, 1), "b": (1, 0), "c": (2, 1), "d": (2, 1)}


def test_an_existing_table_without_the_epoch_column_is_refused_with_the_alter_statement(
        pg, conn, tmp_path, table_name):
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint, key text)").format(
        sql.Identifier(table_name)))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (-1, 'old')").format(sql.Identifier(table_name)))
    conn.commit()
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log")
    with pytest.raises(ConfigError) as err:
        sink.prepare_target(SCHEMA, partitions=2)
    fix = f'ALTER TABLE "{table_name}" ADD COLUMN "exactly_epoch" bigint'
    assert fix in str(err.value) and "epochColumn" in str(err.value)
    conn.execute(fix)  # the fix the error names
    conn.commit()
    sink.prepare_target(SCHEMA, partitions=2)
    ProtocolHarness(sink).run_epoch(0, parts(0))
    assert sorted_ids(conn, f"{table_name}_committed") == [-1, *epoch_ids(0)]  # NULL epoch: shown


def test_a_second_query_into_a_bound_table_is_refused_before_prepare(two_pc, conn, table_name):
    first = ProtocolHarness(two_pc)
    first.run_epoch(0, parts(0))
    other = ProtocolHarness(two_pc)  # another query (a new checkpoint), the same table
    with pytest.raises(ConfigError, match=f"belongs to query {first.query_id}") as err:
        other.tasks(0, parts(0))
    assert "DELETE FROM" in str(err.value) and "new table" in str(err.value)
    assert prepared_count(conn, other.query_id) == 0
    assert sorted_ids(conn, table_name) == epoch_ids(0)


def test_pruning_old_markers_keeps_every_old_epoch_visible_in_the_view(two_pc, conn, table_name):
    h = ProtocolHarness(two_pc)
    epochs = MARKER_RETAIN_EPOCHS + 11  # pruning runs at epochs 20 and 30
    for epoch in range(epochs):
        h.run_epoch(epoch, parts(epoch, count=1, rows=2))
    markers = conn.execute(sql.SQL("SELECT min(epoch) FROM {} WHERE query_id = %s").format(
        two_pc.markers.sql()), (h.query_id,)).fetchone()[0]
    assert markers == 30 - MARKER_RETAIN_EPOCHS  # old markers are gone ...
    expected = [e * 1000 + i for e in range(epochs) for i in range(2)]
    assert sorted_ids(conn, f"{table_name}_committed") == expected  # ... their rows are not hidden


def test_custom_epoch_column_epochs_table_and_view_names_are_quoted(pg, conn, tmp_path,
                                                                    table_name):
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log",
                                epoch_column='Ep"och', epochs_table='"odd.s"."Done Epochs"',
                                view_name='"odd.v"."Whole; Epochs"')
    sink.prepare_target(SCHEMA, partitions=2)
    ProtocolHarness(sink).run_epoch(0, parts(0))
    rows = conn.execute('SELECT id, "Ep""och" FROM "odd.v"."Whole; Epochs" ORDER BY id'
                        ).fetchall()
    assert rows == [(i, 0) for i in epoch_ids(0)]
    assert conn.execute('SELECT epoch FROM "odd.s"."Done Epochs"').fetchall() == [(0,)]


def test_a_view_name_taken_by_a_table_is_refused_with_the_option_named(pg, conn, tmp_path,
                                                                      table_name):
    conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(
        sql.Identifier(f"{table_name}_committed")))
    conn.commit()
    sink = PostgresTwoPhaseSink(pg.dsn, table_name, tmp_path / "log")
    with pytest.raises(ConfigError, match=r"is not a view.*option viewName"):
        sink.prepare_target(SCHEMA, partitions=2)


# -- real Spark, real PostgreSQL --------------------------------------------------------
class ViewPoller(BackgroundReader):
    """Polls ``SELECT epoch, count(*) ... GROUP BY epoch`` on the view (and, for contrast,
    on the plain table) as fast as it can, keeping every distinct state it saw."""

    def __init__(self, pg, table: str) -> None:
        super().__init__()
        self.pg, self.table = pg, table
        self.view_states: Counter = Counter()
        self.table_states: Counter = Counter()
        self.errors: list[str] = []

    def _state(self, conn, relation: str) -> frozenset:
        return frozenset(conn.execute(sql.SQL(
            "SELECT exactly_epoch, count(*) FROM {} GROUP BY 1").format(
            sql.Identifier(relation))).fetchall())

    def run(self) -> None:
        import psycopg

        view = f"{self.table}_committed"
        with self.pg.connect() as conn:
            conn.autocommit = True
            while not self.stopping.is_set():
                try:
                    self.view_states[self._state(conn, view)] += 1
                    self.table_states[self._state(conn, self.table)] += 1
                except psycopg.errors.UndefinedTable:  # the sink has not created it yet
                    self.stopping.wait(0.05)
                except psycopg.Error as exc:  # e.g. a lock while the view is (re)defined
                    self.errors.append(str(exc))
                    self.stopping.wait(0.05)


def test_a_reader_polling_the_view_never_sees_part_of_an_epoch_under_spark(spark, pg, conn,
                                                                          tmp_path,
                                                                          table_name):
    """6 epochs of 3 write tasks each (3 prepared transactions per epoch, committed one by
    one) while a thread polls the view as fast as it can: every state it sees is a union of
    whole epochs (a prefix of them), and at the end it shows every row exactly once."""
    from exactly.config import CheckpointConfig
    from exactly.ops.query import start_query

    rows, per_epoch, tasks = 1800, 300, 3
    df = (spark.readStream.format("exactly.datagen").option("rowsPerSecond", 0)
          .option("totalRows", rows).option("maxRowsPerTrigger", per_epoch)
          .option("numPartitions", tasks).load().select("id", "key"))
    with ViewPoller(pg, table_name) as poller:
        query = start_query(df, sink_format="exactly.postgres",
                            options={"dsn": pg.dsn, "table": table_name,
                                     "partitions": str(tasks)},
                            checkpoint=CheckpointConfig(storage=str(tmp_path / "ck")),
                            available_now=True)
        query.await_termination()
    final = dict(conn.execute(sql.SQL("SELECT exactly_epoch, count(*) FROM {} GROUP BY 1")
                              .format(sql.Identifier(table_name))).fetchall())
    assert sorted(final) == list(range(rows // per_epoch)), final
    assert all(n == per_epoch for n in final.values()), final
    tasks_per_epoch = dict(conn.execute(sql.SQL(
        "SELECT epoch, count(*) FROM {} WHERE query_id = %s GROUP BY 1").format(
        sql.Identifier("exactly_2pc_markers")), (str(query.query.id),)).fetchall())
    assert set(tasks_per_epoch.values()) == {tasks}, tasks_per_epoch  # several COMMIT PREPAREDs

    assert sum(poller.view_states.values()) > 0, poller.errors
    for state in poller.view_states:
        seen = dict(state)
        assert all(seen[e] == final[e] for e in seen), f"part of an epoch in the view: {seen}"
        assert sorted(seen) == list(range(len(seen))), f"epochs out of order: {seen}"
    view_ids = sorted_ids(conn, f"{table_name}_committed")
    assert view_ids == list(range(rows))  # everything, each id exactly once
    assert prepared_count(conn) == 0
    partial = [dict(s) for s in poller.table_states
               if any(n != final[e] for e, n in dict(s).items())]
    print(f"view: {sum(poller.view_states.values())} reads, {len(poller.view_states)} states; "
          f"plain table: {len(partial)} distinct states with part of an epoch")


def test_the_view_survives_a_server_restart_with_prepared_transactions(tmp_path, table_name):
    """Prepared and half-committed across ``pg_ctl stop -m immediate``: the view still hides
    the epoch until its completion is recorded, then shows all of it."""
    from exactly.testing.pgcluster import wait_until_accepting

    with TempPostgres(max_prepared_transactions=4) as server:
        sink = PostgresTwoPhaseSink(server.dsn, table_name, tmp_path / "log")
        sink.prepare_target(SCHEMA, partitions=2)
        h = ProtocolHarness(sink)
        with h.crash_at(FaultPoint.BETWEEN_COMMITS, epoch=0):
            h.run_epoch(0, parts(0))
        server.restart_after_crash()
        wait_until_accepting(server)
        with server.connect() as c:
            assert sorted_ids(c, f"{table_name}_committed") == []
            assert sorted_ids(c, table_name) == epoch_ids(0)[:5]
        h.restart()
        h.commit(0, h.tasks(0, parts(0)))
        with server.connect() as c:
            assert sorted_ids(c, f"{table_name}_committed") == epoch_ids(0)
