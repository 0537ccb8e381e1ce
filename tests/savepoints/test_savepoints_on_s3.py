"""Savepoints on S3 (S3Proxy), in-process with the session's Spark: a savepoint taken into
``s3://`` and restored from there into an ``s3a://`` checkpoint with other partitions and
another state backend (exactly's state writer) through a crash after the restored files
were uploaded, redone from scratch; a savepoint of another job refused before anything is
written on S3; inspecting and disposing of complete and interrupted savepoints on S3. Jobs
running on ``s3a://`` checkpoints under ``exactly run`` (Spark's S3A), their savepoints taken
and restored by the commands: test_savepoint_commands_on_s3.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from savepoint_jobs import KEYS, StatefulJob

import exactly
from exactly.audit import audit_ids, file_ids
from exactly.checkpoint.location import open_store
from exactly.checkpoint.transfer import download_tree, upload_tree
from exactly.cli import main
from exactly.errors import SavepointError
from exactly.ops.job_savepoints import RestoreRequest, restore_job
from exactly.protocol.faults import FaultSpec, SimulatedCrash, fault_action, raise_simulated_crash
from exactly.savepoints.manifest import (
    MANIFEST,
    Manifest,
    SinkInfo,
    dispose,
    inprogress_dir,
    read_manifest,
    upload_savepoint,
    write_manifest,
)
from exactly.savepoints.metadata_files import relocate_schemas, v2_files
from exactly.savepoints.operators import job_operators
from exactly.savepoints.restore import RESTORED_STATE, read_marker
from exactly.savepoints.take import take_savepoint

pytestmark = pytest.mark.server
STEP = 600
#: the dedup job (a dropDuplicates on id, uid ``dedup``; no aggregation) into the file sink
ENV = {"JOB_KIND": "rows", "JOB_VERSION": "v2", "JOB_MAX_ROWS": "300"}




def state_ids(spark, checkpoint: Path, epoch: int) -> list[int]:
    """The ids the dedup operator's state holds after ``epoch``, read by Spark's reader."""
    rows = (spark.read.format("statestore").option("batchId", epoch).option("operatorId", 0)
            .load(str(checkpoint)).select("key.id").collect())
    return sorted(int(r[0]) for r in rows)


def assert_ids_once(out: Path, rows: int) -> None:
    ids, _ = file_ids(out)
    report = audit_ids(ids, np.arange(rows, dtype=np.int64))
    assert report.ok, report.to_json()


def test_a_savepoint_on_s3_restores_rescaled_and_switched_into_s3_through_a_crash(
        spark, tmp_path, s3_bucket):
    out = tmp_path / "out"
    first = StatefulJob(spark, tmp_path / "ck0", **ENV, JOB_BACKEND="hashmap",
                        JOB_OUT=str(out))
    first.run(STEP)
    target = f"s3://{s3_bucket}/team/savepoints"
    savepoint = first.savepoint(target)
    assert isinstance(savepoint, str) and savepoint.startswith(f"{target}/savepoint-")
    manifest = read_manifest(savepoint)  # every object's size and SHA-256
    assert [(o.uid, o.stores[0].rows) for o in manifest.operators] == [("dedup", STEP)]
    assert manifest.state_backend == "hashmap" and manifest.shuffle_partitions == 2
    names = open_store(savepoint).list_tree("")
    assert sorted(names) == sorted([MANIFEST, *(f["path"] for f in manifest.files)])

    # a savepoint of another job (another source) is refused before anything is written
    checkpoint = f"s3a://{s3_bucket}/jobs/dedup"
    other = StatefulJob(spark, checkpoint, **ENV, JOB_OUT=str(tmp_path / "o"))  # type: ignore[arg-type]
    other_job = other.job(STEP)
    (tmp_path / "in").mkdir()
    files = (spark.readStream.format("exactly.files").schema("id long, key string, "
                                                             "amount double")
             .option("format", "json").load(str(tmp_path / "in")))
    other_job.df = exactly.uid("dedup", files.dropDuplicates(["id"]))
    with pytest.raises(SavepointError, match="another job"):
        restore_job(other_job, RestoreRequest(savepoint), job_operators(other_job.df))
    assert not open_store(checkpoint).any()

    # restored from S3 into 3 partitions of RocksDB on S3 (the state rows rewritten through
    # Spark's providers); the driver dies once the restored files are on S3, before the
    # restore says done
    job = StatefulJob(spark, checkpoint, **ENV, JOB_BACKEND="rocksdb",  # type: ignore[arg-type]
                      JOB_OUT=str(out))
    request = RestoreRequest(savepoint, parallelism=3)
    with fault_action(raise_simulated_crash), pytest.raises(SimulatedCrash):
        restore_job(job.job(2 * STEP), request, job.operators(), FaultSpec(RESTORED_STATE))
    store = open_store(checkpoint)
    crashed = read_marker(checkpoint)
    assert crashed is not None and crashed["state"] == "in-progress"
    assert store.exists("metadata") and store.list("offsets") and store.list_tree("state")
    # a file of the interrupted attempt that the next one does not write goes too
    store.write("state/0/7/99.delta", b"left by the interrupted attempt")

    # the next driver redoes the restore from scratch, with the same query id
    done = restore_job(job.job(2 * STEP), request, job.operators())
    assert done is not None and done["restored"] == ["dedup: #0->#0 (rewrite)"]
    assert (done["partitions"], done["backend"]) == ("2->3", "hashmap->rocksdb")
    marker = read_marker(checkpoint)
    assert marker is not None and (marker["state"], marker["savepoint"]) == ("done", savepoint)
    assert marker["query_id"] == crashed["query_id"] == done["query_id"]
    assert not store.exists("state/0/7/99.delta")
    assert not any(name.endswith(".crc") for name in store.list_tree(""))
    # a driver started after that finds the restore done and restores nothing
    assert restore_job(job.job(2 * STEP), request, job.operators()) is None

    # the checkpoint on S3 is complete: its state holds exactly the ids the savepoint's
    # epoch had seen, and Spark goes on from a copy of its objects, every id once
    copy = tmp_path / "copy"
    download_tree(store, copy)
    assert state_ids(spark, copy, manifest.epoch) == list(range(STEP))
    StatefulJob(spark, copy, **ENV, JOB_BACKEND="rocksdb", JOB_OUT=str(out)).run(2 * STEP)
    assert_ids_once(out, 2 * STEP)
    read_manifest(savepoint)  # no_claim: the savepoint on S3 is untouched


def test_a_savepoint_of_transform_with_state_on_s3_reads_only_its_copy(
        spark, tmp_path, s3_bucket, savepoints):
    """Operator metadata v2 names its state schema files by absolute path: the savepoint of a
    checkpoint on S3 reads them from its copy (this session has no S3 file system), and
    keeps the copied bytes."""
    job = StatefulJob(spark, tmp_path / "ck", JOB_KIND="tws", JOB_BACKEND="rocksdb",
                      JOB_MAX_ROWS="300", JOB_OUT=str(tmp_path / "out"))
    job.run(STEP)
    checkpoint = f"s3a://{s3_bucket}/jobs/running"
    relocate_schemas(tmp_path / "ck", checkpoint)  # as Spark writes them on S3A
    upload_tree(tmp_path / "ck", open_store(checkpoint))
    savepoint = take_savepoint(spark, checkpoint, savepoints, operators=job.operators())
    manifest = read_manifest(savepoint)
    assert [(o.uid, o.stores[0].rows) for o in manifest.operators] == [("running", KEYS)]
    assert manifest.job == {} and manifest.query_id == json.loads(
        (tmp_path / "ck" / "metadata").read_text())["id"]
    copied = v2_files(Path(savepoint) / "checkpoint")
    assert copied and all(f"{checkpoint}/state/0/_stateSchema/" in p.read_text()
                          for p in copied)


def local_savepoint(directory: Path) -> Path:
    """A savepoint's ``.inprogress`` directory with two files and its manifest."""
    work = inprogress_dir(directory, 4, "aaa")
    (work / "checkpoint" / "offsets").mkdir(parents=True)
    (work / "checkpoint" / "offsets" / "4").write_text('v1\n{}\n{"rows": 10}')
    (work / "checkpoint" / "metadata").write_text('{"id": "q-1"}\n')
    write_manifest(work, Manifest(
        savepoint_id="aaa", epoch=4, created_at="2026-01-01T00:00:00Z", query_id="q-1",
        trigger="savepoint", spark_version="4.1.0", shuffle_partitions=2,
        state_backend="hashmap", sql_conf={}, sources=[{"index": 0, "offset": {"rows": 10}}],
        operators=[], sinks=[SinkInfo("exactly.files", "/out", 4)], job={}))
    return work


def test_savepoints_on_s3_inspect_refuse_when_interrupted_or_altered_and_dispose(
        tmp_path, s3_bucket):
    target = f"s3://{s3_bucket}/sps"
    work = local_savepoint(tmp_path)

    def interrupted() -> None:
        raise RuntimeError("the driver died before the manifest was uploaded")

    with pytest.raises(RuntimeError, match="driver died"):
        upload_savepoint(work, target, before_manifest=interrupted)
    broken = f"{target}/savepoint-4-aaa"
    assert sorted(open_store(broken).list_tree("")) == ["checkpoint/metadata",
                                                        "checkpoint/offsets/4"]
    with pytest.raises(SavepointError, match="incomplete savepoint"):
        read_manifest(broken)
    shown = CliRunner().invoke(main, ["savepoint", "--inspect", broken])
    assert shown.exit_code != 0 and "incomplete savepoint" in shown.output

    complete = upload_savepoint(work, target)
    assert complete == broken  # the same name: the upload completed now
    with pytest.raises(SavepointError, match="never overwrites"):
        upload_savepoint(work, target)
    shown = CliRunner().invoke(main, ["savepoint", "--inspect", complete.replace("s3:", "s3a:")])
    assert shown.exit_code == 0, shown.output
    assert "complete, 2 files" in shown.output and "epoch 4 of query q-1" in shown.output
    store = open_store(complete)
    store.write("checkpoint/offsets/4", b'v1\n{}\n{"rows": 11}')  # altered, same size
    with pytest.raises(SavepointError, match="truncated or altered"):
        read_manifest(complete)
    assert read_manifest(complete, checksums=False).epoch == 4  # sizes only

    open_store(f"{target}/data").write("x", b"1")
    with pytest.raises(SavepointError, match="not a savepoint"):
        dispose(f"{target}/data")
    disposed = CliRunner().invoke(main, ["savepoint", "--dispose", complete])
    assert disposed.exit_code == 0, disposed.output
    assert not store.any() and open_store(f"{target}/data").exists("x")
    with pytest.raises(SavepointError, match="no savepoint"):
        read_manifest(complete)
