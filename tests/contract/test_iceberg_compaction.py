"""Compaction of the Iceberg sink's tables (connectors/iceberg/compaction.py) on real tables
written through the sink's protocol (embedded SQLite catalog, no Spark): fewer files, the
same rows in every snapshot, no conflict with the epoch commits, savepoint rollback intact."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from exactly.connectors.iceberg import compaction
from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.compaction import compact_iceberg
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.connectors.iceberg.snapshots import main_line
from exactly.errors import SavepointError
from exactly.protocol.contract import CommitOutcome, TargetState
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def rows(ids) -> pa.RecordBatch:
    ids = list(ids)
    return pa.record_batch({"id": ids, "key": [f"k{i % 2}" for i in ids]}, schema=SCHEMA)


def catalog(tmp_path: Path) -> CatalogSpec:
    return CatalogSpec.from_options({}, str(tmp_path / "lake"))


def harness(tmp_path: Path, partition_by: str = "") -> ProtocolHarness:
    sink = IcebergSink("db.events", tmp_path / "log", catalog=catalog(tmp_path),
                       partition_by=partition_by)
    sink.prepare_target(SCHEMA)
    return ProtocolHarness(sink, query_id="0b5c6f9e-1111-4222-8333-944455556666")


def table(tmp_path: Path):
    return catalog(tmp_path).load().load_table("db.events")


def files(tmp_path: Path) -> int:
    return len(list(table(tmp_path).scan().plan_files()))


def ids(tmp_path: Path, snapshot: int | None = None) -> list[int]:
    scan = table(tmp_path).scan(snapshot_id=snapshot, selected_fields=("id",))
    return sorted(scan.to_arrow()["id"].to_pylist())


def run_epochs(h: ProtocolHarness, epochs: range, per_task: int = 5) -> None:
    """Ids ``epoch * 10_000 + n``; two write tasks an epoch: two files."""
    for epoch in epochs:
        base = epoch * 10_000
        h.run_epoch(epoch, [rows(range(base, base + per_task)),
                            rows(range(base + per_task, base + 2 * per_task))])


def expected(epochs: range, per_task: int = 5) -> list[int]:
    return sorted(e * 10_000 + n for e in epochs for n in range(2 * per_task))


def test_compaction_rewrites_the_epochs_files_into_fewer_and_every_snapshot_reads_the_same(
        tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(6))
    before = {e.snapshot.snapshot_id: ids(tmp_path, e.snapshot.snapshot_id)
              for e in main_line(table(tmp_path))}
    assert files(tmp_path) == 12  # 2 files per epoch

    result = compact_iceberg(catalog(tmp_path), "db.events")
    assert (result.files_before, result.files_after, result.rewritten_files) == (12, 1, 12)
    assert files(tmp_path) == 1
    assert ids(tmp_path) == expected(range(6))
    assert all(ids(tmp_path, s) == seen for s, seen in before.items())  # old snapshots too
    current = table(tmp_path).current_snapshot()
    assert current.summary.operation.value == "overwrite"  # pyiceberg writes no "replace"
    assert "exactly.compaction" in current.summary.additional_properties
    assert list(result.ranges.values()) == [[h.query_id, 0, 5]]
    assert compact_iceberg(catalog(tmp_path), "db.events").snapshot is None  # nothing left


def test_the_sink_goes_on_after_a_compaction_and_recognises_a_replay(tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(3))
    compact_iceberg(catalog(tmp_path), "db.events")
    assert h.sink.commit_handle(h.tasks(2, [rows(range(20, 30))])[0]) is \
        CommitOutcome.ALREADY_COMMITTED  # the compacted epoch 2 is still known
    run_epochs(h, range(3, 5))
    assert ids(tmp_path) == expected(range(5))
    assert files(tmp_path) == 1 + 4


def test_compaction_racing_an_epoch_commit_retries_and_both_land(tmp_path, monkeypatch):
    """The sink commits epoch 4 after the compaction read the table and before its commit:
    the catalog refuses the compaction (stale metadata), which tries again on the new one."""
    h = harness(tmp_path)
    run_epochs(h, range(4))
    real = compaction._commit
    calls = []

    def epoch_first(table, *args):
        if not calls:
            run_epochs(h, range(4, 5))
        calls.append(1)
        return real(table, *args)

    monkeypatch.setattr(compaction, "_commit", epoch_first)
    result = compact_iceberg(catalog(tmp_path), "db.events")
    assert len(calls) == 2 and result.snapshot is not None
    assert ids(tmp_path) == expected(range(5))
    assert files(tmp_path) == 1 + 2  # epochs 0..3 compacted, epoch 4's two files


def test_a_partitioned_table_is_compacted_per_partition(tmp_path):
    h = harness(tmp_path, partition_by="key")
    run_epochs(h, range(3))
    assert files(tmp_path) == 12  # 2 tasks x 2 keys per epoch
    compact_iceberg(catalog(tmp_path), "db.events")
    found = [t.file for t in table(tmp_path).scan().plan_files()]
    assert sorted(f.partition[0] for f in found) == ["k0", "k1"]
    assert ids(tmp_path) == expected(range(3))


def test_retract_removes_compacted_files_after_the_savepoint_and_refuses_one_spanning_it(
        tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(3), per_task=3000)
    compact_iceberg(catalog(tmp_path), "db.events")  # epochs 0..2 in one (large) file
    run_epochs(h, range(3, 6))
    (first,) = [t.file for t in table(tmp_path).scan().plan_files()
                if t.file.record_count == 18_000]
    # bins as large as that file: it is full, epochs 3..5 become a file of their own
    compact_iceberg(catalog(tmp_path), "db.events", target_file_bytes=first.file_size_in_bytes)
    assert files(tmp_path) == 2
    state = h.sink.target_state(h.query_id)
    assert isinstance(state, TargetState) and state.progress == 5
    with pytest.raises(SavepointError, match=r"compacted data file .* holds epochs 0\.\.2 of "
                                             r"the line, across the savepoint's epoch 1"):
        h.sink.retract_after(state, 1)
    done = h.sink.retract_after(state, 2)
    assert done["retracted_epochs"] == [3]  # the file of 3..5, named by its first epoch
    assert ids(tmp_path) == expected(range(3), per_task=3000)


def test_a_large_compacted_file_waits_for_enough_new_rows(tmp_path):
    """Tiered: the file of epochs 0..5 (3,000 rows a task) takes in epoch 6's two small
    files only once they add up to half its size."""
    h = harness(tmp_path)
    run_epochs(h, range(6), per_task=3000)
    compact_iceberg(catalog(tmp_path), "db.events")
    run_epochs(h, range(6, 7))
    again = compact_iceberg(catalog(tmp_path), "db.events")
    assert again.rewritten_files == 2  # only epoch 6's files: 0..5 is far larger
    assert sorted(r[1:] for r in again.ranges.values()) == [[6, 6]]
    assert ids(tmp_path) == sorted(expected(range(6), per_task=3000) + expected(range(6, 7)))


def test_no_compacted_file_goes_on_past_a_savepoints_epoch(tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(6))
    result = compact_iceberg(catalog(tmp_path), "db.events", split_after=[2])
    assert sorted(r[1:] for r in result.ranges.values()) == [[0, 2], [3, 5]]
    state = h.sink.target_state(h.query_id)
    assert h.sink.retract_after(state, 2)["retracted_epochs"] == [3]
    assert ids(tmp_path) == expected(range(3))
