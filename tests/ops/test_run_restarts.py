"""``exactly run`` heals a job: query restarts in the driver process, process restarts by the
launcher, both as the restart strategy says, with every id exactly once in the output."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
from supervised import SupervisedRun, audit_rows

from exactly.audit import file_ids


def _all_rows(out: Path, rows: int):
    def done() -> bool:
        try:
            ids, _ = file_ids(out)
        except (FileNotFoundError, OSError):
            return False
        return len(np.unique(ids)) >= rows
    return done


@pytest.mark.chaos
@pytest.mark.slow  # CI budget: in-process query restarts after a UDF failure are in the
# dashboard's live-job test and the checkpoint-timeout escalation (tests/ops/test_outages.py),
# a killed driver's tree restarted as a new process in tests/ops/test_run_on_s3.py,
# tests/ops/test_launcher_where_it_runs.py and the HA failovers, each audited by id
def test_udf_failures_restart_in_process_and_a_killed_driver_restarts_as_a_new_process(
        tmp_path):
    """Two UDF failures restart the query in the driver process; then the fault armed by
    ``exactly run --fault after_intent@4`` SIGKILLs the driver's whole tree and the launcher
    starts a new driver process, which goes on to every id exactly once. (6 epochs of 300
    rows: the UDF failures in epochs 2 and 3, the kill in epoch 4, its replay and one epoch
    after it.)"""
    rows = 1800
    env = {"JOB_OUT": str(tmp_path / "out"), "JOB_ROWS": str(rows), "JOB_RATE": "0",
           "JOB_MAX_ROWS": "300", "JOB_FAIL_IDS": "650,950", "JOB_MARKERS": str(tmp_path),
           "JOB_INTERVAL": "500ms"}
    fired = tmp_path / "fault-fired.json"
    run = SupervisedRun("datagen_job.py", tmp_path / "ck", env, "--fault", "after_intent@4",
                        "--fault-marker", str(fired), log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: run.status() is not None and run.status().driver is not None,
                     "the first driver")
        first_driver = run.status().driver.pid  # long before epoch 4: its JVM is starting
        run.wait_for(lambda: len([e for e in run.history() if e["event"] == "recovered"]) >= 2,
                     "two in-process recoveries")
        failures = [e for e in run.history() if e["event"] == "failure"][:2]
        assert [(e["kind"], e["action"]) for e in failures] == [("query", "restart")] * 2
        assert all("injected UDF failure" in e["cause"] for e in failures)

        run.wait_for(lambda: run.status().driver and run.status().driver.pid != first_driver
                     and len([e for e in run.history() if e["event"] == "recovered"]) >= 3,
                     "the fault's kill and a new driver process that completes an epoch")
        assert json.loads(fired.read_text())["epoch"] == 4
        run.wait_for(_all_rows(tmp_path / "out", rows), "every row in the output")
        stopped = run.command("stop", str(tmp_path / "ck"))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0, run.output()[-3000:]
    finally:
        run.close()
    history = run.history()
    kinds = [e["kind"] for e in history if e["event"] == "failure"]
    assert kinds == ["query", "query", "process"]  # the UDF failures kept the first driver
    recoveries = [e["recovery_s"] for e in history if e["event"] == "recovered"]
    print(f"recovery seconds: in-process {recoveries[:2]}, process {recoveries[2:]}")
    audit_rows(tmp_path / "out", rows)
    assert run.status().state == "stopped"
    _check_checkpoint_history(run, tmp_path / "ck", rows)


def _check_checkpoint_history(run: SupervisedRun, ck: Path, rows: int) -> None:
    """``exactly checkpoints --json`` after the run agrees with Spark's commit log, the
    restart history and the audited output: every committed epoch completed once in the
    history, its rows add up to the audited rows, both UDF failures are failed epochs with
    their cause, every restart is a restore."""
    shown = run.command("checkpoints", str(ck), "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    completed = [r for r in view["history"] if r["status"] == "completed"]
    assert sorted(r["epoch"] for r in completed) == run.committed_epochs()
    assert sum(r["rows_out"] for r in completed) == rows
    failed = [r for r in view["history"] if r["status"] == "failed"]
    query_failures = [r for r in failed if r["failure"] == "query"]
    assert len(query_failures) == 2
    assert all("injected UDF failure" in r["cause"] for r in query_failures)
    # a failed epoch is retried: each failed one completed later
    assert {r["epoch"] for r in failed} <= {r["epoch"] for r in completed}
    assert [r["failure"] for r in failed if r["failure"] != "query"] in ([], ["process"])
    restarts = [e for e in run.history() if e["event"] == "failure"]
    assert view["counts"]["restarts"] == len(restarts) == 3
    assert view["counts"]["restored"] == 3  # two query restarts, one new driver process
    assert view["counts"]["completed"] == len(run.committed_epochs())
    assert view["counts"]["failed"] == len(failed)
    assert view["status"] == "stopped" and view["warnings"] == []
    assert view["latest"]["restore"]["source"] == "checkpoint"


# CI budget: in the slow lane. The default lane gives up by the strategy in
# tests/unit/test_restart_strategies.py (fixed-delay, two attempts), gives up a real Spark
# job in process in tests/spark/test_repeated_failure.py, ends `exactly run` with exit 3 and
# the root cause as its last line in tests/ops/test_launcher_where_it_runs.py (an error in
# build), and keeps every epoch once across restarts in the UDF-failure test above
@pytest.mark.slow
def test_fixed_delay_with_two_attempts_fails_the_job_on_the_third_failure(tmp_path):
    env = {"JOB_OUT": str(tmp_path / "out"), "JOB_ROWS": "3000", "JOB_RATE": "0",
           "JOB_MAX_ROWS": "300", "JOB_FAIL_IDS": "350,650,950", "JOB_MARKERS": str(tmp_path),
           "JOB_INTERVAL": "500ms"}
    run = SupervisedRun("datagen_job.py", tmp_path / "ck", env, "--restart-strategy",
                        "fixed-delay", "--restart-option", "attempts=2", "--restart-option",
                        "delay=0s", log=tmp_path / "run.log")
    code = run.wait(timeout=240)
    assert code == 3, run.output()[-3000:]
    last = run.output().strip().splitlines()[-1]
    assert "injected UDF failure at id 950" in last and "gave up" in last, last
    actions = [e["action"] for e in run.history() if e["event"] == "failure"]
    assert actions == ["restart", "restart", "give-up"]
    assert run.status().state == "failed"
    ids, _ = file_ids(tmp_path / "out")
    assert len(ids) == len(np.unique(ids)), "a committed epoch was written twice"
    assert set(range(900)) <= set(ids.tolist())  # epochs before the last failure are in


def test_min_pause_second_run_fenced_and_ctrl_c_stops_gracefully_in_one_line(tmp_path):
    ck = tmp_path / "ck"
    env = {"JOB_OUT": str(tmp_path / "out"), "JOB_ROWS": "100000", "JOB_RATE": "200",
           "JOB_INTERVAL": "200ms", "JOB_CHECKPOINT_MIN_PAUSE": "1500ms"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 4, "four epochs")
        second = run.command("run", str(Path(__file__).parent / "jobs" / "datagen_job.py"),
                             "--checkpoint", str(ck))
        assert second.returncode == 3
        assert second.stderr.strip().splitlines()[-1].startswith("run failed: FencedError:")
        mark = len(run.output())
        run.signal(signal.SIGINT)
        assert run.wait(timeout=120) == 0
    finally:
        run.close()
    after = run.output()[mark:]
    assert "Traceback" not in after and "Py4J" not in after, after
    assert after.strip().splitlines()[-1] == "exactly run: job stopped"
    assert run.status().state == "stopped"
    ids, _ = file_ids(tmp_path / "out")
    assert len(ids) == len(np.unique(ids)) and ids.max() + 1 == len(ids)
    # min pause: no epoch's input was fixed (offsets/N+1) sooner than 1.5 s after the
    # previous epoch completed (commits/N), although rows arrived all the time
    gaps = run.pause_gaps()
    print(f"min pause 1.5 s, gaps: {gaps}")
    assert len(gaps) >= 3 and min(gaps) >= 1.5, gaps
