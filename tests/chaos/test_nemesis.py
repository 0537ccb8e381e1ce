"""Every exactly-once sink under the nemesis: network faults between the job and its server,
the ambiguous commit, paused processes, a full disk and kills, at random times from a seed,
while readers watch the output; then a checker names every anomaly it saw.

One ``exactly run`` per sink (the datagen job of tests/ops/jobs, a fixed-delay restart
strategy), its checkpoint -- and with it the sink's staging log -- on a small tmpfs disk, its
server (PostgreSQL, S3Proxy, the Kafka broker) behind a :class:`FaultProxy`. Once the job has
committed its first epoch, a :class:`Nemesis` runs a schedule that holds every kind of fault
the sink can meet at least once; then every fault is healed, the job drains its input, stops
on command, and the checker compares what the readers saw and what the target finally holds
with the input. The fault log goes with every failure (``fault_log`` in the message, and
``faults.jsonl`` in the test's directory): ``EXACTLY_NEMESIS_SEED`` replays a run.

Default lane: one short run per sink (each kind of fault once, a few more at random). Slow lane
(``EXACTLY_SLOW=1``) / ``scripts/soak --nemesis``: ``EXACTLY_NEMESIS_FAULTS`` faults per sink
(default 200), with ``EXACTLY_NEMESIS_REPORT`` naming a JSON-lines file for the summary table.
Clock jumps are not in these runs: the job's leases take their clock in-process only, so they
are proven by tests/unit/test_lease_clock_jumps.py (see docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exactly.audit import audit_ids
from exactly.procs import ProcessesSurvived
from exactly.testing.nemesis import actions
from exactly.testing.nemesis.disk import SmallDisk, why_unavailable
from exactly.testing.nemesis.faultlog import FaultLog
from exactly.testing.nemesis.processes import driver_pids, executor_pids, tree_pids
from exactly.testing.nemesis.proxy import FaultProxy, contains
from exactly.testing.nemesis.schedule import Action, FaultSchedule, Nemesis
from exactly.testing.supervised import SupervisedRun

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(why_unavailable() is not None,
                                 reason=f"the nemesis's full disk: {why_unavailable()}")]

JOB = Path(__file__).parents[1] / "ops" / "jobs" / "datagen_job.py"
SLOW = os.environ.get("EXACTLY_SLOW") == "1"
SEED = int(os.environ.get("EXACTLY_NEMESIS_SEED", "28"))
#: faults per sink: the default lane holds each kind once and a few more
FAULTS = int(os.environ.get("EXACTLY_NEMESIS_FAULTS", "200" if SLOW else "0"))
EXTRA_FAULTS = 2
ROWS_PER_EPOCH = 200
#: rows per second of the job's input
RATE = 400


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
    final_ids: Callable[[], np.ndarray]
    #: the faults of the sink's server, given the run's fault log
    server_actions: Callable[[FaultLog], dict[str, Action]] = lambda log: {}
    leftovers: Callable[[], int] = lambda: 0


def schedule_for(kinds: list[str]) -> FaultSchedule:
    count = FAULTS or len(kinds) + EXTRA_FAULTS
    return FaultSchedule.random(SEED, kinds, count, gap=(0.3, 1.5), duration=(0.5, 2.5),
                                durations={actions.KILL: (0.0, 0.0),
                                           "net.cut": (0.0, 0.0),
                                           actions.ANSWER: (2.0, 4.0)})


def run_under_nemesis(tmp_path: Path, target: Target) -> Summary:
    summary = Summary(target.sink, SEED)
    started = time.monotonic()
    log = FaultLog(tmp_path / "faults.jsonl", seed=SEED)
    disk = SmallDisk(tmp_path / "disk", 256 << 20).mount()
    checkpoint = disk.path / "ck"
    kinds_known = sorted(["kill", "pause.driver", "pause.executor", actions.DISK,
                          *target.server_actions(FaultLog())])
    schedule = schedule_for(kinds_known)
    # the input lasts as long as the faults do: every fault meets a job at work
    rows = max(target.rows, int(RATE * (schedule.faults[-1].at + 10)))
    target.rows = rows
    env = {"JOB_ROWS": str(rows), "JOB_RATE": str(RATE),
           "JOB_MAX_ROWS": str(ROWS_PER_EPOCH), "JOB_INTERVAL": "500ms",
           "PYSPARK_PYTHON": sys.executable, **target.env}
    run = SupervisedRun(JOB, checkpoint, env, "--restart-strategy", "fixed-delay",
                        "--restart-option", "attempts=1000", "--restart-option", "delay=1s",
                        log=tmp_path / "run.log")
    nemesis = None
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 1, "the first epoch", timeout=180)

        def driver() -> int | None:
            status = run.status()
            return status.driver.pid if status is not None and status.driver else None

        kinds: dict[str, Action] = {
            actions.KILL: actions.kill_action(driver),
            "pause.driver": actions.pause_action(
                lambda: driver_pids(driver() or 0), "driver", log),
            "pause.executor": actions.pause_action(
                lambda: executor_pids(driver() or 0), "executor", log),
            actions.DISK: actions.disk_action(lambda: disk.fill(), disk.free),
            **target.server_actions(log)}
        assert sorted(kinds) == kinds_known
        nemesis = Nemesis(schedule, kinds, log).start()
        assert nemesis.wait(600), "the nemesis did not finish its schedule"
        assert not nemesis.errors, nemesis.errors
        summary.faults = nemesis.counts()
        summary.answer_faults_fired = sum(
            1 for e in log.entries if e["kind"] == "net.answer_fault")
        expected = target.rows

        def drained() -> bool:
            return len(np.unique(target.final_ids())) >= expected
        run.wait_for(drained, "every row in the target after the faults", timeout=300)
        stopped = run.command("stop", str(checkpoint))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0, run.output()[-3000:]
    except BaseException:
        print(f"fault log ({tmp_path / 'faults.jsonl'}):\n{log.text()}")
        raise
    finally:
        if nemesis is not None:
            nemesis.stop()
        try:
            run.close()
        except ProcessesSurvived as exc:
            summary.processes_left = len(exc.args)
            raise
        finally:
            summary.wall_s = time.monotonic() - started
            summary.epochs = len(run.committed_epochs()) if checkpoint.exists() else 0
            summary.recoveries = sum(1 for e in run.history() if e["event"] == "recovered")
            disk.unmount()
    ids = target.final_ids()
    report = audit_ids(ids, np.arange(target.rows, dtype=np.int64))
    summary.records_audited = len(ids)
    summary.missing = len(report.missing)
    summary.duplicated = len(report.duplicated)
    summary.leftovers = target.leftovers()
    summary.record()
    print(f"fault log: {tmp_path / 'faults.jsonl'}")
    assert report.ok, f"{report.rows()}\nfault log:\n{log.text()}"
    assert summary.leftovers == 0
    assert set(summary.faults) == set(kinds), "a kind of fault never ran"
    return summary


def test_the_file_sink_under_pauses_a_full_disk_and_kills_commits_every_row_once(tmp_path):
    out = tmp_path / "out"

    def final_ids() -> np.ndarray:
        from exactly.audit import file_ids
        return file_ids(out)[0] if out.exists() else np.array([], dtype=np.int64)

    target = Target("files", {"JOB_SINK": "files", "JOB_OUT": str(out)}, 3000, final_ids)
    summary = run_under_nemesis(tmp_path, target)
    assert summary.faults.keys() >= {"kill", "pause.driver", "pause.executor", "disk.full"}


def _pg_target(sink: str, pg: Any, conn: Any, table: str, proxy: FaultProxy) -> Target:
    def final_ids() -> np.ndarray:
        try:
            rows = conn.execute(f'SELECT id FROM "{table}"').fetchall()
        except Exception:  # not created yet
            return np.array([], dtype=np.int64)
        return np.array([r[0] for r in rows], dtype=np.int64)

    def leftovers() -> int:
        return conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]

    def server(log: FaultLog) -> dict[str, Action]:
        proxy.log = log
        commit = contains(b"COMMIT PREPARED" if sink == "postgres" else b"COMMIT")
        return {**actions.network_actions(proxy, commit),
                actions.SERVER_PAUSE: actions.pause_action(lambda: tree_pids(pg.pid or 0),
                                                           "postgres", log)}

    dsn = pg.dsn.replace(f":{pg.port}/", f":{proxy.port}/")
    return Target(sink, {"JOB_SINK": sink, "JOB_DSN": dsn, "JOB_TABLE": table}, 3000,
                  final_ids, server, leftovers)


@pytest.fixture
def pg_proxy(pg):
    with FaultProxy("127.0.0.1", pg.port, name="postgres") as proxy:
        yield proxy


@pytest.mark.parametrize("sink", ["postgres", "wal"])
def test_a_postgres_sink_under_network_faults_pauses_a_full_disk_and_kills_commits_every_row_once(
        tmp_path, pg, conn, table_name, pg_proxy, sink):
    target = _pg_target(sink, pg, conn, table_name, pg_proxy)
    summary = run_under_nemesis(tmp_path, target)
    assert summary.faults.keys() >= {"net.answer", "pause.server", "net.blackhole"}
