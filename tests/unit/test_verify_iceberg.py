"""``exactly verify`` on an Iceberg table written by the real Iceberg sink's protocol (no
Spark; the embedded SQLite catalog): only the data files of the snapshot are read, never a
pre-commit lying under the table's data directory; each row is in the epoch of the snapshot
that added it; an older snapshot can be audited; bad Iceberg addresses exit 2 with one line."""

from __future__ import annotations

import json
import re
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


# -- a key's history across exactly's compaction -----------------------------------------
VALUES = pa.schema([("id", pa.int64()), ("v", pa.int64())])


def values(pairs) -> pa.RecordBatch:
    ids, vs = zip(*pairs, strict=True) if pairs else ((), ())
    return pa.record_batch({"id": list(ids), "v": list(vs)}, schema=VALUES)


def updates_query(warehouse: Path, log: Path) -> ProtocolHarness:
    sink = IcebergSink("db.events", log, catalog=CatalogSpec.from_options({}, str(warehouse)))
    sink.prepare_target(VALUES)
    return ProtocolHarness(sink, query_id="0b5c6f9e-1111-4222-8333-944455556666")


def history_audit(warehouse: Path, expect: str):
    """The audit of a key's newest value and its history (``v`` must never decrease)."""
    return verify(None, address(warehouse), expect=expect, compare=("v",),
                  latest_by_key=True, monotonic="v").to_json()


def test_compacted_epochs_keep_their_place_in_a_keys_history(tmp_path):
    """Key 7 is 1, 3, 2 in epochs 1, 2, 3 (one move backwards), key 8 goes 1, 2, 4; epochs
    1-2 compacted into one file: --latest-by-key, --monotonic and the per-epoch breakdown
    answer as before the compaction."""
    from exactly.connectors.iceberg.compaction import compact_iceberg

    warehouse = tmp_path / "lake"
    h = updates_query(warehouse, tmp_path / "log")
    h.run_epoch(1, [values([(7, 1), (1, 1)]), values([(8, 1)])])
    h.run_epoch(2, [values([(7, 3), (2, 1)]), values([(8, 2)])])
    h.run_epoch(3, [values([(7, 2), (3, 1)]), values([(8, 4)])])
    expect = "SELECT * FROM (VALUES (1, 1), (2, 1), (3, 1), (7, 2), (8, 4)) t(id, v)"
    before = history_audit(warehouse, expect)
    assert before["moved_backwards"]["count"] == 1 and before["differing"]["count"] == 0, before

    result = compact_iceberg(CatalogSpec.from_options({}, str(warehouse)), "db.events",
                             keep_newest_epochs=1)
    assert sorted(r[1:] for r in result.ranges.values()) == [[1, 2]]
    assert history_audit(warehouse, expect) == before


def test_a_compacted_file_beside_a_middle_epochs_file_left_out_keeps_each_rows_epoch(
        tmp_path):
    """Epoch 2's large file stays out of the merge (tiered), its small one goes into a
    compacted file whose epochs reach past the large one: each row still sorts by its own
    epoch."""
    from exactly.connectors.iceberg.compaction import compact_iceberg

    warehouse = tmp_path / "lake"
    h = updates_query(warehouse, tmp_path / "log")
    large = [(i, 1) for i in range(1000, 21000)]
    h.run_epoch(1, [values([(7, 1), (1, 1)]), values([(8, 1)])])
    h.run_epoch(2, [values([(7, 3), *large]), values([(8, 5)])])
    h.run_epoch(3, [values([(7, 2), (3, 1)]), values([(8, 4)])])
    expect = ("SELECT * FROM (VALUES (1, 1), (3, 1), (7, 2), (8, 4)) t(id, v) UNION ALL "
              "SELECT range AS id, 1 AS v FROM range(1000, 21000)")
    before = history_audit(warehouse, expect)
    assert before["moved_backwards"]["count"] == 2, before

    result = compact_iceberg(CatalogSpec.from_options({}, str(warehouse)), "db.events")
    table = CatalogSpec.from_options({}, str(warehouse)).load().load_table("db.events")
    live = [t.file for t in table.scan().plan_files()]
    compacted = re.compile(r"^part-\d{12}-\d{12}-c[0-9a-f]{8}-")
    assert [f.record_count for f in live if not compacted.match(f.file_path.rsplit("/")[-1])
            ] == [20_001]  # epoch 2's large file, left out
    spans = sorted(r[1:] for r in result.ranges.values())
    assert len(spans) == 2 and any(first < 2 <= last or first <= 2 < last
                                   for first, last in spans), spans
    assert history_audit(warehouse, expect) == before


def test_a_file_of_an_older_compaction_without_rows_per_epoch_is_as_new_as_its_snapshot(
        tmp_path, monkeypatch):
    """A compaction's summary from before the rows per epoch (``[query, first, last]``):
    its file's rows are in epoch none and take the compaction snapshot's sequence number."""
    from exactly.connectors.iceberg import compaction
    from exactly.connectors.iceberg.snapshots import SUMMARY_COMPACTION

    warehouse = tmp_path / "lake"
    h = updates_query(warehouse, tmp_path / "log")
    h.run_epoch(1, [values([(7, 1)]), values([(8, 1)])])
    h.run_epoch(2, [values([(7, 2)]), values([(8, 2)])])
    monkeypatch.setattr(compaction, "compaction_summary", lambda ranges, _: {
        SUMMARY_COMPACTION: json.dumps(ranges)})
    compaction.compact_iceberg(CatalogSpec.from_options({}, str(warehouse)), "db.events")
    h.run_epoch(3, [values([(9, 1)])])

    found = history_audit(warehouse, "SELECT * FROM (VALUES (7, 2), (8, 2), (9, 1)) t(id, v)")
    assert [(e["epoch"], e["rows"]) for e in found["epochs"]] == [(3, 1), (None, 2)]


def test_a_table_of_a_sql_catalog_with_another_name_is_read_through_catalog_name(tmp_path):
    """The sink's option catalog.name=prod: the SQL catalog keys the table by that name, so
    the address names it too (verify, doctor --table, compact and the sink's options)."""
    from exactly.connectors.iceberg.catalog import IcebergAddress
    from exactly.connectors.iceberg.health import table_findings
    from exactly.ops.compaction import CompactionPlan, compact_once

    warehouse = tmp_path / "lake"
    sink = IcebergSink("db.events", tmp_path / "log",
                       catalog=CatalogSpec.from_options({"name": "prod"}, str(warehouse)))
    sink.prepare_target(SCHEMA)
    ProtocolHarness(sink).run_epoch(0, [rows(range(3))])
    source = str(write_input(tmp_path / "in", range(3)))

    named = CliRunner().invoke(main, ["verify", "--input", source, "--output",
                                      address(warehouse, "&catalog.name=prod"), "--json"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.output)["epochs"][0]["epoch"] == 0
    unnamed = CliRunner().invoke(main, ["verify", "--input", source, "--output",
                                        address(warehouse)])
    assert unnamed.exit_code == 2, unnamed.output
    assert "&catalog.name=NAME" in unnamed.output  # the fix, named

    parsed = IcebergAddress.parse(address(warehouse, "&catalog.name=prod"))
    assert parsed.catalog.name == "prod"
    query = json.loads((tmp_path / "log" / "query.json").read_text())["query_id"]
    assert table_findings(parsed, query, [0]) == []  # doctor --table
    assert compact_once(CompactionPlan(address(warehouse, "&catalog.name=prod"),
                                       dry_run=True))["files_before"] == 1  # compact
    assert parsed.sink_options() == {"table": "db.events", "warehouse": str(warehouse),
                                     "catalog.name": "prod"}


def test_verify_help_and_bad_locations_name_iceberg_addresses_beside_the_others(tmp_path):
    helped = CliRunner().invoke(main, ["verify", "--help"])
    assert helped.exit_code == 0
    assert "iceberg:CATALOG?table=NS.NAME" in helped.output
    assert "exactly verify --input data/in --output 'iceberg:" in helped.output
    source = str(write_input(tmp_path / "in", range(1)))
    for output in (["--output", "ftp://host/out"], []):
        result = CliRunner().invoke(main, ["verify", "--input", source, *output])
        assert result.exit_code == 2, result.output
        assert "iceberg:CATALOG?table=NS.NAME" in result.output, result.output
