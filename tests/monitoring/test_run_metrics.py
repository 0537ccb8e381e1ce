"""``exactly run --metrics-port``: the running job's ``/metrics`` under Flink's names, served
by the launcher across a driver process restart, with the values ``exactly checkpoints
--json`` shows; a port in use fails the command before anything starts."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from exactly.testing.metrics import scrape
from exactly.testing.ports import free_port
from exactly.testing.supervised import EXACTLY, SupervisedRun

JOB = Path(__file__).parents[1] / "ops" / "jobs" / "datagen_job.py"
J = "flink_jobmanager_job_"
T = "flink_taskmanager_job_task_"


# CI budget: both variants run in the slow lane. The default lane scrapes the restored run
# of the wheel install test (tests/install/test_wheel_install.py), which compares the same
# Flink-named values with `exactly checkpoints --json`; these add the launcher's socket
# ownership (False, 32-46 s) and a driver restart counted on the endpoint (True, 44-73 s).
@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True])
def test_the_launcher_serves_flink_named_metrics_matching_checkpoints_json(tmp_path, kill):
    """800 rows in epochs of 100. The endpoint's socket belongs to the ``exactly run``
    process (the launcher), not to the driver; once the input drained, its Flink-named
    values equal ``exactly checkpoints --json`` read right after, and the record counters
    equal the input. ``kill``: in the 6th epoch a fault SIGKILLs the driver's whole tree and
    the launcher starts a new driver process (epochs 2-5 leave time for a scrape before):
    the endpoint answers before the kill and after it, counting the restart."""
    rows, port = 800, free_port()
    ck = tmp_path / "ck"
    env = {"JOB_OUT": str(tmp_path / "out"), "JOB_ROWS": str(rows), "JOB_RATE": "0",
           "JOB_MAX_ROWS": "100", "JOB_INTERVAL": "300ms"}
    args = ["--metrics-port", str(port)]
    if kill:
        args += ["--fault", "after_intent@5", "--fault-marker", str(tmp_path / "fired.json")]
    run = SupervisedRun(JOB, ck, env, *args, log=tmp_path / "run.log")
    seen: list[dict[str, float]] = []

    def drained() -> bool:
        values = scrape(port)
        if values is None or J + "numberOfCompletedCheckpoints" not in values:
            return False
        seen.append(values)
        return (values.get(T + "numRecordsIn", 0) >= rows
                and values[J + "numRestarts"] >= int(kill)
                and values[J + "numberOfInProgressCheckpoints"] == 0)

    try:
        run.wait_for(drained, "all rows read, seen on /metrics", timeout=240)
        status = run.status()
        assert status is not None and status.driver is not None
        assert _listens(run.proc.pid, port) and not _listens(status.driver.pid, port)
        if kill:
            before = [v for v in seen if v[J + "numRestarts"] == 0
                      and v[J + "numberOfCompletedCheckpoints"] >= 2]
            assert before, "no scrape answered during the first driver with 2 checkpoints"
        metrics = scrape(port)
        shown = run.command("checkpoints", str(ck), "--json")
        assert shown.returncode == 0, shown.stderr
        overview = json.loads(shown.stdout)
        assert metrics is not None
        counts, latest = overview["counts"], overview["latest"]["completed"]
        # the one kill, as the restart history says (none without it)
        assert counts["restarts"] == int(kill)
        kills = [e for e in run.history() if e["event"] == "failure"]
        assert [e["kind"] for e in kills] == ["process"] * int(kill)
        assert metrics[J + "numRestarts"] == counts["restarts"]
        assert metrics[J + "numberOfCompletedCheckpoints"] == counts["completed"] >= 8
        assert metrics[J + "numberOfFailedCheckpoints"] == counts["failed"]
        assert metrics[J + "numberOfInProgressCheckpoints"] == counts["in_progress"] == 0
        assert metrics[J + "totalNumberOfCheckpoints"] == counts["triggered"]
        assert metrics[J + "lastCheckpointDuration"] == latest["duration_ms"]
        assert metrics[J + "lastCheckpointSize"] == latest["new_bytes"]
        assert metrics[J + "lastCheckpointFullSize"] == latest["full_bytes"]
        assert metrics[J + "lastCompletedCheckpointId"] == latest["epoch"]
        # the counters against the input: every row once (a replayed epoch counted once)
        assert metrics[T + "numRecordsIn"] == rows
        assert metrics[T + "numRecordsOut"] == rows
        assert metrics[J + "uptime"] > 0 and metrics[J + "downtime"] == 0  # running
        assert metrics["exactly_job_lastCheckpointSinkCommitDuration"] >= 0
        run.signal(signal.SIGINT)
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()


def _listens(pid: int, port: int) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
               for c in psutil.Process(pid).net_connections(kind="tcp"))


def test_a_metrics_port_in_use_fails_exactly_run_before_anything_starts(tmp_path):
    """The port is bound at once: in use, ``exactly run`` exits 3 naming the port and the
    fix, and leaves no checkpoint behind (no driver, no Spark, no claim)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ended = subprocess.run([*EXACTLY, "run", str(JOB), "--checkpoint",
                                str(tmp_path / "ck"), "--metrics-port", str(port)],
                               capture_output=True, text=True, timeout=60)
    assert ended.returncode == 3, ended.stderr
    assert f"--metrics-port {port}: the port is in use" in ended.stderr
    assert not (tmp_path / "ck").exists()
