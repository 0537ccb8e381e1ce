"""The issue's reproduction under real Spark: an operator deletes a torn ``offsets/N`` while
more input arrived, Spark re-plans epoch N over different input. Before, the sink took the
call for a replay and dropped the new input with exit 0; now the job fails loudly before
anything is lost, and restoring the recorded offsets entry drains everything exactly once.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from exactly.auditor import verify
from exactly.checkpoint.spark_files import restore_offsets
from exactly.demos.files import write_events
from exactly.demos.files_job import PipelineSpec, build, run
from exactly.errors import CorruptCheckpointFileError, ReplannedEpochError
from exactly.protocol.commitlog import CommitLog


def add_files(source: Path, target: Path, names: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(source / name, target / f".{name}.tmp")
        (target / f".{name}.tmp").rename(target / name)


def delete_entry(checkpoint: Path, epoch: int) -> None:
    """What an operator does to get past "Incomplete log file": drop offsets/N, commits/N
    and their checksums."""
    for log in ("offsets", "commits"):
        for name in (str(epoch), f".{epoch}.crc"):
            (checkpoint / log / name).unlink(missing_ok=True)


def test_a_replanned_epoch_fails_loudly_and_the_recorded_offsets_drain_it_exactly_once(
        spark, tmp_path):
    everything = tmp_path / "all"
    write_events(everything, 4000, 8, seed=3)  # 8 files of 500 events
    names = sorted(p.name for p in everything.iterdir())
    inp, out, ck = tmp_path / "input", tmp_path / "out", tmp_path / "ck"
    spec = PipelineSpec(str(inp), str(out), str(ck), max_files_per_epoch=2)

    add_files(everything, inp, names[:4])
    run(spark, spec, out=io.StringIO())  # epochs 0 and 1
    add_files(everything, inp, names[4:5])
    run(spark, spec, out=io.StringIO())  # epoch 2: the fifth file alone
    assert CommitLog(out / "_exactly").completed_epochs() == [0, 1, 2]

    # a torn offsets/2 is named, with its path, before Spark runs
    offsets_2 = ck / "offsets" / "2"
    offsets_2.write_bytes(offsets_2.read_bytes()[:40])
    add_files(everything, inp, names[5:])
    with pytest.raises(CorruptCheckpointFileError, match=str(offsets_2)):
        run(spark, spec, out=io.StringIO())

    # the operator deletes the torn entry: Spark would re-plan epoch 2 over files 5 and 6
    delete_entry(ck, 2)
    with pytest.raises(ReplannedEpochError, match="no longer holds offsets/2"):
        run(spark, spec, out=io.StringIO())  # refused by start_query, before Spark runs

    # a plain writeStream (no start_query) reaches the sink's commit, which refuses it too
    query = (build(spark, spec).writeStream.format("exactly.files")
             .option("checkpointLocation", str(ck)).trigger(availableNow=True)
             .start(str(out)))
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination()
    assert "ReplannedEpochError" in str(caught.value)
    assert "epoch 2 was already committed" in str(caught.value)
    partial = verify(inp, out)
    assert partial.duplicate_extra_rows == 0 and partial.found_rows == 2500  # files 1-5 once

    # the repair named by the error: put back the entry epoch 2 was committed with
    recorded = CommitLog(out / "_exactly").completion(2)["input"]["offsets_log"]
    restore_offsets(str(ck), 2, recorded)
    run(spark, spec, out=io.StringIO())
    report = verify(inp, out)
    assert report.ok, report.rows()
    assert report.found_rows == 4000
