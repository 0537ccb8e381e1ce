"""Savepoints of a transformWithStateInPandas job (running count and sum per key, every input
id written out with them) into the file sink: restored unchanged, rescaled 2 -> 4 -> 3
(Spark's offline repartition, RocksDB), upgraded with a new stateful step before the old one,
downgraded without it; a hashmap target refused up front; forked twice from one savepoint;
rolled back into the same output path; restored in claim mode. Real Spark, real files; the
audit counts every id."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from savepoint_jobs import KEYS, StatefulJob, expected_totals, job_module
from savepoint_jobs import stage as run_stage

import exactly
from exactly.audit import audit_ids, data_files, file_ids
from exactly.errors import SavepointError
from exactly.ops.job_savepoints import RestoreRequest, restore_job
from exactly.savepoints.manifest import list_files, read_manifest
from exactly.savepoints.operators import job_operators
from exactly.savepoints.restore import RestoreMode
from exactly.savepoints.sinks import SinkRollback

STEP = 1000
RunningTotals = job_module().RunningTotals
TWS_OUT = job_module().TWS_OUT
ENV = {"JOB_KIND": "tws", "JOB_BACKEND": "rocksdb"}


def output(out) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in data_files(out)], ignore_index=True)


def assert_exactly_once(out, rows: int) -> None:
    """Every id 0..rows-1 once, and each key's last running totals equal the batch result."""
    found, _ = file_ids(out)
    report = audit_ids(found, np.arange(rows))
    assert report.ok, report.to_json()
    frame = output(out)
    last = frame.sort_values("n").groupby("key").tail(1).set_index("key").sort_index()
    expected = expected_totals(rows)
    assert last["n"].tolist() == expected["n"].tolist()
    assert np.allclose(last["total"].to_numpy(), expected["total"].to_numpy(), rtol=1e-9)
    assert len(last) == KEYS


@pytest.mark.slow  # CI budget (issue 28): transformWithState state is restored,
# rescaled and upgraded through a crash by tests/savepoints/test_savepoint_commands.py
def test_transform_with_state_survives_every_restore_of_the_upgrade_path(
        spark, tmp_path, savepoints):
    out = tmp_path / "out"
    env = {**ENV, "JOB_OUT": str(out)}

    def stage(name: str, savepoint, rows: int, **overrides):
        done, sp = run_stage(spark, tmp_path / name, env, savepoint, rows, savepoints,
                             **overrides)
        assert_exactly_once(out, rows)
        return done, sp

    _, sp0 = stage("ck0", None, STEP)
    manifest = read_manifest(sp0)
    assert [(o.uid, o.name, o.metadata_version) for o in manifest.operators] == [
        ("running", "transformWithStateInPandasExec", 2)]
    assert manifest.operators[0].stores[0].rows == KEYS
    done, sp1 = stage("ck1", sp0, 2 * STEP)
    assert done["restored"] == ["running: #0->#0 (copy)"]
    done, sp2 = stage("ck2", sp1, 3 * STEP, parallelism=4)
    assert done["restored"] == ["running: #0->#0 (repartition)"]
    assert read_manifest(sp2).shuffle_partitions == 4
    done, sp3 = stage("ck3", sp2, 4 * STEP, parallelism=3)
    assert read_manifest(sp3).shuffle_partitions == 3

    hashmap = StatefulJob(spark, tmp_path / "ck-hashmap", **{**env, "JOB_BACKEND": "hashmap"})
    with pytest.raises(SavepointError, match="transformWithState needs RocksDB"):
        hashmap.restore(sp3, 5 * STEP)

    done, sp4 = stage("ck4", sp3, 5 * STEP, JOB_VERSION="v2")
    assert done["new"] == ["dedup"]
    job = StatefulJob(spark, tmp_path / "ck5", **env)
    with pytest.raises(SavepointError, match=r"dedup.*--allow-non-restored-state"):
        job.restore(sp4, 6 * STEP)
    done, _ = stage("ck5", sp4, 6 * STEP, allow_non_restored_state=True)
    assert done["dropped"] == ["dedup"]

    # a retained checkpoint restores like a savepoint (-s CHECKPOINT) and is only read; ck5
    # was not written by `exactly run`, so no uids were recorded: Spark's numbers map state
    retained = tmp_path / "ck5"
    listing = list_files(retained)
    job = StatefulJob(spark, tmp_path / "ck6", **env)
    with pytest.raises(SavepointError, match="restore-mode claim"):
        job.restore(retained, 7 * STEP, mode=RestoreMode.CLAIM)
    with pytest.raises(SavepointError, match="into a new checkpoint directory"):
        StatefulJob(spark, retained, **env).restore(retained, 7 * STEP)
    done = job.restore(retained, 7 * STEP)
    assert done["savepoint"] == str(retained) and done["restored"] == [
        "#0 (transformWithStateInPandasExec): #0->#0 (copy)"]
    assert list_files(retained) == listing
    assert not (tmp_path / "ck6" / "exactly-job" / "retained").exists()
    job.run(7 * STEP)
    assert_exactly_once(out, 7 * STEP)


@pytest.mark.slow  # CI budget: restores of this job are the upgrade path above and
# tests/savepoints/test_savepoints_every_backend.py
def test_one_savepoint_restored_twice_gives_equal_outputs_and_stays_unchanged(
        spark, tmp_path, savepoints):
    first = StatefulJob(spark, tmp_path / "ck0", **ENV, JOB_OUT=str(tmp_path / "out0"))
    first.run(STEP)
    sp = first.savepoint(savepoints)
    before = list_files(sp)
    manifest_bytes = (sp / "_metadata").read_bytes()
    outputs = []
    for fork in ("a", "b"):
        out = tmp_path / f"out-{fork}"
        job = StatefulJob(spark, tmp_path / f"ck-{fork}", **ENV, JOB_OUT=str(out))
        job.restore(sp, 2 * STEP)
        job.run(2 * STEP)
        frame = output(out).sort_values("id").reset_index(drop=True)
        assert frame["id"].tolist() == list(range(STEP, 2 * STEP))  # the fork's own epochs
        outputs.append(frame)
    pd.testing.assert_frame_equal(outputs[0], outputs[1])
    assert list_files(sp) == before and (sp / "_metadata").read_bytes() == manifest_bytes
    read_manifest(sp)  # still complete and verified

    # a savepoint of another job (another source) is refused before anything is written
    other = StatefulJob(spark, tmp_path / "ck-other", **ENV, JOB_OUT=str(tmp_path / "o"))
    other_job = other.job(STEP)
    (tmp_path / "in").mkdir()
    files = (spark.readStream.format("exactly.files").schema("id long, key string, "
                                                             "amount double")
             .option("format", "json").load(str(tmp_path / "in")))
    other_job.df = exactly.uid("running", files.groupBy("key").transformWithStateInPandas(
        RunningTotals(), TWS_OUT, "Update", "None"))
    with pytest.raises(SavepointError, match="another job"):
        restore_job(other_job, RestoreRequest(str(sp)), job_operators(other_job.df))
    assert not (tmp_path / "ck-other" / "offsets").exists()

    # claim: the restore takes the savepoint's files over; the savepoint is gone
    out = tmp_path / "out-claim"
    job = StatefulJob(spark, tmp_path / "ck-claim", **ENV, JOB_OUT=str(out))
    job.restore(sp, 2 * STEP, mode=RestoreMode.CLAIM)
    assert not sp.exists()
    job.run(2 * STEP)
    pd.testing.assert_frame_equal(output(out).sort_values("id").reset_index(drop=True),
                                  outputs[0])


@pytest.mark.slow  # CI budget: the same rollback, refused then retracted and audited, is
# tests/savepoints/test_refused_restore.py; every sink's in test_rollback_lineage.py
def test_rolling_back_the_file_sink_is_refused_then_retracts_newer_epochs(
        spark, tmp_path, savepoints):
    out = tmp_path / "out"
    job = StatefulJob(spark, tmp_path / "ck0", **ENV, JOB_OUT=str(out))
    job.run(STEP)
    older = job.savepoint(savepoints)
    job.run(2 * STEP)  # the output moves past the savepoint
    epochs_before = sorted(p.name for p in out.iterdir() if p.name.startswith("epoch-"))
    again = StatefulJob(spark, tmp_path / "ck1", **ENV, JOB_OUT=str(out))
    with pytest.raises(SavepointError, match=r"newer than the savepoint.*--sink-rollback "
                                             r"retract"):
        again.restore(older, 3 * STEP)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("epoch-")) == \
        epochs_before  # refused: nothing touched
    done = again.restore(older, 3 * STEP, sink_rollback=SinkRollback.RETRACT)
    assert done["retracted_epochs"]
    assert_exactly_once(out, STEP)  # back to the savepoint's output
    again.run(3 * STEP)
    assert_exactly_once(out, 3 * STEP)
