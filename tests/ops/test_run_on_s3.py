"""``exactly run`` with its checkpoint on S3 (S3Proxy): the launcher, the driver, the control
channel, the restart log and the history all live under ``s3a://``; a SIGKILL of the driver's
whole tree (the fault ``after_intent``) is restarted by the launcher; ``exactly checkpoints``
reads the job from S3 while it runs; ``exactly stop`` reaches it; every id once."""

from __future__ import annotations

import json

import numpy as np
import pytest
from supervised import SupervisedRun

from exactly.audit import audit_ids, file_ids
from exactly.checkpoint.location import open_store
from exactly.monitoring.server import Jobs

pytestmark = pytest.mark.chaos


@pytest.fixture
def s3_checkpoint(s3_bucket) -> str:
    """A checkpoint in a fresh bucket (``s3_bucket`` puts the server in the environment)."""
    return f"s3a://{s3_bucket}/jobs/orders"


def test_a_job_on_an_s3_checkpoint_survives_a_driver_kill_and_stops_on_command(
        tmp_path, s3_checkpoint, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # five epochs of 300 rows: three before the kill in epoch 3, its replay, one after it
    rows = 1500
    env = {"JOB_OUT": str(tmp_path / "out"), "JOB_ROWS": str(rows), "JOB_RATE": "0",
           "JOB_MAX_ROWS": "300", "JOB_INTERVAL": "500ms"}
    fired = tmp_path / "fault-fired.json"
    run = SupervisedRun("datagen_job.py", s3_checkpoint, env, "--fault", "after_intent@3",
                        "--fault-marker", str(fired), log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: any(e["event"] == "failure" and e["kind"] == "process"
                                 for e in run.history()), "the killed driver's failure")
        run.wait_for(lambda: any(e["event"] == "recovered" for e in run.history()),
                     "a new driver process that completes an epoch", timeout=180)
        run.wait_for(lambda: len(run.committed_epochs()) >= rows // 300,
                     "every epoch committed", timeout=180)
        shown = run.command("checkpoints", s3_checkpoint, "--json")
        assert shown.returncode == 0, shown.stderr
        overview = json.loads(shown.stdout)
        assert overview["status"] == "running"
        stopped = run.command("stop", s3_checkpoint)
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait() == 0, run.output()[-3000:]
    finally:
        run.close()
    assert json.loads(fired.read_text())["epoch"] == 3
    ids, _ = file_ids(tmp_path / "out")
    report = audit_ids(ids, np.arange(rows, dtype=np.int64))
    assert report.ok, report.rows()
    assert run.status().state == "stopped"
    [failure] = [e for e in run.history() if e["event"] == "failure"]
    assert failure["kind"] == "process" and failure["action"] == "restart"
    # the history on S3 holds every committed epoch once, and the restart
    final = json.loads(run.command("checkpoints", s3_checkpoint, "--json").stdout)
    assert final["status"] == "stopped"
    assert final["counts"]["completed"] == len(run.committed_epochs())
    assert final["counts"]["restarts"] == 1
    assert [r.get("kind") for r in final["restarts"] if r["event"] == "failure"] == ["process"]
    # nothing of the job is kept locally: no directory named after the URI
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault-fired.json", "out",
                                                          "run.log"]
    assert open_store(s3_checkpoint).exists("exactly-job/job.json")
    [(_, shown_by_ui)] = Jobs([s3_checkpoint]).all()  # what `exactly ui` serves
    assert shown_by_ui.overview.checkpoint == s3_checkpoint
    assert shown_by_ui.overview.counts == final["counts"]
    _doctor_and_restore_offsets_on_s3(run, s3_checkpoint, tmp_path / "out")


def _doctor_and_restore_offsets_on_s3(run: SupervisedRun, checkpoint: str, out) -> None:
    """`exactly doctor` checks the S3 checkpoint against the file sink's log (findings name
    the S3 objects); a deleted offsets entry of a committed epoch is an error that
    `exactly restore-offsets` repairs on S3 from the sink's record."""
    sink = ("--sink-path", str(out))
    clean = run.command("doctor", checkpoint, *sink, "--json")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert json.loads(clean.stdout)["checkpoint"] == checkpoint
    store = open_store(checkpoint)
    epoch = run.committed_epochs()[-1]
    kept = store.read(f"offsets/{epoch}")
    store.delete(f"offsets/{epoch}")
    broken = run.command("doctor", checkpoint, *sink, "--json")
    assert broken.returncode == 1
    errors = [f for f in json.loads(broken.stdout)["findings"] if f["severity"] == "error"]
    assert f"{checkpoint}/commits/{epoch}" in [e["path"] for e in errors], errors
    assert "exactly-mirror" not in broken.stdout  # no local copy is ever named
    repaired = run.command("restore-offsets", checkpoint, *sink, "--epoch", str(epoch))
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert store.read(f"offsets/{epoch}") == kept
    again = run.command("restore-offsets", checkpoint, *sink, "--epoch", str(epoch))
    assert again.returncode != 0 and "already holds the input" in again.stderr + again.stdout
    assert checkpoint in again.stderr + again.stdout
