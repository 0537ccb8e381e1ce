"""The staging area's ``task.json`` (exactly.protocol.staging): written whole, not fsynced,
and an empty one -- what a power loss can leave of it -- listed as an unknown attempt of the
query, which recovery aborts, instead of blocking the listing."""

from __future__ import annotations

import pyarrow as pa

from exactly.protocol.contract import TaskInfo
from exactly.protocol.staging import TASK_FILE, StagingArea


def area(tmp_path) -> StagingArea:
    return StagingArea(tmp_path / "staging", tmp_path, "rows.arrow")


def test_an_attempt_lists_with_its_task_and_no_temp_file_is_left(tmp_path):
    stage = area(tmp_path)
    txn = stage.begin_txn(TaskInfo("q", "r", 3, 1, 42))
    txn.writer = pa.ipc.new_file(stage.open_output(txn), pa.schema([("id", pa.int64())]))
    payload = stage.pre_commit(txn)
    (listed,) = stage.list("q")
    assert (listed.run_id, listed.epoch, listed.partition, listed.attempt) == ("r", 3, 1, 42)
    assert listed.payload.dir == payload.dir and listed.payload.file == "rows.arrow"
    assert sorted(p.name for p in (tmp_path / payload.dir).iterdir()) == sorted([
        TASK_FILE, "rows.arrow"])


def test_an_empty_task_file_is_an_unknown_attempt_of_the_query_not_an_error(tmp_path):
    stage = area(tmp_path)
    stage.begin_txn(TaskInfo("q", "r", 3, 0, 7))
    (tmp_path / "staging" / f"{3:012d}" / TaskInfo("q", "r", 3, 0, 7).attempt_key
     / TASK_FILE).write_bytes(b"")  # the power loss took its content
    (listed,) = stage.list("q")
    assert (listed.query_id, listed.run_id, listed.epoch) == ("q", "", 3)
    stage.discard(listed)  # what recovery does with an unknown attempt
    assert stage.list("q") == []
