"""``exactly stop`` and ``exactly cancel`` from outside the driver, through the checkpoint.

(A stop during a busy epoch commits it, and the next run continues and drains:
tests/ops/test_launcher_where_it_runs.py, whose driver stops so after its launcher died.)"""

from __future__ import annotations

import numpy as np
import pytest
from supervised import SupervisedRun

from exactly.audit import file_ids
from exactly.checkpoint.spark_files import batch_numbers
from exactly.testing.file_output import assert_no_dangling_pre_commits


def _in_flight(ck) -> bool:
    """An epoch is in flight: its offsets are logged, its commit is not."""
    offsets, commits = batch_numbers(str(ck), "offsets"), batch_numbers(str(ck), "commits")
    return bool(offsets) and (not commits or offsets[-1] > commits[-1])


def test_cancel_with_delete_on_cancellation_removes_the_checkpoint_and_leaves_no_pre_commit(
        tmp_path):
    ck, out = tmp_path / "ck", tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": "100000", "JOB_RATE": "0", "JOB_MAX_ROWS": "300",
           "JOB_SLOW_MS": "1000", "JOB_CHECKPOINT_CLEANUP": "delete_on_cancellation"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 2, "two epochs")
        run.wait_for(lambda: _in_flight(ck), "the next, slow epoch in flight")
        cancelled = run.command("cancel", str(ck))
        assert cancelled.returncode == 0, cancelled.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    assert not ck.exists(), "delete_on_cancellation left the checkpoint"
    ids, _ = file_ids(out)
    assert len(ids) == len(np.unique(ids)) and len(ids) % 300 == 0  # whole epochs only
    assert_no_dangling_pre_commits(out)


@pytest.mark.slow  # CI budget: the decision is proven without Spark in
# tests/unit/test_job_control.py; this is the whole path, from a kill to the drained input
def test_stop_drain_sent_between_restarts_waits_for_the_next_driver_and_drains(tmp_path):
    """A 20,000-row job is killed; ``exactly stop --drain`` arrives during the restart's
    wait (no driver runs). It is not answered as a plain stop: the next driver drains the
    input present now, every id once, and the answer says drained."""
    import subprocess

    from supervised import EXACTLY

    rows, out, ck = 20_000, tmp_path / "out", tmp_path / "ck"
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "0", "JOB_MAX_ROWS": "500",
           "JOB_INTERVAL": "1s"}
    run = SupervisedRun("datagen_job.py", ck, env, "--restart-strategy", "fixed-delay",
                        "--restart-option", "attempts=3", "--restart-option", "delay=8s",
                        log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 2, "two epochs")
        run.kill_driver_tree()
        run.wait_for(lambda: run.status().state == "restarting", "the restart's wait")
        drain = subprocess.run([*EXACTLY, "stop", "--drain", str(ck)], capture_output=True,
                               text=True, timeout=300)
        assert drain.returncode == 0, drain.stdout + drain.stderr
        assert "drained" in drain.stdout + drain.stderr, drain.stdout + drain.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    ids = file_ids(out)[0]
    assert len(ids) == len(np.unique(ids)) == rows
    assert run.status().state == "stopped"
