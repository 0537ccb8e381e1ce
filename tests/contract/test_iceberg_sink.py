"""The Iceberg sink's own promises, beyond the common protocol (test_commit_protocol.py): one
snapshot per epoch that the table itself recognises (summary and progress property), even
after its snapshots expired; a stale instance of the query fenced by the table; another
writer's commit in between retried; a commit whose answer was lost decided by the table;
partitioned tables; the table's schema checked. The embedded SQLite catalog, no Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.connectors.iceberg.snapshots import committed_epoch, main_line, progress_property
from exactly.errors import ConfigError, FencedError
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("day", pa.date32())])


def rows(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": ids, "key": [f"k{i % 2}" for i in ids],
                            "day": pa.array([i % 3 for i in ids], pa.int32()).cast(pa.date32())},
                           schema=SCHEMA)


def catalog(tmp_path: Path) -> CatalogSpec:
    return CatalogSpec.from_options({}, str(tmp_path / "lake"))


def new_sink(tmp_path: Path, log: str = "log", **kwargs) -> IcebergSink:
    sink = IcebergSink("db.events", tmp_path / log, catalog=catalog(tmp_path), **kwargs)
    sink.prepare_target(SCHEMA)
    return sink


def table(tmp_path: Path):
    return catalog(tmp_path).load().load_table("db.events")


def ids(tmp_path: Path) -> list[int]:
    return sorted(table(tmp_path).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist())


def test_each_epoch_is_one_snapshot_carrying_the_query_and_epoch(tmp_path):
    h = ProtocolHarness(new_sink(tmp_path))
    h.run_epoch(0, [rows([1, 2]), rows([3])])
    h.run_epoch(1, [rows([4]), []])
    t = table(tmp_path)
    line = list(main_line(t))
    assert [(e.query_id, e.epoch, e.operation) for e in reversed(line)] == [
        (h.query_id, 0, "append"), (h.query_id, 1, "append")]
    assert int(line[-1].snapshot.summary["added-data-files"]) == 2  # one file per task
    assert t.metadata.properties[progress_property(h.query_id)] == "1"
    assert ids(tmp_path) == [1, 2, 3, 4]


def test_an_epoch_the_table_holds_is_not_committed_again_even_after_its_snapshots_expired(
        tmp_path):
    """A driver whose commit log was lost publishes epoch 1 again with new files: the table
    adds nothing -- also after another writer's commit and an expiry left no snapshot of the
    query (the progress property outlives them)."""
    first = ProtocolHarness(new_sink(tmp_path, "log-a"), query_id="q-1")
    first.run_epoch(0, [rows([1, 2])])
    first.run_epoch(1, [rows([3])])
    t = table(tmp_path)
    t.append(pa.table({"id": [100], "key": ["x"], "day": pa.array([0], pa.int32())
                       .cast(pa.date32())}, schema=SCHEMA))
    t.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in t.metadata.snapshots[:-1]]).commit()
    assert [e.query_id for e in main_line(table(tmp_path))] == [None]
    second = ProtocolHarness(new_sink(tmp_path, "log-b"), query_id="q-1")
    second.run_epoch(1, [rows([3])])
    assert ids(tmp_path) == [1, 2, 3, 100]
    second.run_epoch(2, [rows([4])])
    assert ids(tmp_path) == [1, 2, 3, 4, 100]


def test_a_stale_instance_of_the_query_is_fenced_by_the_table_and_commits_nothing(tmp_path):
    """Both drivers read the table before either commits epoch 0 (their lease checks and
    intents passed, as in a partition). The second's commit is refused by the catalog (its
    metadata is stale); it reads the table again, finds epoch 0 committed with other files,
    and is fenced -- pyiceberg's own retry, which would append it on top, is off."""
    first = ProtocolHarness(new_sink(tmp_path, "log-a"), query_id="q-1")
    second = ProtocolHarness(new_sink(tmp_path, "log-b"), query_id="q-1")
    second.sink._iceberg()  # its view of the table, from before first's commit
    first.run_epoch(0, [rows([1, 2])])
    with pytest.raises(FencedError, match=r"committed to .* by another writer"):
        second.run_epoch(0, [rows([1, 2])])
    assert ids(tmp_path) == [1, 2]
    assert [e.epoch for e in main_line(table(tmp_path))] == [0]


def test_another_writers_commit_in_between_is_retried_on_the_new_metadata(tmp_path):
    sink = new_sink(tmp_path)
    h = ProtocolHarness(sink)
    h.run_epoch(0, [rows([1])])
    table(tmp_path).append(pa.Table.from_batches([rows([50])]))  # the sink's view is stale
    h.run_epoch(1, [rows([2])])
    assert ids(tmp_path) == [1, 2, 50]
    assert [e.epoch for e in reversed(list(main_line(table(tmp_path))))] == [0, None, 1]


def test_a_commit_whose_answer_was_lost_is_decided_by_the_table(tmp_path, monkeypatch):
    """The catalog applies the commit, then the answer is lost (the connection drops): the
    sink reads the table, finds the epoch with its own files, and does not commit again."""
    sink = new_sink(tmp_path)
    h = ProtocolHarness(sink)
    h.run_epoch(0, [rows([1])])
    real = type(sink._load_catalog()).commit_table

    def applies_then_fails(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise ConnectionResetError("the answer was lost")

    monkeypatch.setattr(type(sink._load_catalog()), "commit_table", applies_then_fails)
    h.run_epoch(1, [rows([2, 3])])
    monkeypatch.undo()
    assert ids(tmp_path) == [1, 2, 3]
    assert [e.epoch for e in main_line(table(tmp_path))] == [1, 0]
    assert committed_epoch(table(tmp_path), h.query_id) == 1


def test_a_partitioned_table_gets_a_file_per_partition_value_and_prunes_on_read(tmp_path):
    h = ProtocolHarness(new_sink(tmp_path, partition_by="key, bucket(4, id)"))
    h.run_epoch(0, [rows(list(range(0, 10))), rows(list(range(10, 20)))])
    t = table(tmp_path)
    files = [task.file for task in t.scan().plan_files()]
    assert {f.partition[0] for f in files} == {"k0", "k1"}
    assert all(f"/key={f.partition[0]}/id_bucket_4={f.partition[1]}/" in f.file_path
               for f in files)
    pruned = t.scan(row_filter="key == 'k1'")
    assert {task.file.partition[0] for task in pruned.plan_files()} == {"k1"}
    assert sorted(pruned.to_arrow()["id"].to_pylist()) == list(range(1, 20, 2))
    assert ids(tmp_path) == list(range(20))
    with pytest.raises(ConfigError, match=r"partitioned by key, bucket\(4, id\), "
                                          r"partitionBy asks for day\(day\)"):
        new_sink(tmp_path, "log-b", partition_by="day(day)")


def test_statistics_of_each_file_let_readers_skip_files(tmp_path):
    h = ProtocolHarness(new_sink(tmp_path))
    h.run_epoch(0, [rows([1, 2, 3]), rows([10, 11])])
    t = table(tmp_path)
    files = [task.file for task in t.scan().plan_files()]
    assert sorted(f.record_count for f in files) == [2, 3]
    assert [task.file.record_count for task in t.scan(row_filter="id >= 10").plan_files()] \
        == [2]


def test_a_compression_codec_parquet_cannot_write_is_refused_when_the_sink_is_built(tmp_path):
    """Refused before the query starts (and before the table exists), naming the codecs;
    a known one, in any case, becomes the new table's codec."""
    from exactly.spark.formats import sink_for

    options = {"table": "db.events", "warehouse": str(tmp_path / "lake"),
               "exactly.logDir": str(tmp_path / "log")}
    with pytest.raises(ConfigError, match=r"compression='zstdd'.*uncompressed, snappy, gzip, "
                                          r"brotli, lz4, zstd"):
        sink_for("exactly.iceberg", {**options, "compression": "zstdd"})
    assert not (tmp_path / "lake").exists()
    new_sink(tmp_path, compression="GZIP")
    assert table(tmp_path).properties["write.parquet.compression-codec"] == "gzip"
