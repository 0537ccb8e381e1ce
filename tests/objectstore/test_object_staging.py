"""Pre-commits staged on S3 (exactly.protocol.object_staging, S3Proxy): a staged file
appears whole when its pre-commit completes the upload, an attempt that died mid-write is
still found (and only its task record is there), and removing attempts leaves no object
behind -- not even the directory markers other S3 clients create."""

from __future__ import annotations

import pyarrow as pa
import pytest

from exactly.errors import CorruptFileError
from exactly.protocol.contract import TaskInfo
from exactly.protocol.object_staging import ObjectStagingArea
from exactly.protocol.stages import open_stage

pytestmark = pytest.mark.server

SCHEMA = pa.schema([("id", pa.int64())])


def keys(s3_server, s3_bucket: str) -> list[str]:
    listed = s3_server.boto3_client().list_objects_v2(Bucket=s3_bucket)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def write_rows(stage, task: TaskInfo, ids: list[int], *, close: bool = True):
    txn = stage.begin_txn(task)
    txn.writer = pa.ipc.new_file(stage.open_output(txn), SCHEMA)
    txn.writer.write_batch(pa.record_batch({"id": ids}, schema=SCHEMA))
    txn.rows += len(ids)
    return stage.pre_commit(txn) if close else txn


def test_a_staged_file_is_listed_and_read_back_whole_and_a_dead_attempt_only_by_its_task(
        s3_server, s3_bucket):
    stage = open_stage(f"s3a://{s3_bucket}/ck/exactly-sink", "staging", "rows.arrow")
    assert isinstance(stage, ObjectStagingArea)
    done = TaskInfo("q", "run-1", 3, 0, 0)
    payload = write_rows(stage, done, [1, 2, 3])
    assert payload.dir == f"staging/000000000003/{done.attempt_key}"
    dying = write_rows(stage, TaskInfo("q", "run-1", 3, 1, 0), [4, 5], close=False)

    handles = {h.partition: h for h in stage.list("q")}
    assert sorted(handles) == [0, 1]
    assert handles[0].payload.file == "rows.arrow"
    assert handles[1].payload.file is None  # its upload never completed: nothing to read
    assert stage.has_attempt(handles[1])
    staged = stage.staged_file(handles[0])
    assert staged is not None and str(staged).startswith(f"s3://{s3_bucket}/ck/exactly-sink/")
    with staged.open() as source:
        assert pa.ipc.open_file(source).read_all()["id"].to_pylist() == [1, 2, 3]
    assert stage.list("another query") == []

    stage.abort_txn(dying)  # the executor's abort: the half-written upload goes too
    for handle in stage.list("q"):
        stage.discard(handle)
    assert stage.list("q") == []
    assert keys(s3_server, s3_bucket) == []  # no directory markers either


def test_a_damaged_task_record_is_named_by_its_s3_uri_with_the_repair(s3_server, s3_bucket):
    stage = open_stage(f"s3://{s3_bucket}/log", "wal", "rows.parquet")
    key = "log/wal/000000000007/00000-deadbeef-0/task.json"
    s3_server.boto3_client().put_object(Bucket=s3_bucket, Key=key, Body=b'{"query_id": "q"')
    with pytest.raises(CorruptFileError) as err:
        stage.list("q")
    assert f"s3://{s3_bucket}/{key}" in str(err.value)
    assert "intent" in str(err.value)  # the repair: which intent names it, else delete it


def test_a_staged_file_removed_behind_the_sinks_back_is_not_found(s3_server, s3_bucket):
    stage = open_stage(f"s3://{s3_bucket}/log", "staging", "rows.arrow")
    write_rows(stage, TaskInfo("q", "run-1", 0, 0, 0), [1])
    (handle,) = stage.list("q")
    s3_server.boto3_client().delete_object(
        Bucket=s3_bucket, Key=f"log/{handle.payload.dir}/rows.arrow")
    staged = stage.staged_file(handle)
    assert staged is not None and not staged.exists()
    with pytest.raises(FileNotFoundError):
        staged.open()
