"""Epoch identity: an epoch is its number and its input (Spark's offsets/N).

Driven with the protocol test kit (exactly.testing.harness) on the file sink and a
hand-written checkpoint (one ``offsets/N`` line per source); the Spark test
tests/spark/test_replanned_epoch.py runs the same sequence under real Spark.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from exactly.audit import data_files
from exactly.checkpoint.spark_files import read_offsets, restore_offsets
from exactly.connectors.files.sink import FileSink
from exactly.errors import CorruptCheckpointFileError, ReplannedEpochError
from exactly.protocol.contract import SinkSettings
from exactly.protocol.epoch_identity import check_checkpoint_against_log
from exactly.protocol.faults import FaultPoint
from exactly.testing.harness import ProtocolHarness

QUERY = str(uuid.uuid4())


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


def visible_ids(root: Path) -> list[int]:
    files = [str(f) for f in data_files(root)] if root.exists() else []
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


@pytest.fixture
def h(tmp_path: Path, checkpoint: Path) -> ProtocolHarness[FileSink]:
    """Query QUERY writing to a file sink; the sink reads epoch inputs from ``checkpoint``."""
    sink = FileSink(str(tmp_path / "out"))
    return ProtocolHarness(sink, SinkSettings(checkpoint_location=str(checkpoint)),
                           query_id=QUERY, visible=lambda: visible_ids(sink.root))


def rows(epoch: int, parts: int = 2, per_part: int = 5) -> list[pa.RecordBatch]:
    """The input of ``epoch``: ``parts`` partitions of ``per_part`` ids from ``epoch * 1000``."""
    return [pa.record_batch({"id": list(range(epoch * 1000 + p * per_part,
                                              epoch * 1000 + (p + 1) * per_part))})
            for p in range(parts)]


def test_a_replay_with_the_same_input_is_aborted_and_logged_at_warning(h, checkpoint,
                                                                      caplog):
    write_offsets(checkpoint, 0, 1)
    h.run_epoch(0, rows(0))
    # Spark re-plans the same positions after a restart (new batch timestamp, same input)
    write_offsets(checkpoint, 0, 1, stamp=5)
    h.restart()
    with caplog.at_level(logging.WARNING, logger="exactly"):
        h.run_epoch(0, rows(0))
    assert h.visible() == list(range(10))
    events = [json.loads(r.message) for r in caplog.records]
    replay = [e for e in events if e["event"] == "replay_of_complete_epoch"]
    assert replay and replay[0]["epoch"] == 0 and replay[0]["input_checked"] is True
    assert h.pre_commits() == []


def test_a_replanned_epoch_over_other_input_is_refused_and_commits_nothing(h, checkpoint):
    write_offsets(checkpoint, 0, 1)
    h.run_epoch(0, rows(0))
    write_offsets(checkpoint, 0, 2)  # offsets/0 deleted, more input arrived, re-planned
    h.restart()
    replanned = h.tasks(0, rows(0, per_part=7))
    with pytest.raises(ReplannedEpochError) as caught:
        h.commit(0, replanned)
    message = str(caught.value)
    assert "epoch 0 was already committed" in message
    assert '"count":1' in message and '"count":2' in message  # both positions named
    assert f"exactly restore-offsets {checkpoint}" in message  # and the repair
    assert h.visible() == list(range(10))  # the first commit only, once
    assert h.pre_commits() == []  # the refused handles were aborted


def test_restoring_the_recorded_offsets_turns_the_replanned_epoch_into_a_replay(h,
                                                                               checkpoint):
    original = write_offsets(checkpoint, 0, 1)
    h.run_epoch(0, rows(0))
    write_offsets(checkpoint, 0, 2)
    h.restart()
    with pytest.raises(ReplannedEpochError):
        h.run_epoch(0, rows(0))
    recorded = h.completion(0)["input"]["offsets_log"]
    assert recorded == original
    restore_offsets(str(checkpoint), 0, recorded)
    h.restart()
    h.run_epoch(0, rows(0))
    assert h.visible() == list(range(10))


def test_an_intent_recovered_after_a_replan_commits_its_own_input_then_refuses(h,
                                                                              checkpoint):
    write_offsets(checkpoint, 0, 1)
    handles = h.tasks(0, rows(0))
    with h.crash_at(FaultPoint.AFTER_INTENT, epoch=0):  # the intent over offsets/0 is durable
        h.commit(0, handles)
    write_offsets(checkpoint, 0, 3)  # then Spark re-planned epoch 0 over more input
    h.restart()
    with pytest.raises(ReplannedEpochError):
        h.run_epoch(0, rows(0))
    # the intent decided epoch 0 over its own input: those rows are visible, once
    assert h.visible() == list(range(10))
    assert h.incomplete_intents() == []


def test_a_start_on_a_checkpoint_missing_a_committed_epoch_fails_before_spark_runs(
        h, checkpoint):
    for epoch in (0, 1):
        write_offsets(checkpoint, epoch, epoch + 1)
        h.run_epoch(epoch, rows(epoch))
    check_checkpoint_against_log(str(checkpoint), h.sink.log_directory)  # consistent: fine
    (checkpoint / "offsets" / "1").unlink()  # the operator's "fix" for a torn offsets/1
    with pytest.raises(ReplannedEpochError, match="no longer holds offsets/1"):
        check_checkpoint_against_log(str(checkpoint), h.sink.log_directory)


def test_an_offsets_entry_purged_below_the_retained_window_is_not_a_replan(h, checkpoint):
    for epoch in (0, 1, 2):
        write_offsets(checkpoint, epoch, epoch + 1)
        h.run_epoch(epoch, rows(epoch))
    (checkpoint / "offsets" / "0").unlink()  # Spark's own purge of old entries
    check_checkpoint_against_log(str(checkpoint), h.sink.log_directory)


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
