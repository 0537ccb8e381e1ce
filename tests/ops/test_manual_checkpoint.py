"""``exactly checkpoint CK``: a manual checkpoint of a running job (Flink's ``flink
checkpoint``), answered with the first epoch that starts after the request and commits."""

from __future__ import annotations

import json

import numpy as np
from supervised import SupervisedRun

from exactly.audit import audit_ids, file_ids
from exactly.checkpoint.spark_files import batch_numbers


def _settled(ck) -> bool:
    """At least one epoch committed and none in flight."""
    offsets, commits = batch_numbers(str(ck), "offsets"), batch_numbers(str(ck), "commits")
    return bool(commits) and offsets[-1:] == commits[-1:]


def test_manual_checkpoint_waives_the_min_pause_and_is_recorded_as_manual(tmp_path):
    """A job whose min pause (30 s) holds its next epoch back: ``exactly checkpoint`` is
    answered with a new epoch (past every epoch logged when it was sent), committed and
    marked manual in ``exactly checkpoints --json``; the output is exactly once."""
    ck, out = tmp_path / "ck", tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": "100000", "JOB_RATE": "200",
           "JOB_INTERVAL": "1s", "JOB_CHECKPOINT_MIN_PAUSE": "30s"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: _settled(ck), "a first epoch committed, none in flight")
        logged = batch_numbers(str(ck), "offsets")[-1]
        answered = run.command("checkpoint", "--json", str(ck), "--timeout", "2min")
        assert answered.returncode == 0, answered.stdout + answered.stderr
        answer = json.loads(answered.stdout)
        epoch = answer["epoch"]
        assert answer["status"] == "done" and not answer["nothing_new"], answer
        assert epoch > logged, (epoch, logged)
        assert epoch in batch_numbers(str(ck), "commits")
        plain = run.command("checkpoints", "--json", str(ck))
        assert plain.returncode == 0, plain.stderr
        view = json.loads(plain.stdout)
        row = next(r for r in view["history"] if r["epoch"] == epoch)
        assert row["trigger"] == "manual" and row["status"] == "completed", row
        assert view["counts"]["manual"] == 1
        assert all(r["trigger"] == "periodic" for r in view["history"] if r["epoch"] != epoch)
        stopped = run.command("stop", str(ck))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    ids = file_ids(out)[0]
    report = audit_ids(ids, np.arange(len(ids), dtype=np.int64))  # the generator's prefix
    assert len(ids) > 0 and report.ok, report.rows()


def test_manual_checkpoint_without_new_input_answers_the_last_epoch_as_nothing_new(tmp_path):
    """All input is in (one epoch): Spark runs no new epoch, so the answer is the last
    committed epoch, said to hold everything (nothing new arrived), not a hang."""
    ck, out = tmp_path / "ck", tmp_path / "out"
    env = {"JOB_OUT": str(out), "JOB_ROWS": "500", "JOB_RATE": "0", "JOB_INTERVAL": "1s"}
    run = SupervisedRun("datagen_job.py", ck, env, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: _settled(ck) and len(np.unique(file_ids(out)[0])) == 500,
                     "every row committed")
        last = batch_numbers(str(ck), "commits")[-1]
        answered = run.command("checkpoint", "--json", str(ck), "--timeout", "2min")
        assert answered.returncode == 0, answered.stdout + answered.stderr
        answer = json.loads(answered.stdout)
        assert answer["status"] == "done" and answer["nothing_new"], answer
        assert answer["epoch"] == last == batch_numbers(str(ck), "commits")[-1], answer
        stopped = run.command("stop", str(ck))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    report = audit_ids(file_ids(out)[0], np.arange(500, dtype=np.int64))
    assert report.ok, report.rows()
