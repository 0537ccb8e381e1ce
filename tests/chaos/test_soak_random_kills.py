"""Soak: SIGKILL the whole process tree of a running job at random times, restart, audit.

Not at protocol points: the crash harness kills each attempt from outside after a random
delay (``run_with_crashes(kill_after=...)``), wherever the job is -- starting its JVM,
recovering, planning, writing, committing -- and restarts it, until every job drains its
input. Two kinds of delay: most kills come a random ``[MIN_DELAY, MAX_DELAY]`` seconds
after the attempt started (start-up, recovery, first epochs: on a loaded 2-core machine a
fresh driver needs tens of seconds to its first epoch), the others a random
``[0, MAX_RUN_DELAY]`` seconds after the attempt reported its first epoch (mid-run, epochs
in flight).

Two jobs are soaked: the file 2PC sink (``exactly pipeline``) and the PostgreSQL 2PC sink
(``python -m exactly.demos.postgres_job --sink 2pc``). During the whole run a reader polls
the output: for files it lists and reads every published epoch directory and checks that
each holds exactly one whole input file's ids (no torn or partial epoch, no epoch twice,
none changed or gone); for PostgreSQL it polls the table and checks that no id is ever
visible twice and the row count never goes down. At the end: zero ids missing, zero
duplicated, no pre-commit or prepared transaction left, no process of any attempt alive.

Marked ``soak``: runs with ``scripts/soak`` and ``./scripts/test --slow`` (``EXACTLY_SLOW=1``),
never in the default lane nor in a share of the slow lane. Knobs (environment):
``EXACTLY_SOAK_KILLS`` (total over both sinks, default 100), ``EXACTLY_SOAK_KILLS_PER_JOB``
(25), ``EXACTLY_SOAK_MIN_DELAY`` (1 s), ``EXACTLY_SOAK_MAX_DELAY`` (30 s),
``EXACTLY_SOAK_MAX_RUN_DELAY`` (8 s), ``EXACTLY_SOAK_MID_RUN_SHARE`` (share of kills after
the first epoch, 0.35), ``EXACTLY_SOAK_SEED``; ``EXACTLY_SOAK_REPORT`` names a JSON-lines
file that receives each sink's summary. ``scripts/soak`` runs it and prints the summary
table.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from exactly.auditor import verify
from exactly.demos.files import write_events
from exactly.procs import ProcessInfo, job_processes
from exactly.testing.chaos import Attempt, RandomKill, python_command, run_with_crashes
from exactly.testing.readers import BackgroundReader

pytestmark = [pytest.mark.chaos, pytest.mark.soak]

KILLS = int(os.environ.get("EXACTLY_SOAK_KILLS", "100"))
KILLS_PER_JOB = int(os.environ.get("EXACTLY_SOAK_KILLS_PER_JOB", "25"))
MIN_DELAY = float(os.environ.get("EXACTLY_SOAK_MIN_DELAY", "1"))
MAX_DELAY = float(os.environ.get("EXACTLY_SOAK_MAX_DELAY", "30"))
MAX_RUN_DELAY = float(os.environ.get("EXACTLY_SOAK_MAX_RUN_DELAY", "8"))
MID_RUN_SHARE = float(os.environ.get("EXACTLY_SOAK_MID_RUN_SHARE", "0.35"))
SEED = int(os.environ.get("EXACTLY_SOAK_SEED", "20240607"))
EPOCHS_PER_JOB = 40
RECORDS_PER_EPOCH = 200
POLL_SECONDS = 0.1


@dataclass
class Summary:
    """What one sink's soak did and found (one row of the report)."""

    sink: str
    jobs: int = 0
    kills: int = 0
    kills_after_start: int = 0  # a random delay after the attempt started
    kills_after_first_epoch: int = 0  # a random delay after its first epoch report
    kills_before_any_epoch: int = 0  # the attempt had reported no epoch (start-up,
    # recovery, the first epoch)
    restarts: int = 0
    epochs_committed: int = 0  # distinct epochs in the output
    epoch_reports: int = 0  # epochs reported by attempts (replays after a kill included)
    records_audited: int = 0
    missing: int = 0
    duplicated: int = 0
    reader_polls: int = 0
    reader_anomalies: int = 0
    left_over_pre_commits: int = 0
    processes_killed: int = 0  # every process the harness killed (whole trees + leftovers)
    processes_left: int = 0
    delay_min_s: float = math.inf
    delay_max_s: float = 0.0
    wall_s: float = 0.0
    anomalies: list[str] = field(default_factory=list)

    def add_attempts(self, attempts: list[Attempt]) -> None:
        self.jobs += 1
        self.restarts += len(attempts) - 1
        for a in attempts:
            self.epoch_reports += len(a.epochs)
            self.processes_killed += len(a.killed)
            if a.killed_externally:
                assert a.kill is not None
                self.kills += 1
                self.kills_after_first_epoch += a.kill.after_epochs > 0
                self.kills_after_start += a.kill.after_epochs == 0
                self.kills_before_any_epoch += not a.epochs
                self.delay_min_s = min(self.delay_min_s, a.kill.delay)
                self.delay_max_s = max(self.delay_max_s, a.kill.delay)
            left = [ProcessInfo.of(p) for p in job_processes(a.token)]
            self.processes_left += len(left)
            self.anomalies += [f"attempt {a.number} left {p}" for p in left]

    def print_and_record(self) -> None:
        row = asdict(self)
        row["anomalies"] = self.anomalies[:20]
        row["delay_min_s"] = round(self.delay_min_s, 2) if self.kills else None
        row["delay_max_s"] = round(self.delay_max_s, 2)
        row["wall_s"] = round(self.wall_s, 1)
        print(f"\nSOAK SUMMARY {self.sink}: " + json.dumps(row), flush=True)
        report = os.environ.get("EXACTLY_SOAK_REPORT")
        if report:
            with open(report, "a") as f:
                f.write(json.dumps(row) + "\n")


def kill_delays(rng: random.Random, count: int) -> list[RandomKill]:
    return [RandomKill(round(rng.uniform(0, MAX_RUN_DELAY), 2), after_epochs=1)
            if rng.random() < MID_RUN_SHARE
            else RandomKill(round(rng.uniform(MIN_DELAY, MAX_DELAY), 2))
            for _ in range(count)]


def quotas() -> tuple[int, int]:
    files = math.ceil(KILLS / 2)
    return files, KILLS - files


def soak(summary: Summary, rng: random.Random, quota: int, run_job) -> None:
    """Run fresh jobs, each killed up to KILLS_PER_JOB times, until ``quota`` kills."""
    started = time.monotonic()
    while summary.kills < quota:
        kills = min(KILLS_PER_JOB, quota - summary.kills)
        run_job(summary, kill_delays(rng, kills))
    summary.wall_s = time.monotonic() - started


def progress(sink: str, summary: Summary):
    def on_end(attempt: Attempt) -> None:
        how = (f"killed {attempt.kill.render()}" if attempt.killed_externally and attempt.kill
               else f"exit {attempt.returncode}")
        print(f"[soak {sink}] job {summary.jobs + 1} attempt {attempt.number}: {how}, "
              f"epochs {attempt.epochs[:1]}..{attempt.epochs[-1:]}, "
              f"{len(attempt.killed)} process(es) killed", flush=True)
    return on_end


# -- files -----------------------------------------------------------------------------------


class SoakReader(BackgroundReader):
    """A reader of the soak's output that counts what it finds wrong in the summary."""

    def __init__(self, summary: Summary) -> None:
        super().__init__()
        self.summary = summary

    def anomaly(self, text: str) -> None:
        self.summary.reader_anomalies += 1
        self.summary.anomalies.append(text)


class EpochDirReader(SoakReader):
    """Polls a file sink's output: every published epoch holds exactly one whole input file."""

    def __init__(self, out: Path, per_file: int, summary: Summary) -> None:
        super().__init__(summary)
        self.out, self.per_file = out, per_file
        self.seen: dict[str, tuple[list[str], int]] = {}  # epoch dir -> (files, first id)
        self.owner: dict[int, str] = {}  # first id of an input file -> epoch dir holding it

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.poll()
            except Exception as exc:  # an unreadable or vanished published file
                self.anomaly(f"files reader: {type(exc).__name__}: {exc}")
            self.stopping.wait(POLL_SECONDS)

    def poll(self) -> None:
        names = sorted(e.name for e in os.scandir(self.out)
                       if e.name.startswith("epoch-")) if self.out.exists() else []
        for name in set(self.seen) - set(names):
            self.anomaly(f"published {name} disappeared")
        for name in names:
            files = sorted(f for f in os.listdir(self.out / name) if not f.startswith((".", "_")))
            if name in self.seen:
                if files != self.seen[name][0]:
                    self.anomaly(f"{name} changed: {self.seen[name][0]} -> {files}")
                continue
            ids = np.concatenate([pq.read_table(self.out / name / f, columns=["id"])["id"]
                                  .to_numpy() for f in files]) if files else np.array([])
            first = int(ids.min()) if len(ids) else -1
            whole = (len(ids) == self.per_file and first % self.per_file == 0
                     and np.array_equal(np.sort(ids), np.arange(first, first + self.per_file)))
            if not whole:
                self.anomaly(f"{name}: torn or partial epoch ({len(ids)} rows, "
                             f"{len(np.unique(ids))} distinct, first id {first})")
            elif first in self.owner:
                self.anomaly(f"{name} repeats the input of {self.owner[first]}")
            self.owner.setdefault(first, name)
            self.seen[name] = (files, first)
        self.summary.reader_polls += 1

    def finish(self) -> None:
        self.poll()  # a last look at the final state


def run_files_job(tmp: Path, summary: Summary, delays: list[float]) -> None:
    from exactly.connectors.files.sink import FileSink
    from exactly.protocol.commitlog import CommitLog

    job = tmp / f"files-{summary.jobs}"
    events = job / "input"
    write_events(events, EPOCHS_PER_JOB * RECORDS_PER_EPOCH, EPOCHS_PER_JOB,
                 seed=summary.jobs)
    out = job / "out"
    command = python_command("pipeline", "--input", str(events), "--output", str(out),
                             "--checkpoint", str(job / "ck"), "--max-files-per-epoch", "1")
    with EpochDirReader(out, RECORDS_PER_EPOCH, summary):
        attempts = run_with_crashes(command, [], kill_after=delays, timeout=900,
                                    on_end=progress("files", summary))
    summary.add_attempts(attempts)
    report = verify(events, out)
    summary.records_audited += report.found_rows
    summary.missing += report.missing.count
    summary.duplicated += report.duplicated.count + report.unexpected.count
    summary.epochs_committed += len(list(out.glob("epoch-*")))
    sink = FileSink(str(out))
    query_id = json.loads((sink.log_directory / "query.json").read_text())["query_id"]
    summary.left_over_pre_commits += len(sink.list_pre_commits(query_id))
    summary.left_over_pre_commits += len(CommitLog(sink.log_directory).incomplete_intents())


def test_file_sink_random_time_kills_of_the_whole_tree_lose_and_duplicate_nothing(tmp_path):
    summary = Summary("files (exactly pipeline, local[2])")
    soak(summary, random.Random(SEED), quotas()[0],
         lambda s, delays: run_files_job(tmp_path, s, delays))
    summary.print_and_record()
    assert_clean(summary)


# -- PostgreSQL ------------------------------------------------------------------------------


class TablePoller(SoakReader):
    """Polls a table during the run: no id ever visible twice, the row count never drops."""

    def __init__(self, dsn: str, table: str, summary: Summary) -> None:
        super().__init__(summary)
        self.dsn, self.table = dsn, table
        self.rows = 0

    def run(self) -> None:
        import psycopg

        while not self.stopping.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    while not self.stopping.is_set():
                        self.poll(conn)
                        self.stopping.wait(POLL_SECONDS)
            except psycopg.errors.UndefinedTable:
                self.stopping.wait(0.5)  # the job has not created it yet
            except psycopg.Error as exc:
                self.anomaly(f"postgres reader: {type(exc).__name__}: {exc}")
                self.stopping.wait(0.5)

    def poll(self, conn) -> None:
        rows, distinct = conn.execute(
            f'SELECT count(*), count(DISTINCT id) FROM "{self.table}"').fetchone()
        if rows != distinct:
            self.anomaly(f"{self.table}: {rows - distinct} id(s) visible twice")
        if rows < self.rows:
            self.anomaly(f"{self.table}: row count went down {self.rows} -> {rows}")
        self.rows = max(self.rows, rows)
        self.summary.reader_polls += 1



def run_postgres_job(pg, tmp: Path, summary: Summary, delays: list[float]) -> None:
    from exactly.audit import audit_ids, pg_table_ids
    from exactly.connectors.postgres.two_phase import prepared_count
    from exactly.demos.postgres_job import DSN_ENV, command
    from exactly.protocol.commitlog import CommitLog

    rows = EPOCHS_PER_JOB * RECORDS_PER_EPOCH
    table = f"soak_{uuid.uuid4().hex[:8]}"
    ck = tmp / f"pg-{summary.jobs}" / "ck"
    args = command("--sink", "2pc", "--table", table, "--checkpoint", str(ck), "--rows",
                   str(rows), "--rows-per-epoch", str(RECORDS_PER_EPOCH), "--partitions", "2")
    with TablePoller(pg.dsn, table, summary):
        attempts = run_with_crashes(args, [], env={DSN_ENV: pg.dsn}, kill_after=delays,
                                    timeout=900, on_end=progress("postgres", summary))
    summary.add_attempts(attempts)
    with pg.connect() as conn:
        report = audit_ids(pg_table_ids(conn, table), np.arange(rows))
        summary.left_over_pre_commits += prepared_count(conn)
    summary.records_audited += report.found_rows
    summary.missing += len(report.missing)
    summary.duplicated += len(report.duplicated) + len(report.unexpected)
    log = CommitLog(ck / "exactly-sink")
    summary.epochs_committed += len(log.completed_epochs())
    summary.left_over_pre_commits += len(log.incomplete_intents())


def test_postgres_2pc_random_time_kills_of_the_whole_tree_lose_and_duplicate_nothing(tmp_path):
    from exactly.testing.pgcluster import TempPostgres

    summary = Summary("postgres 2PC (postgres_job --sink 2pc, local[2])")
    with TempPostgres(max_prepared_transactions=20) as pg:
        soak(summary, random.Random(SEED + 1), quotas()[1],
             lambda s, delays: run_postgres_job(pg, tmp_path, s, delays))
    summary.print_and_record()
    assert_clean(summary)


def assert_clean(summary: Summary) -> None:
    assert summary.kills >= 1
    assert summary.reader_polls > 0
    assert summary.records_audited == summary.jobs * EPOCHS_PER_JOB * RECORDS_PER_EPOCH
    assert (summary.missing, summary.duplicated) == (0, 0), summary.anomalies
    assert summary.reader_anomalies == 0, summary.anomalies
    assert summary.left_over_pre_commits == 0
    assert summary.processes_left == 0, summary.anomalies
