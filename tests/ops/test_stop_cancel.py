"""``exactly stop`` and ``exactly cancel`` from outside the driver, through the checkpoint."""

from __future__ import annotations

import time

import numpy as np
from supervised import SupervisedRun

from exactly.audit import audit_ids, file_ids
from exactly.spark.checkpoint import batch_numbers
from exactly.testing.file_output import assert_no_dangling_pre_commits


def test_stop_during_a_busy_epoch_commits_it_and_a_restart_continues_then_drains(tmp_path):
    rows = 4000
    ck, out = tmp_path / "ck", tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "0", "JOB_MAX_ROWS": "400",
           "JOB_SLOW_MS": "1500", "JOB_INTERVAL": "500ms"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run1.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 1, "a first epoch")
        # an epoch takes >= 1.5 s (the UDF sleeps): right after a commit the next is in flight
        done = len(run.committed_epochs())
        run.wait_for(lambda: len(batch_numbers(str(ck), "offsets")) > done, "an epoch in flight")
        in_flight = max(batch_numbers(str(ck), "offsets"))
        stopped = run.command("stop", str(ck))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    assert f"stopped after epoch {in_flight}" in stopped.stdout  # the busy epoch committed
    assert batch_numbers(str(ck), "offsets")[-1] == batch_numbers(str(ck), "commits")[-1]
    ids, _ = file_ids(out)
    assert len(ids) == len(np.unique(ids)) and len(ids) == (in_flight + 1) * 400

    # the restart continues from there; a drain then finishes the input there now and stops
    again = SupervisedRun("datagen_job.py", ck, {**env, "JOB_SLOW_MS": "0", "JOB_INTERVAL": "3s"},
                          log=tmp_path / "run2.log")
    try:
        again.wait_for(lambda: len(again.committed_epochs()) > in_flight + 1, "one more epoch")
        drained = again.command("stop", "--drain", str(ck))
        assert drained.returncode == 0, drained.stderr
        assert again.wait(timeout=180) == 0, again.output()[-3000:]
    finally:
        again.close()
    assert "drained" in drained.stdout
    report = audit_ids(file_ids(out)[0], np.arange(rows, dtype=np.int64))
    assert report.ok, report.rows()


def test_cancel_with_delete_on_cancellation_removes_the_checkpoint_and_leaves_no_pre_commit(
        tmp_path):
    ck, out = tmp_path / "ck", tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": "100000", "JOB_RATE": "0", "JOB_MAX_ROWS": "300",
           "JOB_SLOW_MS": "1000", "JOB_CHECKPOINT_CLEANUP": "delete_on_cancellation"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 2, "two epochs")
        time.sleep(0.5)  # into the next, slow epoch
        cancelled = run.command("cancel", str(ck))
        assert cancelled.returncode == 0, cancelled.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    assert not ck.exists(), "delete_on_cancellation left the checkpoint"
    ids, _ = file_ids(out)
    assert len(ids) == len(np.unique(ids)) and len(ids) % 300 == 0  # whole epochs only
    assert_no_dangling_pre_commits(out)
