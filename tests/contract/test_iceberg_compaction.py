"""Compaction of the Iceberg sink's tables (connectors/iceberg/compaction.py) on real tables
written through the sink's protocol (embedded SQLite catalog, no Spark): fewer files, the
same rows in every snapshot, no conflict with the epoch commits, savepoint rollback intact."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from exactly.connectors.iceberg import compaction
from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.compaction import compact_iceberg
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.connectors.iceberg.snapshots import main_line
from exactly.errors import ConfigError, SavepointError
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


def before_first_commit(monkeypatch, action) -> list[int]:
    """Run ``action`` (another writer's commit) once, just before the compaction's first
    commit attempt; the list returned counts the attempts."""
    real = compaction._commit
    calls: list[int] = []

    def first(table, *args):
        if not calls:
            action()
        calls.append(1)
        return real(table, *args)

    monkeypatch.setattr(compaction, "_commit", first)
    return calls

def test_compaction_racing_an_epoch_commit_retries_and_both_land(tmp_path, monkeypatch):
    """The sink commits epoch 4 after the compaction read the table and before its commit:
    the catalog refuses the compaction (stale metadata), which tries again on the new one."""
    h = harness(tmp_path)
    run_epochs(h, range(4))
    calls = before_first_commit(monkeypatch, lambda: run_epochs(h, range(4, 5)))
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


# -- another writer's row-level deletes ----------------------------------------------------
#: the reserved field ids of a positional delete file's columns (Iceberg spec, "Position
#: Delete Files")
DELETE_FILE_PATH, DELETE_POS = 2147483546, 2147483545
#: a compacted file's name: part-<first>-<last>-c<8 hex>-<query>-00000.parquet
COMPACTED = re.compile(r"^part-\d{12}-\d{12}-c[0-9a-f]{8}-")


def commit_deletes(tbl, delete_file) -> None:
    """Commit ``delete_file`` (a pyiceberg ``DataFile`` of delete content) as another engine's
    merge-on-read delete does: a ``delete`` snapshot adding it in a delete manifest. pyiceberg
    0.12 deletes copy-on-write only (``write.delete.mode=merge-on-read`` warns and falls back),
    so its fast append is given a writer of delete manifests."""
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class RowDelta(_FastAppendFiles):
        def new_manifest_writer(self, spec):
            return DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(),
                                        self._snapshot_id, self._compression)

    tx = tbl.transaction()
    with RowDelta(operation=Operation.DELETE, transaction=tx, io=tbl.io) as delta:
        delta.append_data_file(delete_file)
    tx.commit_transaction()


def _write_parquet(tbl, name: str, rows: pa.Table) -> tuple[str, int]:
    import pyarrow.parquet as pq

    path = f"{tbl.location()}/data/{name}"
    with tbl.io.new_output(path).create() as out:
        pq.write_table(rows, out)
    return path, len(tbl.io.new_input(path))


def add_position_deletes(tbl, data_file, positions: list[int], *, bounds: bool = True) -> None:
    """Delete the rows at ``positions`` of ``data_file`` with a positional delete file of its
    own; ``bounds``: with the ``file_path`` bounds that tie it to that file (as Spark writes
    them), else it applies to every older file of the partition."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    def field(name: str, kind: pa.DataType, field_id: int) -> pa.Field:
        return pa.field(name, kind, nullable=False,
                        metadata={b"PARQUET:field_id": str(field_id).encode()})

    schema = pa.schema([field("file_path", pa.string(), DELETE_FILE_PATH),
                        field("pos", pa.int64(), DELETE_POS)])
    rows = pa.table({"file_path": [data_file.file_path] * len(positions), "pos": positions},
                    schema=schema)
    path, size = _write_parquet(tbl, "deletes-00000.parquet", rows)
    target = {DELETE_FILE_PATH: data_file.file_path.encode()} if bounds else None
    commit_deletes(tbl, DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=path,
        file_format=FileFormat.PARQUET, partition=data_file.partition, record_count=len(rows),
        file_size_in_bytes=size, lower_bounds=target, upper_bounds=target,
        spec_id=data_file.spec_id))


def add_equality_deletes(tbl, deleted_ids: list[int]) -> None:
    """Delete the rows whose ``id`` is one of ``deleted_ids`` with an equality delete file."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    id_field = tbl.schema().find_field("id").field_id
    rows = pa.table({"id": pa.array(deleted_ids, pa.int64())}, schema=pa.schema([pa.field(
        "id", pa.int64(), metadata={b"PARQUET:field_id": str(id_field).encode()})]))
    path, size = _write_parquet(tbl, "eq-deletes-00000.parquet", rows)
    commit_deletes(tbl, DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES, file_path=path,
        file_format=FileFormat.PARQUET, partition=Record(), record_count=len(rows),
        file_size_in_bytes=size, equality_ids=[id_field], spec_id=0))


def data_file_of(tmp_path: Path, epoch: int, first_id: int):
    """The live data file of ``epoch`` whose rows start at ``first_id``."""
    import pyarrow.parquet as pq

    for task in table(tmp_path).scan().plan_files():
        if task.file.file_path.split("/")[-1].startswith(f"part-{epoch:012d}-"):
            with table(tmp_path).io.new_input(task.file.file_path).open() as stream:
                if pq.read_table(stream)["id"][0].as_py() == first_id:
                    return task.file
    raise AssertionError(f"no file of epoch {epoch} starts at id {first_id}")


def test_a_file_another_writers_position_deletes_apply_to_stays_and_deleted_rows_stay_deleted(
        tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(5))
    held = data_file_of(tmp_path, 2, 20_000)  # rows 20_000..20_004
    add_position_deletes(table(tmp_path), held, [0, 3])
    assert 20_000 not in ids(tmp_path) and 20_003 not in ids(tmp_path)  # a real delete
    before = ids(tmp_path)
    assert before == [i for i in expected(range(5)) if i not in (20_000, 20_003)]

    result = compact_iceberg(catalog(tmp_path), "db.events")
    assert ids(tmp_path) == before  # the deleted rows stay deleted
    assert (result.files_before, result.rewritten_files, result.files_after) == (10, 9, 2)
    tasks = list(table(tmp_path).scan().plan_files())
    (kept,) = [t for t in tasks if t.file.file_path == held.file_path]
    assert [d.file_path.split("/")[-1] for d in kept.delete_files] == ["deletes-00000.parquet"]
    assert [t.delete_files for t in tasks if t is not kept] == [set()]  # the compacted file
    assert compact_iceberg(catalog(tmp_path), "db.events").snapshot is None
    run_epochs(h, range(5, 6))  # the sink goes on beside the delete file
    assert ids(tmp_path) == before + expected(range(5, 6))


def test_a_delete_file_without_path_bounds_holds_every_file_of_its_partition(tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(3))
    add_position_deletes(table(tmp_path), data_file_of(tmp_path, 1, 10_005), [4],
                         bounds=False)
    before = ids(tmp_path)
    assert 10_009 not in before
    result = compact_iceberg(catalog(tmp_path), "db.events")
    assert (result.snapshot, result.rewritten_files, result.files_after) == (None, 0, 6)
    assert ids(tmp_path) == before


def test_a_delete_committed_while_the_compaction_writes_abandons_it(tmp_path, monkeypatch):
    """The delete lands after the compaction chose its inputs: its commit is refused (stale
    metadata), and on the new metadata an input has a delete file: nothing changes, and the
    compaction's new files are deleted."""
    h = harness(tmp_path)
    run_epochs(h, range(3))
    calls = before_first_commit(monkeypatch, lambda: add_position_deletes(
        table(tmp_path), data_file_of(tmp_path, 0, 0), [1]))
    result = compact_iceberg(catalog(tmp_path), "db.events")
    assert (len(calls), result.snapshot, result.rewritten_files) == (1, None, 0)
    assert ids(tmp_path) == [i for i in expected(range(3)) if i != 1]
    assert files(tmp_path) == 6
    names = [p.name for p in (tmp_path / "lake").rglob("*.parquet")]
    assert not [n for n in names if COMPACTED.search(n)], names  # no compacted file left


def test_equality_deletes_refuse_the_compaction_naming_the_cause_and_the_fix(tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(3))
    add_equality_deletes(table(tmp_path), [10_001])
    snapshot = table(tmp_path).metadata.current_snapshot_id
    with pytest.raises(ConfigError, match=r"compaction of db\.events: the table has equality "
                                          r"delete files .* nothing was compacted\. .*"
                                          r"rewrite_data_files") as info:
        compact_iceberg(catalog(tmp_path), "db.events")
    assert "remove-dangling-deletes" in str(info.value)
    assert table(tmp_path).metadata.current_snapshot_id == snapshot
