"""The ambiguous commit on the PostgreSQL sinks: the server applied the final commit, and its
answer never reached the sink (issue 28).

A :class:`~exactly.testing.nemesis.proxy.FaultProxy` sits between the sink and the ``pg``
server; one chosen request goes through and its answer is then

* cut -- the connection is reset as the answer comes (the client sees an error at once),
* dropped -- the connection hangs (the client waits for an answer that never comes),
* late -- held past the sink's ``commitTimeoutMs`` and delivered to a client that gave up;
* or the request itself is held and reaches the server after the sink gave up on it.

What must hold: the sink resolves the commit from the target's own record (the 2PC marker
of the prepared transaction, the write-ahead sink's epoch marker) and neither commits an
epoch twice nor reports it lost; a hung connection ends in a bounded wait with an error that
names the timeout option, and the next run's recovery finishes the epoch; a reader polling
the epoch-consistent relation never sees part of an epoch, and upserted values never move
back. In process: the protocol runs through :class:`~exactly.testing.harness.ProtocolHarness`
(the real committer and task code), no Spark.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from pg_rows import SCHEMA, parts, sorted_ids
from psycopg import sql

from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink, prepared_count
from exactly.connectors.postgres.upsert import IdempotentUpsertSink
from exactly.connectors.sql import DatabaseError
from exactly.connectors.wal import PostgresWalTarget, WriteAheadSink
from exactly.testing.harness import ProtocolHarness
from exactly.testing.nemesis.proxy import Answer, FaultProxy, contains
from exactly.testing.readers import BackgroundReader

#: the sinks' answer timeout here; the proxy holds a late answer for LATE_S
TIMEOUT_MS = 2000
LATE_S = 5.0
#: a commit still waiting after this long waits for good (the bound under test is 2 s)
HUNG_S = 30.0
ANSWERS = [Answer.CUT, Answer.DROP, Answer.LATE, Answer.LATE_REQUEST]


def after(first: bytes, then: bytes) -> Callable[[], Callable[[bytes], bool]]:
    """A proxy matcher: ``then`` sent on a connection after ``first`` was (e.g. the COMMIT
    that follows a COPY, not the one that ends a connection's ``SET lock_timeout``)."""
    def factory() -> Callable[[bytes], bool]:
        seen = {"first": False}

        def match(chunk: bytes) -> bool:
            if not seen["first"]:
                at = chunk.find(first)
                if at < 0:
                    return False
                seen["first"] = True
                chunk = chunk[at + len(first):]
            return then in chunk
        return match
    return factory


#: a simple-protocol query that is exactly ``COMMIT`` (psycopg's ``conn.commit()``)
COMMIT = b"COMMIT\x00"


@pytest.fixture
def proxy(pg) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", pg.port, name="pg") as p:
        yield p


@pytest.fixture
def proxied_dsn(pg, proxy: FaultProxy) -> str:
    """``pg``'s DSN with the proxy's port: the sink's every connection goes through it."""
    return pg.dsn.replace(f":{pg.port}/", f":{proxy.port}/")


def ends(proxy: FaultProxy, step: Callable[[], Any]) -> Any:
    """Run ``step``; fail (and free it by healing the proxy) when it is still waiting after
    HUNG_S, i.e. when nothing bounds the wait for a lost answer."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = step()
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HUNG_S)
    if thread.is_alive():
        proxy.heal()
        thread.join(HUNG_S)
        pytest.fail(f"the call still waited for the lost answer after {HUNG_S:g} s: "
                    "nothing bounds the wait")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def epoch_ids(epoch: int) -> frozenset[int]:
    return frozenset(epoch * 1000 + i for i in range(10))


class IdPoller(BackgroundReader):
    """Reads the ids of ``relation`` (read committed, one statement each) as fast as it can
    and keeps every distinct set it saw."""

    def __init__(self, pg, relation: str) -> None:
        super().__init__()
        self.pg, self.relation = pg, relation
        self.states: set[frozenset[int]] = set()
        self.reads = 0

    def run(self) -> None:
        with self.pg.connect() as conn:
            while not self.stopping.is_set():
                rows = conn.execute(sql.SQL("SELECT id FROM {}").format(
                    sql.Identifier(self.relation))).fetchall()
                self.states.add(frozenset(r[0] for r in rows))
                self.reads += 1
                self.stopping.wait(0.005)


def assert_whole_epochs(poller: IdPoller, epochs: int) -> None:
    """Every state the poller saw is a prefix of whole epochs (no torn epoch)."""
    prefixes = [frozenset().union(*(epoch_ids(e) for e in range(n))) for n in range(epochs + 1)]
    assert poller.reads > 0
    torn = [sorted(s) for s in poller.states if s not in prefixes]
    assert not torn, f"a reader saw part of an epoch: {torn[:2]}"


# -- 2PC: the answer to COMMIT PREPARED --------------------------------------------------
def two_pc_sink(pg, dsn: str, tmp_path, table_name: str) -> PostgresTwoPhaseSink:
    sink = PostgresTwoPhaseSink(dsn, table_name, tmp_path / "log", retry_seconds=20,
                                commit_timeout_ms=TIMEOUT_MS)
    sink.prepare_target(SCHEMA, partitions=2)
    return sink


@pytest.mark.parametrize("answer", ANSWERS, ids=lambda a: a.value)
def test_2pc_commit_prepared_whose_answer_is_lost_is_resolved_by_its_marker_once(
        pg, conn, proxy, proxied_dsn, tmp_path, table_name, answer):
    """The server runs the first COMMIT PREPARED of epoch 1, its answer is cut, dropped or
    late: the sink resolves that prepared transaction as already committed by its marker
    (or, when the request itself arrives late after the sink gave up, the retry commits it
    and the late one finds nothing); never committed twice, never DataLossError; the epoch
    completes, a reader of the view never sees part of it, and a restart's replay of epoch
    1 changes nothing."""
    h = ProtocolHarness(two_pc_sink(pg, proxied_dsn, tmp_path, table_name))
    with IdPoller(pg, f"{table_name}_committed") as poller:
        h.run_epoch(0, parts(0))
        handles = h.tasks(1, parts(1))
        lost = proxy.on_request(contains(b"COMMIT PREPARED"), answer, delay=LATE_S)
        ends(proxy, lambda: h.commit(1, handles))
    assert lost.count == 1
    if answer is not Answer.LATE_REQUEST:  # resolved by the marker, not by the answer (a
        # commit merely slow under load that timed out too would count here as well)
        assert h.completion(1)["already_committed"] >= 1
    # LATE_REQUEST: the held COMMIT PREPARED reaches the server after the retry committed
    # the gid itself, and fails there (no such prepared transaction): committed once
    assert sorted_ids(conn, table_name) == sorted(epoch_ids(0) | epoch_ids(1))
    assert prepared_count(conn, h.query_id) == 0
    assert_whole_epochs(poller, 2)
    h.restart()  # Spark replays epoch 1 after a restart: recovery agrees it is done
    h.commit(1, h.tasks(1, parts(1)))
    assert sorted_ids(conn, table_name) == sorted(epoch_ids(0) | epoch_ids(1))
    assert prepared_count(conn, h.query_id) == 0


def test_2pc_commit_prepared_without_an_answer_fails_bounded_and_the_restart_finishes_it(
        pg, conn, proxy, proxied_dsn, tmp_path, table_name):
    """No retry left (retrySeconds 0 on this driver): the lost answer ends the commit call
    with an error naming commitTimeoutMs instead of a wait without end; the next run's
    recovery finishes the intent (one prepared transaction already committed, one not yet)
    and the epoch is visible once."""
    h = ProtocolHarness(two_pc_sink(pg, proxied_dsn, tmp_path, table_name))
    handles = h.tasks(0, parts(0))
    h.sink.retry_seconds = 0  # this driver only; the restarted one retries as configured
    proxy.on_request(contains(b"COMMIT PREPARED"), Answer.DROP)
    with pytest.raises(DatabaseError, match=r"no answer from PostgreSQL.*commitTimeoutMs"):
        ends(proxy, lambda: h.commit(0, handles))
    assert h.incomplete_intents()
    h.restart()
    h.commit(0, h.tasks(0, parts(0)))
    assert h.completion(0)["already_committed"] >= 1
    assert sorted_ids(conn, table_name) == sorted(epoch_ids(0))
    assert prepared_count(conn, h.query_id) == 0


def test_2pc_prepare_without_an_answer_fails_the_task_and_the_leftover_is_rolled_back(
        pg, conn, proxy, proxied_dsn, tmp_path, table_name):
    """A task's PREPARE TRANSACTION is applied and its answer dropped: the task fails with
    the timeout named instead of hanging; its retry and the epoch commit; the prepared
    transaction of the failed attempt is rolled back as a leftover, so the rows show once."""
    h = ProtocolHarness(two_pc_sink(pg, proxied_dsn, tmp_path, table_name))
    lost = proxy.on_request(contains(b"PREPARE TRANSACTION"), Answer.DROP)
    with pytest.raises(DatabaseError, match=r"PREPARE TRANSACTION.*commitTimeoutMs"):
        ends(proxy, lambda: h.tasks(0, parts(0)))
    assert lost.count == 1
    assert prepared_count(conn, h.query_id) == 1  # applied: the attempt's rows wait, prepared
    h.run_epoch(0, parts(0))  # Spark's retry of the tasks, then the commit
    assert sorted_ids(conn, table_name) == sorted(epoch_ids(0))
    assert prepared_count(conn, h.query_id) == 0


# -- write-ahead: the answer to the load's COMMIT ---------------------------------------------
def wal_sink(dsn: str, tmp_path, table_name: str) -> WriteAheadSink:
    sink = WriteAheadSink(PostgresWalTarget(dsn, table_name, retry_seconds=20,
                                            commit_timeout_ms=TIMEOUT_MS), tmp_path / "log")
    sink.prepare_target(SCHEMA)
    return sink


def wal_markers(conn, query_id: str) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT epoch FROM exactly_wal_epochs WHERE query_id = %s ORDER BY epoch",
        (query_id,)).fetchall()]


@pytest.mark.parametrize("answer", ANSWERS, ids=lambda a: a.value)
def test_wal_load_whose_commit_answer_is_lost_is_recognised_by_its_marker(
        pg, conn, proxy, proxied_dsn, tmp_path, table_name, answer):
    """The COMMIT of epoch 1's load (its rows and its marker) is applied and its answer cut,
    dropped or late, or the COMMIT itself arrives late on the connection the sink gave up:
    the retry finds the marker (waiting on its row lock until the late COMMIT lands) and
    loads nothing again; a reader of the
    table never sees part of an epoch; a restart's replay changes nothing."""
    h = ProtocolHarness(wal_sink(proxied_dsn, tmp_path, table_name))
    with IdPoller(pg, table_name) as poller:
        h.run_epoch(0, parts(0))
        handles = h.tasks(1, parts(1))
        lost = proxy.on_request(after(b"COPY", COMMIT), answer, delay=LATE_S)
        ends(proxy, lambda: h.commit(1, handles))
    assert lost.count == 1
    assert sorted_ids(conn, table_name) == sorted(epoch_ids(0) | epoch_ids(1))
    assert wal_markers(conn, h.query_id) == [0, 1]
    assert_whole_epochs(poller, 2)
    h.restart()
    h.commit(1, h.tasks(1, parts(1)))
    assert sorted_ids(conn, table_name) == sorted(epoch_ids(0) | epoch_ids(1))


def test_wal_load_without_an_answer_fails_bounded_and_the_restart_finishes_it(
        pg, conn, proxy, proxied_dsn, tmp_path, table_name):
    """No retry left: the lost COMMIT answer ends the commit call with an error naming
    commitTimeoutMs; the next run's recovery finds the epoch loaded (its marker) and loads
    nothing again."""
    h = ProtocolHarness(wal_sink(proxied_dsn, tmp_path, table_name))
    handles = h.tasks(0, parts(0))
    h.sink.target.retry_seconds = 0  # this driver only
    proxy.on_request(after(b"COPY", COMMIT), Answer.DROP)
    with pytest.raises(DatabaseError, match=r"no answer from PostgreSQL.*commitTimeoutMs"):
        ends(proxy, lambda: h.commit(0, handles))
    assert h.incomplete_intents()
    h.restart()
    h.commit(0, h.tasks(0, parts(0)))
    assert h.completion(0) is not None
    assert sorted_ids(conn, table_name) == sorted(epoch_ids(0))
    assert wal_markers(conn, h.query_id) == [0]


# -- upsert: the answer to a task's COMMIT ----------------------------------------------------
KEYED = pa.schema([("id", pa.int64()), ("key", pa.string())])  # key column: id


def keyed(epoch: int) -> list[pa.RecordBatch]:
    """Ids 0..9 in two partitions, each row's value naming the epoch that wrote it."""
    return [pa.record_batch({"id": list(range(p * 5, p * 5 + 5)), "key": [f"e{epoch}"] * 5},
                            schema=KEYED) for p in range(2)]


class ValuePoller(BackgroundReader):
    """Reads ``(id, value, epoch)`` as fast as it can and records every value that moved
    back (an epoch older than one this reader already saw for the id)."""

    def __init__(self, pg, table: str) -> None:
        super().__init__()
        self.pg, self.table = pg, table
        self.newest: dict[int, int] = {}
        self.back: list[tuple[int, int, int]] = []
        self.wrong: list[tuple[int, str, int]] = []
        self.reads = 0

    def run(self) -> None:
        with self.pg.connect() as conn:
            while not self.stopping.is_set():
                for id_, value, epoch in conn.execute(sql.SQL(
                        "SELECT id, key, exactly_epoch FROM {}").format(
                        sql.Identifier(self.table))).fetchall():
                    if epoch < self.newest.get(id_, -1):
                        self.back.append((id_, self.newest[id_], epoch))
                    if value != f"e{epoch}":
                        self.wrong.append((id_, value, epoch))
                    self.newest[id_] = max(epoch, self.newest.get(id_, -1))
                self.reads += 1
                self.stopping.wait(0.005)


@pytest.mark.parametrize("answer", [Answer.CUT, Answer.DROP], ids=lambda a: a.value)
def test_upsert_task_whose_commit_answer_is_lost_fails_and_its_retry_moves_no_value_back(
        pg, conn, proxy, proxied_dsn, tmp_path, table_name, answer):
    """The COMMIT of a task's upserts in epoch 1 is applied and its answer cut or dropped:
    the task fails (bounded, with the cause named) instead of hanging; Spark's retry of the
    task rewrites the same values; a straggling write of epoch 0 changes nothing; a reader
    never sees a value move back to an older epoch's."""
    sink = IdempotentUpsertSink(proxied_dsn, table_name, ["id"], tmp_path / "log",
                                commit_timeout_ms=TIMEOUT_MS)
    sink.prepare_target(KEYED)
    h = ProtocolHarness(sink)
    with ValuePoller(pg, table_name) as poller:
        h.run_epoch(0, keyed(0))
        lost = proxy.on_request(after(b"ON CONFLICT", COMMIT), answer)
        with pytest.raises(DatabaseError, match="committing upserts") as failed:
            ends(proxy, lambda: h.tasks(1, keyed(1)))
        assert lost.count == 1
        if answer is Answer.DROP:
            assert "no answer from PostgreSQL" in str(failed.value)
            assert "commitTimeoutMs" in str(failed.value)
        h.run_epoch(1, keyed(1))  # Spark's retry of the epoch's tasks
        h.tasks(0, keyed(0))  # a straggler of epoch 0 (e.g. a speculative attempt)
    rows = conn.execute(sql.SQL("SELECT id, key, exactly_epoch FROM {} ORDER BY id").format(
        sql.Identifier(table_name))).fetchall()
    assert rows == [(i, "e1", 1) for i in range(10)]
    assert poller.reads > 0
    assert poller.back == [] and poller.wrong == []
