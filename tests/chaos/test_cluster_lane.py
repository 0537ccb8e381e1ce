"""Every sink on a multi-JVM Spark cluster: a driver kill and an executor kill, audited.

One standalone cluster (:class:`exactly.testing.spark_cluster.StandaloneCluster`: a master
and two workers of 1 core and 1 GB on 127.0.0.1) serves the whole module. Each test runs a
sink's job on it through the crash harness (:func:`exactly.testing.chaos.run_with_crashes`)
with one driver-side fault, ``after_intent`` at epoch 1: the driver's whole process tree is
SIGKILLed between the epoch's durable intent and its commit, the application dies with it
and the restarted driver gets new executors. Once that restarted attempt has made progress
(its executors finished the tasks of one epoch), one executor JVM of its application is
SIGKILLed while it runs a task: Spark loses the executor, the worker launches a new one and
the lost tasks run again.

The Kafka and write-ahead sinks run with their checkpoint, commit log and staged files on
S3 (S3Proxy): their executors, in JVMs of their own, stage to the object store and the
restarted driver publishes from it.

Audits as in the sinks' own chaos tests: every id exactly once, no prepared transaction, no
staged or pending leftovers.

The default lane runs the write-ahead sink here (its executors stage to S3, its driver loads
PostgreSQL); the file, 2PC, upsert, Kafka and Delta sinks (each killed at protocol points in
its own chaos test) join it in the slow lane, to keep the default run within its CI
budget.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable

from exactly.audit import audit_ids, pg_table_ids
from exactly.auditor import verify
from exactly.connectors.postgres.two_phase import prepared_count
from exactly.demos import postgres_job
from exactly.demos.files import write_events
from exactly.demos.kafka import run_chaos
from exactly.procs import ProcessInfo, is_alive
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import Attempt, python_command, run_with_crashes
from exactly.testing.delta_output import leftovers
from exactly.testing.file_output import assert_no_dangling_pre_commits
from exactly.testing.spark_cluster import Executor, StandaloneCluster

pytestmark = pytest.mark.chaos

ROWS, PER_EPOCH = 5000, 1000  # 5 epochs: the restarted attempt replays 1, then loses an executor
FILES = 10  # 500 events a file, 2 files an epoch
DRIVER_KILL = [FaultSpec(FaultPoint.AFTER_INTENT, 1)]
#: how often the executor killer looks at the executors' logs (each look reads them whole)
POLL_S = 0.1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Master + 2 workers (1 core, 1 GB each), shared by the module; every JVM of it runs the
    C1 compiler only (they live seconds to minutes), and its drivers default to 2 shuffle
    partitions (one per core) through the ``spark-defaults.conf`` of ``client_env()``."""
    with StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2, cores=1,
                           memory="1g", java_options="-XX:TieredStopAtLevel=1",
                           client_conf={"spark.sql.shuffle.partitions": "2"}) as c:
        yield c


class ExecutorKiller:
    """SIGKILLs one executor JVM once, in the first attempt after the driver crash: as soon
    as that attempt's application has made progress (its executors finished
    ``after_tasks`` tasks: the first epoch it ran), the first of its executors seen running a
    task (any of them if none is seen busy for a while)."""

    def __init__(self, cluster: StandaloneCluster, after_tasks: int = 2) -> None:
        self.cluster = cluster
        self.after_tasks = after_tasks
        self.victim: Executor | None = None
        self.busy: set[int] = set()  # task ids the victim's log showed running at the kill
        self._attempt: Attempt | None = None
        self._before: set[str] = set()  # applications of the earlier attempts
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._kill, daemon=True)
        self._t0 = time.monotonic()
        self.timeline: list[str] = []  # what happened when: printed with the result

    def _note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self._t0:6.1f}s {what}")

    def on_start(self, attempt: Attempt) -> None:
        self._note(f"attempt {attempt.number} starts")
        if attempt.number >= 2 and self._attempt is None:
            self._attempt = attempt
            self._before = set(self.cluster.applications())
            self._thread.start()

    def on_line(self, attempt: Attempt, event: dict) -> None:
        if event.get("event") == "epoch":
            self._note(f"attempt {attempt.number} reported epoch {event['epoch']}")

    def on_end(self, attempt: Attempt) -> None:
        self._note(f"attempt {attempt.number} ended (exit {attempt.returncode})")
        if attempt is self._attempt:
            self._ended.set()

    def _kill(self) -> None:
        app = None
        while app is None or self.cluster.finished_tasks(app) < self.after_tasks:
            if self._ended.wait(POLL_S):
                return
            app = app or next((a for a in self.cluster.applications()
                               if a not in self._before), None)
        self._note(f"{app}: {self.cluster.finished_tasks(app)} tasks finished")
        polls = 0  # ~10 s looking for a busy executor, then any of them
        while not self._ended.is_set():
            executors = [e for e in self.cluster.executors() if e.app_id == app]
            busy = [e for e in executors if e.running_tasks()]
            if busy or (executors and polls >= 10 / POLL_S):
                self._shoot((busy or executors)[0])
                return
            polls += 1
            self._ended.wait(POLL_S)

    def _shoot(self, victim: Executor) -> None:
        self.busy = victim.running_tasks()
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.victim = victim
        self._note(f"executor {victim.executor_id} killed, running tasks {sorted(self.busy)}")

    def __enter__(self) -> ExecutorKiller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def finish(self) -> None:
        """Stop looking for a victim; print the timeline (pytest shows it on a failure)."""
        self._ended.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        print("", *self.timeline, sep="\n  ", file=sys.stderr)

    def check(self, attempts: list[Attempt]) -> None:
        """The driver kill fired in attempt 1, an executor was killed later, the job drained
        and nothing of its applications is left on the cluster."""
        assert attempts[0].crashed and attempts[0].fired["point"] == "after_intent"
        assert attempts[-1].returncode == 0
        assert self.victim is not None, "no executor was killed"
        print(f"  {self.victim.app_id}: {self.cluster.reattempts(self.victim.app_id)} task "
              f"re-runs after the executor kill", file=sys.stderr)
        # the drained driver stopped its application: the workers stop its executors
        left = self.cluster.application_processes()
        for _ in range(600):  # at most ~60 s
            if not left:
                break
            time.sleep(0.1)
            left = self.cluster.application_processes()
        assert left == [], [ProcessInfo.of(p) for p in left if is_alive(p)]


def run(cluster: StandaloneCluster, command: list[str],
        env: dict[str, str] | None = None) -> list[Attempt]:
    with ExecutorKiller(cluster) as killer:
        attempts = run_with_crashes(command, DRIVER_KILL,
                                    env={**cluster.client_env(), **(env or {})},
                                    on_start=killer.on_start, on_line=killer.on_line,
                                    on_end=killer.on_end, timeout=480)
    killer.check(attempts)
    return attempts


# -- files and Delta Lake --------------------------------------------------------------


@pytest.fixture
def events(tmp_path: Path) -> Path:
    directory = tmp_path / "input"
    write_events(directory, ROWS, FILES, seed=3)
    return directory


def pipeline(tmp_path: Path, events: Path, output: str, *extra: str) -> list[str]:
    return python_command("pipeline", *extra, "--input", str(events), "--output", output,
                          "--checkpoint", str(tmp_path / "ck"), "--max-files-per-epoch", "2")


# CI budget: the default lane's cluster run is the write-ahead sink's below (executors staging
# to S3, a PostgreSQL target); the file sink on the cluster in the slow lane
@pytest.mark.slow
def test_file_sink_on_the_cluster(cluster, tmp_path, events):
    out = tmp_path / "out"
    run(cluster, pipeline(tmp_path, events, str(out)))
    report = verify(events, out)
    assert report.ok, report.rows()
    assert report.found_rows == ROWS
    assert_no_dangling_pre_commits(out)


@pytest.mark.slow  # CI budget: Delta under kills is tests/connect/test_chaos_on_connect.py
# (default lane) and tests/chaos/test_delta_chaos.py
def test_delta_sink_on_the_cluster(cluster, tmp_path, events):
    uri = str(tmp_path / "table")
    run(cluster, pipeline(tmp_path, events, uri, "--sink", "delta"))
    final = DeltaTable(uri)
    ids = final.to_pyarrow_table(columns=["id"])["id"].to_pylist()
    assert sorted(ids) == list(range(ROWS))
    for version in range(final.version() + 1):  # every version holds whole epochs
        seen = DeltaTable(uri, version=version).to_pyarrow_table(columns=["id"])["id"]
        assert len(seen) % PER_EPOCH == 0 and len(set(seen.to_pylist())) == len(seen)
    assert leftovers(uri, {}) == []  # aborted attempts' files and markers removed


# -- PostgreSQL ------------------------------------------------------------------------


class OnS3:
    """A fresh bucket for a job's checkpoint (``s3a://``), with the sink's log and staging
    beside it on ``s3://``; ``env`` carries the store's ``AWS_*`` settings to the driver,
    which passes them on to its executors (``spark_session(s3a=True)``)."""

    def __init__(self, s3_server, monkeypatch) -> None:
        self.server = s3_server
        self.bucket = f"cluster-{uuid.uuid4().hex[:12]}"
        s3_server.create_bucket(self.bucket)
        self.checkpoint = f"s3a://{self.bucket}/ck"
        self.env = s3_server.env()
        for key, value in self.env.items():  # for the test's own reads of the log
            monkeypatch.setenv(key, value)

    def keys(self, prefix: str) -> list[str]:
        listed = self.server.boto3_client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]

    def check_log_and_staging(self, staging: str) -> list[int]:
        """The completed epochs of the log on S3; fails if staged objects were left."""
        assert self.keys("ck/offsets/"), "Spark's offsets log is not on S3"
        assert self.keys(f"ck/exactly-sink/{staging}/") == [], "staged objects left behind"
        return CommitLog(f"s3://{self.bucket}/ck/exactly-sink").completed_epochs()


@pytest.mark.server
# CI budget: the default lane runs the write-ahead sink here (executors staging to S3); the
# 2PC and upsert sinks, whose tasks write to PostgreSQL directly, run in the slow lane
@pytest.mark.parametrize("sink", [pytest.param("2pc", marks=pytest.mark.slow), "wal",
                                  pytest.param("upsert", marks=pytest.mark.slow)])
def test_postgres_sink_on_the_cluster(cluster, pg, conn, tmp_path, sink, request, monkeypatch):
    """The write-ahead sink runs with its checkpoint, log and staged files on S3: executors
    on other JVMs stage to the object store, the restarted driver loads from it."""
    table = f"ev_{uuid.uuid4().hex[:8]}"
    s3 = OnS3(request.getfixturevalue("s3_server"), monkeypatch) if sink == "wal" else None
    ck = s3.checkpoint if s3 else str(tmp_path / "ck")
    run(cluster, postgres_job.command(
        "--sink", sink, "--table", table, "--checkpoint", ck, "--rows", str(ROWS),
        "--rows-per-epoch", str(PER_EPOCH), "--master", cluster.url),
        env={postgres_job.DSN_ENV: pg.dsn, **(s3.env if s3 else {})})
    report = audit_ids(pg_table_ids(conn, table), np.arange(ROWS))
    assert report.ok, report.to_json()
    assert report.found_rows == ROWS
    assert prepared_count(conn) == 0, "a prepared transaction was left behind"
    completed = (s3.check_log_and_staging("wal") if s3
                 else CommitLog(tmp_path / "ck" / "exactly-sink").completed_epochs())
    assert completed == list(range(ROWS // PER_EPOCH))


# -- Kafka -----------------------------------------------------------------------------


# CI budget: the Kafka sink under kills is tests/connect/test_chaos_on_connect.py (default
# lane) and tests/kafka/test_kafka_chaos.py, on S3 in the
# contract suite (case kafka_s3); on the cluster in the slow lane
@pytest.mark.slow
@pytest.mark.server
def test_kafka_sink_on_the_cluster(cluster, broker, s3_server, tmp_path, monkeypatch):
    """Kafka -> stateful job -> Kafka (``exactly.kafka`` transactional sink), with the
    checkpoint, log and staged files on S3: a ``read_committed`` consumer sees every id once
    and per key the sequence 1..n."""
    s3 = OnS3(s3_server, monkeypatch)
    for key, value in cluster.client_env().items():  # run_chaos starts the job with ours
        monkeypatch.setenv(key, value)
    with ExecutorKiller(cluster) as killer:
        result = run_chaos(broker.bootstrap, tmp_path / "job", events=ROWS // 2,
                           epochs=ROWS // PER_EPOCH, schedule=DRIVER_KILL,
                           on_start=killer.on_start, on_line=killer.on_line,
                           on_end=killer.on_end, checkpoint=s3.checkpoint, env=s3.env)
    killer.check(result.attempts)
    assert result.committed.report.ok, result.committed.report.to_json()
    assert result.committed.report.found_rows == ROWS // 2
    assert result.committed.seq_errors == 0
    assert s3.check_log_and_staging("staging")
