"""Compaction of the Delta sink's table (exactly.connectors.delta.compaction), on real tables
through the real commit protocol: fewer files, the same rows in every version, no conflict
with epoch commits racing it (either way round), a retract that still knows each row's
epochs, and replays still recognised after the replayed epoch's files were compacted."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from exactly.connectors.delta import compaction
from exactly.connectors.delta import sink as delta_sink
from exactly.connectors.delta.commits import file_origins, read_commit
from exactly.connectors.delta.compaction import compact_delta
from exactly.connectors.delta.sink import DeltaSink, app_id, data_file
from exactly.errors import SavepointError
from exactly.objectstore import Location
from exactly.protocol.faults import FaultPoint
from exactly.protocol.target_state import Edge, line_state
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])
PARTITIONS = 3  # files per epoch: one per task


def rows(ids: list[int]) -> pa.RecordBatch:
    """Rows whose keys do not compress (an epoch's files are mostly rows, not footers: file
    sizes add up as rows do)."""
    return pa.record_batch({"id": ids, "key": [hashlib.sha256(b"%d" % i).hexdigest()
                                               for i in ids]}, schema=SCHEMA)


def epoch_input(epoch: int) -> list[pa.RecordBatch]:
    """``PARTITIONS`` tasks of 50 ids each: ids epoch*1000 .. epoch*1000+149."""
    return [rows(list(range(epoch * 1000 + 50 * p, epoch * 1000 + 50 * p + 50)))
            for p in range(PARTITIONS)]


def truth(epochs: range | list[int]) -> list[int]:
    return sorted(i for e in epochs for b in epoch_input(e) for i in b.column(0).to_pylist())


def harness(tmp_path: Path, log: str = "log", query: str = "q-1") -> ProtocolHarness:
    sink = DeltaSink(str(tmp_path / "table"), tmp_path / log)
    sink.prepare_target(SCHEMA)
    return ProtocolHarness(sink, query_id=query)


def ids(tmp_path: Path, version: int | None = None) -> list[int]:
    table = DeltaTable(str(tmp_path / "table"), version=version)
    return sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist())


def files(tmp_path: Path) -> list[str]:
    table = DeltaTable(str(tmp_path / "table"))
    return sorted(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())


def files_per_epoch(tmp_path: Path) -> Counter[int]:
    """Live files per epoch of the newest version (a compacted file counts for each epoch
    it holds: epochs first..last share it)."""
    found: Counter[int] = Counter()
    for path in files(tmp_path):
        f = data_file(path)
        if f is not None:
            for epoch in range(f.first, f.last + 1):
                found[epoch] += 1 / (f.last - f.first + 1)
    return found


def log_actions(tmp_path: Path, version: int) -> list[dict]:
    text = (tmp_path / "table" / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_compaction_merges_each_querys_epoch_files_and_no_version_reads_differently(
        tmp_path, monkeypatch, capsys):
    """12 epochs of 3 files each and another writer's file: one compaction commit replaces
    the 36 epoch files with one file named by the epochs it holds (rows in epoch order,
    row groups of the sink's size, the sink's statistics), leaves the other writer's file,
    says dataChange=false for every file it touches, and every version -- before and after
    -- reads the same rows as before. A second run finds nothing to do."""
    monkeypatch.setattr(delta_sink, "ROW_GROUP_ROWS", 500)
    h = harness(tmp_path)
    for epoch in range(12):
        h.run_epoch(epoch, epoch_input(epoch))
    write_deltalake(str(tmp_path / "table"), pa.table(rows([9001])), mode="append")
    before = {v: ids(tmp_path, v) for v in range(DeltaTable(str(tmp_path / "table")).version()
                                                    + 1)}
    per_epoch_before = files_per_epoch(tmp_path)

    planned = compact_delta(str(tmp_path / "table"), dry_run=True)
    assert (planned.table_version, planned.rewritten_files, planned.written_files) == \
        (None, 36, 1)
    assert len(files(tmp_path)) == 37  # a dry run writes nothing

    result = compact_delta(str(tmp_path / "table"))
    per_epoch_after = files_per_epoch(tmp_path)
    print(f"files per epoch: before {per_epoch_before[0]:.2f}, after {per_epoch_after[0]:.2f}; "
          f"table files {result.files_before} -> {result.files_after}")
    assert (result.files_before, result.files_after) == (37, 2)
    assert (result.rewritten_files, result.written_files) == (36, 1)
    assert result.epochs_by_query() == {"q-1": [(0, 11)]}
    assert set(per_epoch_before.values()) == {3} and set(per_epoch_after.values()) == {1 / 12}

    newest = DeltaTable(str(tmp_path / "table")).version()
    assert result.table_version == newest == max(before) + 1
    assert ids(tmp_path) == before[max(before)] == sorted([*truth(range(12)), 9001])
    assert {v: ids(tmp_path, v) for v in before} == before  # time travel unchanged
    (output,) = [p for p in files(tmp_path) if data_file(p) is not None]
    found = data_file(output)
    assert found is not None and (found.query_id, found.first, found.last, found.compacted) == \
        ("q-1", 0, 11, True)

    actions = log_actions(tmp_path, newest)
    assert {a["add"]["dataChange"] for a in actions if "add" in a} == {False}
    assert {a["remove"]["dataChange"] for a in actions if "remove" in a} == {False}
    assert not [a for a in actions if "txn" in a]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    recorded = json.loads(info[delta_sink.COMPACTION_KEY])
    assert {k: v[:3] for k, v in recorded.items()} == {output: ["q-1", 0, 11]}

    footer = pq.ParquetFile(tmp_path / "table" / output).metadata
    assert [footer.row_group(i).num_rows for i in range(footer.num_row_groups)] == \
        [500, 500, 500, 300]
    data = pq.read_table(tmp_path / "table" / output)
    assert data.schema.equals(SCHEMA) and data["id"].to_pylist() == truth(range(12))
    (add,) = [a for a in pa.table(DeltaTable(str(tmp_path / "table")).get_add_actions(
        flatten=True)).to_pylist() if a["path"] == output]
    assert (add["num_records"], add["min.id"], add["max.id"]) == (1800, 0, 11149)

    again = compact_delta(str(tmp_path / "table"))
    assert (again.table_version, again.rewritten_files) == (None, 0)


def test_compacted_files_keep_the_version_their_rows_were_committed_in_for_the_audit(tmp_path):
    """The audit orders rows by the version of the commit that added their file
    (``--latest-by-key``): a compacted file's origin is the version of its newest epoch's
    commit, not the compaction's, so epochs committed after it still sort after it."""
    h = harness(tmp_path)
    for epoch in range(4):
        h.run_epoch(epoch, epoch_input(epoch))  # versions 1..4
    compact_delta(str(tmp_path / "table"))  # version 5
    h.run_epoch(4, epoch_input(4))  # version 6
    fs, base = Location.parse(str(tmp_path / "table")).filesystem()
    origins = file_origins(fs, base, files(tmp_path), 6)
    by_range = {(f.first, f.last): origins[f.path] for f in map(data_file, files(tmp_path))
                if f is not None}
    assert {r: (o.version, o.epoch) for r, o in by_range.items()} == {
        (0, 3): (4, None), (4, 4): (6, 4)}
    assert read_commit(fs, base, 5).epoch is None  # a compaction commit holds no one epoch


def test_small_new_epochs_are_not_rewritten_into_a_large_compacted_file_every_run(tmp_path):
    """Tiered packing: a compacted file larger than the new epochs' files together stays
    as it is; the new ones are merged among themselves, and once they add up to its size
    the next run merges them all."""
    h = harness(tmp_path)
    for epoch in range(8):
        h.run_epoch(epoch, epoch_input(epoch))
    assert compact_delta(str(tmp_path / "table")).epochs_by_query() == {"q-1": [(0, 7)]}
    for epoch in range(8, 10):
        h.run_epoch(epoch, epoch_input(epoch))
    assert compact_delta(str(tmp_path / "table")).epochs_by_query() == {"q-1": [(8, 9)]}
    for epoch in range(10, 16):
        h.run_epoch(epoch, epoch_input(epoch))
    third = compact_delta(str(tmp_path / "table"))
    assert third.epochs_by_query() == {"q-1": [(0, 15)]}
    assert ids(tmp_path) == truth(range(16))


def test_keep_newest_epochs_split_after_and_the_target_size_end_runs(tmp_path):
    h = harness(tmp_path)
    for epoch in range(9):
        h.run_epoch(epoch, epoch_input(epoch))
    table = str(tmp_path / "table")
    planned = compact_delta(table, keep_newest_epochs=2, split_after=[3], dry_run=True)
    assert planned.epochs_by_query() == {"q-1": [(0, 3), (4, 6)]}
    one_epoch = sum(a["size_bytes"] for a in pa.table(DeltaTable(table).get_add_actions(
        flatten=True)).to_pylist() if data_file(a["path"]).first == 0)
    small = compact_delta(table, target_file_bytes=int(one_epoch * 2.5), dry_run=True)
    assert small.epochs_by_query() == {"q-1": [(0, 1), (2, 3), (4, 5), (6, 7), (8, 8)]}


def test_an_epoch_commit_landing_between_compactions_read_and_commit_both_commit_ids_once(
        tmp_path, monkeypatch):
    """Compaction wrote its file and read the newest version (4); epoch 4's commit lands
    (version 5) before compaction commits. Its commit of version 5 loses the race; it
    reads version 5, finds its inputs still there and commits version 6. Both commits are
    in the table, every id once, and version 5 reads as version 6 does."""
    h = harness(tmp_path)
    for epoch in range(4):
        h.run_epoch(epoch, epoch_input(epoch))
    landed = compaction._Run._landed

    def epoch_meanwhile(run, tried, newest):
        if newest == 4:
            h.run_epoch(4, epoch_input(4))
        return landed(run, tried, newest)

    monkeypatch.setattr(compaction._Run, "_landed", epoch_meanwhile)
    result = compact_delta(str(tmp_path / "table"))
    table = DeltaTable(str(tmp_path / "table"))
    assert result.epochs_by_query() == {"q-1": [(0, 3)]}
    assert (result.attempts, result.table_version, table.version()) == (2, 6, 6)
    assert table.transaction_version(app_id("q-1")) == 4
    assert ids(tmp_path) == ids(tmp_path, 5) == truth(range(5))
    assert [data_file(p).first for p in files(tmp_path)] == [0, 4, 4, 4]


def test_a_compaction_landing_between_the_sinks_read_and_its_commit_fails_no_epoch(
        tmp_path, monkeypatch):
    """The sink read the table for epoch 4 (commit_handle), a compaction commits, and the
    sink commits epoch 4 on its older view: deltalake rebases the blind append over the
    compaction (no file of one is a file of the other). The epoch is committed once."""
    h = harness(tmp_path)
    for epoch in range(4):
        h.run_epoch(epoch, epoch_input(epoch))
    publish = DeltaSink.publish_epoch

    def compaction_first(sink, epoch, handles):
        compacted.append(compact_delta(sink.uri))
        return publish(sink, epoch, handles)

    compacted: list[compaction.CompactionResult] = []
    monkeypatch.setattr(DeltaSink, "publish_epoch", compaction_first)
    h.run_epoch(4, epoch_input(4))
    assert compacted[0].table_version == 5
    table = DeltaTable(str(tmp_path / "table"))
    assert table.version() == 6 and table.transaction_version(app_id("q-1")) == 4
    assert ids(tmp_path) == truth(range(5))


def test_two_compactions_racing_never_commit_a_file_twice(tmp_path, monkeypatch):
    """deltalake lets a commit through that removes a file a concurrent commit removed with
    dataChange=false (measured, deltalake 1.6): two rebased compactions would both commit
    and duplicate rows. A compaction is never rebased: the slower one finds its inputs gone
    in the new version, deletes its outputs and plans again on that version."""
    h = harness(tmp_path)
    for epoch in range(6):
        h.run_epoch(epoch, epoch_input(epoch))
    write = compaction._Run.write
    other: list[compaction.CompactionResult] = []

    def another_meanwhile(run, bins):
        outputs = write(run, bins)
        if not other:
            monkeypatch.setattr(compaction._Run, "write", write)
            other.append(compact_delta(str(tmp_path / "table")))
        return outputs

    monkeypatch.setattr(compaction._Run, "write", another_meanwhile)
    slower = compact_delta(str(tmp_path / "table"))
    assert other[0].epochs_by_query() == {"q-1": [(0, 5)]}
    assert slower.table_version is None and slower.rewritten_files == 0  # nothing left to do
    assert ids(tmp_path) == truth(range(6))
    assert [p for p in files(tmp_path)] == [other[0].ranges[0].file]
    on_disk = {p.name for p in (tmp_path / "table").glob("part-*.parquet")
               if (found := data_file(p.name)) is not None and found.compacted}
    assert on_disk == {other[0].ranges[0].file}  # the slower one's outputs were deleted


def line_of(sink: DeltaSink, query: str):
    return line_state(sink.describe_target(), list[Edge](), query,
                      lambda q: DeltaTable(sink.uri).transaction_version(app_id(q)))


def test_a_retract_removes_compacted_files_after_the_savepoint_and_refuses_one_spanning_it(
        tmp_path):
    """Epochs 0..7 compacted into files of epochs 0..2, 3..5 and 6..7. A retract after epoch
    5 removes the file of 6..7 and keeps the others; a retract after 4 is refused naming the
    file of 3..5 and the fixes (a savepoint at or after epoch 5, or keep)."""
    h = harness(tmp_path)
    for epoch in range(8):
        h.run_epoch(epoch, epoch_input(epoch))
    result = compact_delta(str(tmp_path / "table"), split_after=[2, 5])
    assert result.epochs_by_query() == {"q-1": [(0, 2), (3, 5), (6, 7)]}
    spanning = next(r.file for r in result.ranges if r.first == 3)
    sink = h.sink

    state = line_of(sink, "q-1")
    refusal = sink.rollback_support(state, 4).retract
    assert refusal is not None and spanning in refusal and "epochs 3..5" in refusal
    assert "at or after epoch 5" in refusal and "--sink-rollback keep" in refusal
    with pytest.raises(SavepointError, match=r"--sink-rollback retract: compaction merged"):
        sink.retract_after(state, 4)
    assert ids(tmp_path) == truth(range(8))  # the refusal changed nothing

    done = sink.retract_after(state, 5)
    assert done == {"retracted_files": 1, "retracted_epochs": [6, 7]}
    assert ids(tmp_path) == truth(range(6))
    assert DeltaTable(str(tmp_path / "table")).transaction_version(app_id("q-1")) == 5


def test_a_retract_racing_a_compaction_plans_again_and_takes_the_compacted_rows_back(
        tmp_path, monkeypatch):
    """The retract after epoch 3 planned on a version where epochs 4..5 are task files; a
    compaction then merges them into one file before the retract commits. Rebased, the
    retract would remove files already removed and leave the compacted copy (deltalake
    does not see the double removal); never rebased, it plans again and removes the
    compacted file."""
    h = harness(tmp_path)
    for epoch in range(6):
        h.run_epoch(epoch, epoch_input(epoch))
    plan = DeltaSink._retract_plan
    raced: list[compaction.CompactionResult] = []

    def compaction_after_the_plan(sink, table, state, epoch):
        planned = plan(sink, table, state, epoch)
        if not raced:
            raced.append(compact_delta(sink.uri, split_after=[3]))
        return planned

    monkeypatch.setattr(DeltaSink, "_retract_plan", compaction_after_the_plan)
    done = h.sink.retract_after(line_of(h.sink, "q-1"), 3)
    assert raced[0].epochs_by_query() == {"q-1": [(0, 3), (4, 5)]}
    assert done == {"retracted_files": 1, "retracted_epochs": [4, 5]}
    assert ids(tmp_path) == truth(range(4))


def test_after_a_compaction_the_sink_still_recognises_replays_and_commits_on(tmp_path):
    """Epoch 3's Delta commit lands, then the driver dies before recording it complete;
    compaction merges epochs 0..3 (epoch 3's files included). The restarted driver's replay
    of epoch 3 is recognised by the table (ALREADY_COMMITTED: nothing added twice), as is a
    replay from a driver whose commit log was lost; epoch 4 commits on."""
    h = harness(tmp_path)
    for epoch in range(3):
        h.run_epoch(epoch, epoch_input(epoch))
    handles = h.tasks(3, epoch_input(3))
    with h.crash_at(FaultPoint.AFTER_COMMITS, epoch=3):
        h.commit(3, handles)
    assert compact_delta(str(tmp_path / "table")).epochs_by_query() == {"q-1": [(0, 3)]}
    h.restart()
    h.run_epoch(3, epoch_input(3))
    completion = h.completion(3)
    assert completion is not None and completion["already_committed"] == PARTITIONS
    assert ids(tmp_path) == truth(range(4)) and h.pre_commits() == []

    lost_log = harness(tmp_path, log="log-b")
    lost_log.run_epoch(3, epoch_input(3))
    assert lost_log.completion(3)["already_committed"] == PARTITIONS
    h.run_epoch(4, epoch_input(4))
    assert ids(tmp_path) == truth(range(5))


def test_a_commit_whose_answer_was_lost_while_compaction_merged_its_files_is_recognised(
        tmp_path):
    """The store applied epoch 2's commit but its answer was lost (an OSError), and before
    the sink looks, a compaction merged the epoch's files: they are no longer in the newest
    version, but the commit after the sink's read added them: the epoch is committed (not
    an error, not fenced), once."""
    h = harness(tmp_path)
    for epoch in range(2):
        h.run_epoch(epoch, epoch_input(epoch))
    table = h.sink._delta()
    real = table.create_write_transaction

    def answer_lost(*args, **kwargs):
        real(*args, **kwargs)
        compact_delta(h.sink.uri)
        raise OSError("connection reset by peer (the answer to the PUT)")

    table.create_write_transaction = answer_lost
    h.run_epoch(2, epoch_input(2))
    assert ids(tmp_path) == truth(range(3))
    assert DeltaTable(str(tmp_path / "table")).transaction_version(app_id("q-1")) == 2
    assert h.log.completed_epochs() == [0, 1, 2] and h.pre_commits() == []


def test_exactly_verify_reads_a_compacted_table_in_commit_order(tmp_path):
    """``exactly verify`` on a compacted table: every id once (the compacted rows count as
    epoch "none": a file of several epochs has no one epoch), and ``--latest-by-key`` still
    takes a key's newest row: epochs 0..2, compacted after epoch 3 committed, sort before
    epoch 3 by the version their rows were committed in."""
    from exactly.auditor import verify

    schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
    sink = DeltaSink(str(tmp_path / "table"), tmp_path / "log")
    sink.prepare_target(schema)
    h = ProtocolHarness(sink)
    for epoch, (key, n) in enumerate([("a", 1), ("b", 1), ("c", 1), ("a", 2)]):
        h.run_epoch(epoch, [pa.table({"key": [key], "n": [n]}, schema=schema)] * 2)
    result = compact_delta(str(tmp_path / "table"), keep_newest_epochs=1)
    assert result.epochs_by_query() == {h.query_id: [(0, 2)]}
    source = tmp_path / "in"
    source.mkdir()
    (source / "e.jsonl").write_text("".join(json.dumps({"key": k}) + "\n"
                                            for k in ["a", "b", "c", "a"] for _ in range(2)))
    report = verify(source, tmp_path / "table", key="key", compare=("n",), latest_by_key=True,
                    expect="select key, count(*) // 2 as n from input group by key")
    assert report.ok, report.rows()
    plain = verify(source, tmp_path / "table", key="key")
    assert [(e.epoch, e.rows) for e in plain.epochs] == [(3, 2), (None, 6)]


@pytest.mark.server
def test_compaction_on_an_object_store_merges_the_files_and_keeps_the_rows(s3_server, tmp_path):
    """The same on S3Proxy: outputs uploaded in place (nothing renamed), the commit id read
    back from ``_delta_log`` on the store."""
    import uuid

    bucket = f"compact-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    uri, options = f"s3://{bucket}/table", s3_server.storage_options()
    sink = DeltaSink(uri, tmp_path / "log", storage_options=options)
    sink.prepare_target(SCHEMA)
    h = ProtocolHarness(sink, query_id="q-1")
    for epoch in range(4):
        h.run_epoch(epoch, epoch_input(epoch))
    result = compact_delta(uri, options)
    assert (result.files_before, result.files_after, result.table_version) == (12, 1, 5)
    table = DeltaTable(uri, storage_options=options)
    assert sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist()) == truth(range(4))
    h.run_epoch(4, epoch_input(4))
    assert DeltaTable(uri, storage_options=options).transaction_version(app_id("q-1")) == 4
