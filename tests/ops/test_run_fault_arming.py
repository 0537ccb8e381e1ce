"""The environment arms no fault and chooses no commit path: a plain ``exactly run`` with the
old test switches in its environment runs to the end without a kill or a restart, every id
once. (``exactly run --fault`` does kill: tests/ops/test_run_restarts.py.) The same run
names no ``--checkpoint``: the job's ``CheckpointConfig(storage=...)`` is its address."""

from __future__ import annotations

import subprocess

import numpy as np
from supervised import EXACTLY, SupervisedRun

from exactly.audit import audit_ids, file_ids

ROWS = 900


def test_a_plain_run_with_fault_variables_in_its_environment_kills_nothing(tmp_path):
    """... and, started without --checkpoint, runs on the checkpoint its job names."""
    out, ck, marker = tmp_path / "out", tmp_path / "ck", tmp_path / "fired.json"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(ROWS), "JOB_RATE": "0", "JOB_MAX_ROWS": "300",
           "JOB_INTERVAL": "500ms", "JOB_CHECKPOINT_STORAGE": str(ck),
           # what once armed a SIGKILL of the driver's tree and switched the commit path
           "EXACTLY_FAULT": "after_intent", "EXACTLY_FAULT_MARKER": str(marker),
           "EXACTLY_FAULT_ACTION": "kill", "EXACTLY_COMMIT_PATH": "sink-runner"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log",
                        name_checkpoint=False)
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= ROWS // 300, "every epoch")
        stopped = run.command("stop", str(ck))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    assert not marker.exists(), marker.read_text()
    assert [e for e in run.history() if e["event"] == "failure"] == []
    assert "restarting" not in run.output()
    ids, _ = file_ids(out)
    report = audit_ids(ids, np.arange(ROWS, dtype=np.int64))
    assert report.ok, report.rows()


def test_a_run_without_checkpoint_of_a_job_that_names_none_fails_in_one_line(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("from exactly import Job\n"
                   "def build(spark):\n"
                   "    df = spark.readStream.format('exactly.datagen').load()\n"
                   f"    return Job(df, sink_format='exactly.files', path={str(tmp_path)!r})\n")
    shown = subprocess.run([*EXACTLY, "run", str(job)], capture_output=True, text=True,
                           timeout=180, cwd=tmp_path)
    assert shown.returncode == 3, shown.stderr
    last = shown.stderr.strip().splitlines()[-1]
    assert last.startswith("run failed: ConfigError: exactly run without --checkpoint: ")
    assert "give --checkpoint DIR, or CheckpointConfig(storage=DIR)" in last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]
