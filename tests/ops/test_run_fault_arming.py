"""The environment arms no fault and chooses no commit path: a plain ``exactly run`` with the
old test switches in its environment runs to the end without a kill or a restart, every id
once. (``exactly run --fault`` does kill: tests/ops/test_run_restarts.py.)"""

from __future__ import annotations

import numpy as np
from supervised import SupervisedRun

from exactly.audit import audit_ids, file_ids

ROWS = 900


def test_a_plain_run_with_fault_variables_in_its_environment_kills_nothing(tmp_path):
    out, ck, marker = tmp_path / "out", tmp_path / "ck", tmp_path / "fired.json"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(ROWS), "JOB_RATE": "0", "JOB_MAX_ROWS": "300",
           "JOB_INTERVAL": "500ms",
           # what once armed a SIGKILL of the driver's tree and switched the commit path
           "EXACTLY_FAULT": "after_intent", "EXACTLY_FAULT_MARKER": str(marker),
           "EXACTLY_FAULT_ACTION": "kill", "EXACTLY_COMMIT_PATH": "sink-runner"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log")
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
