"""Kill -9 at every protocol point on Spark Connect, restart, audit: files, Delta, every
PostgreSQL sink (2PC appending and in writeMode=upsert, write-ahead into PostgreSQL and into
SQLite, upsert) and Kafka stay exactly-once when the job's driver is a Spark Connect server.
These are the default lane's kills of every sink at every protocol point (docs/reliability.md,
"Kill coverage"): a runner's kill and restart costs seconds, the server stays up.

The same job commands as the classic chaos tests (tests/chaos/test_file_sink_chaos.py,
tests/chaos/test_delta_chaos.py, tests/postgres/test_pg_chaos.py,
tests/kafka/test_kafka_chaos.py), each attempt with
``SPARK_REMOTE=<server>`` in its environment: the attempt's process is a Connect client,
the sink's commit runs in the server's ``foreachBatch`` Python process. Two deaths at every
driver point, one run each:

* ``runner`` (default lane; the file sink's run is slow, its classic every-point run is the
  default lane's): the fault SIGKILLs the committing process alone
  (``--fault-action kill-process``), the server's ``foreachBatch`` runner; the server lives
  on, the query fails, the client exits and the next attempt starts the query again on the
  same server.
* ``server`` (slow lane): the fault SIGKILLs the Connect server's JVM and every Python worker
  of it -- a platform's node loss. The test plays the platform: before each attempt it starts
  the server again if it is down (same URL), and after each driver crash it checks that
  nothing of the server is left alive. (``exactly run --remote`` surviving a server SIGKILL
  in the default lane: tests/ops/test_run_remote.py.)

The client of an attempt whose server died would retry for
``exactly.spark.connect.RETRY_SECONDS``; the harness ends it a few seconds after its fault
fired (``run_with_crashes(end_after_fault=...)``). An executor crash (``in_write``) kills one
Python worker of the server; the server lives on. Then the audit the classic tests make:
every input record exactly once, nothing dangling.
"""

from __future__ import annotations

import math
import os
import sys
import time
import uuid
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
from pg_aggregate import CountPoller, expected_totals

from exactly.audit import audit_ids, pg_table_ids, sqlite_table_ids
from exactly.auditor import verify
from exactly.connectors.kafka.publisher import IN_TRANSACTION
from exactly.connectors.postgres.two_phase import prepared_count
from exactly.demos.kafka import audit_output, produce_events
from exactly.demos.postgres_job import DSN_ENV, command
from exactly.procs import ProcessInfo
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.faults import DRIVER_POINTS, KILL, KILL_PROCESS, FaultPoint, FaultSpec
from exactly.spark.connect import REMOTE_ENV
from exactly.testing.chaos import Attempt, python_command, run_with_crashes
from exactly.testing.connect_server import ConnectServer
from exactly.testing.file_output import assert_no_dangling_pre_commits
from exactly.testing.kafka_broker import create_topic

pytestmark = [pytest.mark.chaos, pytest.mark.server]

#: every protocol point of DESIGN.md section 3, in protocol order
EVERY_POINT = (FaultPoint.IN_WRITE, *DRIVER_POINTS)
#: seconds an attempt may go on after its fault fired before the harness ends it (a
#: client whose server died retries it; one whose query failed exits at once)
END_AFTER_FAULT = 3.0


#: what a driver-point fault kills: the committing runner alone, or the whole server (slow:
#: a server SIGKILL at every point costs a server start per point;
#: tests/ops/test_run_remote.py kills the server in the default lane)
DEATHS = ["runner", pytest.param("server", marks=pytest.mark.slow)]
ACTIONS = {"runner": KILL_PROCESS, "server": KILL}


class Platform:
    """What runs the Connect server in production, played by the test: starts the server
    before an attempt when it is down; after an attempt killed at a driver point, records
    what is left of the server (``server``: nothing, once the fault's SIGKILL has taken it
    down; ``runner``: the server, without the killed runner)."""

    def __init__(self, server: ConnectServer, death: str = "server") -> None:
        self.server = server
        self.death = death
        self.runner_left: list[bool] = []
        self.restarts = 0
        self.left_after_driver_crash: list[tuple[str, list[ProcessInfo]]] = []
        self.alive_after_executor_crash: list[bool] = []
        self._started = 0.0

    def on_start(self, attempt: Attempt) -> None:
        self._started = time.monotonic()
        if not self.server.running():
            self.server.start()
            self.restarts += 1
        print(f"attempt {attempt.number}: server up after "
              f"{time.monotonic() - self._started:.1f} s", flush=True)

    def on_end(self, attempt: Attempt) -> None:
        print(f"attempt {attempt.number} ({attempt.armed and attempt.armed.render()}): "
              f"{time.monotonic() - self._started:.1f} s, exit {attempt.returncode}, "
              f"fired {attempt.fired}", flush=True)
        if not attempt.crashed:
            return
        point = attempt.fired["point"]
        if point == FaultPoint.IN_WRITE.value:
            self.alive_after_executor_crash.append(self.server.running())
            return
        if self.death == "runner":
            self.runner_left.append(psutil.pid_exists(attempt.fired["pid"]))
            self.left_after_driver_crash.append((point, []))
            self.alive_after_executor_crash.append(self.server.running())
            return
        deadline = time.monotonic() + 20
        left = self.server.processes()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.server.processes()
        self.left_after_driver_crash.append(
            (point, [ProcessInfo.of(p) for p in left]))

    def hooks(self) -> dict:
        return {"on_start": self.on_start, "on_end": self.on_end,
                "env": {REMOTE_ENV: self.server.url}, "end_after_fault": END_AFTER_FAULT}

    def schedule(self, faults: list[FaultSpec]) -> list[FaultSpec]:
        return [replace(f, action=ACTIONS[self.death]) for f in faults]

    def assert_every_crash_killed_what_it_should(self, points) -> None:
        """``server``: every driver crash left no process of the server alive and the
        platform started it again; ``runner``: every driver crash killed the runner and the
        server ran on, never restarted. The executor crash left the server running."""
        driver = [p.value for p in points if p.on_driver]
        assert [point for point, _ in self.left_after_driver_crash] == driver
        if self.death == "runner":
            assert self.runner_left == [False] * len(driver)
            assert self.restarts == 0
            assert self.alive_after_executor_crash == [True] * len(points)
            return
        assert all(left == [] for _, left in self.left_after_driver_crash), \
            self.left_after_driver_crash
        assert self.restarts == len(driver)
        assert self.alive_after_executor_crash == [True] * (len(points) - len(driver))


def fired(attempts: list[Attempt]) -> list[tuple[str, int]]:
    return [(a.fired["point"], a.fired["epoch"]) for a in attempts if a.crashed]


#: the file sink's deaths, both slow (issue 43): its every point is killed in the default lane
#: by the classic driver's run (tests/chaos/test_file_sink_chaos.py::
#: test_killed_at_every_protocol_point_in_turn_every_event_is_committed_exactly_once
#: [start_query]), the runner's death on Connect by the Delta, PostgreSQL and Kafka runs below
FILE_DEATHS = [pytest.param("runner", marks=pytest.mark.slow),
               pytest.param("server", marks=pytest.mark.slow)]


@pytest.fixture(params=FILE_DEATHS)
def platform(connect_server, request):
    platform = Platform(connect_server, request.param)
    yield platform
    connect_server.start()  # the next test finds it running


def packed(platform: Platform) -> list[FaultSpec]:
    """Every point once, in protocol order, packed into 4 epochs: a kill before the intent
    or mid-write leaves the epoch to be run again, so ``in_write``, ``before_intent`` and
    ``after_intent`` all fire in epoch 0; each later point fires in the first try of its own
    epoch (a kill after the intent completes that epoch in the restart's recovery)."""
    return platform.schedule([
        FaultSpec(FaultPoint.IN_WRITE, 0), FaultSpec(FaultPoint.BEFORE_INTENT, 0),
        FaultSpec(FaultPoint.AFTER_INTENT, 0), FaultSpec(FaultPoint.BETWEEN_COMMITS, 1),
        FaultSpec(FaultPoint.AFTER_COMMITS, 2), FaultSpec(FaultPoint.AFTER_COMPLETE, 3)])


def test_file_sink_on_connect_killed_at_every_protocol_point_commits_every_event_once(
        events_dir, tmp_path, platform):
    """The demo pipeline (``exactly pipeline``), 8 files of 500 events in 4 epochs, killed at
    each point in turn."""
    out = tmp_path / "out"
    schedule = packed(platform)
    job = python_command("pipeline", "--input", str(events_dir), "--output", str(out),
                         "--checkpoint", str(tmp_path / "ck"), "--max-files-per-epoch", "2")
    attempts = run_with_crashes(job, schedule, timeout=480, **platform.hooks())

    assert fired(attempts) == [(s.point, s.min_epoch) for s in schedule]
    assert not attempts[-1].crashed and attempts[-1].returncode == 0
    platform.assert_every_crash_killed_what_it_should(EVERY_POINT)
    report = verify(events_dir, out)
    assert report.ok, report.rows()
    assert report.found_rows == 4000
    assert_no_dangling_pre_commits(out)


def delta_ids(uri: str, version: int | None = None) -> list[int]:
    from deltalake import DeltaTable

    return DeltaTable(uri, version=version).to_pyarrow_table(columns=["id"])["id"].to_pylist()


def test_delta_sink_on_connect_killed_at_every_protocol_point_commits_every_event_once(
        events_dir, tmp_path, connect_server):
    """``exactly pipeline --sink delta``, 4 epochs of 1000 events, killed at each point in
    turn: after every crash the table holds whole epochs, the crashed one only when the kill
    came after its Delta commit; every version the table ever had (all a reader can see)
    holds whole epochs; at the end every event once, no aborted attempt's file or marker."""
    from deltalake import DeltaTable

    from exactly.testing.delta_output import leftovers

    platform = Platform(connect_server, "runner")  # the server's death: files, Kafka
    uri, per_epoch = str(tmp_path / "table"), 1000
    schedule = packed(platform)
    job = python_command("pipeline", "--sink", "delta", "--input", str(events_dir),
                         "--output", uri, "--checkpoint", str(tmp_path / "ck"),
                         "--max-files-per-epoch", "2")
    after_crash: list[tuple[str, int, int]] = []
    hooks = platform.hooks()

    def on_end(attempt: Attempt) -> None:
        platform.on_end(attempt)
        if attempt.crashed:
            rows = len(delta_ids(uri)) if DeltaTable.is_deltatable(uri) else 0
            after_crash.append((attempt.fired["point"], attempt.fired["epoch"], rows))

    hooks["on_end"] = on_end
    attempts = run_with_crashes(job, schedule, timeout=480, **hooks)

    assert fired(attempts) == [(s.point, s.min_epoch) for s in schedule]
    assert not attempts[-1].crashed and attempts[-1].returncode == 0
    platform.assert_every_crash_killed_what_it_should(EVERY_POINT)
    for point, epoch, rows in after_crash:
        published = point in (FaultPoint.AFTER_COMMITS, FaultPoint.AFTER_COMPLETE)
        assert rows == per_epoch * (epoch + published), (point, epoch, rows)
    assert sorted(delta_ids(uri)) == list(range(4 * per_epoch))
    versions = [delta_ids(uri, v) for v in range(DeltaTable(uri).version() + 1)]
    assert [len(ids) for ids in versions] == [per_epoch * i for i in range(5)]
    assert all(len(set(ids)) == len(ids) for ids in versions)
    assert leftovers(uri) == []


PG_ROWS, PG_PER_EPOCH, PG_KEYS = 800, 200, 20  # 4 epochs, the packed schedule's

#: the PostgreSQL sinks (``python -m exactly.demos.postgres_job`` arguments): exactly.postgres
#: appending (start_query) and in writeMode=upsert (per-key running totals in update mode,
#: ``TwoPhaseForeachBatch``), exactly.wal into PostgreSQL and into SQLite, exactly.upsert
PG_SINKS = {
    "2pc": ["--sink", "2pc"],
    "2pc-upsert-mode": ["--sink", "2pc", "--pipeline", "aggregate", "--keys", str(PG_KEYS)],
    "wal": ["--sink", "wal"],
    "wal-sqlite": ["--sink", "wal"],  # + --sqlite in the test's directory
    "upsert": ["--sink", "upsert"],
}


# 2PC append in the default lane; the other PostgreSQL sinks' kills (~230 s each on the
# loaded default lane, which they would push past CI's hour) run in the slow lane's shares;
# the default lane has their simulated crashes at every point (tests/contract)
@pytest.mark.parametrize("sink,death", [
    *((sink, "runner") if sink == "2pc" else pytest.param(sink, "runner", marks=pytest.mark.slow)
      for sink in PG_SINKS),
    pytest.param("2pc", "server", marks=pytest.mark.slow)])
def test_each_postgres_sink_on_connect_killed_at_every_point_commits_every_row_once(
        pg, conn, tmp_path, connect_server, sink, death):
    """Each PostgreSQL sink (and the write-ahead sink into SQLite), 4 epochs, killed at each
    point in turn: every input id once (the aggregate: the table equals a crash-free batch
    run, and a reader polling it during the crashes never sees a count go down), no
    prepared transaction or staged file left, every epoch recorded complete."""
    platform = Platform(connect_server, death)
    table = f"ev_{uuid.uuid4().hex[:8]}"
    ck, db = tmp_path / "ck", tmp_path / "out.sqlite"
    schedule = packed(platform)
    args = [*PG_SINKS[sink], "--table", table, "--checkpoint", str(ck), "--rows",
            str(PG_ROWS), "--rows-per-epoch", str(PG_PER_EPOCH)]
    if sink == "wal-sqlite":
        args += ["--sqlite", str(db)]
    hooks = platform.hooks()
    hooks["env"][DSN_ENV] = pg.dsn
    try:
        with CountPoller(pg, table) as poller:
            attempts = run_with_crashes(command(*args), schedule, timeout=480, **hooks)
    finally:
        connect_server.start()  # the next test finds it running (a no-op when it is)

    assert fired(attempts) == [(s.point, s.min_epoch) for s in schedule]
    platform.assert_every_crash_killed_what_it_should(EVERY_POINT)
    if sink == "2pc-upsert-mode":
        got = {k: (e, t) for k, e, t in conn.execute(
            f'SELECT key, events, total_cents FROM "{table}"').fetchall()}
        assert got == expected_totals(PG_ROWS, PG_KEYS)
        assert poller.reads > 0 and poller.backwards == []
    else:
        ids = (sqlite_table_ids(str(db), table) if sink == "wal-sqlite"
               else pg_table_ids(conn, table))
        report = audit_ids(ids, np.arange(PG_ROWS))
        assert report.ok, report.to_json()
        assert report.found_rows == PG_ROWS
    assert prepared_count(conn) == 0, "a prepared transaction was left behind"
    assert not list((ck / "exactly-sink" / "wal").glob("*/*")), "staged files left behind"
    assert CommitLog(ck / "exactly-sink").completed_epochs() == \
        list(range(PG_ROWS // PG_PER_EPOCH))


KAFKA_EVENTS, KAFKA_EPOCHS = 600, 6


@pytest.fixture(scope="module")
def kafka_server(tmp_path_factory):
    """A Connect server started with Spark's Kafka connector (the Kafka job reads its input
    with ``format("kafka")``, whose jars only the server's start can load)."""
    from exactly.connectors.kafka.jars import connector_conf

    with ConnectServer(tmp_path_factory.mktemp("connect-kafka"), conf=connector_conf(),
                       java_options=os.environ.get("EXACTLY_DRIVER_JAVA_OPTIONS", "")) as server:
        yield server


@pytest.mark.parametrize("death", DEATHS)
def test_kafka_job_on_connect_killed_at_every_protocol_point_is_exactly_once_end_to_end(
        broker, tmp_path, kafka_server, death):
    """Kafka -> per-key running state -> ``exactly.kafka``, killed at each point in turn and
    inside the Kafka transaction, then the broker killed and restarted (with that
    transaction open) before the fault-free attempt recovers: a read_committed consumer sees
    every input id once and per key the state's sequence numbers 1..n; a read_uncommitted
    one also sees the aborted transaction."""
    platform = Platform(kafka_server, death)
    name = uuid.uuid4().hex[:8]
    source, target = f"in-{name}", f"out-{name}"
    create_topic(broker.bootstrap, source, 2)
    create_topic(broker.bootstrap, target, 2)
    produce_events(broker.bootstrap, source, KAFKA_EVENTS)
    schedule = [*packed(platform), *platform.schedule([FaultSpec(IN_TRANSACTION, 4)])]
    job = [sys.executable, "-m", "exactly.demos.kafka_job", "--bootstrap", broker.bootstrap,
           "--input", source, "--output", target, "--checkpoint", str(tmp_path / "ck"),
           "--prefix", f"connect-{name}", "--max-offsets-per-trigger",
           str(math.ceil(KAFKA_EVENTS / KAFKA_EPOCHS))]
    restarts = []
    hooks = platform.hooks()

    def on_start(attempt: Attempt) -> None:
        if attempt.armed is None and not restarts:  # the transaction killed inside is open
            restarts.append(attempt.number)
            broker.kill()
            broker.start()
        platform.on_start(attempt)

    hooks["on_start"] = on_start
    attempts = run_with_crashes(job, schedule, timeout=480, **hooks)

    assert fired(attempts) == [(s.point, s.min_epoch) for s in schedule]
    platform.assert_every_crash_killed_what_it_should(
        [*EVERY_POINT, SimpleNamespace(value=IN_TRANSACTION, on_driver=True)])
    assert restarts == [len(schedule) + 1], "the broker was not restarted before recovery"
    committed = audit_output(broker.bootstrap, source, target, "read_committed")
    assert committed.report.ok, committed.report.to_json()
    assert committed.report.found_rows == KAFKA_EVENTS
    assert committed.seq_errors == 0  # the job's state was applied exactly once
    uncommitted = audit_output(broker.bootstrap, source, target, "read_uncommitted")
    assert uncommitted.report.missing.count == 0
    assert uncommitted.report.duplicate_extra_rows > 0  # the transaction killed inside
