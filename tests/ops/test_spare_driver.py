"""``exactly run``'s warm spare driver: it takes the job over when the active driver's tree
is SIGKILLed, a new spare starts behind it, a killed spare is replaced, the driver and its
spare killed together restart from scratch -- every id exactly once in the output."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from supervised import EXACTLY, JOBS, SupervisedRun, ids_in

from exactly.audit import audit_ids, file_ids
from exactly.procs import JOB_TOKEN_ENV, job_processes, kill_job


class Watched:
    """The drivers and spares ``job.json`` showed while the test looked (by pid)."""

    def __init__(self, run: SupervisedRun) -> None:
        self.run = run
        self.drivers: list[int] = []
        self.spares: list[int] = []

    def look(self) -> None:
        status = self.run.status()
        if status is None:
            return
        if status.driver is not None and status.driver.pid not in self.drivers:
            self.drivers.append(status.driver.pid)
        spare = (status.spare or {}).get("process")
        if spare and spare["pid"] not in self.spares:
            self.spares.append(spare["pid"])

    def spare(self, state: str = "ready") -> int | None:
        """The spare's pid while it is in ``state``."""
        self.look()
        status = self.run.status()
        found = (status.spare or {}) if status is not None else {}
        return found["process"]["pid"] if found.get("state") == state else None

    def wait(self, condition, what: str, timeout: float = 150) -> None:
        def looked() -> bool:
            self.look()
            return bool(condition())
        self.run.wait_for(looked, what, timeout=timeout)


def _kill_tree(pid: int) -> None:
    """SIGKILL a driver process (the active one or the spare) and every process of its job
    token (its JVM, PySpark's daemons, which leave its process group); checks none is left."""
    token = psutil.Process(pid).environ().get(JOB_TOKEN_ENV)
    assert token, f"pid {pid} carries no job token"
    kill_job(token, psutil.Process(pid), what=f"the driver {pid}")
    assert not job_processes(token)


def test_spare_driver_off_keeps_none_and_on_with_spark_connect_is_refused(tmp_path):
    """``--spare-driver on`` with ``--remote`` is refused before anything starts, naming
    why; a bad value is a usage error."""
    job = str(JOBS / "datagen_job.py")

    def exactly_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*EXACTLY, "run", job, *args], capture_output=True, text=True,
                              timeout=120)

    refused = exactly_run("--checkpoint", str(tmp_path / "ck"), "--remote",
                          "sc://127.0.0.1:1", "--spare-driver", "on")
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert "--spare-driver on" in last and "Spark Connect" in last, refused.stderr
    bad = exactly_run("--spare-driver", "maybe")
    assert bad.returncode == 2 and "maybe" in bad.stderr
    assert not (tmp_path / "ck").exists()


@pytest.mark.slow  # CI budget: the spare's path is in the test above; this one proves the
# opt-out leaves the launcher with the one driver it had before spares existed
def test_a_spare_is_never_started_with_spare_driver_off(tmp_path):
    """``--spare-driver off``: job.json never shows a spare and the launcher has one driver
    process below it while the job runs."""
    out = tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": "6000", "JOB_RATE": "400", "JOB_INTERVAL": "500ms"}
    run = SupervisedRun("datagen_job.py", tmp_path / "ck", env, "--spare-driver", "off",
                        log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: run.status() is not None and run.status().state == "running"
                     and ids_in(out) > 0, "a committed epoch")
        deadline = time.monotonic() + 12  # longer than SPARE_AFTER_S
        while time.monotonic() < deadline:
            assert run.status().spare is None
            drivers = [p for p in psutil.Process(run.proc.pid).children()
                       if "exactly.ops.driver" in " ".join(p.cmdline())]
            assert len(drivers) == 1, [p.cmdline() for p in drivers]
            time.sleep(0.5)
        stopped = run.command("stop", str(tmp_path / "ck"))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0
    finally:
        run.close()
    assert json.loads((tmp_path / "ck" / "exactly-job" / "job.json").read_text())["spare"] is None


#: the driver's protocol points (DESIGN.md section 3), one SIGKILL each in one run, 12 epochs
#: apart: each new active driver commits an epoch, then its spare starts and gets warm
POINTS = ("before_intent", "after_intent", "between_commits", "after_commits",
          "after_complete")
SPACING = 12


def _sink_env(sink: str, tmp_path: Path, request) -> tuple[dict[str, str], object]:
    """The job's environment for ``sink`` and a function that reads the ids it holds."""
    if sink == "files":
        out = tmp_path / "out"
        return {"JOB_OUT": str(out)}, lambda: file_ids(out)[0] if out.exists() else np.array([])
    if sink == "delta":
        from deltalake import DeltaTable

        table = tmp_path / "delta"

        def delta_ids() -> np.ndarray:
            if not (table / "_delta_log").exists():
                return np.array([], dtype=np.int64)
            return DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_numpy()
        return {"JOB_SINK": "delta", "JOB_DELTA_PATH": str(table)}, delta_ids
    if sink in ("postgres", "wal"):
        from exactly.audit import pg_table_ids

        pg, name = request.getfixturevalue("pg"), request.getfixturevalue("table_name")

        def pg_ids() -> np.ndarray:
            with pg.connect() as conn:
                try:
                    return pg_table_ids(conn, name)
                except Exception:
                    return np.array([], dtype=np.int64)
        return {"JOB_SINK": sink, "JOB_DSN": pg.dsn, "JOB_TABLE": name}, pg_ids
    from exactly.audit import json_ids
    from exactly.testing.kafka_broker import consume_all

    broker, topic = request.getfixturevalue("broker"), request.getfixturevalue("topic")
    return ({"JOB_SINK": "kafka", "JOB_BOOTSTRAP": broker.bootstrap, "JOB_TOPIC": topic},
            lambda: json_ids(v for _, _, _, v in consume_all(broker.bootstrap, topic,
                                                             timeout=10)))


@pytest.mark.chaos
@pytest.mark.parametrize("sink", [
    "files",
    pytest.param("postgres", marks=[pytest.mark.server, pytest.mark.slow]),
    pytest.param("wal", marks=[pytest.mark.server, pytest.mark.slow]),
    pytest.param("kafka", marks=[pytest.mark.server, pytest.mark.slow]),
    pytest.param("delta", marks=pytest.mark.slow),
])
def test_the_spare_takes_every_driver_point_kill_a_lost_spare_is_replaced_both_lost_restart_cold(
        sink, tmp_path, request):
    """One run, every id once in the sink: (1) ``exactly run --fault P1@E1,P2@E2,...``
    SIGKILLs the driver's whole tree at each of the driver's protocol points in turn; every
    time the warm spare takes the job over (the next driver is a process job.json showed as
    the spare) and a new spare starts behind it; (2) that spare's tree is SIGKILLed: the job
    goes on with the same driver, the launcher says so and starts another spare; (3) the
    driver and its spare are SIGKILLed together, at no protocol point: the next driver
    starts from scratch (a pid never seen as a spare). (The executor's point, ``in_write``,
    fails a task, which restarts the query inside the driver: no driver process dies.) The
    input outlasts the test however slow the machine (an exhausted input commits no epoch
    after a restart), so the audit is of every id the generator reached."""
    env, ids = _sink_env(sink, tmp_path, request)
    env.update({"JOB_ROWS": "10000000", "JOB_RATE": "100", "JOB_INTERVAL": "1s"})
    # the first kill waits SPACING epochs too: the first driver's first epochs catch up the
    # rows generated while it started (seconds on a loaded machine) and go by in about a
    # second, before its spare (started once it committed an epoch) exists
    schedule = ",".join(f"{point}@{(i + 1) * SPACING}" for i, point in enumerate(POINTS))
    marker = tmp_path / "fired.json"
    markers = [tmp_path / f"fired-{i}.json" for i in range(1, len(POINTS) + 1)]
    run = SupervisedRun("datagen_job.py", tmp_path / "ck", env, "--fault", schedule,
                        "--fault-marker", str(marker), "--restart-strategy", "fixed-delay",
                        "--restart-option", "attempts=10", "--restart-option", "delay=1s",
                        log=tmp_path / "run.log")
    watched = Watched(run)

    def held() -> int:
        return len(np.unique(ids()))
    try:
        # (1) a kill at every driver point, the spare taking over each time
        watched.wait(lambda: all(m.exists() for m in markers)
                     and len(watched.drivers) == len(POINTS) + 1
                     and run.status().state == "running", "every fault and a driver after it",
                     timeout=420)
        takeovers = list(watched.drivers)
        assert all(driver in watched.spares for driver in takeovers[1:]), (
            takeovers, watched.spares)
        active = takeovers[-1]

        # (2) the spare behind the last one is killed: the driver goes on, another starts
        watched.wait(lambda: watched.spare() not in (None, active), "a new spare behind it")
        killed_spare = watched.spare()
        _kill_tree(killed_spare)
        watched.wait(lambda: f"the spare driver (pid {killed_spare}) ended" in run.output(),
                     "the launcher's word on the lost spare")
        assert run.status().driver.pid == active  # the active driver was not touched
        watched.wait(lambda: watched.spare() not in (None, killed_spare), "another spare")
        third_spare = watched.spare()

        # (3) the driver and its spare die together: a driver from scratch
        recovered = len([e for e in run.history() if e["event"] == "recovered"])
        _kill_tree(active)
        _kill_tree(third_spare)
        watched.wait(lambda: run.status().driver.pid not in takeovers
                     and run.status().state == "running"
                     and len([e for e in run.history() if e["event"] == "recovered"])
                     > recovered, "a driver started from scratch that committed an epoch")
        cold = run.status().driver.pid
        assert cold not in watched.spares
        before = held()
        watched.wait(lambda: held() > before + 200, "epochs of the cold driver")
        stopped = run.command("stop", str(tmp_path / "ck"))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0, run.output()[-3000:]
    finally:
        run.close()
    fired = [json.loads(m.read_text())["point"] for m in markers]
    assert fired == list(POINTS)
    recoveries = [e["recovery_s"] for e in run.history() if e["event"] == "recovered"]
    print(f"{sink}: kill -> first committed epoch of the next driver, per point and then "
          f"cold: {recoveries}")
    failures = [e for e in run.history() if e["event"] == "failure"]
    assert [e["kind"] for e in failures] == ["process"] * (len(POINTS) + 1), failures
    assert run.status().state == "stopped" and run.status().spare is None
    found = ids()
    report = audit_ids(found, np.arange(int(found.max()) + 1, dtype=np.int64))
    assert report.ok, report.rows()


#: the flapping drill: a SIGKILL of the driver's tree every KILL_EVERY_S for WINDOW_S
KILL_EVERY_S, WINDOW_S, FLAP_RATE = 20.0, 180.0, 2000


@pytest.mark.chaos
@pytest.mark.slow  # 4 minutes: the drill's window is 3 minutes of kills
def test_a_driver_killed_every_20_seconds_for_3_minutes_commits_most_of_its_input_once(
        tmp_path):
    """datagen at 2,000 rows/s -> exactly.files; the active driver's tree is SIGKILLed every
    20 s for 3 minutes (9 kills). Every restart (the spare taking over) reaches a committed
    epoch before the next kill, the job commits >= 50 % of the rows the generator offered in
    the window (it offers rows only while a driver runs: time down is rows lost to
    throughput, not to correctness), and every id is in the output exactly once. Restart
    strategy fixed-delay 1 s: the default exponential-delay backs off on purpose under
    repeated failures (1.5x per failure: 17 s before the 8th restart, 26 s before the 9th),
    as Flink's does."""
    out = tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(10**9), "JOB_RATE": str(FLAP_RATE),
           "JOB_INTERVAL": "1s"}
    run = SupervisedRun("datagen_job.py", tmp_path / "ck", env, "--restart-strategy",
                        "fixed-delay", "--restart-option", "attempts=1000",
                        "--restart-option", "delay=1s", log=tmp_path / "run.log")
    watched = Watched(run)
    late: list[str] = []
    try:
        watched.wait(lambda: watched.spare() is not None, "a warm spare")
        start = time.monotonic()
        committed_before = ids_in(out)
        kills = 0
        while kills * KILL_EVERY_S < WINDOW_S:
            recovered = len([e for e in run.history() if e["event"] == "recovered"])
            if kills and recovered < kills:
                late.append(f"kill {kills + 1}: restart {kills} had committed no epoch")
            _kill_tree(run.status().driver.pid)
            kills += 1
            until = start + kills * KILL_EVERY_S
            while time.monotonic() < until:
                watched.look()
                time.sleep(0.2)
        recovered = len([e for e in run.history() if e["event"] == "recovered"])
        if recovered < kills:
            late.append(f"restart {kills} committed no epoch within {KILL_EVERY_S:.0f} s")
        committed = ids_in(out) - committed_before
        stopped = run.command("stop", str(tmp_path / "ck"))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0, run.output()[-3000:]
    finally:
        run.close()
    offered = FLAP_RATE * WINDOW_S
    recoveries = [e["recovery_s"] for e in run.history() if e["event"] == "recovered"]
    print(f"flapping: {kills} kills, committed {committed:,} of {offered:,.0f} rows offered "
          f"in {WINDOW_S:.0f} s ({committed / offered:.1%}); recoveries {recoveries}")
    assert not late, late
    assert committed >= 0.5 * offered, f"{committed:,} < half of {offered:,.0f}"
    ids = file_ids(out)[0]
    report = audit_ids(ids, np.arange(int(ids.max()) + 1, dtype=np.int64))
    assert report.ok, report.rows()
