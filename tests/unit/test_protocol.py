"""The commit protocol on the real file sink, driven step by step without Spark."""

from __future__ import annotations

import socket
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.connectors.files.sink import FileSink
from exactly.errors import DataLossError, FencedError, OwnershipError
from exactly.procs import ProcessId, _stat
from exactly.protocol.committer import Committer
from exactly.protocol.contract import Handle, SinkSettings, TaskInfo
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.protocol.lease import Lease
from exactly.protocol.staging import StagedPayload

QUERY = str(uuid.uuid4())
#: a driver on this host that no longer runs: its lease can be taken over
DEAD_DRIVER = ProcessId(socket.gethostname(), 4_000_000, 1)


def run_tasks(sink: FileSink, run_id: str, epoch: int, parts: int = 2, rows: int = 5,
              attempt_base: int = 0) -> list[Handle]:
    """What Spark's executors do in step 1: one pre-committed handle per partition."""
    handles = []
    for p in range(parts):
        task = TaskInfo(QUERY, run_id, epoch, p, attempt_base + p)
        txn = sink.begin_transaction(task)
        start = epoch * 1000 + p * rows
        sink.write(txn, pa.record_batch({"id": list(range(start, start + rows))}))
        handles.append(Handle(task, sink.pre_commit(txn)))
    return handles


def visible_ids(root: Path) -> list[int]:
    files = [str(f) for f in data_files(root)] if root.exists() else []
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


@pytest.fixture
def sink(tmp_path: Path) -> FileSink:
    return FileSink(str(tmp_path / "out"))


def committer(sink: FileSink, fault: FaultSpec | None = None) -> Committer:
    return Committer(sink, SinkSettings(), fault)


def test_nothing_is_visible_before_the_commit_and_everything_after(sink):
    run = str(uuid.uuid4())
    handles = run_tasks(sink, run, epoch=0)
    assert visible_ids(sink.root) == []
    committer(sink).commit_epoch(0, handles)
    assert visible_ids(sink.root) == list(range(0, 10))
    assert sink.list_pre_commits(QUERY) == []


def test_a_replay_of_a_complete_epoch_aborts_its_new_handles(sink):
    run = str(uuid.uuid4())
    committer(sink).commit_epoch(0, run_tasks(sink, run, 0))
    replay = run_tasks(sink, str(uuid.uuid4()), 0)
    committer(sink).commit_epoch(0, replay)
    assert visible_ids(sink.root) == list(range(0, 10))
    assert sink.list_pre_commits(QUERY) == []


def test_an_intent_without_completion_is_finished_by_the_next_run(sink):
    """Killed after the intent: the epoch still commits exactly once."""
    run = str(uuid.uuid4())
    handles = run_tasks(sink, run, 0)
    c = committer(sink)
    c.lease.acquire(run, DEAD_DRIVER)
    c.log.write_intent(0, run, handles)  # the crash happens right after step 2b
    sink.commit_handle(handles[0])  # ... or even after one handle commit
    assert c.log.incomplete_intents()

    replay = run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=10)
    committer(sink).commit_epoch(0, replay)
    assert visible_ids(sink.root) == list(range(0, 10))
    assert committer(sink).log.completion(0)["already_committed"] == 1
    assert sink.list_pre_commits(QUERY) == []


def test_recovery_aborts_orphans_of_dead_runs_but_not_the_current_handles(sink):
    dead = str(uuid.uuid4())
    run_tasks(sink, dead, 0)  # crashed before the intent: orphans
    run = str(uuid.uuid4())
    handles = run_tasks(sink, run, 0, attempt_base=10)
    committer(sink).commit_epoch(0, handles)
    assert visible_ids(sink.root) == list(range(0, 10))
    assert sink.list_pre_commits(QUERY) == []


def test_failed_attempts_of_this_run_are_swept_after_the_commit(sink):
    run = str(uuid.uuid4())
    failed = run_tasks(sink, run, 0, parts=1, attempt_base=50)  # a task attempt that failed
    handles = run_tasks(sink, run, 0)
    committer(sink).commit_epoch(0, handles)
    assert failed[0].key not in {h.key for h in sink.list_pre_commits(QUERY)}
    assert visible_ids(sink.root) == list(range(0, 10))


def test_spark_abort_of_an_epoch_with_an_intent_keeps_the_intent(sink):
    run = str(uuid.uuid4())
    handles = run_tasks(sink, run, 0)
    c = committer(sink)
    c.lease.acquire(run, DEAD_DRIVER)
    c.log.write_intent(0, run, handles)
    c.abort_epoch(0, handles)
    assert len(sink.list_pre_commits(QUERY)) == 2  # the intent decided: they will commit
    committer(sink).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=9))
    assert visible_ids(sink.root) == list(range(0, 10))


def test_abort_without_intent_drops_the_pre_commits(sink):
    handles = run_tasks(sink, str(uuid.uuid4()), 0)
    committer(sink).abort_epoch(0, handles)
    assert sink.list_pre_commits(QUERY) == []
    assert visible_ids(sink.root) == []


def test_a_vanished_pre_commit_named_by_an_intent_is_reported_as_data_loss(sink):
    run = str(uuid.uuid4())
    handles = run_tasks(sink, run, 0)
    c = committer(sink)
    c.lease.acquire(run, DEAD_DRIVER)
    c.log.write_intent(0, run, handles)
    sink.abort(handles[1])  # someone deletes staged data behind our back
    with pytest.raises(DataLossError, match="partition 1"):
        committer(sink).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=7))


def test_a_second_live_instance_is_fenced_and_commits_nothing(sink):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        first = str(uuid.uuid4())
        stat = _stat(holder.pid)
        me = ProcessId(socket.gethostname(), holder.pid, stat[2])
        Lease(sink.log_directory).acquire(first, me)
        second = run_tasks(sink, str(uuid.uuid4()), 0)
        with pytest.raises(FencedError, match=f"run {first} holds it"):
            committer(sink).commit_epoch(0, second)
        assert visible_ids(sink.root) == []
        assert committer(sink).log.read_intent(0) is None
    finally:
        holder.kill()
        holder.wait()
    # once the holder is dead, a new run takes over and recovers
    committer(sink).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=20))
    assert visible_ids(sink.root) == list(range(0, 10))


def test_a_different_query_cannot_write_into_an_owned_output(sink):
    committer(sink).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0))
    other = Handle(TaskInfo(str(uuid.uuid4()), str(uuid.uuid4()), 1, 0, 0),
                   StagedPayload(0, "_staging/x"))
    with pytest.raises(OwnershipError, match="new, empty output path"):
        committer(sink).commit_epoch(1, [other])


def test_fault_spec_parsing_rejects_unknown_points():
    assert FaultSpec.parse("after_intent@3").min_epoch == 3
    assert FaultSpec.parse("IN_WRITE").point == FaultPoint.IN_WRITE
    with pytest.raises(ValueError, match="unknown"):
        FaultSpec.parse("after_lunch")
