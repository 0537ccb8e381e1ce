"""``exactly verify`` on a local Delta table written by the real Delta sink's protocol (no
Spark): only the files of the table's version are read, never a pre-commit or a replaced
file lying in its directory; each row is in the epoch of the commit that added it; the
commit order orders a key's history; bad Delta locations are refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, write_deltalake

from exactly.auditor import (
    AuditSpec,
    DeltaLocation,
    FilesLocation,
    parse_location,
    run_audit,
    verify,
)
from exactly.cli import main
from exactly.config import Mode
from exactly.connectors.delta.sink import DeltaSink
from exactly.errors import AuditInputError
from exactly.protocol.contract import SinkSettings
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def rows(ids) -> pa.RecordBatch:
    ids = list(ids)
    return pa.record_batch({"id": ids, "key": [f"k{i % 3}" for i in ids]}, schema=SCHEMA)


def delta_query(table: Path, log: Path, *, query_id: str | None = None,
                mode: Mode = Mode.EXACTLY_ONCE) -> ProtocolHarness:
    """A query writing to the Delta table ``table`` through the real sink's protocol."""
    sink = DeltaSink(str(table), log)
    sink.prepare_target(SCHEMA)
    return ProtocolHarness(sink, SinkSettings(mode=mode), query_id=query_id)


def write_input(root: Path, ids) -> Path:
    root.mkdir(parents=True)
    (root / "events.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return root


def test_only_the_files_of_the_tables_version_are_read_not_every_parquet_file_beside_them(
        tmp_path):
    """The files an OPTIMIZE replaced and a pending replay of epoch 2 (its pre-commit
    written in place, not committed) lie in the table's directory; read as loose Parquet
    they are duplicates, read through the log they are not there."""
    table = tmp_path / "table"
    h = delta_query(table, tmp_path / "log")
    h.run_epoch(0, [rows(range(0, 5)), rows(range(5, 10))])
    h.run_epoch(1, [rows(range(10, 15))])
    h.run_epoch(2, [rows(range(15, 18)), rows(range(18, 20))])
    DeltaTable(str(table)).optimize.compact()  # the old files stay until a VACUUM
    h.tasks(2, [rows(range(15, 20))])  # a replay's pre-commit: the table already holds 2
    source = write_input(tmp_path / "in", range(20))

    report = verify(source, table)
    assert report.ok, report.rows()
    assert report.found_rows == 20
    assert report.output == f"Delta table {table}"
    explicit = verify(source, f"delta:{table}")
    assert explicit.ok and explicit.found_rows == 20

    loose = run_audit(AuditSpec(input=FilesLocation(source), output=FilesLocation(table)))
    assert loose.duplicated.count == 20  # every row once more in the compacted file
    assert loose.found_rows == 20 + 20 + 5  # ... and the replay's 15..19 a third time


def test_each_row_is_in_the_epoch_of_the_commit_that_added_it(tmp_path):
    """Epochs of a query, of the query restored from a savepoint (another query id, the
    epochs go on), of an at-least-once query (each task's commit records its epoch), and a
    plain append by another writer (no epoch)."""
    table = tmp_path / "table"
    first = delta_query(table, tmp_path / "log-a", query_id="q-1")
    first.run_epoch(0, [rows(range(0, 4)), rows(range(4, 6))])
    first.run_epoch(1, [rows(range(6, 9))])
    restored = delta_query(table, tmp_path / "log-b", query_id="q-2")
    restored.run_epoch(2, [rows(range(9, 10))])
    restored.run_epoch(3, [rows(range(10, 14))])
    at_least_once = delta_query(table, tmp_path / "log-c", query_id="q-3",
                                mode=Mode.AT_LEAST_ONCE)
    at_least_once.tasks(4, [rows(range(14, 16)), rows(range(16, 17))])
    write_deltalake(str(table), pa.Table.from_batches([rows(range(17, 20))]), mode="append")

    report = verify(write_input(tmp_path / "in", range(20)), table)
    assert report.ok, report.rows()
    assert [(e.epoch, e.rows) for e in report.epochs] == [
        (0, 6), (1, 3), (2, 1), (3, 4), (4, 3), (None, 3)]


def test_a_duplicated_and_a_missing_id_are_named_with_their_epochs(tmp_path):
    table = tmp_path / "table"
    h = delta_query(table, tmp_path / "log")
    h.run_epoch(0, [rows(range(0, 5))])
    h.run_epoch(1, [rows([4, 5, 7])])  # 4 again, 6 never

    report = verify(write_input(tmp_path / "in", range(8)), table)
    assert not report.ok
    assert report.duplicated.sample == [{"id": 4, "rows": 2}]
    assert report.missing.sample == [{"id": 6}]
    assert [(e.epoch, e.rows, e.duplicated_rows) for e in report.epochs] == [(0, 5, 1),
                                                                             (1, 3, 1)]


def test_latest_by_key_and_monotonic_follow_the_commit_order_and_a_version_can_be_audited(
        tmp_path):
    """Running counts per key appended each epoch: the newest commit's count is the result;
    an epoch that wrote an older count is a value that moved backwards. Version 2 (before
    that epoch) is audited on its own with ``?version=2``."""
    table = tmp_path / "table"
    schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
    sink = DeltaSink(str(table), tmp_path / "log")
    sink.prepare_target(schema)
    h = ProtocolHarness(sink)
    for epoch, counts in enumerate([{"a": 1, "b": 1}, {"a": 2}, {"a": 1}]):  # versions 1-3
        h.run_epoch(epoch, [pa.table({"key": list(counts), "n": list(counts.values())},
                                     schema=schema)])
    source = tmp_path / "in"
    source.mkdir()
    (source / "e.jsonl").write_text('{"key": "a"}\n{"key": "b"}\n{"key": "a"}\n')
    spec = {"key": "key", "expect": "select key, count(*) as n from input group by key",
            "compare": ("n",), "latest_by_key": True, "monotonic": "n"}

    before = verify(source, f"{table}?version=2", **spec)
    assert before.ok, before.rows()
    assert before.output == f"Delta table {table} version 2"
    newest = verify(source, table, **spec)
    assert not newest.ok
    assert newest.differing.sample == [{"key": "a", "expected n": 2, "found n": 1}]
    assert newest.backwards.count == 1
    moved = newest.backwards.sample[0]
    assert (moved["key"], moved["before"], moved["after"], moved["__x_version"]) == \
        ("a", 2, 1, 3)


def cli(*args: str):
    return CliRunner().invoke(main, ["verify", *args])


@pytest.mark.parametrize("output, message", [
    ("delta:{tmp}/plain", "is not a Delta table: it has no _delta_log/; drop 'delta:'"),
    ("delta:{tmp}/nothing", "nothing does not exist"),
    ("{tmp}/table?version=99", "it has no version 99; its newest is 1"),
    ("{tmp}/plain?version=1", "?version=1: {tmp}/plain is not a Delta table"),
    ("{tmp}/nolog", "Delta table {tmp}/nolog: cannot read the table: its _delta_log/ holds "
                    "no commit"),
    ("delta:ftp://host/t", "a Delta table is a directory or an s3://bucket/prefix"),
    ("s3:///prefix", "names no bucket; write s3://BUCKET/prefix"),
])
def test_bad_delta_locations_exit_2_with_one_line(tmp_path, output, message):
    h = delta_query(tmp_path / "table", tmp_path / "log")
    h.run_epoch(0, [rows([0])])
    write_input(tmp_path / "plain", [0])
    (tmp_path / "nolog" / "_delta_log").mkdir(parents=True)
    result = cli("--input", str(tmp_path / "plain"), "--output", output.format(tmp=tmp_path))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verify: bad input: ")
    assert message.format(tmp=tmp_path) in lines[0], lines[0]


def test_plain_http_to_an_object_store_needs_aws_allow_http(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    result = cli("--expect", "select 1 as id", "--output", "s3://bucket/t")
    assert result.exit_code == 2, result.output
    assert "set AWS_ALLOW_HTTP=true" in result.stderr


def test_the_cli_audits_a_delta_table(tmp_path):
    """In process (the S3 tests run the command as a subprocess)."""
    table = tmp_path / "table"
    h = delta_query(table, tmp_path / "log")
    h.run_epoch(0, [rows(range(0, 3))])
    h.tasks(1, [rows(range(0, 3))])  # pending: not in the table
    result = cli("--input", str(write_input(tmp_path / "in", range(3))), "--output", str(table),
                 "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["output"] == f"Delta table {table}" and report["found_rows"] == 3
    assert [(e["epoch"], e["rows"]) for e in report["epochs"]] == [(0, 3)]


def test_a_delta_location_is_parsed_from_a_directory_with_a_log(tmp_path):
    h = delta_query(tmp_path / "table", tmp_path / "log")
    h.run_epoch(0, [rows([0])])
    assert parse_location(str(tmp_path / "table")) == DeltaLocation(str(tmp_path / "table"))
    assert parse_location(f"{tmp_path}/table?version=0") == \
        DeltaLocation(str(tmp_path / "table"), 0)


def test_a_table_with_deletion_vectors_is_refused_not_read_with_its_deleted_rows(tmp_path):
    write_deltalake(str(tmp_path / "dv"), pa.table({"id": [1, 2]}),
                    configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(AuditInputError, match=r"reader features: \{'deletionVectors'\} .* "
                                              r"applies neither deletion vectors"):
        verify(None, tmp_path / "dv", expect="select 1 as id")
