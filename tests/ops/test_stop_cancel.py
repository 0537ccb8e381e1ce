"""``exactly stop`` and ``exactly cancel`` from outside the driver, through the checkpoint.

(A stop during a busy epoch commits it, and the next run continues and drains:
tests/ops/test_launcher_where_it_runs.py, whose driver stops so after its launcher died.)"""

from __future__ import annotations

import numpy as np
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
