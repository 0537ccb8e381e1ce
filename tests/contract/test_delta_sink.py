"""The Delta Lake sink's own promises, beyond the common protocol (test_commit_protocol.py):
one Delta commit per epoch that the table itself recognises, the table's schema checked,
file statistics a Delta reader can trust, and storage settings checked before any write."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from exactly.connectors.delta.sink import DeltaSink, app_id
from exactly.errors import ConfigError
from exactly.objectstore import Location
from exactly.protocol.contract import SinkSettings
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("day", pa.date32())])


def rows(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": ids, "key": [f"k{i}" for i in ids],
                            "day": pa.array([i % 28 for i in ids], pa.int32()).cast(pa.date32())},
                           schema=SCHEMA)


def new_sink(tmp_path: Path, log: str = "log") -> DeltaSink:
    sink = DeltaSink(str(tmp_path / "table"), tmp_path / log)
    sink.prepare_target(SCHEMA)
    return sink


def test_each_epoch_is_one_delta_commit_carrying_the_query_and_epoch_as_a_transaction(tmp_path):
    h = ProtocolHarness(new_sink(tmp_path))
    h.run_epoch(0, [rows([1, 2]), rows([3])])
    h.run_epoch(1, [rows([4]), []])
    table = DeltaTable(str(tmp_path / "table"))
    assert table.version() == 2  # the create, then one commit per epoch
    assert table.transaction_version(app_id(h.query_id)) == 1
    commits = [c for c in table.history() if c.get("exactly.epoch") is not None]
    assert sorted((c["exactly.epoch"], c["exactly.queryId"]) for c in commits) == \
        [("0", h.query_id), ("1", h.query_id)]


def test_an_epoch_the_table_already_holds_is_not_committed_again_even_without_the_commit_log(
        tmp_path):
    """The table recognises a replay on its own: a driver whose commit log was lost (a new
    log directory) publishes epoch 0 again with new files, and the table adds nothing."""
    first = ProtocolHarness(new_sink(tmp_path, "log-a"), query_id="q-1")
    first.run_epoch(0, [rows([1, 2])])
    second = ProtocolHarness(new_sink(tmp_path, "log-b"), query_id="q-1")
    second.run_epoch(0, [rows([1, 2])])
    table = DeltaTable(str(tmp_path / "table"))
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2]
    assert table.version() == 1
    second.run_epoch(1, [rows([3])])
    assert sorted(DeltaTable(str(tmp_path / "table")).to_pyarrow_table()["id"].to_pylist()) \
        == [1, 2, 3]


def test_two_writers_racing_for_one_epoch_the_table_takes_one_and_fences_the_other(tmp_path):
    """Both drivers read the table before either commits epoch 0 (their lease checks and
    intents passed, as in a partition): Delta's conflict check on the application
    transaction refuses the second commit, so the epoch is in the table once."""
    from exactly.errors import FencedError

    first = ProtocolHarness(new_sink(tmp_path, "log-a"), query_id="q-1")
    second = ProtocolHarness(new_sink(tmp_path, "log-b"), query_id="q-1")
    stale = second.sink._delta()  # second's view of the table, before first commits
    second.sink._delta = lambda fresh=True: stale  # it does not see first's commit
    first.run_epoch(0, [rows([1, 2])])
    with pytest.raises(FencedError, match=r"committed to .* by another writer"):
        second.run_epoch(0, [rows([1, 2])])
    table = DeltaTable(str(tmp_path / "table"))
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2]


def test_after_its_own_commit_the_driver_knows_the_epoch_without_reading_the_log(
        tmp_path, monkeypatch):
    """While the table's newest version is the sink's own last commit, the next epoch takes
    the query's txn version from that commit instead of reading the log (a GET per epoch on
    S3): epoch 1 reads no transaction version."""
    h = ProtocolHarness(new_sink(tmp_path))
    h.run_epoch(0, [rows([1, 2])])
    reads = []
    original = DeltaTable.transaction_version
    monkeypatch.setattr(DeltaTable, "transaction_version",
                        lambda self, app: reads.append(app) or original(self, app))
    h.run_epoch(1, [rows([3])])
    assert reads == []
    table = DeltaTable(str(tmp_path / "table"))
    assert table.transaction_version(app_id(h.query_id)) == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]


def test_a_commit_of_another_writer_since_its_own_makes_the_driver_read_the_log(tmp_path):
    """Another instance of the query committed epoch 1 after this driver's epoch 0: the
    table's version is no longer this driver's own commit, so it reads the txn version,
    finds epoch 1 there and adds nothing."""
    first = ProtocolHarness(new_sink(tmp_path, "log-a"), query_id="q-1")
    first.run_epoch(0, [rows([1, 2])])
    second = ProtocolHarness(new_sink(tmp_path, "log-b"), query_id="q-1")
    second.run_epoch(1, [rows([3])])
    first.run_epoch(1, [rows([3])])
    table = DeltaTable(str(tmp_path / "table"))
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]
    assert table.version() == 2


def test_files_carry_record_counts_and_exact_bounds_only(tmp_path):
    h = ProtocolHarness(new_sink(tmp_path))
    h.run_epoch(0, [rows([7, 3, 9])])
    actions = DeltaTable(str(tmp_path / "table")).get_add_actions(flatten=True)
    adds = pa.table(actions).to_pylist()
    assert len(adds) == 1
    stats = adds[0]
    assert stats["num_records"] == 3
    assert (stats["min.id"], stats["max.id"]) == (3, 9)
    assert stats.get("min.key") is None  # strings: Delta truncates them, so no bounds given
    assert stats["null_count.key"] == 0
    assert (str(stats["min.day"]), str(stats["max.day"])) == ("1970-01-04", "1970-01-10")


def test_a_task_writes_its_small_batches_as_few_large_row_groups(tmp_path, monkeypatch):
    """Spark hands a task its rows in Arrow batches of 10,000: the task buffers them into row
    groups of ROW_GROUP_ROWS rows (deltalake's own size) instead of one row group per batch,
    with every row once, in order, and file statistics over all row groups."""
    import pyarrow.parquet as pq

    from exactly.connectors.delta import sink as delta_sink

    monkeypatch.setattr(delta_sink, "ROW_GROUP_ROWS", 250, raising=False)
    h = ProtocolHarness(new_sink(tmp_path))
    h.run_epoch(0, [[rows(list(range(start, start + 100))) for start in range(0, 1000, 100)]])
    table = DeltaTable(str(tmp_path / "table"))
    (add,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    footer = pq.ParquetFile(tmp_path / "table" / add["path"]).metadata
    assert [footer.row_group(i).num_rows for i in range(footer.num_row_groups)] == \
        [300, 300, 300, 100]
    assert table.to_pyarrow_table()["id"].to_pylist() == list(range(1000))
    assert (add["num_records"], add["min.id"], add["max.id"]) == (1000, 0, 999)
    assert add["size_bytes"] == (tmp_path / "table" / add["path"]).stat().st_size


def test_a_table_with_other_columns_is_refused_naming_both_schemas(tmp_path):
    new_sink(tmp_path)
    sink = DeltaSink(str(tmp_path / "table"), tmp_path / "log")
    with pytest.raises(ConfigError, match=r"has columns \(id long, key string, day date\), "
                                          r"the stream writes \(id string\)"):
        sink.prepare_target(pa.schema([("id", pa.string())]))


def test_at_least_once_commits_each_task_on_its_own_without_a_transaction(tmp_path):
    from exactly.config import Mode

    h = ProtocolHarness(new_sink(tmp_path), SinkSettings(mode=Mode.AT_LEAST_ONCE))
    h.tasks(0, [rows([1]), rows([2])])
    table = DeltaTable(str(tmp_path / "table"))
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2]  # before any commit
    assert table.transaction_version(app_id(h.query_id)) is None


def test_plain_http_endpoints_need_an_explicit_allowance_and_secrets_never_show():
    location = Location.parse("s3a://bucket/t/", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                                                  "AWS_SECRET_ACCESS_KEY": "hunter2"})
    assert location.uri == "s3://bucket/t"
    assert "hunter2" not in repr(location)
    assert "hunter2" not in repr(DeltaSink("s3://bucket/t", Path("log"), storage_options={
        "AWS_SECRET_ACCESS_KEY": "hunter2"}))
    with pytest.raises(ConfigError, match="AWS_ALLOW_HTTP=true"):
        location.filesystem()


def test_an_empty_path_is_refused_naming_the_option():
    with pytest.raises(ConfigError, match=r"option\('path', URI\)"):
        DeltaSink("", Path("log"))


def test_stats_are_valid_json_for_every_file(tmp_path):
    h = ProtocolHarness(new_sink(tmp_path))
    h.run_epoch(0, [rows([1]), rows([2, 3])])
    log = sorted((tmp_path / "table" / "_delta_log").glob("*.json"))[-1]
    adds = [json.loads(line)["add"] for line in log.read_text().splitlines()
            if '"add"' in line]
    assert sorted(json.loads(a["stats"])["numRecords"] for a in adds) == [1, 2]
