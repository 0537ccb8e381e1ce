"""The drain's final offsets entry (:func:`append_end_of_time_epoch`), without Spark."""

from __future__ import annotations

import json

import pytest

from exactly.checkpoint.spark_files import (
    END_OF_TIME_MS,
    append_end_of_time_epoch,
    read_offsets,
)


def _log(ck, epoch: int, watermark: int, *, committed: bool) -> None:
    """Write ``offsets/<epoch>`` as Spark 4.3 does (and its commit when ``committed``)."""
    (ck / "offsets").mkdir(parents=True, exist_ok=True)
    (ck / "commits").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": watermark, "batchTimestampMs": 1, "conf": {}}
    (ck / "offsets" / str(epoch)).write_text(f"v1\n{json.dumps(meta)}\n{{\"rows\":95}}")
    if committed:
        (ck / "commits" / str(epoch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_appends_the_last_offsets_with_the_end_of_time_watermark(tmp_path):
    _log(tmp_path, 0, 0, committed=True)
    _log(tmp_path, 1, 94_000, committed=True)
    assert append_end_of_time_epoch(str(tmp_path)) == 2
    entry, last = read_offsets(str(tmp_path), 2), read_offsets(str(tmp_path), 1)
    assert entry.metadata["batchWatermarkMs"] == END_OF_TIME_MS
    assert entry.input.sources == last.input.sources  # no new input
    assert append_end_of_time_epoch(str(tmp_path)) == 2  # a crash before its commit: again


def test_nothing_to_do_once_committed_or_before_the_first_epoch(tmp_path):
    assert append_end_of_time_epoch(str(tmp_path)) is None
    _log(tmp_path, 0, END_OF_TIME_MS, committed=True)
    assert append_end_of_time_epoch(str(tmp_path)) is None


def test_refuses_while_another_epoch_is_uncommitted(tmp_path):
    _log(tmp_path, 0, 0, committed=True)
    _log(tmp_path, 1, 5, committed=False)
    with pytest.raises(RuntimeError, match="restart the job"):
        append_end_of_time_epoch(str(tmp_path))
