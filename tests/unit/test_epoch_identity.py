"""Epoch identity on the real file sink: an epoch is its number AND its input.

Spark's offset log is written here in Spark's own format (``v1``, the batch metadata, one
line per source); the integration test tests/spark/test_replanned_epoch.py runs the
same cases through real Spark.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest
from test_protocol import DEAD_DRIVER, QUERY, run_tasks, visible_ids

from exactly.connectors.files.sink import FileSink
from exactly.errors import CorruptCheckpointFileError, ReplannedEpochError
from exactly.protocol.committer import Committer
from exactly.protocol.contract import SinkSettings
from exactly.protocol.epoch_identity import check_checkpoint_against_log, input_record
from exactly.spark.checkpoint import read_offsets, restore_offsets


def write_offsets(checkpoint: Path, epoch: int, count: int, stamp: int = 0) -> str:
    """Spark's offsets/N for one exactly.files source that has taken ``count`` files."""
    text = "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000
                                + stamp, "conf": {"spark.sql.shuffle.partitions": "2"}})
    text += "\n" + json.dumps({"last": f"f{count:03d}.jsonl", "count": count})
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(epoch)).write_text(text)
    (checkpoint / "metadata").write_text(json.dumps({"id": QUERY}))
    return text


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return tmp_path / "ck"


@pytest.fixture
def sink(tmp_path: Path) -> FileSink:
    return FileSink(str(tmp_path / "out"))


def committer(sink: FileSink, checkpoint: Path) -> Committer:
    return Committer(sink, SinkSettings(checkpoint_location=str(checkpoint)))


def test_a_replay_with_the_same_input_is_aborted_and_logged_at_warning(sink, checkpoint,
                                                                      caplog):
    write_offsets(checkpoint, 0, 1)
    committer(sink, checkpoint).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0))
    # Spark re-plans the same positions after a restart (new batch timestamp, same input)
    write_offsets(checkpoint, 0, 1, stamp=5)
    with caplog.at_level(logging.WARNING, logger="exactly"):
        committer(sink, checkpoint).commit_epoch(
            0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=10))
    assert visible_ids(sink.root) == list(range(10))
    events = [json.loads(r.message) for r in caplog.records]
    replay = [e for e in events if e["event"] == "replay_of_complete_epoch"]
    assert replay and replay[0]["epoch"] == 0 and replay[0]["input_checked"] is True
    assert sink.list_pre_commits(QUERY) == []


def test_a_replanned_epoch_over_other_input_is_refused_and_commits_nothing(sink, checkpoint):
    write_offsets(checkpoint, 0, 1)
    committer(sink, checkpoint).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0))
    write_offsets(checkpoint, 0, 2)  # offsets/0 deleted, more input arrived, re-planned
    replanned = run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=10, rows=7)
    with pytest.raises(ReplannedEpochError) as caught:
        committer(sink, checkpoint).commit_epoch(0, replanned)
    message = str(caught.value)
    assert "epoch 0 was already committed" in message
    assert '"count":1' in message and '"count":2' in message  # both positions named
    assert f"exactly restore-offsets {checkpoint}" in message  # and the repair
    assert visible_ids(sink.root) == list(range(10))  # the first commit only, once
    assert sink.list_pre_commits(QUERY) == []  # the refused handles were aborted


def test_restoring_the_recorded_offsets_turns_the_replanned_epoch_into_a_replay(sink,
                                                                               checkpoint):
    original = write_offsets(checkpoint, 0, 1)
    committer(sink, checkpoint).commit_epoch(0, run_tasks(sink, str(uuid.uuid4()), 0))
    write_offsets(checkpoint, 0, 2)
    with pytest.raises(ReplannedEpochError):
        committer(sink, checkpoint).commit_epoch(
            0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=10))
    recorded = committer(sink, checkpoint).log.completion(0)["input"]["offsets_log"]
    assert recorded == original
    restore_offsets(str(checkpoint), 0, recorded)
    committer(sink, checkpoint).commit_epoch(
        0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=20))
    assert visible_ids(sink.root) == list(range(10))


def test_an_intent_recovered_after_a_replan_commits_its_own_input_then_refuses(sink,
                                                                              checkpoint):
    write_offsets(checkpoint, 0, 1)
    first_run = str(uuid.uuid4())
    c = committer(sink, checkpoint)
    first = run_tasks(sink, first_run, 0)
    # a driver that died right after writing the intent of epoch 0 over its input
    c.lease.acquire(first_run, DEAD_DRIVER)
    c.log.write_intent(0, first_run, first, input_record(str(checkpoint), 0))
    write_offsets(checkpoint, 0, 3)
    with pytest.raises(ReplannedEpochError):
        committer(sink, checkpoint).commit_epoch(
            0, run_tasks(sink, str(uuid.uuid4()), 0, attempt_base=10))
    # the intent decided epoch 0 over its own input: those rows are visible, once
    assert visible_ids(sink.root) == list(range(10))
    assert committer(sink, checkpoint).log.incomplete_intents() == []


def test_a_start_on_a_checkpoint_missing_a_committed_epoch_fails_before_spark_runs(
        sink, checkpoint):
    for epoch in (0, 1):
        write_offsets(checkpoint, epoch, epoch + 1)
        committer(sink, checkpoint).commit_epoch(
            epoch, run_tasks(sink, str(uuid.uuid4()), epoch))
    check_checkpoint_against_log(str(checkpoint), sink.log_directory)  # consistent: fine
    (checkpoint / "offsets" / "1").unlink()  # the operator's "fix" for a torn offsets/1
    with pytest.raises(ReplannedEpochError, match="no longer holds offsets/1"):
        check_checkpoint_against_log(str(checkpoint), sink.log_directory)


def test_an_offsets_entry_purged_below_the_retained_window_is_not_a_replan(sink, checkpoint):
    for epoch in (0, 1, 2):
        write_offsets(checkpoint, epoch, epoch + 1)
        committer(sink, checkpoint).commit_epoch(
            epoch, run_tasks(sink, str(uuid.uuid4()), epoch))
    (checkpoint / "offsets" / "0").unlink()  # Spark's own purge of old entries
    check_checkpoint_against_log(str(checkpoint), sink.log_directory)


def test_a_torn_offsets_entry_is_named_with_its_path(checkpoint):
    text = write_offsets(checkpoint, 4, 9)
    (checkpoint / "offsets" / "4").write_text(text[: text.index("\n", 4)])  # metadata only
    with pytest.raises(CorruptCheckpointFileError, match=str(checkpoint / "offsets" / "4")):
        read_offsets(str(checkpoint), 4)


def test_an_offsets_entry_that_no_longer_matches_its_crc_is_named(checkpoint):
    import struct
    import zlib

    text = write_offsets(checkpoint, 2, 5).encode()
    crc = b"crc\0" + struct.pack(">i", 512) + b"".join(
        struct.pack(">I", zlib.crc32(text[i:i + 512])) for i in range(0, len(text), 512))
    (checkpoint / "offsets" / ".2.crc").write_bytes(crc)
    assert read_offsets(str(checkpoint), 2).input.sources[0]["count"] == 5
    (checkpoint / "offsets" / "2").write_bytes(text.replace(b'"count": 5', b'"count": 6'))
    with pytest.raises(CorruptCheckpointFileError, match="does not match its checksum"):
        read_offsets(str(checkpoint), 2)
