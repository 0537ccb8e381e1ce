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
    rows = 150_000
    ck, out = tmp_path / "ck", tmp_path / "out"
    # 100 us a row: the whole backlog in one epoch would take 7.5 s on 2 cores, over the
    # target of 6 s. The target stays well above Spark's own cost of an epoch, which a loaded
    # machine stretches to 2-3 s: the sizer fits (target * 0.8 - that cost) / cost of a row
    # into an epoch, so a target near that cost (once 2 s) cut the backlog into more and
    # smaller epochs the more loaded the machine was (30 s alone, 180 s in a loaded lane)
    env = {"JOB_OUT": str(out), "JOB_ROWS": str(rows), "JOB_RATE": "0",
           "JOB_ROW_COST_US": "100", "JOB_INTERVAL": "200ms", "JOB_CHECKPOINT_TARGET": "6s"}
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
    print(f"rows per epoch with a 6 s target: {sizes}")
    assert len(sizes) >= 3 and max(sizes) < rows, sizes
    report = audit_ids(file_ids(out)[0], np.arange(rows, dtype=np.int64))
    assert report.ok, report.rows()
