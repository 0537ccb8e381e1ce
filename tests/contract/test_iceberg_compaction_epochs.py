"""What exactly's Iceberg compaction records of its rows' epochs (connectors/iceberg/
compaction.py), on real tables written through the sink's protocol (embedded SQLite catalog,
no Spark): a compacted file holds its inputs' rows in epoch order, and its snapshot's summary
and its own footer say how many rows of which epoch, in file order -- also for a file made
of compacted files; files of older compactions (no rows per epoch) are still compacted."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from exactly.connectors.iceberg import compaction
from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.compaction import EPOCHS_KEY, compact_iceberg
from exactly.connectors.iceberg.data_files import file_epochs
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.connectors.iceberg.snapshots import SUMMARY_COMPACTION
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64())])
QUERY = "0b5c6f9e-1111-4222-8333-944455556666"


def catalog(tmp_path: Path) -> CatalogSpec:
    return CatalogSpec.from_options({}, str(tmp_path / "lake"))


def harness(tmp_path: Path) -> ProtocolHarness:
    sink = IcebergSink("db.events", tmp_path / "log", catalog=catalog(tmp_path))
    sink.prepare_target(SCHEMA)
    return ProtocolHarness(sink, query_id=QUERY)


def table(tmp_path: Path):
    return catalog(tmp_path).load().load_table("db.events")


def run_epochs(h: ProtocolHarness, epochs: range) -> None:
    """Epoch e writes ids ``e * 100 + n``: 2 rows in one task, 3 in another (two files)."""
    for epoch in epochs:
        base = epoch * 100
        h.run_epoch(epoch, [pa.record_batch({"id": [base, base + 1]}, schema=SCHEMA),
                            pa.record_batch({"id": [base + 2, base + 3, base + 4]},
                                            schema=SCHEMA)])


def summary(tmp_path: Path) -> dict:
    current = table(tmp_path).current_snapshot()
    return json.loads(current.summary.additional_properties[SUMMARY_COMPACTION])


def file_ids(tmp_path: Path, path: str) -> list[int]:
    with table(tmp_path).io.new_input(path).open() as stream:
        return pq.read_table(stream)["id"].to_pylist()


def test_the_summary_records_each_epochs_rows_also_of_a_file_made_of_compacted_files(tmp_path):
    h = harness(tmp_path)
    run_epochs(h, range(3))
    first = compact_iceberg(catalog(tmp_path), "db.events", keep_newest_epochs=1)
    (path,) = first.ranges
    assert summary(tmp_path) == {path: [QUERY, 0, 1, [[0, 5], [1, 5]]]}
    assert first.epoch_rows == {path: [[0, 5], [1, 5]]}
    assert [i // 100 for i in file_ids(tmp_path, path)] == [0] * 5 + [1] * 5

    run_epochs(h, range(3, 4))
    again = compact_iceberg(catalog(tmp_path), "db.events")  # 0..1 (its footer), 2, 3
    (merged,) = again.ranges
    assert summary(tmp_path) == {merged: [QUERY, 0, 3, [[0, 5], [1, 5], [2, 5], [3, 5]]]}
    assert [i // 100 for i in file_ids(tmp_path, merged)] == sorted([0, 1, 2, 3] * 5)
    with table(tmp_path).io.new_input(merged).open() as stream:
        footer = pq.ParquetFile(stream).schema_arrow.metadata
    assert json.loads(footer[EPOCHS_KEY]) == [[0, 5], [1, 5], [2, 5], [3, 5]]


def test_inputs_out_of_epoch_order_are_written_in_epoch_order(tmp_path):
    """Whatever order a merge's inputs come in (a compacted input may reach past a plain
    file an earlier merge left out), the rows go out in epoch order, an epoch's inputs in
    their order."""
    h = harness(tmp_path)
    run_epochs(h, range(3))
    tbl = table(tmp_path)
    files = sorted((t.file for t in tbl.scan().plan_files()),
                   key=lambda f: (file_epochs(f.file_path), f.file_path))
    e0a, e0b, e1a, _, e2a, e2b = files
    backwards = compaction._Group(QUERY, [e2a, e0a, e2b, e1a, e0b])
    facts, epochs = compaction._rewrite(tbl, compaction.LayoutWriter(
        compaction.TableLayout.of(tbl, {})), backwards)
    assert epochs == [[0, 5], [1, e1a.record_count], [2, 5]]
    assert file_ids(tmp_path, facts.path) == [
        i for f in (e0a, e0b, e1a, e2a, e2b) for i in file_ids(tmp_path, f.file_path)]


def test_a_file_of_an_older_compaction_is_compacted_again_and_recorded_by_its_range(
        tmp_path, monkeypatch):
    """An older compaction recorded ``[query, first, last]`` only and wrote no epochs into
    the file: a merge with it keeps its rows (oldest epochs first) and records the range."""
    h = harness(tmp_path)
    run_epochs(h, range(2))
    with monkeypatch.context() as older:
        older.setattr(compaction, "EPOCHS_KEY", b"older.compaction")
        older.setattr(compaction, "compaction_summary", lambda ranges, _: {
            SUMMARY_COMPACTION: json.dumps(ranges)})
        (path,) = compact_iceberg(catalog(tmp_path), "db.events").ranges
    assert summary(tmp_path) == {path: [QUERY, 0, 1]}

    run_epochs(h, range(2, 4))
    again = compact_iceberg(catalog(tmp_path), "db.events")
    (merged,) = again.ranges
    assert summary(tmp_path) == {merged: [QUERY, 0, 3]} and again.epoch_rows == {}
    assert [i // 100 for i in file_ids(tmp_path, merged)] == sorted([0, 1, 2, 3] * 5)
