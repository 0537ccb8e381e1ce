"""``exactly doctor s3a://CK --table iceberg:...`` (S3Proxy): the Iceberg table is checked
against the epochs the S3 checkpoint's sink log completed, read from the checkpoint's local
copy (ops/doctor.py, connectors/iceberg/health.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner

from exactly.checkpoint.location import open_store
from exactly.cli import main
from exactly.connectors.iceberg.catalog import CatalogSpec
from exactly.connectors.iceberg.sink import IcebergSink
from exactly.testing.harness import ProtocolHarness

SCHEMA = pa.schema([("id", pa.int64())])


def upload_tree(local: Path, remote: str) -> None:
    store = open_store(remote)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            store.upload(path.relative_to(local).as_posix(), path)


def test_doctor_on_an_s3a_checkpoint_checks_the_table_against_its_completed_epochs(
        s3_bucket, tmp_path):
    """Epochs 0 and 1 in the table and completed in the S3 sink log: in step, no finding
    about the table. Epoch 2 then completed in the log but rolled out of the table: the
    doctor sees the table behind the log."""
    warehouse = tmp_path / "lake"
    log = tmp_path / "ck" / "exactly-sink"
    sink = IcebergSink("db.events", log, catalog=CatalogSpec.from_options({}, str(warehouse)))
    sink.prepare_target(SCHEMA)
    h = ProtocolHarness(sink, query_id="q-1")
    for epoch in range(3):
        h.run_epoch(epoch, [pa.record_batch({"id": [epoch]}, schema=SCHEMA)])
    table = sink._iceberg(fresh=True)
    checkpoint = f"s3a://{s3_bucket}/jobs/events"
    address = f"iceberg:{warehouse}?table=db.events"

    def table_findings() -> list[dict]:
        result = CliRunner().invoke(main, ["doctor", checkpoint, "--table", address, "--json"])
        assert result.exit_code in (0, 1), result.output
        return [f for f in json.loads(result.output)["findings"]
                if f["path"].startswith("Iceberg table db.events")]

    upload_tree(tmp_path / "ck", checkpoint)
    assert table_findings() == []  # not "holds epoch 2, whose completion record ... lacks"

    table.manage_snapshots().rollback_to_snapshot(
        table.metadata.snapshots[1].snapshot_id).commit()  # epoch 1's snapshot
    found = table_findings()
    assert [f["severity"] for f in found] == ["error", "warning"], found
    assert "holds its epochs up to 1" in found[0]["problem"]
    assert "completed epoch 2" in found[0]["problem"]
