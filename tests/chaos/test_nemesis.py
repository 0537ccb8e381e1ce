"""Every exactly-once sink under the nemesis: network faults between the job and its server,
the ambiguous commit, paused processes, a full disk and kills, at random times from a seed,
while readers watch the output; then a checker names every anomaly it saw.

One ``exactly run`` per sink (the datagen job of tests/ops/jobs, a fixed-delay restart
strategy), its checkpoint -- and with it the sink's staging log -- on a small tmpfs disk, its
server (PostgreSQL, S3Proxy, the Kafka broker) behind a :class:`FaultProxy`. Once the job has
committed its first epoch, a :class:`Nemesis` runs a schedule that holds every kind of fault
the sink can meet at least once; then every fault is healed, the job drains its input, stops
on command, and the checker compares what the readers saw and what the target finally holds
with the input (the final audit -- lost, duplicated, unexpected ids -- is ``exactly verify``'s,
run on the target as a user would; the history's anomalies are the checker's own).
The fault log goes with every failure (in the message, and
``faults.jsonl`` in the test's directory): ``EXACTLY_NEMESIS_SEED`` replays a run.

Default lane: one short run per sink (each kind of fault once, a few more at random; no kill:
every sink is already SIGKILLed at every protocol point in the default lane -- docs/
reliability.md, "Kill coverage" -- and a restart costs a new driver JVM); the write-ahead
sink's and the Iceberg sink's are slow proofs. The Iceberg run has two servers behind
proxies -- its SQL catalog on PostgreSQL and its files on S3Proxy -- so its network faults
name the server they hit (``net.cut@catalog``, ``net.answer@s3``). Soaks (marked
``soak``: ``scripts/soak --nemesis``, ``./scripts/test --slow``): one long run per sink,
``EXACTLY_NEMESIS_FAULTS`` faults (default 200), kills included, with
``EXACTLY_NEMESIS_REPORT`` naming a JSON-lines file for the summary table.
Clock jumps are not in these runs: the job's leases take their clock in-process only, so they
are proven by tests/unit/test_lease_clock_jumps.py (see docs/reliability.md).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exactly.auditor import verify
from exactly.checkpoint.spark_files import batch_numbers, read_offsets
from exactly.procs import ProcessesSurvived
from exactly.testing.nemesis import actions
from exactly.testing.nemesis.checker import History, Row, check
from exactly.testing.nemesis.disk import SmallDisk, why_unavailable
from exactly.testing.nemesis.faultlog import FaultLog
from exactly.testing.nemesis.observers import (
    DeltaObserver,
    FileOutputObserver,
    IcebergObserver,
    KafkaObserver,
    Observer,
    PostgresObserver,
    json_row,
    retry_incomplete_listing,
)
from exactly.testing.nemesis.processes import driver_pids, executor_pids, tree_pids
from exactly.testing.nemesis.proxy import (
    FaultProxy,
    after,
    contains,
    http_request,
    kafka_request,
)
from exactly.testing.nemesis.schedule import Action, FaultSchedule, Nemesis
from exactly.testing.supervised import SupervisedRun

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(why_unavailable() is not None,
                                 reason=f"the nemesis's full disk: {why_unavailable()}")]

JOB = Path(__file__).parents[1] / "ops" / "jobs" / "datagen_job.py"
SEED = int(os.environ.get("EXACTLY_NEMESIS_SEED", "28"))
#: the short run's faults beyond one of each kind
EXTRA_FAULTS = 2
ROWS_PER_EPOCH = 1000


@dataclass(frozen=True)
class Length:
    """A short run or a soak: its faults and its input."""

    #: faults in all; 0: each kind once and EXTRA_FAULTS more
    faults: int
    #: whether the driver is killed too
    kills: bool
    #: rows per second of the job's input (the soak's runs last minutes: fewer rows keep the
    #: readers' snapshots, which the checker keeps whole, within memory)
    rate: int
    #: how often the readers that read the whole output poll it
    poll_s: float
    #: the ranges of the random gaps between faults and of their durations
    gap: tuple[float, float]
    duration: tuple[float, float]
    #: the share of the time the job is up (a soak's kills keep it down about half of it)
    up: float


#: the default lane's run: each kind of fault once and a few more, no kill
SHORT = Length(0, False, 400, 0.1, (0.2, 0.8), (0.3, 1.2), 1.0)


def soak() -> Length:
    """The soak's run: ``EXACTLY_NEMESIS_FAULTS`` faults (200), kills included."""
    return Length(int(os.environ.get("EXACTLY_NEMESIS_FAULTS", "200")), True, 200, 1.0,
                  (0.2, 1.0), (0.3, 1.8), 0.5)


@dataclass
class Summary:
    """One sink's nemesis run: one row of the soak's table."""

    sink: str
    seed: int
    faults: dict[str, int] = field(default_factory=dict)
    answer_faults_fired: int = 0
    recoveries: int = 0
    epochs: int = 0
    records_audited: int = 0
    missing: int = 0
    duplicated: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    processes_left: int = 0
    leftovers: int = 0
    wall_s: float = 0.0

    def record(self) -> None:
        row = {**self.__dict__, "wall_s": round(self.wall_s, 1)}
        print(f"\nNEMESIS SUMMARY {self.sink}: {json.dumps(row)}", flush=True)
        report = os.environ.get("EXACTLY_NEMESIS_REPORT")
        if report:
            with open(report, "a") as f:
                f.write(json.dumps(row) + "\n")


@dataclass
class Target:
    """What a sink's run needs: the job's settings, its server's faults, the output."""

    sink: str
    env: dict[str, str]
    rows: int
    #: the target's committed rows, read after the job (``Row(id, epoch, ...)``)
    final_rows: Callable[[], list[Row]]
    #: readers that watch the output while the job runs
    observers: Callable[[History], list[Observer]]
    #: the readers of a target that promises whole epochs (see the checker's table)
    whole_epochs: set[str] = field(default_factory=set)
    #: the faults of the sink's server, given the run's fault log
    server_actions: Callable[[FaultLog], dict[str, Action]] = lambda log: {}
    #: prepared transactions or staged files the run left behind
    leftovers: Callable[[], int] = lambda: 0
    #: the output as ``exactly verify`` names it (the final audit is verify's)
    location: str = ""
    #: the shares each epoch is published in (Kafka's ``publishShares``): readers see whole
    #: shares, not whole epochs
    shares: int = 1


#: the durations of the kinds of fault that do not last the default range
DURATIONS = {actions.KILL: (0.0, 0.0), "net.cut": (0.0, 0.0), actions.ANSWER: (2.0, 4.0)}


def base_kind(kind: str) -> str:
    """A kind without the server it targets: ``net.cut@catalog`` -> ``net.cut`` (a run with
    two servers behind proxies names each server's faults apart)."""
    return kind.split("@", 1)[0]


def schedule_for(kinds: list[str], length: Length) -> FaultSchedule:
    """The short run: each kind once and a few more; the soak: its faults."""
    count = length.faults or len(kinds) + EXTRA_FAULTS
    return FaultSchedule.random(SEED, kinds, count, gap=length.gap, duration=length.duration,
                                durations={k: DURATIONS[base_kind(k)] for k in kinds
                                           if base_kind(k) in DURATIONS})


def epoch_ranges(checkpoint: Path) -> dict[int, tuple[int, int]]:
    """Each epoch's input ids ``[start, end)``, from Spark's offset log (the datagen source's
    offset is the number of rows generated before an epoch). Spark keeps the newest 100
    entries: an epoch whose predecessor's entry is gone has an unknown start and is left out,
    except epoch 0, which starts at row 0."""
    ends = {}
    for epoch in batch_numbers(str(checkpoint), "offsets"):
        entry = read_offsets(str(checkpoint), epoch)
        if entry is not None:
            (source,) = entry.input.sources
            ends[epoch] = int(source["rows"])
    ranges = {}
    for epoch, end in ends.items():
        start = 0 if epoch == 0 else ends.get(epoch - 1)
        if start is not None:
            ranges[epoch] = (start, end)
    return ranges


def epochs_of_input(checkpoint: Path) -> dict[int, int]:
    """Each input id's epoch (:func:`epoch_ranges`): what the checker needs for targets
    whose rows do not carry their epoch (Kafka, the write-ahead sink)."""
    return {i: epoch for epoch, (start, end) in epoch_ranges(checkpoint).items()
            for i in range(start, end)}


def partitions_of_input(checkpoint: Path) -> dict[int, int]:
    """Each input id's read task in its epoch: the datagen source splits an epoch's rows
    into ``numPartitions`` (2) even ranges, and the job keeps its partitions to the sink, so
    an id's share is its task's number modulo the shares."""
    partition_of = {}
    for start, end in epoch_ranges(checkpoint).values():
        if end <= start:
            continue
        bounds = np.linspace(start, end, min(2, end - start) + 1, dtype=np.int64)
        for task, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            partition_of.update(dict.fromkeys(range(int(lo), int(hi)), task))
    return partition_of


def run_under_nemesis(tmp_path: Path, target: Target, length: Length) -> Summary:
    summary = Summary(target.sink, SEED)
    started = time.monotonic()
    log = FaultLog(tmp_path / "faults.jsonl", seed=SEED)
    disk = SmallDisk(tmp_path / "disk", 256 << 20).mount()
    checkpoint = disk.path / "ck"
    kinds_known = sorted([*([actions.KILL] if length.kills else []), "pause.driver",
                          "pause.executor", actions.DISK, *target.server_actions(FaultLog())])
    schedule = schedule_for(kinds_known, length)
    # the input lasts about as long as the faults do, so that faults meet a job at work: the
    # generator's rate counts from each driver's start, and a soak's kills keep the job down
    # about half of the time
    rows = max(target.rows, int(length.rate * (schedule.faults[-1].at + 10) * length.up))
    target.rows = rows
    env = {"JOB_ROWS": str(rows), "JOB_RATE": str(length.rate),
           "JOB_MAX_ROWS": str(ROWS_PER_EPOCH), "JOB_INTERVAL": "500ms",
           "PYSPARK_PYTHON": sys.executable, **target.env}
    run = SupervisedRun(JOB, checkpoint, env, "--restart-strategy", "fixed-delay",
                        "--restart-option", "attempts=1000", "--restart-option", "delay=1s",
                        log=tmp_path / "run.log")
    history = History()
    readers = target.observers(history)
    nemesis = None
    epoch_of: dict[int, int] = {}
    share_of: dict[int, int] = {}
    try:
        for reader in readers:
            reader.__enter__()
        run.wait_for(lambda: len(run.committed_epochs()) >= 1, "the first epoch", timeout=180)

        def driver() -> int | None:
            status = run.status()
            return status.driver.pid if status is not None and status.driver else None

        kinds: dict[str, Action] = {
            **({actions.KILL: actions.kill_action(driver)} if length.kills else {}),
            "pause.driver": actions.pause_action(
                lambda: driver_pids(driver() or 0), "driver", log),
            "pause.executor": actions.pause_action(
                lambda: executor_pids(driver() or 0), "executor", log),
            actions.DISK: actions.disk_action(lambda: disk.fill(), disk.free),
            **target.server_actions(log)}
        assert sorted(kinds) == kinds_known
        nemesis = Nemesis(schedule, kinds, log).start()
        assert nemesis.wait(3600), "the nemesis did not finish its schedule"
        assert not nemesis.errors, nemesis.errors
        summary.faults = nemesis.counts()
        summary.answer_faults_fired = sum(
            1 for e in log.entries if e["kind"] == "net.answer_fault")

        def drained() -> bool:
            return len({r.id for r in target.final_rows()}) >= rows
        run.wait_for(drained, "every row in the target after the faults",
                     timeout=300 + rows / length.rate)
        stopped = run.command("stop", str(checkpoint))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0, run.output()[-3000:]
        epoch_of = epochs_of_input(checkpoint)
        if target.shares > 1:
            share_of = {i: task % target.shares
                        for i, task in partitions_of_input(checkpoint).items()}
    except BaseException:
        print(f"fault log ({tmp_path / 'faults.jsonl'}):\n{log.text()}")
        raise
    finally:
        if nemesis is not None:
            nemesis.stop()
        for reader in readers:
            reader.__exit__(None, None, None)
        try:
            run.close()
        except ProcessesSurvived as exc:
            summary.processes_left = len(exc.args)
            raise
        finally:
            summary.wall_s = time.monotonic() - started
            committed = run.committed_epochs() if checkpoint.exists() else []
            summary.epochs = committed[-1] + 1 if committed else 0
            summary.recoveries = sum(1 for e in run.history() if e["event"] == "recovered")
            disk.unmount()
    final = target.final_rows()
    audit = verify(None, target.location, expect=f"select range as id from range({rows})")
    report = check(history, expected_ids=range(rows), final_rows=final,
                   whole_epochs=target.whole_epochs, epoch_of=epoch_of, audit=audit,
                   share_of=share_of)
    summary.records_audited = len(final)
    summary.missing = rows - len({r.id for r in final} & set(range(rows)))
    summary.duplicated = len(final) - len({r.id for r in final})
    summary.anomalies = {k.label: n for k, n in report.counts.items() if n}
    summary.leftovers = target.leftovers()
    summary.record()
    print(f"{report.render()}\nfault log: {tmp_path / 'faults.jsonl'}")
    assert report.ok, f"{report.render()}\nfault log:\n{log.text()}"
    assert summary.leftovers == 0
    assert set(summary.faults) == set(kinds), "a kind of fault never ran"
    if actions.ANSWER in kinds:
        assert summary.answer_faults_fired >= 1, "no commit request met an answer fault"
    for kind in kinds:  # an answer fault of a named server: one of its requests met it
        if "@" in kind and base_kind(kind) == actions.ANSWER:
            server = kind.split("@", 1)[1]
            assert any(e["kind"] == "net.answer_fault" and e["target"] == server
                       for e in log.entries), f"no commit request to {server} met {kind}"
    return summary


# -- the file sink ----------------------------------------------------------------------------
def test_the_file_sink_under_the_nemesis_commits_every_row_once_and_readers_see_no_anomaly(
        tmp_path):
    files_under_the_nemesis(tmp_path, SHORT)


@pytest.mark.soak
def test_the_file_sink_soaks_under_the_nemesis_with_kills(tmp_path):
    files_under_the_nemesis(tmp_path, soak())


def files_under_the_nemesis(tmp_path: Path, length: Length) -> None:
    out = tmp_path / "out"

    def final_rows() -> list[Row]:
        history = History()
        FileOutputObserver(history, out, name="final").poll()
        last = history.last("final")
        return list(last) if last else []

    target = Target("files", {"JOB_SINK": "files", "JOB_OUT": str(out)}, 3000, final_rows,
                    lambda h: [FileOutputObserver(h, out, poll_seconds=length.poll_s)],
                    whole_epochs={"files"}, location=str(out))
    summary = run_under_nemesis(tmp_path, target, length)
    assert summary.faults.keys() >= {"pause.driver", "pause.executor", "disk.full"}


# -- PostgreSQL: the 2PC sink and the write-ahead sink ----------------------------------------
def _pg_target(sink: str, pg: Any, conn: Any, table: str, proxy: FaultProxy,
               poll_s: float) -> Target:
    epoch_column = "exactly_epoch" if sink == "postgres" else None

    def final_rows() -> list[Row]:
        try:
            rows = conn.execute(f'SELECT id{", " + epoch_column if epoch_column else ""} '
                                f'FROM "{table}"').fetchall()
        except Exception:  # not created yet
            return []
        return [Row(r[0], r[1] if epoch_column else None, None, None) for r in rows]

    def leftovers() -> int:
        return conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]

    def observers(history: History) -> list[Observer]:
        found = [PostgresObserver(history, pg.dsn, table, name="table",
                                  epoch_column=epoch_column, poll_seconds=poll_s)]
        if sink == "postgres":  # the view shows whole epochs; the table, whole tasks
            found.append(PostgresObserver(history, pg.dsn, f"{table}_committed",
                                          name="view", epoch_column=epoch_column,
                                          poll_seconds=poll_s))
        return found

    def server(log: FaultLog) -> dict[str, Action]:
        proxy.log = log
        commit = contains(b"COMMIT PREPARED" if sink == "postgres" else b"COMMIT")
        return {**actions.network_actions(proxy, commit),
                actions.SERVER_PAUSE: actions.pause_action(lambda: tree_pids(pg.pid or 0),
                                                           "postgres", log)}

    dsn = pg.dsn.replace(f":{pg.port}/", f":{proxy.port}/")
    return Target(sink, {"JOB_SINK": sink, "JOB_DSN": dsn, "JOB_TABLE": table}, 3000,
                  final_rows, observers, {"view"} if sink == "postgres" else {"table"},
                  server, leftovers, location=f"{pg.dsn}?table={table}")


@pytest.fixture
def pg_proxy(pg):
    with FaultProxy("127.0.0.1", pg.port, name="postgres") as proxy:
        yield proxy


@pytest.mark.parametrize("sink", [
    "postgres",
    # CI budget (issue 30, 41.6 s): the write-ahead sink's default-lane proofs under faults
    # are its kills: at every protocol point on Spark Connect (tests/connect/
    # test_chaos_on_connect.py [wal-runner]) and on the cluster (test_cluster_lane.py[wal])
    pytest.param("wal", marks=pytest.mark.slow)])
def test_a_postgres_sink_under_the_nemesis_commits_every_row_once_and_readers_see_no_anomaly(
        tmp_path, pg, conn, table_name, pg_proxy, sink):
    postgres_under_the_nemesis(tmp_path, _pg_target(sink, pg, conn, table_name, pg_proxy,
                                                    SHORT.poll_s), SHORT)


@pytest.mark.soak
@pytest.mark.parametrize("sink", ["postgres", "wal"])
def test_a_postgres_sink_soaks_under_the_nemesis_with_kills(tmp_path, pg, conn, table_name,
                                                            pg_proxy, sink):
    length = soak()
    postgres_under_the_nemesis(tmp_path, _pg_target(sink, pg, conn, table_name, pg_proxy,
                                                    length.poll_s), length)


def postgres_under_the_nemesis(tmp_path: Path, target: Target, length: Length) -> None:
    summary = run_under_nemesis(tmp_path, target, length)
    assert summary.faults.keys() >= {"net.answer", "pause.server", "net.blackhole"}


# -- Delta on S3 ------------------------------------------------------------------------------
@pytest.fixture
def s3_proxy(s3_server):
    port = int(s3_server.endpoint.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port, name="s3") as proxy:
        yield proxy


def test_the_delta_sink_on_s3_under_the_nemesis_commits_every_row_once_and_readers_see_no_anomaly(
        tmp_path, s3_server, s3_bucket, s3_proxy):
    delta_on_s3_under_the_nemesis(tmp_path, s3_server, s3_bucket, s3_proxy, SHORT)


@pytest.mark.soak
def test_the_delta_sink_on_s3_soaks_under_the_nemesis_with_kills(tmp_path, s3_server,
                                                                 s3_bucket, s3_proxy):
    delta_on_s3_under_the_nemesis(tmp_path, s3_server, s3_bucket, s3_proxy, soak())


def delta_on_s3_under_the_nemesis(tmp_path: Path, s3_server: Any, s3_bucket: str,
                                  s3_proxy: FaultProxy, length: Length) -> None:
    uri = f"s3://{s3_bucket}/events"
    options = s3_server.storage_options()

    def newest_rows() -> list[Row]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            newest = DeltaTable(uri, storage_options=options).version()
        except TableNotFoundError:
            return []
        history = History()
        final = DeltaObserver(history, uri, name="final", storage_options=options)
        final.version = newest - 1  # the newest version only, its files' epochs from the log
        final.poll()
        last = history.last("final")
        return list(last) if last else []

    def final_rows() -> list[Row]:
        # drained() reads while the job commits: S3Proxy's LIST can then miss commit files
        # of _delta_log/ (a "gap"), read again; any other error fails the test (observers.py)
        return retry_incomplete_listing(newest_rows)

    def server(log: FaultLog) -> dict[str, Action]:
        s3_proxy.log = log
        return {**actions.network_actions(s3_proxy, http_request("PUT", b"_delta_log/")),
                actions.SERVER_PAUSE: actions.pause_action(
                    lambda: tree_pids(s3_server.proc.pid), "s3proxy", log)}

    env = {"JOB_SINK": "delta", "JOB_DELTA_PATH": uri,
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_proxy.port}"}
    target = Target("delta-s3", env, 3000, final_rows,
                    lambda h: [DeltaObserver(h, uri, storage_options=options,
                                             poll_seconds=length.poll_s)], {"delta"},
                    server, location=f"delta:{uri}")
    summary = run_under_nemesis(tmp_path, target, length)
    assert summary.faults.keys() >= {"net.answer", "pause.server", "net.drop"}


# -- Kafka ------------------------------------------------------------------------------------
def test_the_kafka_sink_under_the_nemesis_commits_every_row_once_and_readers_see_no_anomaly(
        tmp_path, broker, topic, kafka_proxy):
    kafka_under_the_nemesis(tmp_path, broker, topic, kafka_proxy, SHORT)


# CI budget: the shares' default-lane proofs are in tests/kafka/test_kafka_publish_shares.py
@pytest.mark.slow
def test_the_kafka_sink_in_shares_under_the_nemesis_commits_every_row_once_readers_see_whole_shares(
        tmp_path, broker, topic, kafka_proxy):
    """``exactly.kafka.publishShares=2``: each share published by a task of its own; the
    checker holds readers to whole shares of epochs (not whole epochs)."""
    kafka_under_the_nemesis(tmp_path, broker, topic, kafka_proxy, SHORT, shares=2)


@pytest.mark.soak
def test_the_kafka_sink_soaks_under_the_nemesis_with_kills(tmp_path, broker, topic,
                                                           kafka_proxy):
    kafka_under_the_nemesis(tmp_path, broker, topic, kafka_proxy, soak())


def kafka_under_the_nemesis(tmp_path: Path, broker: Any, topic: str, kafka_proxy: FaultProxy,
                            length: Length, shares: int = 1) -> None:
    from exactly.testing.kafka_broker import consume_all

    read = json_row("id")

    def final_rows() -> list[Row]:
        rows = [read(_Message(value)) for _, _, _, value in consume_all(broker.bootstrap, topic)]
        return [r for r in rows if r is not None]

    def observers(history: History) -> list[Observer]:
        return [KafkaObserver(history, broker.bootstrap, topic, isolation=isolation, row=read)
                for isolation in ("read_committed", "read_uncommitted")]

    def server(log: FaultLog) -> dict[str, Action]:
        kafka_proxy.log = log
        return {**actions.network_actions(kafka_proxy, kafka_request(26)),  # EndTxn
                actions.SERVER_PAUSE: actions.pause_action(
                    lambda: tree_pids(broker.proc.pid), "kafka", log)}

    # a producer abandoned after its call hung is replaced after 10 s instead of 30
    env = {"JOB_SINK": "kafka", "JOB_BOOTSTRAP": broker.proxied_bootstrap, "JOB_TOPIC": topic,
           "JOB_KAFKA_CALL_TIMEOUT_MS": "10000", "JOB_KAFKA_SHARES": str(shares)}
    target = Target("kafka" if shares == 1 else f"kafka-{shares}-shares", env, 3000,
                    final_rows, observers, {"kafka-read_committed"}, server,
                    location=f"kafka://{broker.bootstrap}/{topic}", shares=shares)
    summary = run_under_nemesis(tmp_path, target, length)
    assert summary.faults.keys() >= {"net.answer", "pause.server", "net.cut"}


class _Message:
    """A consumed record's value in the shape ``json_row`` reads."""

    def __init__(self, value: bytes | None) -> None:
        self._value = value

    def value(self) -> bytes | None:
        return self._value


# -- Iceberg: the SQL catalog on PostgreSQL, the files on S3 ----------------------------------
@pytest.fixture
def catalog_proxy(pg):
    with FaultProxy("127.0.0.1", pg.port, name="catalog") as proxy:
        yield proxy


# CI budget: the Iceberg sink's default-lane proofs are its kills at every protocol point in
# process (tests/contract: the iceberg case of test_commit_protocol.py); this run of a whole
# driver under two servers' faults (~60-90 s) is a slow proof, as its kills of whole drivers
# are (tests/chaos/test_iceberg_chaos.py)
@pytest.mark.slow
def test_the_iceberg_sink_under_the_nemesis_commits_every_row_once_and_readers_see_no_anomaly(
        tmp_path, pg, s3_server, s3_bucket, catalog_proxy, s3_proxy):
    iceberg_under_the_nemesis(tmp_path, pg, s3_server, s3_bucket, catalog_proxy, s3_proxy,
                              SHORT)


@pytest.mark.soak
def test_the_iceberg_sink_soaks_under_the_nemesis_with_kills(tmp_path, pg, s3_server,
                                                             s3_bucket, catalog_proxy,
                                                             s3_proxy):
    iceberg_under_the_nemesis(tmp_path, pg, s3_server, s3_bucket, catalog_proxy, s3_proxy,
                              soak())


def _at(server: str, kinds: dict[str, Action]) -> dict[str, Action]:
    return {f"{kind}@{server}": action for kind, action in kinds.items()}


def iceberg_under_the_nemesis(tmp_path: Path, pg: Any, s3_server: Any, s3_bucket: str,
                              catalog_proxy: FaultProxy, s3_proxy: FaultProxy,
                              length: Length) -> None:
    """The SQL catalog on the test kit's PostgreSQL, reached by the job through
    ``catalog_proxy``; the table's files (data, manifests, metadata) on S3Proxy through
    ``s3_proxy``. The readers (the observer, the final read, ``exactly verify``) reach both
    directly. Answer faults: the ``COMMIT`` of the catalog's swap of the metadata pointer
    (the commit of an epoch), and the PUT of a new ``.metadata.json``."""
    from exactly.testing.iceberg_output import leftovers as iceberg_leftovers

    table = f"nemesis_{uuid.uuid4().hex[:8]}.events"  # one PostgreSQL for the session
    warehouse = f"s3://{s3_bucket}/lake"
    address = f"iceberg:{pg.dsn}?table={table}&warehouse={warehouse}"
    proxied = pg.dsn.replace(f":{pg.port}/", f":{catalog_proxy.port}/")
    final = IcebergObserver(History(), address, name="final")
    final.address.catalog.load()  # the catalog's own tables exist before two clients race

    def final_rows() -> list[Row]:
        try:
            return final.current_rows()
        except Exception:  # a read while the job creates the table
            final.reset()
            return []

    def server(log: FaultLog) -> dict[str, Action]:
        catalog_proxy.log = log
        s3_proxy.log = log
        return {
            **_at("catalog", actions.network_actions(
                catalog_proxy, after(b"UPDATE iceberg_tables", b"COMMIT"))),
            f"{actions.SERVER_PAUSE}@catalog": actions.pause_action(
                lambda: tree_pids(pg.pid or 0), "postgres", log),
            **_at("s3", actions.network_actions(
                s3_proxy, http_request("PUT", b".metadata.json"))),
            f"{actions.SERVER_PAUSE}@s3": actions.pause_action(
                lambda: tree_pids(s3_server.proc.pid), "s3proxy", log)}

    env = {"JOB_SINK": "iceberg",
           "JOB_ICEBERG": f"iceberg:{proxied}?table={table}&warehouse={warehouse}",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_proxy.port}"}
    target = Target("iceberg", env, 3000, final_rows,
                    lambda h: [IcebergObserver(h, address, poll_seconds=length.poll_s)],
                    {"iceberg"}, server, lambda: len(iceberg_leftovers(address)),
                    location=address)
    try:
        summary = run_under_nemesis(tmp_path, target, length)
    finally:
        final.reset()
    assert summary.faults.keys() >= {"net.answer@catalog", "net.blackhole@catalog",
                                     "pause.server@catalog", "net.drop@s3", "pause.driver",
                                     "disk.full"}
