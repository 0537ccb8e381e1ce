"""``exactly doctor --table iceberg:...``'s findings (connectors/iceberg/health.py) on real
Iceberg tables written through the sink's protocol (embedded SQLite catalog, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from exactly.connectors.iceberg.catalog import CatalogSpec, IcebergAddress
from exactly.connectors.iceberg.health import table_findings
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.connectors.iceberg.snapshots import committed_epoch
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64())])


def harness(tmp_path: Path, query_id: str = "q-1") -> ProtocolHarness:
    sink = IcebergSink("db.events", tmp_path / f"log-{query_id}",
                       catalog=CatalogSpec.from_options({}, str(tmp_path / "lake")))
    sink.prepare_target(SCHEMA)
    return ProtocolHarness(sink, query_id=query_id)


def batch(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": ids}, schema=SCHEMA)


def findings(tmp_path: Path, completed: list[int]) -> list[tuple[str, str]]:
    address = IcebergAddress.parse(f"iceberg:{tmp_path / 'lake'}?table=db.events")
    return [(f.severity, f.problem) for f in table_findings(address, "q-1", completed)]


def test_a_table_in_step_with_its_sink_log_has_no_findings(tmp_path):
    h = harness(tmp_path)
    h.run_epoch(0, [batch([1])])
    h.run_epoch(1, [batch([2])])
    assert findings(tmp_path, [0, 1]) == []


def test_a_rollback_outside_exactly_is_an_error_and_moves_the_tables_epoch_back(tmp_path):
    h = harness(tmp_path)
    for epoch in range(3):
        h.run_epoch(epoch, [batch([epoch])])
    table = h.sink._iceberg(fresh=True)
    first = table.metadata.snapshots[0].snapshot_id
    table.manage_snapshots().rollback_to_snapshot(first).commit()
    found = findings(tmp_path, [0, 1, 2])
    assert [s for s, _ in found] == ["error", "warning"], found
    assert "holds its epochs up to 0" in found[0][1] and "completed epoch 2" in found[0][1]
    assert "rolled back to an older snapshot" in found[1][1]
    assert committed_epoch(h.sink._iceberg(fresh=True), "q-1") == 0  # a replay of 1 or 2
    # would be committed again: the table no longer holds them


def test_pending_attempts_and_stray_data_files_are_named(tmp_path):
    h = harness(tmp_path)
    h.run_epoch(0, [batch([1])])
    h.tasks(1, [batch([2]), batch([3])])  # pre-committed, no intent yet
    found = findings(tmp_path, [0])
    assert [s for s, _ in found] == ["info"], found
    assert "2 task attempt(s) of epoch(s) 1 are pending" in found[0][1]

    query = "0123abcd-0000-0000-0000-000000000000"
    harness(tmp_path, query).run_epoch(0, [batch([7])])
    stray = next((tmp_path / "lake" / "db" / "events" / "data").glob(f"*{query}*"))
    copy = stray.with_name(stray.name.replace("-00000.parquet", "-00001.parquet"))
    copy.write_bytes(stray.read_bytes())  # a file of the query no snapshot names
    address = IcebergAddress.parse(f"iceberg:{tmp_path / 'lake'}?table=db.events")
    strays = [f for f in table_findings(address, query, [0]) if f.severity == "warning"]
    assert len(strays) == 1 and "1 data file(s) of the query that no snapshot" in \
        strays[0].problem
    assert strays[0].path.endswith(copy.name)


def test_a_table_the_query_never_wrote_is_named_as_another_or_a_new_table(tmp_path):
    """The checkpoint's query (q-1) completed epochs 0 and 1, the table holds only another
    query's snapshots: not "epochs removed outside exactly" but the wrong table or a new one."""
    harness(tmp_path, "q-2").run_epoch(0, [batch([1])])
    found = findings(tmp_path, [0, 1])
    assert [s for s, _ in found] == ["error"], found
    assert "holds no snapshot of query q-1" in found[0][1], found
    assert "removed" not in found[0][1]
    assert "another table than the job writes" in found[0][1]
    (repair,) = [f.repair for f in table_findings(
        IcebergAddress.parse(f"iceberg:{tmp_path / 'lake'}?table=db.events"), "q-1", [0, 1])]
    assert "name the table the job writes" in repair


def test_doctor_table_compares_the_table_with_the_checkpoints_own_sink_log(tmp_path):
    """`exactly doctor CK --table ...` on a local checkpoint whose sink log (CK/exactly-sink)
    completed the table's epochs: no finding about the table."""
    import json

    from click.testing import CliRunner

    from exactly.cli import main

    sink = IcebergSink("db.events", tmp_path / "ck" / "exactly-sink",
                       catalog=CatalogSpec.from_options({}, str(tmp_path / "lake")))
    sink.prepare_target(SCHEMA)
    h = ProtocolHarness(sink, query_id="q-1")
    h.run_epoch(0, [batch([1])])
    h.run_epoch(1, [batch([2])])
    result = CliRunner().invoke(main, ["doctor", str(tmp_path / "ck"), "--table",
                                       f"iceberg:{tmp_path / 'lake'}?table=db.events", "--json"])
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.output)
    assert report["sink_query_id"] == "q-1"
    assert [f for f in report["findings"] if f["path"].startswith("Iceberg table")] == []
