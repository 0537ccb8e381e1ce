"""``exactly verify`` on an Iceberg table written by the real Iceberg sink's protocol (no
Spark; the embedded SQLite catalog): only the data files of the snapshot are read, never a
pre-commit lying under the table's data directory; each row is in the epoch of the snapshot
that added it; an older snapshot can be audited; bad Iceberg addresses exit 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from exactly.auditor import (
    AuditSpec,
    FilesLocation,
    IcebergLocation,
    parse_location,
    run_audit,
    verify,
)
from exactly.cli import main
from exactly.config import Mode
from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.protocol.contract import SinkSettings
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def rows(ids) -> pa.RecordBatch:
    ids = list(ids)
    return pa.record_batch({"id": ids, "key": [f"k{i % 3}" for i in ids]}, schema=SCHEMA)


def iceberg_query(warehouse: Path, log: Path, *, query_id: str | None = None,
                  mode: Mode = Mode.EXACTLY_ONCE) -> ProtocolHarness:
    """A query writing to ``db.events`` in the embedded catalog of ``warehouse``."""
    sink = IcebergSink("db.events", log, catalog=CatalogSpec.from_options({}, str(warehouse)))
    sink.prepare_target(SCHEMA)
    return ProtocolHarness(sink, SinkSettings(mode=mode), query_id=query_id)


def write_input(root: Path, ids) -> Path:
    root.mkdir(parents=True)
    (root / "events.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return root


def address(warehouse: Path, extra: str = "") -> str:
    return f"iceberg:{warehouse}?table=db.events{extra}"


def test_only_the_snapshots_data_files_are_read_not_a_pre_commit_beside_them(tmp_path):
    warehouse = tmp_path / "lake"
    h = iceberg_query(warehouse, tmp_path / "log")
    h.run_epoch(0, [rows(range(0, 5)), rows(range(5, 10))])
    h.run_epoch(1, [rows(range(10, 15)), rows(range(15, 20))])
    h.tasks(1, [rows(range(10, 20))])  # a replay's pre-commit: the table already holds 1
    source = write_input(tmp_path / "in", range(20))

    report = verify(source, address(warehouse))
    assert report.ok, report.rows()
    assert report.found_rows == 20
    assert report.output.startswith("Iceberg table db.events (sql catalog sqlite:///")
    assert [(e.epoch, e.rows) for e in report.epochs] == [(0, 10), (1, 10)]

    data = warehouse / "db" / "events" / "data"
    loose = run_audit(AuditSpec(input=FilesLocation(source), output=FilesLocation(data)))
    assert loose.duplicated.count == 10  # the replay's pre-commit, read as loose Parquet


def test_each_row_is_in_the_epoch_of_its_snapshot_and_an_older_snapshot_can_be_audited(
        tmp_path):
    """Epochs of a query, of a restored query (another id, the epochs go on), of an
    at-least-once query (each task's snapshot names its epoch), and a plain pyiceberg append
    by another writer (no epoch); then the snapshot before the duplicate."""
    warehouse = tmp_path / "lake"
    first = iceberg_query(warehouse, tmp_path / "log-a", query_id="q-1")
    first.run_epoch(0, [rows(range(0, 4)), rows(range(4, 6))])
    restored = iceberg_query(warehouse, tmp_path / "log-b", query_id="q-2")
    restored.run_epoch(1, [rows(range(6, 9))])
    at_least_once = iceberg_query(warehouse, tmp_path / "log-c", query_id="q-3",
                                  mode=Mode.AT_LEAST_ONCE)
    at_least_once.tasks(2, [rows(range(9, 11)), rows(range(11, 12))])
    catalog = CatalogSpec.from_options({}, str(warehouse)).load()
    table = catalog.load_table("db.events")
    before = table.metadata.current_snapshot_id
    table.append(pa.Table.from_batches([rows([11, 12])]))  # 11 again, by another writer

    source = write_input(tmp_path / "in", range(13))
    report = verify(source, address(warehouse))
    assert not report.ok
    assert report.duplicated.sample == [{"id": 11, "rows": 2}]
    assert [(e.epoch, e.rows) for e in report.epochs] == [(0, 6), (1, 3), (2, 3), (None, 2)]

    older = verify(write_input(tmp_path / "in-12", range(12)),
                   address(warehouse, f"&snapshot={before}"))
    assert older.ok, older.rows()
    assert older.output.endswith(f"snapshot {before}")


def test_a_location_string_names_the_catalog_kind():
    sql = parse_location("iceberg:postgresql://u:pw@h:5432/db?table=ns.t&sslmode=disable")
    assert isinstance(sql, IcebergLocation)
    assert sql.address.catalog.properties["uri"] == \
        "postgresql+psycopg://u:pw@h:5432/db?sslmode=disable"
    assert "pw" not in sql.describe() and "pw" not in repr(sql.address.catalog)
    rest = parse_location("iceberg:http://127.0.0.1:8181?table=ns.t&warehouse=s3://b/w")
    assert isinstance(rest, IcebergLocation)
    assert rest.address.catalog.properties["type"] == "rest"
    assert rest.address.catalog.properties["warehouse"] == "s3://b/w"


@pytest.mark.parametrize("output, message", [
    ("iceberg:{tmp}/lake", "names no Iceberg table"),
    ("iceberg:{tmp}/lake?table=events", "is not a table name"),
    ("iceberg:{tmp}/lake?table=db.none", "the catalog has no table db.none"),
    ("iceberg:{tmp}/lake?table=db.events&snapshot=7", "the table has no snapshot 7"),
    ("iceberg:{tmp}/lake?table=db.events&snapshot=x", "snapshot='x' is not a snapshot id"),
    ("iceberg:s3://bucket/lake?table=db.events", "embedded SQLite catalog cannot live"),
])
def test_bad_iceberg_addresses_exit_2_with_one_line(tmp_path, output, message):
    iceberg_query(tmp_path / "lake", tmp_path / "log").run_epoch(0, [rows(range(3))])
    source = write_input(tmp_path / "in", range(3))
    result = CliRunner().invoke(main, ["verify", "--input", str(source), "--output",
                                       output.format(tmp=tmp_path)])
    assert result.exit_code == 2, result.output
    assert message.format(tmp=tmp_path) in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
