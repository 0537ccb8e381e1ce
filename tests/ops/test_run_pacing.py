"""Epoch sizing set in CheckpointConfig reaches exactly's sources under ``exactly run``
(the supervisor writes the admission file, the sources obey it). Min pause: the Ctrl-C
test of test_run_restarts (datagen) and the Kafka outage test (exactly's Kafka reader)."""

from __future__ import annotations

import itertools
import json

import numpy as np
from supervised import SupervisedRun

from exactly.audit import audit_ids, file_ids


def _epoch_end_rows(ck, epoch: int) -> int:
    return json.loads((ck / "offsets" / str(epoch)).read_text().splitlines()[-1])["rows"]


def test_epoch_sizing_cuts_a_backlog_behind_a_slow_transform_into_smaller_epochs(tmp_path):
    rows = 200_000
    ck, out = tmp_path / "ck", tmp_path / "out"
    # 40 us a row: the whole backlog in one epoch would take 8 s, the target is 2 s
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "0",
           "JOB_ROW_COST_US": "40", "JOB_INTERVAL": "200ms", "JOB_CHECKPOINT_TARGET": "2s"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: run.committed_epochs() and _epoch_end_rows(
            ck, run.committed_epochs()[-1]) >= rows, "the whole backlog", timeout=240)
        assert run.command("stop", str(ck)).returncode == 0
        assert run.wait(timeout=120) == 0
    finally:
        run.close()
    ends = [0] + [_epoch_end_rows(ck, n) for n in run.committed_epochs()]
    sizes = [b - a for a, b in itertools.pairwise(ends) if b > a]
    print(f"rows per epoch with a 2 s target: {sizes}")
    assert len(sizes) >= 3 and max(sizes) < rows, sizes
    report = audit_ids(file_ids(out)[0], np.arange(rows, dtype=np.int64))
    assert report.ok, report.rows()
