"""The Iceberg observer on a real pyiceberg table (the embedded SQLite catalog; no Spark, no
server): every snapshot of the main line is read once, also those committed between two
polls, each row with the epoch of the snapshot that added its file, and the table's progress
property with it; and the checker names what a broken table shows a reader."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.connectors.iceberg.snapshots import SUMMARY_EPOCH, SUMMARY_QUERY
from exactly.protocol.contract import SinkSettings
from exactly.testing.harness import ProtocolHarness
from exactly.testing.nemesis.checker import Anomaly, History, Row, check
from exactly.testing.nemesis.observers import IcebergObserver

SCHEMA = pa.schema([("id", pa.int64())])


def batch(ids) -> pa.RecordBatch:
    return pa.record_batch({"id": list(ids)}, schema=SCHEMA)


def found(report) -> set[Anomaly]:
    return {kind for kind, count in report.counts.items() if count}


def test_every_snapshot_is_read_with_the_epochs_of_its_files_and_the_progress_record(
        tmp_path):
    warehouse = tmp_path / "lake"
    sink = IcebergSink("db.events", tmp_path / "log",
                       catalog=CatalogSpec.from_options({}, str(warehouse)))
    sink.prepare_target(SCHEMA)
    query = ProtocolHarness(sink, SinkSettings(), query_id="q-1")
    history = History()
    observer = IcebergObserver(history, f"iceberg:{warehouse}?table=db.events")
    try:
        observer.poll()  # the table exists, no snapshot yet: nothing seen, no error
        query.run_epoch(0, [batch([0, 1]), batch([2])])  # two tasks: two files, one snapshot
        observer.poll()
        query.run_epoch(1, [batch([3, 4])])
        query.run_epoch(2, [batch([5])])  # both between two polls: each read all the same
        observer.poll()
        observer.poll()  # nothing new: no observation
        other = sink._iceberg(fresh=True)
        other.append(pa.table({"id": pa.array([9], pa.int64())}))  # another writer: no epoch
        observer.poll()
        final = IcebergObserver(History(), f"iceberg:{warehouse}?table=db.events",
                                name="final").current_rows()
    finally:
        observer.reset()
        query.close()

    assert len(observer.snapshots_read) == 4
    assert [len(o.rows) for o in history.observations()] == [3, 5, 6, 7]
    everything = [Row(0, 0), Row(1, 0), Row(2, 0), Row(3, 1), Row(4, 1), Row(5, 2),
                  Row(9, None)]
    assert sorted(history.last("iceberg"), key=lambda r: r.id) == everything
    assert sorted(final, key=lambda r: r.id) == everything
    # the property was read with each metadata version: epoch 0, then 2 (1 came between)
    assert [(r.query, r.recorded, r.shown) for r in history.epoch_records()] == [
        ("q-1", 0, 0), ("q-1", 2, 2)]
    report = check(history, expected_ids=[0, 1, 2, 3, 4, 5, 9], final_rows=final,
                   whole_epochs=True, epoch_of={0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2})
    assert report.ok, report.render()
    assert report.stats["epoch records"] == 2
    assert not history.errors


def test_a_torn_epoch_a_vanished_id_and_a_wrong_progress_record_are_named(tmp_path):
    """Snapshots no exactly-once sink may commit, made with plain pyiceberg: epoch 0 in two
    snapshots (a reader of the first sees part of it), epoch 1 whose file is then deleted
    (its ids vanish), and a progress property ahead of the table's snapshots."""
    table = _table(tmp_path / "lake")
    epoch = {SUMMARY_QUERY: "q-1"}
    history = History()
    observer = IcebergObserver(history, f"iceberg:{tmp_path / 'lake'}?table=db.events")
    try:
        table.append(_ids([0, 1]), snapshot_properties={**epoch, SUMMARY_EPOCH: "0"})
        table.append(_ids([2]), snapshot_properties={**epoch, SUMMARY_EPOCH: "0"})
        with table.transaction() as tx:
            tx.set_properties({"exactly.epoch.q-1": "1"})
            tx.append(_ids([3, 4]), snapshot_properties={**epoch, SUMMARY_EPOCH: "1"})
        observer.poll()
        table.delete("id >= 3")  # the epoch-1 file dropped whole: copy-on-write, no delete file
        with table.transaction() as tx:
            tx.set_properties({"exactly.epoch.q-1": "7"})  # names an epoch it does not hold
        observer.poll()
    finally:
        observer.reset()
    report = check(history, expected_ids=range(5), final_rows=[(i, 0) for i in range(3)]
                   + [(3, 1), (4, 1)], whole_epochs=True)
    assert found(report) == {Anomaly.TORN_EPOCH, Anomaly.VANISHED, Anomaly.EPOCH_RECORD}
    assert report.counts[Anomaly.TORN_EPOCH] == 1  # epoch 0, in the first snapshot
    assert report.counts[Anomaly.VANISHED] == 2  # ids 3 and 4
    (record,) = report.anomalies[Anomaly.EPOCH_RECORD]
    assert "records epoch 7 of query q-1 as its newest, its commits' newest is 1" in record


def _table(warehouse: Path):
    catalog = CatalogSpec.from_options({}, str(warehouse)).load()
    catalog.create_namespace_if_not_exists(("db",))
    return catalog.create_table(("db", "events"), schema=SCHEMA)


def _ids(ids) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})
