"""The savepoint commands for a job whose checkpoint is on S3 (S3Proxy, Spark's S3A), as a
user runs them: ``exactly savepoint CK`` while the job runs (into the default target beside
the checkpoint, ``s3://bucket/prefix.savepoints``), ``exactly stop --savepoint s3://...``
and ``exactly run -s s3://... --checkpoint s3a://... --parallelism 3`` with a new version
of the job (its first driver SIGKILLed once the restored checkpoint is on S3), and then
``-s s3a://RETAINED-CHECKPOINT`` through the same kill. Real Spark under
``exactly run``; the audit counts every id and checks each key's running totals against a
batch computation of the input. ``--inspect`` and ``--dispose`` on S3:
test_savepoints_on_s3.py.

A slow proof (marked ``slow``): the default lane is at its 20-minute budget; it keeps the
savepoints on S3 in process (test_savepoints_on_s3.py: a restore into
S3 rescaled and switched through a crash, a running job's savepoint read from its copy) and
``exactly run`` on S3 with a driver kill (tests/ops/test_run_on_s3.py); the same commands on a
cluster are in tests/chaos/test_cluster_on_s3.py, slow too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_restore_transform_with_state import assert_exactly_once
from test_savepoint_commands import JOB, env_for

from exactly.audit import file_ids
from exactly.checkpoint.location import open_store
from exactly.savepoints.manifest import MANIFEST, dispose, read_manifest
from exactly.savepoints.restore import read_marker
from exactly.testing.supervised import SupervisedRun

pytestmark = pytest.mark.server


def savepoint_uri(stdout: str) -> str:
    match = re.search(r"savepoint (s3://\S+)", stdout)
    assert match, stdout
    return match.group(1)


def ids_written(out: Path) -> int:
    """How many ids the output holds (every one once: assert_exactly_once checks)."""
    return len(file_ids(out)[0])


@pytest.mark.slow
def test_savepoints_of_a_job_on_s3_are_taken_inspected_disposed_and_restored_rescaled_on_s3(
        tmp_path, s3_bucket):
    ck, out = f"s3a://{s3_bucket}/jobs/totals", tmp_path / "out"
    run = SupervisedRun(JOB, ck, env_for(out), log=tmp_path / "run1.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 2, "two epochs", timeout=300)
        taken = run.command("savepoint", ck)  # the default target, beside the checkpoint
        assert taken.returncode == 0, taken.stderr
        running_sp = savepoint_uri(taken.stdout)
        assert running_sp.startswith(f"s3://{s3_bucket}/jobs/totals.savepoints/savepoint-")
        at = read_manifest(running_sp).epoch
        run.wait_for(lambda: max(run.committed_epochs()) > at, "an epoch after it", timeout=300)
        stopped = run.command("stop", "--savepoint", f"s3://{s3_bucket}/sps", ck)
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    final_sp = savepoint_uri(stopped.stdout)
    assert final_sp.startswith(f"s3://{s3_bucket}/sps/savepoint-")
    manifest = read_manifest(final_sp)
    assert manifest.trigger == "stop" and manifest.epoch == max(run.committed_epochs())
    assert manifest.job["checkpoint"] == ck
    assert read_manifest(running_sp).trigger == "savepoint"
    before = ids_written(out)
    assert_exactly_once(out, before)  # everything up to the savepoint, once
    assert [o.uid for o in manifest.operators] == ["running"]
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "s3a:").exists()

    # version 2 (a new dedup step before the running totals) on 3 state partitions goes on
    # from the savepoint on S3 into a new checkpoint on S3. Its first driver is killed once
    # the restored checkpoint is uploaded, before the restore says done, and the next one
    # restores again from scratch (the default lane crashes a restore into S3 at the same
    # point in-process, test_savepoints_on_s3.py)
    ck2, fired = f"s3a://{s3_bucket}/jobs/totals-v2", tmp_path / "fired"
    again = SupervisedRun(JOB, ck2, env_for(out, JOB_VERSION="v2"), "-s", final_sp,
                          "--parallelism", "3", "--fault", "restore.state", "--fault-marker",
                          str(fired), log=tmp_path / "run2.log")
    try:
        again.wait_for(lambda: max(again.committed_epochs(), default=-1) > manifest.epoch + 1,
                       "epochs after the restore", timeout=400)
        assert fired.exists()
        assert [e["kind"] for e in again.history() if e["event"] == "failure"] == ["process"]
        assert again.command("stop", ck2).returncode == 0
        assert again.wait(timeout=120) == 0, again.output()[-3000:]
    finally:
        again.close()
    after = ids_written(out)
    assert after > before  # went on from the savepoint: no gap, no repeat, totals kept
    assert_exactly_once(out, after)
    marker = read_marker(ck2)
    assert marker is not None and (marker["state"], marker["savepoint"]) == ("done", final_sp)
    assert sorted(marker["restored"]) == ["running: #0->#0 (repartition)"]
    assert marker["partitions"] == "2->3" and marker["new"] == ["dedup"]
    assert read_manifest(final_sp).files == manifest.files  # no_claim: untouched

    # the stopped job's checkpoint on S3 restores like a savepoint (-s CHECKPOINT)
    restore_a_retained_checkpoint_on_s3_through_a_kill(tmp_path, s3_bucket, out, ck2,
                                                       max(again.committed_epochs()))

    dispose(running_sp)  # the command: test_savepoints_on_s3.py
    assert not open_store(running_sp).any()
    assert open_store(final_sp).exists(MANIFEST)


def restore_a_retained_checkpoint_on_s3_through_a_kill(tmp_path: Path, bucket: str, out: Path,
                                                       retained: str, last: int) -> None:
    """``exactly run -s s3a://retained`` into a new checkpoint on S3 with the same job and
    partitions (its state copied, mapped by the uids the last run recorded), its first
    driver killed once the restored checkpoint is uploaded; every id once after it."""
    before = ids_written(out)
    ck3, fired = f"s3a://{bucket}/jobs/totals-v3", tmp_path / "fired3"
    third = SupervisedRun(JOB, ck3, env_for(out, JOB_VERSION="v2", JOB_PARTITIONS="3"),
                          "-s", retained, "--fault", "restore.state", "--fault-marker",
                          str(fired), log=tmp_path / "run3.log")
    try:
        third.wait_for(lambda: max(third.committed_epochs(), default=-1) > last + 1,
                       "epochs after the restore of the retained checkpoint", timeout=400)
        assert fired.exists()
        assert third.command("stop", ck3).returncode == 0
        assert third.wait(timeout=120) == 0, third.output()[-3000:]
    finally:
        third.close()
    marker = read_marker(ck3)
    assert marker is not None and marker["state"] == "done" and marker["epoch"] == last
    assert marker["savepoint"] == retained.replace("s3a://", "s3://")
    assert sorted(marker["restored"]) == ["dedup: #1->#1 (copy)", "running: #0->#0 (copy)"]
    assert not open_store(ck3, "exactly-job", "retained").any()
    assert ids_written(out) > before
    assert_exactly_once(out, ids_written(out))
