"""The savepoint commands end to end, as a user runs them: ``exactly savepoint`` while the job
runs, ``exactly stop --savepoint``, ``exactly savepoint --inspect``, ``exactly run -s`` with a
new version of the job; and SIGKILLs of the driver while one is restored and while one is
taken. Real Spark under ``exactly run``, real files; the audit counts every id."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from exactly.audit import audit_ids, file_ids
from exactly.savepoints.manifest import INPROGRESS_SUFFIX, read_manifest
from exactly.testing.supervised import SupervisedRun

JOB = Path(__file__).parent / "jobs" / "stateful_job.py"


def env_for(out: Path, **extra: str) -> dict[str, str]:
    """Input that keeps coming (200 rows/s of 10^6) in epochs of at most 400 rows."""
    return {"JOB_KIND": "tws", "JOB_BACKEND": "rocksdb", "JOB_OUT": str(out),
            "JOB_ROWS": "1000000", "JOB_RATE": "200", "JOB_MAX_ROWS": "400", "JOB_KEYS": "10",
            **extra}


def savepoint_path(stdout: str) -> Path:
    match = re.search(r"savepoint (/\S+)", stdout)
    assert match, stdout
    return Path(match.group(1))


def assert_prefix_once(out: Path) -> int:
    """The ids written are 0..n-1, each once (epochs commit in order); returns n."""
    ids = file_ids(out)[0]
    assert len(ids) > 0
    report = audit_ids(ids, np.arange(int(ids.max()) + 1, dtype=np.int64))
    assert report.ok, report.rows()
    return len(ids)


def restore_v2_through_a_kill(tmp_path: Path, out: Path, ck: Path, source: Path, *,
                              beyond: int) -> SupervisedRun:
    """``exactly run`` version 2 of the job (a dedup step, 3 state partitions) with ``-s
    source`` into ``ck``; its first driver is SIGKILLed after writing the restored state
    (``restore.state``), the launcher's next driver restores again. Returns the stopped run,
    once it committed past epoch ``beyond`` after exactly that one process failure."""
    marker = tmp_path / f"fired-{ck.name}"
    env = env_for(out, JOB_VERSION="v2", JOB_PARTITIONS="3")
    run = SupervisedRun(JOB, ck, env, "-s", str(source), "--fault", "restore.state",
                        "--fault-marker", str(marker), log=tmp_path / f"run-{ck.name}.log")
    try:
        run.wait_for(lambda: max(run.committed_epochs(), default=-1) > beyond,
                     f"epochs after the restore of {source.name}", timeout=240)
        assert marker.exists()
        assert [e["kind"] for e in run.history() if e["event"] == "failure"] == ["process"]
        assert run.command("stop", str(ck)).returncode == 0
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    return run


def test_savepoint_while_running_stop_with_savepoint_and_a_new_version_restored_through_a_crash(
        tmp_path):
    savepoints_and_restores(tmp_path, restore_the_retained_checkpoint=False)


# CI budget: a slow proof; the default lane restores a retained checkpoint in
# test_restore_transform_with_state.py, and through a kill above
@pytest.mark.slow
def test_savepoint_stop_a_new_version_and_then_its_retained_checkpoint_restored_through_crashes(
        tmp_path):
    savepoints_and_restores(tmp_path, restore_the_retained_checkpoint=True)


def savepoints_and_restores(tmp_path: Path, *, restore_the_retained_checkpoint: bool) -> None:
    """A savepoint while the job runs, ``stop --savepoint``, ``--inspect``, version 2
    restored from it through a kill; with ``restore_the_retained_checkpoint``, then the
    stopped version 2's checkpoint restored like a savepoint (``-s CHECKPOINT``) through a
    kill; the checkpoint histories name every savepoint and restore."""
    ck, out, target = tmp_path / "ck", tmp_path / "out", tmp_path / "sps"
    run = SupervisedRun(JOB, ck, env_for(out), log=tmp_path / "run1.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 1, "an epoch")
        taken = run.command("savepoint", str(ck), str(target))
        assert taken.returncode == 0, taken.stderr
        running_sp = savepoint_path(taken.stdout)
        at = read_manifest(running_sp).epoch
        run.wait_for(lambda: max(run.committed_epochs()) > at, "an epoch after it")
        stopped = run.command("stop", "--savepoint", str(target), str(ck))
        assert stopped.returncode == 0, stopped.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    final_sp = savepoint_path(stopped.stdout)
    manifest = read_manifest(final_sp)
    assert manifest.trigger == "stop" and manifest.epoch == max(run.committed_epochs())
    assert read_manifest(running_sp).trigger == "savepoint"
    before = assert_prefix_once(out)  # everything up to the savepoint, once
    inspected = run.command("savepoint", "--inspect", str(final_sp))
    assert inspected.returncode == 0, inspected.stderr
    assert "complete" in inspected.stdout and "running" in inspected.stdout

    # a new version (a dedup step before the running totals, 3 state partitions) goes on
    # from the savepoint; its first driver is killed after writing the restored state, and
    # the next one restores again from scratch
    ck2 = tmp_path / "ck2"
    again = restore_v2_through_a_kill(tmp_path, out, ck2, final_sp, beyond=manifest.epoch + 2)
    after = assert_prefix_once(out)
    assert after > before  # went on from the savepoint: no gap, no repeat
    restored = read_manifest(final_sp)  # no_claim: the savepoint is untouched
    assert restored.files == manifest.files

    checkpoints = [("ck", ck), ("ck2", ck2)]
    restores = [("ck2", "savepoint", final_sp, manifest.epoch)]
    if restore_the_retained_checkpoint:
        # the stopped job's checkpoint restores like a savepoint (-s CHECKPOINT), its state
        # mapped by the uids its last driver recorded; the first driver is killed after
        # writing the restored state, and the next one stages and restores the checkpoint
        # again
        ck3, last = tmp_path / "ck3", max(again.committed_epochs())
        restore_v2_through_a_kill(tmp_path, out, ck3, ck2, beyond=last + 1)
        record = json.loads((ck3 / "exactly-job" / "restore.json").read_text())
        assert record["savepoint"] == str(ck2) and record["epoch"] == last
        assert sorted(record["restored"]) == ["dedup: #1->#1 (copy)",
                                              "running: #0->#0 (copy)"]
        assert not (ck3 / "exactly-job" / "retained").exists()  # the staged copy, taken over
        assert assert_prefix_once(out) > after
        checkpoints.append(("ck3", ck3))
        restores.append(("ck3", "checkpoint", ck2, last))

    # the checkpoint histories name the savepoints and the restores
    views = {}
    for name, checkpoint in checkpoints:
        shown = run.command("checkpoints", str(checkpoint), "--json")
        assert shown.returncode == 0, shown.stderr
        views[name] = json.loads(shown.stdout)
    assert views["ck"]["counts"]["savepoints"] == 2
    assert views["ck"]["latest"]["savepoint"]["path"] == str(final_sp)
    assert views["ck"]["latest"]["savepoint"]["trigger"] == "stop"
    for name, source, path, epoch in restores:
        latest = views[name]["latest"]["restore"]
        assert (latest["source"], latest["path"], latest["epoch"]) == (source, str(path), epoch)
        assert views[name]["counts"]["restored"] == 1, views[name]["counts"]


# CI budget: a slow proof (a restore refusing an incomplete savepoint is
# tests/unit/test_cli.py; the default lane kills a driver while it restores, above)
@pytest.mark.slow
@pytest.mark.parametrize("point", ["savepoint.copied", "savepoint.written"])
def test_a_driver_killed_while_taking_a_savepoint_leaves_it_marked_incomplete(tmp_path, point):
    ck, out, target = tmp_path / "ck", tmp_path / "out", tmp_path / "sps"
    run = SupervisedRun(JOB, ck, env_for(out), "--fault", point, "--fault-marker",
                        str(tmp_path / "fired"), log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: len(run.committed_epochs()) >= 2, "two epochs")
        first = run.status().driver.pid
        # the driver dies mid-savepoint; the launcher starts a new one, which takes the
        # still-pending request again
        taken = run.command("savepoint", str(ck), str(target), timeout=300)
        assert taken.returncode == 0, taken.stderr + run.output()[-3000:]
        assert (tmp_path / "fired").exists() and run.status().driver.pid != first
        assert run.command("stop", str(ck)).returncode == 0
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    assert assert_prefix_once(out) >= 2  # the new driver went on where the old one died
    broken = [p for p in target.iterdir() if p.name.endswith(INPROGRESS_SUFFIX)]
    complete = [p for p in target.iterdir() if not p.name.startswith(".")]
    assert len(broken) == 1 and complete == [savepoint_path(taken.stdout)]
    read_manifest(complete[0])
    inspected = run.command("savepoint", "--inspect", str(broken[0]))
    assert inspected.returncode != 0 and "incomplete savepoint" in inspected.stderr
    refused = run.command("run", str(JOB), "--checkpoint", str(tmp_path / "ck2"), "-s",
                          str(broken[0]))
    assert refused.returncode != 0 and "incomplete savepoint" in refused.stderr
    assert not (tmp_path / "ck2").exists()


@pytest.mark.server
@pytest.mark.slow  # three `exactly run` drivers (~40 s alone, minutes on a loaded machine)
def test_rolling_back_after_an_upgrade_into_the_same_table_is_a_rollback_naming_the_flag(
        tmp_path, pg, table_name):
    """v1 (query A) -> `exactly stop --savepoint` -> restored as query B into the same
    PostgreSQL table -> restoring A's older savepoint there is refused as a rollback over
    B's epochs (naming --sink-rollback), not as "not this job's output". The same rule per
    sink and per --sink-rollback value, without Spark: test_rollback_lineage.py."""
    env = {"JOB_KIND": "agg", "JOB_BACKEND": "hashmap", "JOB_DSN": pg.dsn,
           "JOB_TABLE": table_name, "JOB_ROWS": "1000000", "JOB_RATE": "200",
           "JOB_MAX_ROWS": "400", "JOB_KEYS": "10"}
    ck_a, target = tmp_path / "ck-a", tmp_path / "sps"
    first = SupervisedRun(JOB, ck_a, env, log=tmp_path / "run-a.log")
    try:
        first.wait_for(lambda: len(first.committed_epochs()) >= 2, "two epochs of A")
        taken = first.command("savepoint", str(ck_a), str(target))
        assert taken.returncode == 0, taken.stderr
        older = read_manifest(savepoint_path(taken.stdout))
        first.wait_for(lambda: max(first.committed_epochs()) > older.epoch, "an epoch after it")
        stopped = first.command("stop", "--savepoint", str(target), str(ck_a))
        assert stopped.returncode == 0, stopped.stderr
        assert first.wait(timeout=120) == 0, first.output()[-3000:]
    finally:
        first.close()
    upgrade = savepoint_path(stopped.stdout)
    at = read_manifest(upgrade).epoch

    ck_b = tmp_path / "ck-b"  # v2 = B, restored from A's last savepoint into the same table
    second = SupervisedRun(JOB, ck_b, env, "-s", str(upgrade), log=tmp_path / "run-b.log")
    try:
        second.wait_for(lambda: max(second.committed_epochs(), default=-1) > at,
                        "an epoch of B")
        assert second.command("stop", str(ck_b)).returncode == 0
        assert second.wait(timeout=120) == 0, second.output()[-3000:]
    finally:
        second.close()

    back = SupervisedRun(JOB, tmp_path / "ck-c", env, "-s", str(savepoint_path(taken.stdout)),
                         log=tmp_path / "run-c.log")
    try:
        assert back.wait(timeout=240) != 0
    finally:
        back.close()
    said = back.output()
    assert "not this job's output" not in said, said[-3000:]
    assert f"restored from {older.query_id} at epoch {at}" in said, said[-3000:]
    assert re.search(rf"epochs {older.epoch + 1}\.\.\d+ of query .*--sink-rollback keep", said)
